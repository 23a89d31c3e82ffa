"""LFM2 and LFM2 MoE (short gated convolution layers beside attention): the
NumPy reference of the convolution layer, the forward pass against it, the
convolution state in the one cache, what ``elelem info`` shows, and the
files refused before anything is computed.  Their logits against llama.cpp
are tests/test_arch_llamacpp.py's (the ``lfm2*`` configs); batching,
rewinds, forks and saved states tests/test_hybrid.py's."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import elelem
from elelem.errors import ModelShapeError
from synthetic import TinyConfig, reference_logits
from synthetic_lfm2 import shortconv_layer

LFM2 = TinyConfig(arch="lfm2", head_dim=16, n_layer=6, seed=21)                   # C C A C C A
LFM2MOE = TinyConfig(arch="lfm2moe", head_dim=16, n_layer=8, n_dense_lead=2, seed=22)
PROMPT = np.random.default_rng(3).integers(1, 96, 20)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), cuts=st.lists(st.integers(1, 11), max_size=4), taps=st.integers(2, 5))
def test_the_short_convolution_run_in_pieces_equals_it_run_whole(n, cuts, taps):
    """The layer's state (the last l_cache - 1 values of B*x) carries a
    sequence from one piece to the next exactly: what the cache's slots keep
    between steps."""
    rng = np.random.default_rng(n * 31 + taps)
    e = 6
    w = {"blk.0.shortconv.in_proj.weight": rng.standard_normal((3 * e, e)),
         "blk.0.shortconv.conv.weight": rng.standard_normal((e, taps)),
         "blk.0.shortconv.out_proj.weight": rng.standard_normal((e, e))}

    def mm(x, name):
        return x @ w[name].T

    h = rng.standard_normal((n, e))
    whole, final = shortconv_layer(h, w, "blk.0.", mm)
    # by its definition: y_t = C_t * sum_i kernel[:, i] * (B*x)_{t - (taps - 1) + i}, zeros before the start
    b, c, x = np.split(mm(h, "blk.0.shortconv.in_proj.weight"), 3, axis=1)
    bx = b * x
    for t in range(n):
        acc = sum(w["blk.0.shortconv.conv.weight"][:, i] * bx[t - taps + 1 + i]
                  for i in range(taps) if t - taps + 1 + i >= 0)
        np.testing.assert_allclose(whole[t], mm(c[t] * acc, "blk.0.shortconv.out_proj.weight"), rtol=1e-12,
                                   atol=1e-12)
    bounds = sorted({c_ for c_ in cuts if c_ < n}) + [n]
    state, pieces, start = None, [], 0
    for end in bounds:
        out, state = shortconv_layer(h[start:end], w, "blk.0.", mm, state)
        pieces.append(out)
        start = end
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, final, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cfg", [LFM2, LFM2MOE], ids=["lfm2", "lfm2moe"])
def test_logits_match_the_numpy_reference(tiny_model, cfg):
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, PROMPT)
    with elelem.LLM(path, kv_type="f32", n_threads=2, amx=False) as llm:
        whole = llm.eval(PROMPT, all_logits=True)
        llm.reset()
        steps = [llm.eval(PROMPT[:7])] + [llm.eval([t]) for t in PROMPT[7:]]
    tol = 2e-5 * np.abs(want).max()   # F32 weights and cache: float32 rounding only
    np.testing.assert_allclose(whole, want, rtol=0, atol=tol)
    np.testing.assert_allclose(np.stack(steps), want[6:], rtol=0, atol=tol)


@pytest.mark.parametrize("cfg", [LFM2, LFM2MOE], ids=["lfm2", "lfm2moe"])
def test_the_convolution_state_lives_in_the_one_cache(tiny_model, cfg):
    from elelem.gguf.reader import read_gguf
    from elelem.model.architectures import model_spec

    path, _ = tiny_model(cfg)
    spec = model_spec(read_gguf(path))
    n_conv = sum(spec.hparams["recurrent_layers"])
    assert spec.recurrent_state_bytes() == {"convolution": n_conv * (cfg.conv_l_cache - 1) * cfg.n_embd * 4}
    with elelem.LLM(path, n_threads=2, n_seq_max=3, kv_size=256, amx=False) as llm:
        cache = llm.engine.context.cache
        assert cache.hybrid and cache.state_bytes == n_conv * (cfg.conv_l_cache - 1) * cfg.n_embd * 4
        llm.engine.context.decode([1, 2, 3], [1, 1, 1])
        # the last l_cache - 1 values of B*x of each convolution layer, nothing else
        state = cache.recurrent_state(1).view(np.float32).reshape(n_conv, cfg.n_embd, cfg.conv_l_cache - 1)
        assert np.all(np.any(state != 0, axis=(1, 2))) and not np.any(cache.recurrent_state(0))


def test_info_shows_the_layer_pattern_and_the_state(tiny_model, capsys):
    from elelem.cli.info_cmd import describe
    from elelem.cli.parser import build_parser

    path, _ = tiny_model(LFM2)
    facts = describe(path)
    assert facts["layer_pattern"] == "RRARRA"
    assert facts["recurrent_kind"] == "short convolution"
    assert facts["recurrent_state_bytes"] == {"convolution": 4 * (3 - 1) * 64 * 4}
    from elelem.cli.info_cmd import main
    main(build_parser().parse_args(["info", str(path)]))
    out = capsys.readouterr().out
    assert "layer pattern    4 short convolution, 2 attention: RRARRA" in out
    assert "recurrent state  2.0 KiB a sequence (convolution 2.0 KiB)" in out


@pytest.mark.parametrize("cfg, message", [
    (LFM2.but(drop=("blk.1.shortconv.conv.weight",)), r"required tensor 'blk\.1\.shortconv\.conv\.weight' is missing"),
    (LFM2.but(drop=("blk.3.shortconv.in_proj.weight",)),
     r"required tensor 'blk\.3\.shortconv\.in_proj\.weight' is missing"),
    (LFM2.but(cut=(("blk.0.shortconv.conv.weight", 1, 2),)),
     r"tensor 'blk\.0\.shortconv\.conv\.weight' \(shortconv_conv\) has shape \[2, 64\], expected \[3, 64\]"),
    (LFM2.but(cut=(("blk.4.shortconv.in_proj.weight", 0, 128),)),
     r"tensor 'blk\.4\.shortconv\.in_proj\.weight' \(shortconv_in_proj\) has shape \[64, 128\], "
     r"expected \[64, 192\]"),
    # l_cache says 4, the convolution tensors are 3 wide
    (LFM2.but(conv_l_cache=4, cut=tuple((f"blk.{i}.shortconv.conv.weight", 1, 3) for i in (0, 1, 3, 4))),
     r"tensor 'blk\.0\.shortconv\.conv\.weight' \(shortconv_conv\) has shape \[3, 64\], expected \[4, 64\]"),
    (LFM2.but(conv_l_cache=1), r"lfm2\.shortconv\.l_cache = 1 must be in 2\.\.64"),
    # head_count_kv makes layer 1 an attention layer, whose tensors are a convolution's ...
    (LFM2.but(kv_pattern="CAACCA"), r"required tensor 'blk\.1\.attn_q\.weight' is missing"),
    # ... or layer 2 a convolution layer, whose tensors are attention's
    (LFM2.but(kv_pattern="CCCCCA"), r"required tensor 'blk\.2\.shortconv\.conv\.weight' is missing"),
    (LFM2.but(kv_pattern="CCCCCC"), r"lfm2\.attention\.head_count_kv = \[0, 0, 0, 0, 0, 0\] has no attention layer"),
    (LFM2MOE.but(drop=("blk.3.exp_probs_b.bias",)), r"required tensor 'blk\.3\.exp_probs_b\.bias' is missing"),
    (LFM2.but(extra_keys=(("{arch}.attention.sliding_window", 8),)), r"lfm2\.attention\.sliding_window"),
    (LFM2.but(extra_keys=(("{arch}.attention.causal", False),)), r"lfm2\.attention\.causal = False"),
], ids=["no-conv", "no-in-proj", "conv-width", "in-proj-width", "l-cache-vs-tensors", "l-cache-1",
        "pattern-attention", "pattern-conv", "pattern-no-attention", "moe-no-selection-bias", "sliding-window",
        "bidirectional"])
def test_a_broken_lfm2_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)


def test_lfm2s_colbert_projection_is_refused(tmp_path):
    from synthetic import write_model

    def add_projection(writer):   # LFM2-ColBERT's dense_2_out, as its converter writes it
        writer.add_tensor("dense_2_out.weight", np.zeros((32, LFM2.n_embd), np.float32))

    path = tmp_path / "colbert.gguf"
    write_model(path, LFM2, extra_metadata=add_projection)
    with pytest.raises(ModelShapeError, match=r"tensor 'dense_2_out\.weight': elelem does not run LFM2's ColBERT"):
        elelem.LLM(path)
