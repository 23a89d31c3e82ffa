"""The native forward pass against the NumPy reference, on tiny random models."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import elelem
from synthetic import TinyConfig, reference_logits

# Tolerances, as a fraction of the largest reference logit:
# - F32 weights and F32 cache: only float32 rounding, ~1e-6;
# - an F16 cache (or F16 weights, whose matmuls round activations to F16):
#   values carry ~2^-11 relative error, ~1e-3 after a few layers;
# - Q8_0 weights: ggml quantizes activations to 8 bits per block of 32 for the
#   dot products, ~1% error.
TOLERANCE = {("f32", "f32"): 2e-5, ("f32", "f16"): 2e-3, ("f16", "f16"): 2e-3, ("f16", "f32"): 2e-3,
             ("q8_0", "f16"): 3e-2, ("q8_0", "f32"): 3e-2}

PROMPT = np.random.default_rng(1).integers(0, 96, 24)


def assert_close(got, want, wtype, kv_type):
    tol = TOLERANCE[(wtype, kv_type)] * np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= tol, f"max |diff| {err:.3g} > {tol:.3g}"
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("wtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_reference_at_every_position(tiny_model, wtype, kv_type, tied):
    cfg = TinyConfig(wtype=wtype, tied=tied)
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, PROMPT)
    with elelem.LLM(path, kv_type=kv_type) as llm:
        got = llm.eval(PROMPT, all_logits=True)
    assert got.shape == (len(PROMPT), cfg.n_vocab) and got.dtype == np.float32
    assert_close(got, want, wtype, kv_type)


def test_last_position_logits_equal_the_all_positions_row(tiny_model):
    path, _ = tiny_model(TinyConfig())
    with elelem.LLM(path, kv_type="f32") as llm:
        every = llm.eval(PROMPT, all_logits=True)
        llm.reset()
        last = llm.eval(PROMPT)
    np.testing.assert_allclose(last, every[-1], rtol=1e-5, atol=1e-5)


def test_flash_attention_path_matches_reference(tiny_model):
    cfg = TinyConfig()
    path, weights = tiny_model(cfg)
    with elelem.LLM(path, kv_type="f16", flash_attn=True) as llm:
        got = llm.eval(PROMPT, all_logits=True)
    assert_close(got, reference_logits(weights, cfg, PROMPT), "f32", "f16")


def test_incremental_decoding_equals_one_batch(tiny_model):
    cfg = TinyConfig()
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, PROMPT)
    with elelem.LLM(path, kv_type="f32") as llm:
        rows = [llm.eval(PROMPT[:8])]
        rows += [llm.eval([t]) for t in PROMPT[8:]]
        assert llm.n_past == len(PROMPT)
    np.testing.assert_allclose(np.stack(rows), want[7:], rtol=0, atol=2e-5 * np.abs(want).max())


def test_rewind_then_reevaluate_gives_the_same_logits(tiny_model):
    cfg = TinyConfig()
    path, weights = tiny_model(cfg)
    other = (PROMPT[10:] + 1) % cfg.n_vocab
    with elelem.LLM(path, kv_type="f32") as llm:
        llm.eval(PROMPT[:10])
        llm.eval(other)           # a different continuation...
        llm.rewind(10)            # ...forgotten
        got = llm.eval(PROMPT[10:], all_logits=True)
    want = reference_logits(weights, cfg, PROMPT)[10:]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_long_prompt_is_evaluated_in_n_batch_chunks(tiny_model):
    cfg = TinyConfig()
    path, weights = tiny_model(cfg)
    with elelem.LLM(path, kv_type="f32", n_batch=5) as llm:
        got = llm.eval(PROMPT, all_logits=True)
        assert llm.n_evaluated == len(PROMPT)
    assert_close(got, reference_logits(weights, cfg, PROMPT), "f32", "f32")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_positions_survive_any_split_and_rewind(tiny_model, data):
    """Evaluate a prefix, a detour, rewind anywhere, then finish: each logit row
    must be the reference row for its absolute position."""
    cfg = TinyConfig()
    path, weights = tiny_model(cfg)
    tokens = np.random.default_rng(7).integers(0, cfg.n_vocab, 40)
    want = reference_logits(weights, cfg, tokens)
    n_ctx = 48
    first = data.draw(st.integers(1, 39), label="first")
    detour = data.draw(st.integers(1, n_ctx - first), label="detour")
    back = data.draw(st.integers(0, first - 1), label="rewind to")
    with elelem.LLM(path, kv_type="f32", n_ctx=n_ctx) as llm:
        llm.eval(tokens[:first])
        llm.eval((tokens[:detour] + 3) % cfg.n_vocab)
        llm.rewind(back)
        got = llm.eval(tokens[back:], all_logits=True)
    np.testing.assert_allclose(got, want[back:], rtol=0, atol=2e-5 * np.abs(want).max())


@settings(max_examples=200, deadline=None)
@given(n_past=st.integers(0, 300), n_tokens=st.integers(1, 64), pad=st.integers(0, 300),
       n_swa=st.integers(0, 40))
def test_causal_mask_properties(n_past, n_tokens, pad, n_swa):
    n_kv = n_past + n_tokens + pad
    mask = elelem._core.causal_mask(n_past, n_tokens, n_kv, n_swa).astype(np.float32)
    assert mask.shape == (n_tokens, n_kv)
    assert set(np.unique(mask)) <= {0.0, -np.inf}
    visible = mask == 0
    for i in range(n_tokens):
        pos = n_past + i
        seen = np.flatnonzero(visible[i])
        # a query always sees itself, never the future, and a contiguous run of the past
        assert seen[-1] == pos
        assert (seen == np.arange(seen[0], pos + 1)).all()
        width = pos + 1 if n_swa == 0 else min(n_swa, pos + 1)
        assert len(seen) == width
    # a later query never sees less of the past than it should (rows nest under plain causality)
    if n_swa == 0 and n_tokens > 1:
        assert (visible[1:] >= visible[:-1]).all()


def test_sequences_share_one_cache_and_keep_separate_positions(tiny_model):
    """Two sequences in one cache, stepped in interleaved batches, each get the
    logits of the prompt alone (cells of one sequence are masked for the other)."""
    cfg = TinyConfig()
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, PROMPT)
    with elelem.LLM(path, kv_type="f32") as llm:
        context = elelem._core.new_context(llm._model, 64, 512, 1, "f32", False, 2)
        context.decode(PROMPT[:5], 0)
        # sequence 1's first 12 tokens and sequence 0's next 7, in one step
        out = context.decode(list(PROMPT[:12]) + list(PROMPT[5:12]), [1] * 12 + [0] * 7)
        assert out.shape == (2, cfg.n_vocab)
        np.testing.assert_allclose(out[0], out[1], rtol=0, atol=1e-5 * np.abs(want).max())
        np.testing.assert_allclose(out[1], want[11], rtol=0, atol=2e-5 * np.abs(want).max())
        assert context.cache.seq_tokens(0) == context.cache.seq_tokens(1) == list(PROMPT[:12])
        context.close()


# One case per architecture: adding an architecture adds a line here.
ARCH_CASES = {
    "qwen2": TinyConfig(arch="qwen2"),
    "llama": TinyConfig(arch="llama"),
    "llama3-rope-freqs": TinyConfig(arch="llama", rope_freqs=True),
    "qwen3": TinyConfig(arch="qwen3", head_dim=32),
    # 7 layers: layers 0-4 and 6 slide over a 5-token window, layer 5 is global.
    "gemma3": TinyConfig(arch="gemma3", head_dim=32, n_layer=7, n_swa=5, tied=True),
    # Gemma 3 270M's global base (1e6) with no rope.freq_base_swa key: the sliding layers must keep
    # llama.cpp's default 10000, which the case above (global base 10000 too) cannot tell apart.
    "gemma3-global-base-1e6": TinyConfig(arch="gemma3", head_dim=32, n_layer=7, n_swa=5, tied=True, rope_base=1e6),
    # Gemma 4: sliding layers (head 16, 2 KV heads) and every third layer global (head 32, 1 KV
    # head, proportional RoPE); layers 3-5 reuse the K/V of layers 1 and 2; per-layer embeddings.
    "gemma4": TinyConfig(arch="gemma4", head_dim=32, head_dim_swa=16, n_layer=6, n_swa=5, n_head_kv_global=1,
                         n_kv_shared=3, n_embd_per_layer=16, double_ffn=True, softcap=30.0),
    # ... with experts beside each dense FFN, V = K in global layers, layer output scales.
    "gemma4-moe": TinyConfig(arch="gemma4", head_dim=32, head_dim_swa=16, n_layer=4, n_swa=5, swa_every=2,
                             experts=True, k_eq_v=True, layer_scale=True, softcap=30.0, seed=3),
    "gemma4-moe-gate-up-apart": TinyConfig(arch="gemma4", head_dim=32, n_layer=3, n_swa=5, experts=True,
                                           fused_gate_up=False, seed=4),
    # Seed-OSS: heads wider than n_embd / n_head, Q/K/V biases, the FFN's norm named post_attention_norm.
    "seed_oss": TinyConfig(arch="seed_oss", head_dim=32, n_layer=3),
    # SmolLM3: layer 3 attends without RoPE (every fourth), the others with normal RoPE; tied output.
    "smollm3": TinyConfig(arch="smollm3", n_layer=5, tied=True),
    # MiniMax-M2: sigmoid-routed experts with a selection bias, Q/K norms over all heads, RoPE over
    # half of each head.
    "minimax-m2": TinyConfig(arch="minimax-m2", head_dim=32, n_rot=16, n_layer=2, n_ff=32),
}
# ggml's GELU reads a float16 table, so GeGLU models carry ~1e-4 relative error.
ARCH_TOLERANCE = {"gemma3": 2e-3, "gemma3-global-base-1e6": 2e-3, "gemma4": 2e-3, "gemma4-moe": 2e-3,
                  "gemma4-moe-gate-up-apart": 2e-3}


@pytest.mark.parametrize("name", ARCH_CASES)
def test_architecture_matches_reference(tiny_model, name):
    cfg = ARCH_CASES[name]
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, PROMPT)
    with elelem.LLM(path, kv_type="f32") as llm:
        assert llm.spec.arch.name == cfg.arch
        got = llm.eval(PROMPT, all_logits=True)
    tol = ARCH_TOLERANCE.get(name, 2e-5) * np.abs(want).max()
    assert np.abs(got - want).max() <= tol
    assert (got.argmax(1) == want.argmax(1)).all()


@pytest.mark.parametrize("name", ARCH_CASES)
def test_architecture_cached_decoding_equals_uncached(tiny_model, name):
    cfg = ARCH_CASES[name]
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, kv_type="f32") as llm:
        whole = llm.eval(PROMPT, all_logits=True)
        llm.reset()
        steps = np.stack([llm.eval([t]) for t in PROMPT])
    np.testing.assert_allclose(steps, whole, rtol=0, atol=1e-4 * np.abs(whole).max())
