"""The 2025-26 decoders (qwen3moe, gpt-oss, glm4moe, mistral3) against the NumPy
reference (tests/support/synthetic.py), which is written from the definitions in
float64: expert routing (softmax, sigmoid with a selection bias, softmax over
the chosen logits), SwiGLU and gpt-oss's clamped swiglu_oai experts, shared
experts, attention sinks, sliding windows, YaRN RoPE, the attention
temperature; and MXFP4 experts, dequantized by tests/support/mxfp4.py from the format.
(Against llama.cpp, bit for bit, these models are tests/test_arch_llamacpp.py's.)

Tolerance: 2e-5 of the largest logit, test_core_forward's for F32 weights and
an F32 cache.  elelem computes in float32 and the reference in float64, so
what differs is float32 rounding: measured at most 1.4e-6 (gpt-oss), 3.7e-6
with gpt-oss's activations clamped (larger values), 7e-7 for MXFP4 experts.
Every feature left out of the reference misses by far more (measured: the
attention temperature 0.1, YaRN's ramp 0.6, sinks 0.8 of the largest logit),
so the bound tells them apart 5000x over.

That holds only while float32 and float64 choose the same experts: each test
first checks that no token's k-th and (k+1)-th experts come within
ROUTING_MARGIN of a tie (measured: >= 9.8e-4 in every layer).

MXFP4 experts: ggml multiplies them with Q8_0-quantized activations
(ggml_vec_dot_mxfp4_q8_0), so the reference reproduces that
(tests/support/ggml_numerics.py).  An activation lying within a hair of a rounding
tie could round the other way in elelem's float32 and move every later
layer (and, through the router, the choice of experts: measured up to 0.19
of the largest logit for a single such flip); so the config is one where no
quantized activation lies within TIE_MARGIN steps of a tie, which the test
checks.  Measured 6.5e-7; leaving the activation quantization out misses by
2.1e-2, and reading the nibbles in the OCP spec's interleaved order by 1.3.
"""
from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

import elelem
import ggml_numerics as numerics
import mxfp4
import synthetic
from synthetic import (StoredWeights, TinyConfig, _moe_ffn, moe_route, reference_logits, write_model)

PROMPT = np.random.default_rng(3).integers(0, 96, 48)   # 48 > 5 x mistral3's yarn_orig_ctx of 8
TOLERANCE = 2e-5
ROUTING_MARGIN = 1e-4   # router logits carry ~1e-6 of float32 rounding
# elelem's F32 activations agree with the reference to ~3e-7 relative, ~4e-5 of a
# Q8_0 step at 127 steps per block: a 5x margin.
TIE_MARGIN = 2e-4

CASES = {
    "qwen3moe": TinyConfig(arch="qwen3moe", head_dim=32),
    # Layers 0 and 2 slide over a 5-token window, 1 and 3 attend to everything; YaRN x8.
    "gpt-oss": TinyConfig(arch="gpt-oss", head_dim=32, n_layer=4, n_swa=5, yarn=8.0, yarn_orig_ctx=64),
    # Layer 0 dense, layers 1-2 experts plus a shared expert, layer 3 a NextN block (never run);
    # RoPE on 16 of 32 dims.
    "glm4moe": TinyConfig(arch="glm4moe", head_dim=32, n_rot=16, n_layer=3),
    # YaRN x16 from 8 positions, the temperature's floor every 8: positions 0-47 see 6 temperatures.
    # (With head_dim 16 YaRN's ramp is a step here, and log_mul 1 makes its magnitude 1...)
    "mistral3": TinyConfig(arch="mistral3", yarn=16.0, yarn_orig_ctx=8, yarn_log_mul=1.0, attn_temp=0.1),
    # ... so also: a ramp through 1, 0.5, 0 over the first pairs, and a magnitude of
    # mscale(4, 1) / mscale(4, 0.5) = 1.065.
    "mistral3-yarn-ramp": TinyConfig(arch="mistral3", head_dim=32, yarn=4.0, yarn_orig_ctx=16, yarn_log_mul=0.5,
                                     attn_temp=0.3),
}
MOE_LAYERS = {"qwen3moe": ["blk.0.", "blk.1."], "gpt-oss": ["blk.0.", "blk.1.", "blk.2.", "blk.3."],
              "glm4moe": ["blk.1.", "blk.2."], "mistral3": [], "mistral3-yarn-ramp": []}

