"""Every weight type the three packaged models use (Q4_K, Q5_0, Q6_K, Q4_1, Q8_0;
Q4_0 too, which the CPU backend repacks) against the NumPy reference, with
ggml's activation quantization reproduced so the bound can be tight.

Fixtures: tiny random models written by tests/support/synthetic.py; Q4_0, Q4_1, Q5_0
and Q8_0 weights are quantized with the `gguf` package's quantizers, Q4_K and
Q6_K with tests/support/kquants.py (gguf 0.19 has none); the reference always uses
gguf's dequantization of the bytes written.

Why only the output projection is quantized in the tight test: ggml rounds
each quantized activation to a step of its block (tests/support/ggml_numerics.py), and
elelem's float32 activations differ from the float64 reference in the last
bits, so an activation lying within ~1e-4 step of a rounding tie can round the
other way.  Behind a quantized layer such a flip moves everything after it
(measured: up to 1.2e-2 of the largest logit with every matmul of a 2-layer
model quantized, as much as leaving the activation quantization out).  With
the layers in F32, the only quantized activations are the output projection's
input, and a flip there moves that row's logits by at most one step times |w|:
the test allows exactly that, for activations within TIE_MARGIN of a tie, and
nothing else.

The kernels each case runs on AVX2 (ggml 0.25.3): the 13-token prompt goes
through llamafile's tinyBLAS (Q4_0 unrepacked, Q5_0, Q8_0), ggml's vec_dot
loop (Q4_1, Q6_K, Q4_K unrepacked) or the repacked GEMM (Q4_0, Q4_K: 12 rows
by gemm, the last by gemv); single-token decode goes through vec_dot or the
repacked gemv.  All quantize the activations the same way.
"""
from __future__ import annotations


import numpy as np
import pytest

import elelem
import ggml_numerics as numerics
from synthetic import TinyConfig, output_weight_name, reference_hidden, reference_logits

PROMPT = np.random.default_rng(1).integers(0, 96, 13)
# K-quant rows are 256-value super-blocks: 512 gives the output two per row.
BASE = TinyConfig(n_embd=512, n_head=4, n_head_kv=2, n_ff=256, n_layer=1)
# An activation within this many quantization steps of a rounding tie may round
# either way.  elelem's F32 layers agree with the reference to ~3e-7 relative
# (the logits below), i.e. ~4e-5 step at 127 steps per block: 25x margin.
TIE_MARGIN = 1e-3
# Beyond that allowance, as a fraction of the largest logit.  Measured max over
# all cases, batch and decode: 2.7e-7 (Q4_K, untied, repacked); F32 rounding in
# the layers and in the kernels' sums.  Leaving the activation quantization out
# of the reference misses by >= 8.3e-4, so this bound tells the two apart 400x over.
TOLERANCE = 2e-6
WTYPES = ["q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k"]
REPACKED_ON_AVX2 = {"q4_0", "q4_k"}  # ggml_repack_get_optimal_repack_type, without AVX-512


def _cpu_has_avx2() -> bool:
    """The loaded CPU module is an AVX2 one without AVX-512 or AMX (whose repacking choices differ)."""
    info = elelem._core.cpu_backend_info()
    compiled = {name for name, value in info["features"] if value == "1"}
    return ("AVX2" in compiled and "AVX512" not in compiled and "AMX" not in info["extra_buffer_types"])


def _cases():
    for wtype in WTYPES:
        for tied in (False, True):
            for repack in ((True, False) if wtype in REPACKED_ON_AVX2 else (True,)):
                yield pytest.param(wtype, tied, repack, id=f"{wtype}-{'tied' if tied else 'untied'}"
                                                          f"{'' if repack else '-norepack'}")


@pytest.mark.parametrize("wtype,tied,repack", list(_cases()))
def test_quantized_output_projection_matches_ggml_arithmetic(tiny_model, wtype, tied, repack):
    n_repacked = _check_output_projection(tiny_model, BASE, wtype, tied, repack)
    if not repack:
        assert n_repacked == 0
    elif _cpu_has_avx2():
        assert n_repacked == (1 if wtype in REPACKED_ON_AVX2 else 0)


