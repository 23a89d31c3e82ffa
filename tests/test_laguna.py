"""Laguna (laguna) on tiny synthetic models written as llama.cpp's converter
writes them (tests/support/synthetic_laguna.py): elelem against the NumPy
reference, the gate's two forms, batching, what ``elelem info`` shows, and
bad files.  The logits against llama.cpp live are tests/test_arch_llamacpp.py's
(its laguna_* configs, flash attention off and on)."""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.cli.info_cmd import describe
from elelem.errors import ModelShapeError
from elelem.gguf.reader import read_gguf
from elelem.model.architectures import model_spec
from batched_steps import assert_steps_match_solo
from synthetic_laguna import LagunaConfig, gated_attention, reference_logits, softplus

XS2 = LagunaConfig(seed=31)   # full, SWA, SWA, SWA, full, SWA; 4 and 6 heads; YaRN; a gate per head
M1 = LagunaConfig(n_layer=4, heads_swa=4, n_swa=0, per_element_gate=True, n_dense_lead=2, yarn=0.0,
                  n_rot=16, expert_scale=1.0, tied=True, seed=32)   # every layer full, a gate per element
TOKENS = [int(t) for t in np.random.default_rng(5).integers(1, 90, 14)]


# -- the NumPy reference: the gate ----------------------------------------------------

def test_a_gate_per_head_is_a_gate_per_element_repeated_over_the_head():
    rng = np.random.default_rng(0)
    out, gate = rng.standard_normal((5, 3, 4)), rng.standard_normal((5, 3))
    per_head = gated_attention(out, gate, per_element=False)
    np.testing.assert_array_equal(per_head, gated_attention(out, np.repeat(gate, 4, axis=1), per_element=True))
    np.testing.assert_allclose(per_head.reshape(5, 3, 4), out * np.log1p(np.exp(gate))[..., None], rtol=1e-14)
    assert softplus(np.array([800.0]))[0] == 800.0   # no overflow where exp(x) would


# -- elelem against the reference -----------------------------------------------------

@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
@pytest.mark.parametrize("cfg", [XS2, M1], ids=["xs2", "m1"])
def test_logits_follow_the_numpy_reference(tiny_model, cfg, flash_attn):
    # F32 weights and an F32 cache: float32 rounding only.
    path, w = tiny_model(cfg)
    want = reference_logits(w, cfg, TOKENS)
    with elelem.LLM(path, kv_type="f32", n_ctx=64, n_threads=2, flash_attn=flash_attn) as llm:
        got = np.asarray(llm.eval(TOKENS, all_logits=True), dtype=np.float64)
        # one token a step: the cached K/V read back, the window sliding past the first tokens
        llm.reset()
        llm.eval(TOKENS[:3])
        rows = [llm.eval([t]) for t in TOKENS[3:]]
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(rows[:-1], dtype=np.float64), want[3:-1], atol=5e-5, rtol=0)


def test_the_window_and_the_per_layer_rope_matter(tiny_model):
    """Without the window, or with the full layers' RoPE everywhere, the
    reference parts from the file's logits: the test above checks something."""
    path, w = tiny_model(XS2)
    with elelem.LLM(path, kv_type="f32", n_ctx=64, n_threads=2, flash_attn=False) as llm:
        got = np.asarray(llm.eval(TOKENS, all_logits=True), dtype=np.float64)
    for other in (XS2.but(n_swa=64), XS2.but(rope_base_swa=XS2.rope_base), XS2.but(n_rot_swa=XS2.n_rot)):
        assert np.abs(reference_logits(w, other, TOKENS) - got).max() > 1e-3, other


# -- batching: every sequence gets its solo logits ------------------------------------

@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
@pytest.mark.parametrize("cfg", [XS2, M1], ids=["xs2", "m1"])
def test_sequences_in_one_step_get_their_solo_logits(tiny_model, cfg, flash_attn):
    # Q8_0 matmuls (M.1's tied output too): tinyBLAS gives a column the same numbers in a product of
    # any width, where an F32 weight's one column in a step of several sequences is left to it.
    cfg = cfg.but(wtype="q8_0", embd_type="q8_0", n_embd=128)
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, n_threads=2, n_seq_max=4, flash_attn=flash_attn, amx=False, kv_size=512) as llm:
        ctx = llm.engine.context
        rng = np.random.default_rng(9)
        assert_steps_match_solo(ctx, cfg.n_vocab, rng, (11, 1, 17))


# -- reading: the layer pattern, the defaults, what info shows -------------------------

