"""Quantized KV cache: q8_0 and q4_0 keys and values beside f16 and f32.

Tolerances, measured on this machine (see README): against an f16 cache, a
q8_0 cache moves SmolLM2's logits by at most ~7% of their largest magnitude
over a 1024-token code prompt, and the top-1 token agrees at ~95% of the
positions -- as llama.cpp's own q8_0 cache does on the same prompt (6%,
94%); q4_0 moves them by ~37%, with ~77% agreement.  The synthetic model
here has no near-ties, so its bounds are tighter.
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.errors import InvalidArgumentError
from synthetic import TinyConfig

# head_dim 32: q8_0 and q4_0 store blocks of 32 values per row.
CONFIG = TinyConfig(head_dim=32)
PROMPT = list(np.random.default_rng(3).integers(0, 96, 40))


def logits(path, **options):
    with elelem.LLM(path, n_ctx=64, n_threads=1, **options) as llm:
        return llm.eval(PROMPT, all_logits=True), llm.engine.context


@pytest.mark.parametrize("type_k,type_v,bound", [
    ("q8_0", "f16", 0.02), ("q8_0", "q8_0", 0.02), ("q4_0", "q4_0", 0.15), ("f32", "f32", 0.005)])
def test_quantized_caches_stay_close_to_f16(tiny_model, type_k, type_v, bound):
    path, _ = tiny_model(CONFIG)
    want, _ = logits(path, flash_attn=True)
    got, context = logits(path, type_k=type_k, type_v=type_v, flash_attn=True)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < bound, err
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9


def test_a_quantized_v_turns_on_flash_attention(tiny_model, caplog):
    path, _ = tiny_model(CONFIG)
    # flash_attn=False asked for: LLM's default, "auto", has it on already on the CPU.
    with caplog.at_level("INFO", logger="elelem"), elelem.LLM(path, n_ctx=64, type_v="q8_0", flash_attn=False) as llm:
        assert llm.engine.context.flash_attn
        assert llm.engine.context.cache.type_v == "q8_0" and llm.engine.context.cache.type_k == "f16"
    assert any("needs flash attention" in r.getMessage() for r in caplog.records)


def test_quantized_k_works_without_flash_attention(tiny_model):
    path, _ = tiny_model(CONFIG)
    want, _ = logits(path, flash_attn=False)
    got, context = logits(path, type_k="q8_0", flash_attn=False)
    assert not context.flash_attn
    assert np.abs(got - want).max() / np.abs(want).max() < 0.02


def test_flash_attention_auto_is_on_on_the_cpu(tiny_model):
    """llama.cpp's default, "auto": on where the devices that hold K/V run it, as the CPU does."""
    path, _ = tiny_model(CONFIG)
    for type_k in ("f16", "q8_0"):
        _, context = logits(path, type_k=type_k)
        assert context.flash_attn


def test_memory_per_cell_follows_the_type(tiny_model):
    path, _ = tiny_model(CONFIG)
    sizes = {}
    for kv in ("f32", "f16", "q8_0", "q4_0"):
        with elelem.LLM(path, n_ctx=64, kv_type=kv, flash_attn=True) as llm:
            sizes[kv] = llm.engine.context.cache.bytes_per_cell
    width = 2 * CONFIG.n_layer * CONFIG.n_head_kv * 32  # K and V values per cell
    assert sizes == {"f32": 4 * width, "f16": 2 * width, "q8_0": width * 34 // 32, "q4_0": width * 18 // 32}


@pytest.mark.parametrize("options", [{"kv_type": "q5_1"}, {"type_v": "int8"}, {"type_k": 8}])
def test_unknown_types_are_refused(tiny_model, options):
    path, _ = tiny_model(CONFIG)
    with pytest.raises(InvalidArgumentError, match="must be one of"):
        elelem.LLM(path, n_ctx=64, **options)


def test_heads_not_a_multiple_of_the_block_are_refused(tiny_model):
    path, _ = tiny_model(TinyConfig())  # head_dim 16
    with pytest.raises(InvalidArgumentError, match="blocks of 32"):
        elelem.LLM(path, n_ctx=64, kv_type="q8_0")


@pytest.mark.real_model
def test_q8_0_cache_agrees_with_f16_on_smollm2(smollm_path):
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 12
    out = {}
    for kv in ("f16", "q8_0"):
        with elelem.LLM(smollm_path, n_ctx=1024, n_threads=2, kv_type=kv, flash_attn=True) as llm:
            ids = llm.tokenize(text)[:512]
            out[kv] = llm.eval(ids, all_logits=True)
    agree = (out["f16"].argmax(1) == out["q8_0"].argmax(1)).mean()
    assert agree >= 0.9, agree