@pytest.mark.parametrize("wtype", sorted(REPACKED_ON_AVX2))
def test_weights_the_repacker_cannot_take_run_unrepacked(tiny_model, wtype):
    # The repacked kernels need a multiple of 8 output rows; 100 is not.
    assert _check_output_projection(tiny_model, BASE.but(n_vocab=100), wtype, False, True) == 0


def _check_output_projection(tiny_model, base: TinyConfig, wtype: str, tied: bool, repack: bool) -> int:
    """Batch and decode logits against the reference; returns the repacked weight count."""
    # token_embd has the type too: get_rows from it, and (tied) the output reads it.
    cfg = base.but(embd_type=wtype, tied=tied, wtypes=() if tied else (("output.weight", wtype),))
    path, weights = tiny_model(cfg)
    tokens = PROMPT % cfg.n_vocab
    x = reference_hidden(weights, cfg, tokens)
    name = output_weight_name(weights)
    w = weights[name].astype(np.float64)
    want = numerics.matmul(x, w, wtype, weights.raw.get(name))
    allowance = numerics.rounding_flip_allowance(x, w, numerics.VEC_DOT_TYPE[wtype], TIE_MARGIN)
    bound = TOLERANCE * np.abs(want).max()
    # One thread: on models this small ggml's thread barriers cost more than the work.
    with elelem.LLM(path, kv_type="f32", repack=repack, n_threads=1) as llm:
        n_repacked = llm._model.n_repacked
        batch = llm.eval(tokens, all_logits=True)
        llm.reset()
        steps = np.stack([llm.eval([t]) for t in tokens])
    for got in (batch, steps):
        excess = (np.abs(got - want) - allowance).max()
        assert excess <= bound, f"{excess / np.abs(want).max():.3g} of the largest logit beyond the allowance"
    # The bound is tight enough to see ggml's activation quantization at all.
    assert (np.abs(batch - x @ w.T) - allowance).max() > 50 * bound
    return n_repacked


def test_quantized_weights_round_trip_through_the_writer(tiny_model):
    """The K-quant writer is ours: its blocks must decode (with gguf) to within
    the format's own rounding of the float weights."""
    from synthetic import make_weights
    cfg = BASE.but(wtype="q4_k", wtypes=(("ffn_down.weight", "q6_k"),))
    _, weights = tiny_model(cfg)
    floats = make_weights(cfg)
    # Relative RMS errors of round-to-nearest at 4 and 6 bits: ~0.08 and ~0.02.
    for name, limit in (("blk.0.attn_q.weight", 0.1), ("blk.0.ffn_down.weight", 0.03)):
        err = np.sqrt(np.mean((weights[name] - floats[name]) ** 2)) / floats[name].std()
        assert 0 < err < limit, (name, err)


# The tensor types of the packaged Q4_K_M files (Qwen2.5-Coder, Gemma 3): Q5_0
# for most matmuls, Q8_0 for V and the output, Q6_K for some ffn_down, Q4_K.
MIXED = BASE.but(wtype="q5_0", embd_type="q5_0",
                 wtypes=(("attn_v.weight", "q8_0"), ("output.weight", "q8_0"),
                         ("ffn_down.weight", "q6_k"), ("attn_output.weight", "q4_k")))
# Every matmul quantized: rounding flips (see the module docstring) moved the
# logits by up to 9.4e-3 of the largest, measured over 4 seeds x 6 types in this
# shape (1e-7 when no activation lands near a tie: 9e-8 for this model here);
# a kernel or layout bug moves them by O(1).
MIXED_TOLERANCE = 3e-2


def test_mixed_weight_types_like_the_packaged_models(tiny_model):
    path, weights = tiny_model(MIXED)
    want = reference_logits(weights, MIXED, PROMPT, ggml_numerics=True)
    with elelem.LLM(path, kv_type="f32", n_threads=1) as llm:
        got = llm.eval(PROMPT, all_logits=True)
    assert np.abs(got - want).max() <= MIXED_TOLERANCE * np.abs(want).max()
