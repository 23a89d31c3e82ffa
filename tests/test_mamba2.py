"""Mamba-2 hybrids (nemotron_h, nemotron_h_moe, granitehybrid): the NumPy reference of the
Mamba-2 layer (its scan against the state-space-duality form, its state
carrying a sequence across pieces), elelem's forward pass against it, the
state in the one cache, what ``elelem info`` shows, and the files refused
before anything is computed.  The logits against llama.cpp are
tests/test_arch_llamacpp.py's (the ``nemotron_h*`` and ``granitehybrid*`` configs); batching,
rewinds, forks and saved states tests/test_hybrid.py's."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import elelem
from elelem.errors import ModelShapeError
from synthetic_mamba2 import Mamba2Config, gated_group_rms_norm, mamba2_layer, reference_logits, ssm_scan

NEMOTRON_H = Mamba2Config(seed=21)                                  # M - M * M - M
NEMOTRON_NANO = Mamba2Config(arch="nemotron_h_moe", pattern="MEM*EM", seed=22)
GRANITE = Mamba2Config(arch="granitehybrid", pattern="MM*MM*", ssm_n_head=16, ssm_n_group=1, n_ff=32, seed=23)
GRANITE_DENSE = GRANITE.but(granite_experts=False, n_ff=128, seed=24)
PROMPT = [int(t) for t in np.random.default_rng(3).integers(1, 96, 20)]


def _ssd(state, x, dt, a, b, c):
    """The scan in its state-space-duality form (Mamba-2's "quadratic" mode):
    y_t = C_t . (prod_{r<=t} exp(dt_r A)) h_0 + sum_{s<=t} C_t . B_s (prod_{s<r<=t} exp(dt_r A)) dt_s x_s,
    every output at once rather than one token after another."""
    n, heads, _ = x.shape
    group_of = np.arange(heads) // (heads // b.shape[1])
    cum = np.cumsum(dt * a, axis=0)                                    # (n, heads): sum_{r<=t} dt_r A
    y = np.empty_like(x)
    for h in range(heads):
        bh, ch = b[:, group_of[h]], c[:, group_of[h]]                  # (n, d_state)
        decay = np.exp(cum[:, None, h] - cum[None, :, h])              # (t, s): prod_{s<r<=t}
        scores = np.tril((ch @ bh.T) * decay)                          # (t, s)
        y[:, h] = scores @ (dt[:, h, None] * x[:, h]) + np.exp(cum[:, h])[:, None] * (ch @ state[h].T)
    return y


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), heads_per_group=st.integers(1, 3), groups=st.integers(1, 3), seed=st.integers(0, 99))
def test_the_scan_token_by_token_equals_its_quadratic_form(n, heads_per_group, groups, seed):
    rng = np.random.default_rng(seed)
    heads, head_dim, d_state = heads_per_group * groups, 3, 5
    state = rng.standard_normal((heads, head_dim, d_state))
    x = rng.standard_normal((n, heads, head_dim))
    dt = rng.uniform(0.01, 1.0, (n, heads))
    a = -rng.uniform(0.5, 4.0, heads)
    b, c = rng.standard_normal((n, groups, d_state)), rng.standard_normal((n, groups, d_state))
    y, _ = ssm_scan(state, x, dt, a, b, c)
    np.testing.assert_allclose(y, _ssd(state, x, dt, a, b, c), rtol=1e-10, atol=1e-10)


def test_the_gated_norm_normalizes_each_group_alone():
    rng = np.random.default_rng(0)
    y, z = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    weight = np.ones((2, 4))
    out = gated_group_rms_norm(y, z, weight, 0.0).reshape(3, 2, 4)
    np.testing.assert_allclose(np.mean(out ** 2, axis=-1), 1.0, rtol=1e-12)   # each group's RMS is 1
    g = (y * z / (1 + np.exp(-z))).reshape(3, 2, 4)
    np.testing.assert_allclose(out * np.sqrt(np.mean(g ** 2, axis=-1, keepdims=True)), g, rtol=1e-12)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 12), cuts=st.lists(st.integers(1, 11), max_size=4))
def test_a_mamba2_layer_run_in_pieces_equals_it_run_whole(tiny_model, n, cuts):
    """The layer's state (the convolution's last d_conv - 1 inputs and the
    scan's state) carries a sequence from one piece to the next exactly: what
    the cache's slots keep between steps."""
    _, weights = tiny_model(NEMOTRON_H)
    w = {k: v.astype(np.float64) for k, v in weights.items()}

    def mm(x, name):
        return x @ w[name].T

    h = np.random.default_rng(n).standard_normal((n, NEMOTRON_H.n_embd))
    whole, final = mamba2_layer(h, w, "blk.0.", NEMOTRON_H, mm)
    state, pieces, start = None, [], 0
    for end in sorted({c for c in cuts if c < n}) + [n]:
        out, state = mamba2_layer(h[start:end], w, "blk.0.", NEMOTRON_H, mm, state)
        pieces.append(out)
        start = end
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=1e-10, atol=1e-10)
    for got, want in zip(state, final):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
