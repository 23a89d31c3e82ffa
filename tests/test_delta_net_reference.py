"""One Gated DeltaNet layer's delta rule in NumPy (tests/support/delta_net.py), two ways
that must agree: the recurrence token by token, and llama.cpp's chunked form
(build_delta_net_chunking: chunks of 64, a triangular solve within each, the
state passed between them); then Qwen3.5 models (qwen35, qwen35moe) in elelem
against the NumPy reference (tests/support/synthetic.py), which runs that delta rule
beside the gated, interleaved-multi-section-RoPE attention layers.

Recurrent vs chunked: both float64, so they differ by rounding only; measured
<= 7e-15 of the largest output (lengths 1 to 200, one to four chunks, padded
and not), so 1e-10 is a bound far from anything a wrong mask, decay or state
hand-over would give.

elelem vs the reference: TOLERANCE 2e-5 of the largest logit, test_core_forward's
(and test_moe_reference's) for F32 weights and an F32 cache; elelem computes in
float32 (ggml_gated_delta_net is a float32 recurrence, token by token, for a
prompt and for decode alike), the reference in float64.  Measured, 70 tokens
(over one 64-token chunk), seed 11: qwen35 1.9e-6 all at once, 3.9e-6 token by
token; qwen35moe 2.1e-6 and 1.8e-6; sections leaving pairs on the fourth (zero)
position stream 1.8e-6.  What a wrong reference misses by, measured on the
qwen35 case: value heads grouped by key head instead of tiled 1.09, no decay
1.08, q not scaled by 1/sqrt(d) 0.19, the convolution kernel reversed 1.56,
silu(z) left out 1.01; qwen35moe's shared expert ungated 0.73; NEOX RoPE in place of IMROPE where the
sections leave pairs to the zero stream 2.3e-3 (sections (2, 2, 1, 3)) and
1.6e-2 (sections (1, 1, 1, 1), the case below).  (With sections covering every
pair, as Qwen3.5's own [11, 11, 10, 0] over 64 rotated dims do, IMROPE on text
positions is NEOX RoPE exactly: test_imrope_on_text_positions_is_neox_where_the_sections_cover.)
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import delta_net
import elelem
import synthetic
from synthetic import TinyConfig, prompt_then_decode, reference_logits

# -- the delta rule: recurrent and chunked ----------------------------------------------

AGREEMENT = 1e-10


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("H_k, H_v", [(2, 2), (2, 4), (1, 3)])
@pytest.mark.parametrize("initial", [False, True])
def test_recurrent_and_chunked_agree(T, H_k, H_v, initial):
    rng = np.random.default_rng(T * 100 + H_k * 10 + H_v)
    d = 16
    q, k, v, g, beta = delta_net.random_inputs(rng, T, H_k, H_v, d)
    state = rng.standard_normal((H_v, d, d)) if initial else None
    out_r, s_r = delta_net.recurrent(q, k, v, g, beta, state)
    out_c, s_c = delta_net.chunked(q, k, v, g, beta, state)
    assert np.abs(out_r - out_c).max() <= AGREEMENT * np.abs(out_r).max()
    assert np.abs(s_r - s_c).max() <= AGREEMENT * np.abs(s_r).max()


def test_a_sequence_split_anywhere_continues_from_its_state():
    """The final state carries the sequence on: 150 tokens at once equal 70, then
    80 from the state the 70 left, in either form (a step boundary of elelem's
    engine lands anywhere, chunks of the chunked form restart there)."""
    rng = np.random.default_rng(7)
    inputs = delta_net.random_inputs(rng, 150, 2, 4, 16)
    whole, s_whole = delta_net.recurrent(*inputs)
    for form in (delta_net.recurrent, delta_net.chunked):
        first, s_first = form(*(x[:70] for x in inputs))
        rest, s_rest = form(*(x[70:] for x in inputs), state=s_first)
        np.testing.assert_allclose(np.concatenate([first, rest]), whole, rtol=0, atol=1e-12)
        np.testing.assert_allclose(s_rest, s_whole, rtol=0, atol=1e-12)


def test_the_delta_rule_is_an_associative_memory():
    """From its definition: with no decay and beta 1, writing values under
    orthonormal keys and then reading (beta 0: no write) with a key as the query
    returns its value over sqrt(d); a decay g per step on the reads scales it by exp(g)
    per step since the last write."""
    d, rng = 8, np.random.default_rng(3)
    keys = np.linalg.qr(rng.standard_normal((d, d)))[0]   # rows: orthonormal keys
    values = rng.standard_normal((d, d))
    k = np.concatenate([keys, keys])[:, None]                 # (2d, 1 head, d)
    v = np.concatenate([values, rng.standard_normal((d, d))])[:, None]
    beta = np.concatenate([np.ones(d), np.zeros(d)])[:, None]
    for decay in (0.0, -0.3):
        g = np.concatenate([np.zeros(d), np.full(d, decay)])[:, None]
        for form in (delta_net.recurrent, delta_net.chunked):
            out, _ = form(k, k, v, g, beta)
            want = values * np.exp(decay * np.arange(1, d + 1))[:, None] / math.sqrt(d)
            np.testing.assert_allclose(out[d:, 0], want, rtol=0, atol=1e-12)


def test_the_l2_norm_is_llama_cpps_scaled_rms_norm():
    x = np.random.default_rng(1).standard_normal((5, 3, 16)) * 0.01
    eps, n = 1e-6, x.shape[-1]
    rms_norm = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps / n)   # ggml_rms_norm(x, eps / n)
    np.testing.assert_allclose(delta_net.l2_normalize(x, eps), rms_norm / math.sqrt(n), rtol=1e-14)


def test_tiled_value_heads_are_the_grouped_ones_reordered():
    """Hugging Face's value head j reads key head j // r; llama.cpp's converter
    reorders the value heads (conversion/qwen.py, _reorder_v_heads) so that head t
    reads key head t % H_k, ggml's broadcast.  The reorder, written as the converter
    does it (a reshape to (H_k, r, d) and a swap), is grouped_to_tiled, and the
    delta rule on reordered heads is the grouped one's output reordered."""
    H_k, r, d, T = 2, 3, 4, 20
    rng = np.random.default_rng(5)
    rows = np.arange(H_k * r * d).reshape(H_k, r, d).transpose(1, 0, 2).reshape(-1)
    perm = delta_net.grouped_to_tiled(H_k, r)
    np.testing.assert_array_equal(rows, (perm[:, None] * d + np.arange(d)).reshape(-1))
    q, k, v, g, beta = delta_net.random_inputs(rng, T, H_k, H_k * r, d)
    grouped = np.arange(H_k * r) // r   # the key head of each value head, Hugging Face's order
    want, _ = delta_net.recurrent(q[:, grouped], k[:, grouped], v, g, beta)   # one key head per value head
    got, _ = delta_net.recurrent(q, k, v[:, perm], g[:, perm], beta[:, perm])
    np.testing.assert_allclose(got, want[:, perm], rtol=0, atol=1e-12)