MXFP4_EXPERTS = (("ffn_gate_exps.weight", "mxfp4"), ("ffn_up_exps.weight", "mxfp4"),
                 ("ffn_down_exps.weight", "mxfp4"))
# Seed 17 and 8 tokens: the nearest quantized activation is 4.8e-4 steps from a tie.
GPT_OSS_MXFP4 = TinyConfig(arch="gpt-oss", head_dim=32, n_layer=4, n_swa=5, yarn=8.0, yarn_orig_ctx=64,
                           wtypes=MXFP4_EXPERTS, seed=17)
MXFP4_PROMPT = PROMPT[:8]


def elelem_logits(path, tokens) -> np.ndarray:
    with elelem.LLM(path, kv_type="f32", n_threads=1) as llm:
        return llm.eval(tokens, all_logits=True)


def assert_close(got, want, tolerance=TOLERANCE) -> float:
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    assert err <= tolerance, f"max |diff| {err:.3g} of the largest logit > {tolerance:.3g}"
    assert (got.argmax(1) == want.argmax(1)).all()
    return err


def reference_with_routing(weights, cfg, tokens, **kw):
    """The reference logits, and its routing, checked to be clear of ties."""
    trace = []
    want = reference_logits(weights, cfg, tokens, trace=trace, **kw)
    for layer in trace:
        assert layer["margin"] > ROUTING_MARGIN, f"{layer['layer']}: experts within {layer['margin']:.3g} of a tie"
    return want, trace


# -- each architecture against the reference ------------------------------------------

@pytest.mark.parametrize("name", CASES)
def test_architecture_matches_reference(tiny_model, name):
    cfg = CASES[name]
    path, weights = tiny_model(cfg)
    want, trace = reference_with_routing(weights, cfg, PROMPT)
    assert [layer["layer"] for layer in trace] == MOE_LAYERS[name]
    with elelem.LLM(path, kv_type="f32", n_threads=1) as llm:
        assert llm.spec.arch.name == cfg.arch and llm.spec.hparams["n_layer"] == cfg.n_layer  # NextN not counted
        got = llm.eval(PROMPT, all_logits=True)
    assert_close(got, want)


def _scale_in_file(path, names, factor):
    """Multiply tensors of the (F32) file at ``path`` in place."""
    reader = gguf.GGUFReader(path, "r+")
    for t in reader.tensors:
        if t.name in names:
            t.data[...] *= np.float32(factor)
    reader.data.flush()
    del reader