@pytest.mark.parametrize("cfg", [NEMOTRON_H, NEMOTRON_NANO, GRANITE, GRANITE_DENSE],
                         ids=["nemotron_h", "nemotron_h_moe", "granitehybrid", "granitehybrid_dense"])
def test_logits_match_the_numpy_reference(tiny_model, cfg, flash_attn):
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, PROMPT)
    with elelem.LLM(path, kv_type="f32", n_ctx=64, n_threads=2, amx=False, flash_attn=flash_attn) as llm:
        whole = llm.eval(PROMPT, all_logits=True)
        llm.reset()
        steps = [llm.eval(PROMPT[:7])] + [llm.eval([t]) for t in PROMPT[7:]]
    tol = 2e-5 * np.abs(want).max()   # F32 weights and cache: float32 rounding only
    np.testing.assert_allclose(whole, want, rtol=0, atol=tol)
    np.testing.assert_allclose(np.stack(steps), want[6:], rtol=0, atol=tol)


def test_the_state_lives_in_the_one_cache(tiny_model):
    from elelem.gguf.reader import read_gguf
    from elelem.model.architectures import model_spec

    cfg = NEMOTRON_H
    path, _ = tiny_model(cfg)
    spec = model_spec(read_gguf(path))
    n_mamba = cfg.pattern.count("M")
    conv = n_mamba * (cfg.ssm_d_conv - 1) * cfg.channels * 4
    scan = n_mamba * cfg.ssm_d_state * cfg.d_inner * 4
    assert spec.recurrent_state_bytes() == {"convolution": conv, "scan": scan}
    with elelem.LLM(path, n_threads=2, n_seq_max=3, kv_size=256, amx=False) as llm:
        cache = llm.engine.context.cache
        assert cache.hybrid and cache.state_bytes == conv + scan
        # K/V for the one attention layer only: the Mamba-2 and MLP layers keep no cells
        assert cache.bytes_per_cell < 2 * cfg.n_head_kv * cfg.head_dim * 2 + 64
        llm.engine.context.decode([1, 2, 3], [1, 1, 1])
        state = cache.recurrent_state(1).view(np.float32)
        assert np.any(state != 0) and not np.any(cache.recurrent_state(0))


def test_info_shows_the_layer_pattern_and_the_state(tiny_model, capsys):
    from elelem.cli.info_cmd import describe, main
    from elelem.cli.parser import build_parser

    path, _ = tiny_model(NEMOTRON_H)
    facts = describe(path)
    assert facts["layer_pattern"] == "RFRARFR"
    assert facts["recurrent_kind"] == "Mamba-2"
    assert facts["shape"] == ("Mamba-2 d_inner 64: 8 heads of 8, 2 groups, state 16, convolution 4; "
                              "layers M-M*M-M")
    main(build_parser().parse_args(["info", str(path)]))
    out = capsys.readouterr().out
    assert "layer pattern    4 Mamba-2, 1 attention, 2 FFN: RFRARFR" in out
    assert "recurrent state  22.0 KiB a sequence (convolution 6.0 KiB, scan 16.0 KiB)" in out


H = NEMOTRON_H


@pytest.mark.parametrize("cfg, message", [
    (H.but(drop=("blk.2.ssm_conv1d.weight",)), r"required tensor 'blk\.2\.ssm_conv1d\.weight' is missing"),
    (H.but(drop=("blk.0.ssm_conv1d.bias",)), r"required tensor 'blk\.0\.ssm_conv1d\.bias' is missing"),
    (H.but(drop=("blk.4.ssm_d",)), r"required tensor 'blk\.4\.ssm_d' is missing"),
    (H.but(drop=("blk.1.ffn_up.weight",)), r"required tensor 'blk\.1\.ffn_up\.weight' is missing"),
    (H.but(cut=(("blk.0.ssm_in.weight", 0, 190),)),
     r"tensor 'blk\.0\.ssm_in\.weight' \(mamba_in\) has shape \[64, 190\], expected \[64, 200\]"),
    (H.but(cut=(("blk.6.ssm_norm.weight", 1, 16),)),
     r"tensor 'blk\.6\.ssm_norm\.weight' \(mamba_norm\) has shape \[16, 2\], expected \[32, 2\]"),
    (H.but(cut=(("blk.2.ssm_a", 0, 4),)), r"tensor 'blk\.2\.ssm_a' \(mamba_a\) has shape \[1, 4\], expected \[1, 8\]"),
    # ssm.group_count 3 does not divide the 8 heads
    (H.but(extra_keys=(("{arch}.ssm.group_count", 3),), drop_keys=("ssm.group_count",)),
     r"nemotron_h\.ssm\.inner_size = 64 must be a multiple of ssm\.time_step_rank \(8 heads\) and of "
     r"ssm\.group_count \(3 groups\)"),
    (H.but(drop_keys=("ssm.state_size",)), r"missing hyperparameter nemotron_h\.ssm\.state_size"),
    (H.but(drop_keys=("attention.layer_norm_epsilon",)),
     r"missing hyperparameter nemotron_h\.attention\.layer_norm_epsilon"),
    # the arrays one short, or saying layer 1 attends where its tensors are an MLP's
    (H.but(kv_override=(0, 0, 0, 2, 0, 0)), r"nemotron_h\.attention\.head_count_kv must hold a count per layer"),
    (H.but(ff_override=(0, 128, 0, 0, 0, 128)), r"nemotron_h\.feed_forward_length must hold a count per layer"),
    (H.but(kv_override=(0, 2, 0, 2, 0, 0, 0), ff_override=(0, 0, 0, 0, 0, 128, 0)),
     r"required tensor 'blk\.1\.attn_q\.weight' is missing"),
    (H.but(kv_override=(0, 0, 0, 0, 0, 0, 0)), r"must give attention layers of one KV head count \(at least one\)"),
    (H.but(kv_override=(0, 2, 0, 2, 0, 0, 0)), r"a layer has either KV heads \(attention\) or an FFN, not both"),
], ids=["no-conv", "no-conv-bias", "no-d", "no-mlp-up", "in-proj-width", "norm-groups", "a-heads", "groups",
        "no-state-size", "no-eps", "kv-short", "ff-short", "kinds-vs-tensors", "no-attention", "attention-and-ffn"])