def test_the_layers_are_read_as_llamacpp_reads_them(tiny_model):
    h = model_spec(read_gguf(tiny_model(XS2)[0])).hparams
    assert h["layer_n_head"] == [4, 6, 6, 6, 4, 6] and h["n_head"] == 6
    assert h["swa_layers"] == [False, True, True, True, False, True]   # full at il % 4 == 0
    assert h["layer_n_rot"] == [8, 16, 16, 16, 8, 16]
    assert (h["rope_base_swa"], h["rope_scale_swa"], h["rope_scale"]) == (10000.0, 1.0, 0.25)
    assert (h["expert_gating"], h["expert_norm"], h["expert_scale"]) == (1, True, 2.5)
    assert (h["n_expert_shared"], h["n_ff_shexp"], h["n_layer_dense_lead"]) == (1, 64, 1)
    assert h["layer_attn_gate_width"] == [1] * 6
    m1 = model_spec(read_gguf(tiny_model(M1)[0])).hparams
    assert "layer_n_head" not in m1 and not m1.get("swa_layers") and m1["attn_gate_width"] == 16
    # No expert_shared_feed_forward_length: the routed experts' width times the shared count (1)
    path, _ = tiny_model(XS2.but(drop_keys=("expert_shared_feed_forward_length",), n_ff_shexp=32))
    assert model_spec(read_gguf(path)).hparams["n_ff_shexp"] == 32


def test_info_shows_the_layer_pattern_and_the_gate(tiny_model):
    facts = describe(tiny_model(XS2)[0])
    assert facts["supported"], facts.get("unsupported_reason")
    assert facts["shape"] == ("4/6 heads x 16 (2 KV); softplus output gate per head; sliding window 5 in all "
                              "layers but 0, 4 (full: RoPE over 8 dims; window: RoPE over 16 dims, base 10000); "
                              "1 dense, then sigmoid routing with a selection bias and a shared expert of n_ff 64")
    assert describe(tiny_model(M1)[0])["shape"] == (
        "4 heads x 16 (2 KV); softplus output gate per element; every layer full attention; 2 dense, then "
        "sigmoid routing with a selection bias and a shared expert of n_ff 64")


# -- bad files: a clear error naming the key or tensor, before any compute ------------

@pytest.mark.parametrize("cfg, message", [
    (XS2.but(drop=("blk.2.attn_gate.weight",)), r"required tensor 'blk\.2\.attn_gate\.weight' is missing"),
    (XS2.but(cut=(("blk.1.attn_gate.weight", 0, 5),)),
     r"tensor 'blk\.1\.attn_gate\.weight' has 5 outputs; expected 6 \(a gate per head\) or 96 \(per element\)"),
    (XS2.but(drop=("blk.3.exp_probs_b.bias",)), r"required tensor 'blk\.3\.exp_probs_b\.bias' is missing"),
    (XS2.but(drop=("blk.1.ffn_up_shexp.weight",)), r"required tensor 'blk\.1\.ffn_up_shexp\.weight' is missing"),
    (XS2.but(drop=("blk.0.attn_q_norm.weight",)), r"required tensor 'blk\.0\.attn_q_norm\.weight' is missing"),
    (XS2.but(drop=("blk.0.ffn_up.weight",)), r"required tensor 'blk\.0\.ffn_up\.weight' is missing"),
    # layer 1 has 6 heads: its Q is 96 wide, not the full layers' 64
    (XS2.but(cut=(("blk.1.attn_q.weight", 0, 64),)),
     r"tensor 'blk\.1\.attn_q\.weight' \(wq\) has shape \[64, 64\], expected \[64, 96\]"),
    (XS2.but(cut=(("blk.4.attn_output.weight", 1, 48),)),
     r"tensor 'blk\.4\.attn_output\.weight' \(wo\) has shape \[48, 64\], expected \[64, 64\]"),
    (XS2.but(drop_keys=("leading_dense_block_count",)), r"missing hyperparameter laguna\.leading_dense_block_count"),
    (XS2.but(drop_keys=("expert_feed_forward_length",)),
     r"missing hyperparameter laguna\.expert_feed_forward_length"),
    (XS2.but(drop_keys=("attention.head_count_kv",)), r"laguna\.attention\.head_count_kv is missing"),
    (XS2.but(extra_keys=(("{arch}.attention.head_count", (4, 6)),)),
     r"laguna\.attention\.head_count must be a number or an integer per layer \(6 layers\)"),
    (XS2.but(heads_swa=5), r"head_count_kv = 2 does not divide layer 1's attention\.head_count = 5"),
    (XS2.but(extra_keys=(("{arch}.attention.value_length", 8),)), r"value_length = 8 must equal"),
    (XS2.but(n_rot_swa=7), r"laguna\.rope\.dimension_count_swa = 7 must be even and at most 16"),
    (XS2.but(drop_keys=("expert_shared_feed_forward_length",), extra_keys=(("{arch}.expert_shared_count", 0),)),
     r"the shared expert must have a width"),
], ids=["no-gate", "gate-width", "no-selection-bias", "no-shared-up", "no-q-norm", "no-dense-up", "q-width-per-layer",
        "out-width-per-layer", "no-dense-lead", "no-expert-width", "no-kv-heads", "heads-too-few", "kv-not-dividing",
        "value-length", "swa-rot-odd", "no-shared-width"])
def test_a_broken_laguna_file_is_refused_naming_the_key_or_tensor(tiny_model, cfg, message):
    path, _ = tiny_model(cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(path)