def test_gpt_oss_clamped_activation_matches_reference(tmp_path, monkeypatch):
    """gpt-oss's experts with gate and up weights x8, so that a fifth of the gates
    pass the limit of 7 and a third of the linear halves leave [-7, 7]."""
    cfg = CASES["gpt-oss"]
    path = tmp_path / "clamped.gguf"
    weights = write_model(path, cfg)
    names = [n for n in weights if n.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight"))]
    _scale_in_file(path, names, 8.0)
    for n in names:
        weights[n] = weights[n] * np.float32(8.0)
    clamped = []
    activation = synthetic._swiglu_oai

    def spy(gate, up):
        clamped.append(((gate > synthetic.SWIGLU_OAI_LIMIT).mean(), (np.abs(up) > synthetic.SWIGLU_OAI_LIMIT).mean()))
        return activation(gate, up)

    monkeypatch.setattr(synthetic, "_swiglu_oai", spy)
    want, _ = reference_with_routing(weights, cfg, PROMPT)
    gate_clamped, up_clamped = np.mean(clamped, axis=0)
    assert gate_clamped > 0.1 and up_clamped > 0.2
    assert_close(elelem_logits(path, PROMPT), want)


# -- routing ---------------------------------------------------------------------

def test_routing_picks_the_experts_the_router_prefers():
    """Logits built so that each token's two best experts are known."""
    logits = np.full((3, 8), -2.0)
    favourites = [(5, 2), (0, 7), (3, 4)]
    for t, (a, b) in enumerate(favourites):
        logits[t, a], logits[t, b] = 3.0, 1.0
    for arch in ("qwen3moe", "gpt-oss", "glm4moe"):
        cfg = TinyConfig(arch=arch)
        ids, weights = moe_route(logits, cfg)
        assert [tuple(row) for row in ids] == favourites, arch
        if arch == "glm4moe":   # sigmoid probabilities, renormalised, times expert_weights_scale 1.5
            s3, s1 = 1 / (1 + np.exp(-3.0)), 1 / (1 + np.exp(-1.0))
            want = 1.5 * np.array([s3, s1]) / (s3 + s1)
        else:   # softmax renormalised over the chosen (qwen3moe) = softmax of the chosen logits (gpt-oss)
            want = np.exp([3.0, 1.0]) / np.exp([3.0, 1.0]).sum()
        np.testing.assert_allclose(weights, np.tile(want, (3, 1)), rtol=1e-12)


def test_selection_bias_moves_the_choice_but_not_the_weights():
    """glm4moe's exp_probs_b: the bias picks expert 6 over 2 for the choice; the
    weight stays expert 6's unbiased probability."""
    cfg = TinyConfig(arch="glm4moe")
    logits = np.array([[0.0, -1.0, 2.0, -1.0, 3.0, -1.0, 1.0, -1.0]])
    assert sorted(moe_route(logits, cfg)[0][0]) == [2, 4]
    bias = np.zeros(8)
    bias[6] = 0.5   # sigmoid(1) + 0.5 > sigmoid(2)
    ids, weights = moe_route(logits, cfg, bias)
    assert list(ids[0]) == [6, 4] or list(ids[0]) == [4, 6]
    s = {e: 1 / (1 + np.exp(-logits[0, e])) for e in (4, 6)}
    np.testing.assert_allclose(sorted(weights[0]), sorted(1.5 * np.array([s[4], s[6]]) / (s[4] + s[6])), rtol=1e-12)


def test_gpt_oss_layer_routes_by_the_router_bias_and_sums_biased_experts():
    """One gpt-oss expert layer by hand: a zero router whose bias prefers
    experts 5 then 2, and experts whose outputs are easy to write down."""
    cfg = TinyConfig(arch="gpt-oss", n_expert=8, n_expert_used=2)
    rng = np.random.default_rng(0)
    n_embd, n_ff = 4, 3
    p = "blk.0."
    w = {p + "ffn_gate_inp.weight": np.zeros((8, n_embd)),
         p + "ffn_gate_inp.bias": np.array([0, 0, 1.0, 0, 0, 2.0, 0, 0]),
         p + "ffn_gate_exps.weight": rng.standard_normal((8, n_ff, n_embd)),
         p + "ffn_up_exps.weight": rng.standard_normal((8, n_ff, n_embd)),
         p + "ffn_down_exps.weight": rng.standard_normal((8, n_embd, n_ff)),
         p + "ffn_gate_exps.bias": rng.standard_normal((8, n_ff)),
         p + "ffn_up_exps.bias": rng.standard_normal((8, n_ff)),
         p + "ffn_down_exps.bias": rng.standard_normal((8, n_embd))}
    h = rng.standard_normal((2, n_embd))
    trace = []
    out = _moe_ffn(h, w, p, cfg, lambda x, name, e=None: x @ (w[name] if e is None else w[name][e]).T, trace)
    assert (trace[0]["ids"] == [5, 2]).all()
    weights = np.exp([2.0, 1.0]) / np.exp([2.0, 1.0]).sum()   # softmax over the two chosen logits
    want = np.zeros_like(h)
    for e, weight in zip((5, 2), weights):
        g = h @ w[p + "ffn_gate_exps.weight"][e].T + w[p + "ffn_gate_exps.bias"][e]
        u = h @ w[p + "ffn_up_exps.weight"][e].T + w[p + "ffn_up_exps.bias"][e]
        act = np.minimum(g, 7) / (1 + np.exp(-1.702 * np.minimum(g, 7))) * (np.clip(u, -7, 7) + 1)
        want += weight * (act @ w[p + "ffn_down_exps.weight"][e].T + w[p + "ffn_down_exps.bias"][e])
    np.testing.assert_allclose(out, want, rtol=1e-12)


def _zero_expert(src, dst, layer: str, expert: int, weights: dict) -> dict:
    """A copy of the model at ``src`` with one expert's three matrices zeroed, and
    the weights it now has."""
    shutil.copy(src, dst)
    names = [layer + f"ffn_{m}_exps.weight" for m in ("gate", "up", "down")]
    reader = gguf.GGUFReader(dst, "r+")
    for t in reader.tensors:
        if t.name in names:
            t.data[expert] = 0
    reader.data.flush()
    del reader
    zeroed = dict(weights)
    for n in names:
        zeroed[n] = weights[n].copy()
        zeroed[n][expert] = 0
    return zeroed


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss", "glm4moe"])
def test_elelem_runs_only_the_chosen_experts(tmp_path, name):
    """Zeroing an expert the reference never routes a token to leaves elelem's
    logits bit for bit; zeroing one it does changes them, to the reference's."""
    cfg = CASES[name]
    tokens = PROMPT[:4]     # 8 choices per layer among 8 experts: some expert goes unused
    path = tmp_path / "model.gguf"
    weights = write_model(path, cfg)
    _, trace = reference_with_routing(weights, cfg, tokens)
    base = elelem_logits(path, tokens)
    layer = trace[0]
    unused = sorted(set(range(cfg.n_expert)) - set(layer["ids"].ravel()))
    assert unused, "every expert is chosen"
    _zero_expert(path, tmp_path / "unused.gguf", layer["layer"], unused[0], weights)
    np.testing.assert_array_equal(elelem_logits(tmp_path / "unused.gguf", tokens), base)

    chosen = int(layer["ids"][0, 0])    # the first token's best
    zeroed = _zero_expert(path, tmp_path / "chosen.gguf", layer["layer"], chosen, weights)
    got = elelem_logits(tmp_path / "chosen.gguf", tokens)
    want, _ = reference_with_routing(zeroed, cfg, tokens)
    assert np.abs(got - base).max() > 100 * TOLERANCE * np.abs(base).max()
    assert_close(got, want)


# -- Gemma 4 ---------------------------------------------------------------------------

# Sliding and global layers alternating (head 16 and 32), experts beside every dense FFN,
# global layers whose V is K, layer output scales, soft-capped logits.  Its experts and FFNs
# are GeGLU, whose GELU ggml reads from a float16 table: the reference reads the same table
# (ggml_numerics; its other parts, for F32 weights, are plain float64).  An input within float32
# rounding of a float16 rounding tie still rounds either way, moving that GELU by a float16 step
# (~1e-3): measured 5.4e-5 of the largest logit over the 48 tokens, hence 2e-4 here.  (Leaving
# out the experts' output scales misses by ~1e-1.)
GEMMA4_TOLERANCE = 2e-4
GEMMA4_MOE = TinyConfig(arch="gemma4", head_dim=32, head_dim_swa=16, n_layer=4, n_swa=5, swa_every=2,
                        experts=True, k_eq_v=True, layer_scale=True, softcap=30.0, seed=3)


@pytest.mark.parametrize("fused", [True, False], ids=["gate-up-stacked", "gate-up-apart"])
def test_gemma4_experts_match_reference(tiny_model, fused):
    """The router on its own input (RMS-normed, scaled by 1/sqrt(n_embd) and its
    scale), softmax over the experts, the chosen renormalised, each expert's
    output times its scale, added to the dense FFN's."""
    cfg = GEMMA4_MOE.but(fused_gate_up=fused)
    path, weights = tiny_model(cfg)
    want, trace = reference_with_routing(weights, cfg, PROMPT, ggml_numerics=True)
    assert [layer["layer"] for layer in trace] == [f"blk.{i}." for i in range(cfg.n_layer)]
    assert_close(elelem_logits(path, PROMPT), want, GEMMA4_TOLERANCE)


# -- MXFP4 ---------------------------------------------------------------------------

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_mxfp4_block_layout():
    """Byte j's low nibble is element j, its high nibble element j + 16; the
    scale byte e gives 2^(e - 127)."""
    codes = np.arange(16, dtype=np.uint8)
    block = np.concatenate([[128], codes | ((15 - codes) << 4)]).astype(np.uint8)   # scale 2
    want = 2.0 * np.array(E2M1 + E2M1[::-1])
    np.testing.assert_array_equal(mxfp4.dequantize(block), want)
    np.testing.assert_array_equal(mxfp4.e8m0(np.array([0, 1, 126, 127, 254])),
                                  [2.0 ** -127, 2.0 ** -126, 0.5, 1.0, 2.0 ** 127])
    assert np.isnan(mxfp4.e8m0(np.array([255]))).all()


def test_mxfp4_dequantizer_matches_gguf_on_random_blocks():
    """Every scale byte but 255 (NaN in the format; no quantizer writes it) and
    random codes: the float64 values, rounded to float32, are gguf's exactly
    (all of them are float32 numbers; the largest scales overflow to inf in both)."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (255, 4 * mxfp4.BLOCK_BYTES), dtype=np.uint8)
    raw[:, ::mxfp4.BLOCK_BYTES] = np.arange(255, dtype=np.uint8)[:, None]   # each row one scale byte
    ours = mxfp4.dequantize(raw)
    with np.errstate(over="ignore"):
        theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4)
        np.testing.assert_array_equal(ours.astype(np.float32), theirs)
    assert np.isinf(theirs).any() and (ours[:200] == theirs[:200]).all()


def test_mxfp4_experts_match_reference(tiny_model, monkeypatch):
    """gpt-oss with MXFP4 experts: the reference on tests/support/mxfp4.py's dequantization
    of the bytes written, with ggml's Q8_0 activations."""
    cfg = GPT_OSS_MXFP4
    path, stored = tiny_model(cfg)
    weights = StoredWeights()
    weights.update(stored)
    weights.types, weights.raw = stored.types, stored.raw
    mx = [n for n, t in stored.types.items() if t == "mxfp4"]
    assert len(mx) == 3 * cfg.n_layer
    for n in mx:
        ours = mxfp4.dequantize(stored.raw[n]).reshape(stored[n].shape)
        np.testing.assert_array_equal(ours.astype(np.float32), stored[n])   # gguf's dequantization
        weights[n] = ours

    distances = []
    matmul = numerics.matmul

    def spy(x, w, wtype, raw=None):
        if wtype == "mxfp4":   # how far each activation, in Q8_0 steps of its block, is from a tie
            blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
            steps = (blocks * (np.float32(127) / np.abs(blocks).max(axis=2, keepdims=True))).astype(np.float64)
            distances.append(np.abs(np.abs(steps - np.floor(steps)) - 0.5).min())
        return matmul(x, w, wtype, raw)

    monkeypatch.setattr(numerics, "matmul", spy)
    want, _ = reference_with_routing(weights, cfg, MXFP4_PROMPT, ggml_numerics=True)
    monkeypatch.setattr(numerics, "matmul", matmul)
    assert len(distances) >= 3 * cfg.n_layer and min(distances) > TIE_MARGIN   # gate, up, down of each expert used

    got = elelem_logits(path, MXFP4_PROMPT)
    assert_close(got, want)
    # The Q8_0 activations are what makes the bound this tight.
    plain = reference_logits(weights, cfg, MXFP4_PROMPT)
    assert np.abs(got - plain).max() > 100 * TOLERANCE * np.abs(plain).max()