@pytest.mark.parametrize("sections, n_rot, head_dim", [((11, 11, 10, 0), 64, 256),   # Qwen3.5's own
                                                       ((3, 3, 2, 0), 16, 32), ((3, 3, 2, 0), 32, 32)])
def test_imrope_on_text_positions_is_neox_where_the_sections_cover(sections, n_rot, head_dim):
    assert (synthetic.imrope_streams(sections, n_rot) != 3).all()
    x = np.random.default_rng(2).standard_normal((40, 2, head_dim))
    got = synthetic._rope_imrope(x, synthetic.text_positions4(40), 1e7, n_rot, sections)
    want = synthetic._rope(x, np.arange(40.0), 1e7, True, n_rot=n_rot)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_imrope_leaves_the_fourth_streams_pairs_unrotated_on_text():
    sections, n_rot = (1, 1, 1, 1), 16
    streams = synthetic.imrope_streams(sections, n_rot)
    np.testing.assert_array_equal(streams, [0, 1, 2, 3] * 2)
    x = np.random.default_rng(2).standard_normal((10, 1, 32))
    got = synthetic._rope_imrope(x, synthetic.text_positions4(10), 1e4, n_rot, sections)
    neox = synthetic._rope(x, np.arange(10.0), 1e4, True, n_rot=n_rot)
    e = np.flatnonzero(streams == 3)
    for dims in (e, e + n_rot // 2):
        np.testing.assert_array_equal(got[..., dims], x[..., dims])
    others = np.setdiff1d(np.arange(32), np.concatenate([e, e + n_rot // 2]))
    np.testing.assert_allclose(got[..., others], neox[..., others], rtol=0, atol=1e-12)


# -- elelem against the reference ------------------------------------------------------

TOLERANCE = 2e-5
ROUTING_MARGIN = 1e-4   # router logits carry ~1e-6 of float32 rounding; measured >= 8.9e-3
PROMPT = np.random.default_rng(5).integers(0, 96, 70)   # over one 64-token chunk

# 4 layers: 0-2 Gated DeltaNet (2 key heads, 4 value heads of 16: tiled broadcast), 3 attention.
CASES = {
    "qwen35": TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, seed=11),
    "qwen35moe": TinyConfig(arch="qwen35moe", head_dim=32, n_rot=16, n_layer=4, seed=11),
    # Sections leaving every 4th rotation pair to the fourth stream (position 0 for text).
    "qwen35-imrope-e": TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, seed=11,
                                  rope_sections=(1, 1, 1, 1)),
    # Qwen3-Next: value heads grouped by key head (Q and K repeated per group), beta and alpha
    # through one projection, NEOX RoPE over a quarter of each head, an MTP layer (never run);
    # and Q, K, V and z through one projection as older files have them.
    "qwen3next": TinyConfig(arch="qwen3next", head_dim=32, n_rot=8, n_layer=4, seed=11),
    "qwen3next-ssm-in": TinyConfig(arch="qwen3next", head_dim=32, n_rot=8, n_layer=4, seed=11, ssm_in=True),
}


def assert_close(got, want) -> float:
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= TOLERANCE, f"max |diff| {err:.3g} of the largest logit > {TOLERANCE:.3g}"
    assert (got.argmax(1) == want.argmax(1)).all()
    return err


@pytest.mark.parametrize("name", CASES)
def test_elelem_matches_the_reference(tiny_model, name):
    cfg = CASES[name]
    path, weights = tiny_model(cfg)
    trace = []
    want = reference_logits(weights, cfg, PROMPT, trace=trace)
    chunked = reference_logits(weights, cfg, PROMPT, delta_form="chunked")
    assert np.abs(chunked - want).max() <= AGREEMENT * np.abs(want).max()
    assert len(trace) == (cfg.n_layer if cfg.moe else 0)
    for layer in trace:
        assert layer["margin"] > ROUTING_MARGIN, f"{layer['layer']}: experts within {layer['margin']:.3g} of a tie"
    with elelem.LLM(path, kv_type="f32", n_threads=1) as llm:
        assert llm.spec.arch.name == cfg.arch
        at_once = llm.eval(PROMPT, all_logits=True)
        llm.reset()
        one_by_one = np.stack([llm.eval([t]) for t in PROMPT])
        llm.reset()
        prompt_then_steps = prompt_then_decode(llm, PROMPT, 65)
    assert_close(at_once, want)
    assert_close(one_by_one, want)
    assert_close(prompt_then_steps, want)