def test_a_broken_nemotron_h_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


N = NEMOTRON_NANO


@pytest.mark.parametrize("cfg, message", [
    (N.but(drop=("blk.1.exp_probs_b.bias",)), r"required tensor 'blk\.1\.exp_probs_b\.bias' is missing"),
    (N.but(drop=("blk.4.ffn_up_shexp.weight",)), r"required tensor 'blk\.4\.ffn_up_shexp\.weight' is missing"),
    (N.but(cut=(("blk.1.ffn_up_exps.weight", 1, 16),)),
     r"tensor 'blk\.1\.ffn_up_exps\.weight' \(ffn_up_exps\) has shape \[64, 16, 8\], expected \[64, 32, 8\]"),
    (N.but(extra_keys=(("{arch}.moe_latent_size", 32),)), r"nemotron_h_moe\.moe_latent_size: elelem does not run"),
    (N.but(extra_keys=(("{arch}.expert_group_count", 4),), drop_keys=("expert_group_count",)),
     r"nemotron_h_moe\.expert_group_count = 4: grouped expert routing"),
    (N.but(extra_keys=(("{arch}.expert_used_count", (0, 2, 0, 0, 2, 0)),), drop_keys=("expert_used_count",)),
     r"nemotron_h_moe\.expert_used_count is an array: elelem does not run"),
], ids=["no-selection-bias", "no-shared-up", "expert-width", "latent", "groups", "per-layer-experts"])
def test_a_broken_nemotron_h_moe_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


G = GRANITE


@pytest.mark.parametrize("cfg, message", [
    (G.but(drop=("blk.2.ffn_norm.weight",)), r"required tensor 'blk\.2\.ffn_norm\.weight' is missing"),
    (G.but(drop=("blk.0.ffn_gate_shexp.weight",)), r"required tensor 'blk\.0\.ffn_gate_shexp\.weight' is missing"),
    (G.but(drop=("blk.1.ssm_norm.weight",)), r"required tensor 'blk\.1\.ssm_norm\.weight' is missing"),
    # inner_size 64 with n_embd 64: llama.cpp's granitehybrid asserts 2 * n_embd
    (G.but(ssm_n_head=8), r"granitehybrid\.ssm\.inner_size = 64 must be twice embedding_length \(64\)"),
    (G.but(extra_keys=(("{arch}.rope.scaling.finetuned", True),)),
     r"granitehybrid\.rope\.scaling\.finetuned is not false"),
    (G.but(drop_keys=("attention.layer_norm_rms_epsilon",)),
     r"missing hyperparameter granitehybrid\.attention\.layer_norm_rms_epsilon"),
    (G.but(kv_override=(0, 0, 2, 0, 0)), r"granitehybrid\.attention\.head_count_kv must be a number or an integer "
                                         r"per layer"),
    (G.but(kv_override=(0, 0, 0, 0, 0, 0)), r"has no attention layer"),
], ids=["no-ffn-norm", "no-shared-gate", "no-ssm-norm", "inner-size", "rope", "no-eps", "kv-short", "no-attention"])
def test_a_broken_granitehybrid_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


def test_info_shows_granites_scales(tiny_model):
    from elelem.cli.info_cmd import describe

    facts = describe(tiny_model(GRANITE)[0])
    assert facts["layer_pattern"] == "RRARRA" and facts["recurrent_kind"] == "Mamba-2"
    assert facts["shape"] == ("Mamba-2 d_inner 128: 16 heads of 8, 1 groups, state 16, convolution 4; scales: "
                              "embeddings 12, residual 0.22, attention 0.0078125, logits 1/6")
