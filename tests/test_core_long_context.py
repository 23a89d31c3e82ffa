"""Long positions and flash attention against the NumPy reference.

elelem attends over n_kv = n_past + n_tokens rounded up to 256 (masking the
tail) and rebuilds its graph when that changes, so positions past 256 and
past 512 run different graphs; Gemma 3's sliding layers must drop what
leaves the window.  Flash attention (``flash_attn=True``) takes an F16 mask
and, in ggml 0.25.3's CPU backend (ops.cpp), one of three kernels:
one_chunk (a prompt under 64 tokens, or decode with n_kv < 512), tiled (a
prompt of 64 tokens or more), or split-KV (decode with n_kv >= 512, chunked
over the threads and reduced).  Each case below names the kernels it reaches.

Tolerances, as a fraction of the largest reference logit:
- F32 weights and cache: float32 rounding only, measured max 7.1e-7 over
  these cases (530 positions); bound 5e-6.
- Gemma 3: ggml reads GELU from an F16 table; the reference reproduces it
  (ggml_numerics), leaving measured max 2.7e-5; bound 2e-4.
- An F16 cache: K, V and Q are rounded to F16, and flash attention
  accumulates V in F16 too: measured max 7.0e-4 (flash) and 3.3e-4 (not)
  against the F32 reference, 7.9e-4 between the two; bound 2e-3.
The window check also shows that a window one wider misses the bound.
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from synthetic import TinyConfig, prompt_then_decode, reference_logits

F32_TOLERANCE = 5e-6
GEMMA3_TOLERANCE = 2e-4
F16_CACHE_TOLERANCE = 2e-3
TOKENS = np.random.default_rng(3).integers(0, 96, 530)
GEMMA3 = TinyConfig(arch="gemma3", head_dim=32, n_layer=7, n_swa=40, tied=True)  # layer 5 global


def _tolerance(cfg: TinyConfig) -> float:
    return GEMMA3_TOLERANCE if cfg.arch == "gemma3" else F32_TOLERANCE


def _reference(weights, cfg, tokens):
    return reference_logits(weights, cfg, tokens, ggml_numerics=True)


def _max_error(got, want) -> float:
    return np.abs(got - want).max() / np.abs(want).max()


# name: (config, tokens, prompt length, n_ctx, n_batch)
POSITION_CASES = {
    # a 250-token prompt in chunks of 100, then decode across 256 (n_kv 256 -> 512)
    "qwen2": (TinyConfig(), 270, 250, 600, 100),
    "llama": (TinyConfig(arch="llama"), 270, 250, 600, 100),
    # sliding layers over 40 positions, at positions up to 6.7 windows
    "gemma3-window": (GEMMA3, 270, 250, 600, 100),
    # to the last slot of a context that is not a multiple of 256 (n_kv 256 -> 300)
    "qwen2-full-context": (TinyConfig(), 300, 250, 300, 512),
}


@pytest.mark.parametrize("name", POSITION_CASES)
def test_positions_past_the_256_padding_and_the_window(tiny_model, name):
    cfg, n, n_prompt, n_ctx, n_batch = POSITION_CASES[name]
    path, weights = tiny_model(cfg)
    want = _reference(weights, cfg, TOKENS[:n])
    with elelem.LLM(path, kv_type="f32", n_ctx=n_ctx, n_batch=n_batch, n_threads=1) as llm:
        got = prompt_then_decode(llm, TOKENS[:n], n_prompt)
    assert _max_error(got, want) <= _tolerance(cfg)
    if cfg.n_swa:
        wider = _reference(weights, cfg.but(n_swa=cfg.n_swa + 1), TOKENS[:n])
        assert _max_error(got, wider) > 10 * _tolerance(cfg)


# name: (config, tokens, prompt length, n_ctx, n_threads) and the kernels reached.  One
# thread where the kernel does not depend on it: on models this small ggml's thread
# barriers cost more than the work.
FLASH_CASES = {
    "decode": (TinyConfig(), 30, 20, 64, 1),                  # one_chunk
    "long-prompt": (TinyConfig(), 104, 100, 128, 1),          # tiled, then one_chunk
    "decode-past-256": (TinyConfig(), 304, 300, 600, 2),      # tiled, then split-KV in 2 chunks
    "decode-across-512": (TinyConfig(), 517, 505, 768, 1),    # split-KV at n_kv 512 and 768
    "gemma3-window": (GEMMA3, 310, 300, 600, 1),              # a 40-wide window at every kernel
    "gemma3-window-5": (GEMMA3.but(n_swa=5), 110, 100, 600, 1),  # a window far inside one tile
}


@pytest.mark.parametrize("name", FLASH_CASES)
def test_flash_attention_matches_reference(tiny_model, name):
    cfg, n, n_prompt, n_ctx, n_threads = FLASH_CASES[name]
    path, weights = tiny_model(cfg)
    want = _reference(weights, cfg, TOKENS[:n])
    with elelem.LLM(path, kv_type="f32", flash_attn=True, n_ctx=n_ctx, n_threads=n_threads) as llm:
        got = prompt_then_decode(llm, TOKENS[:n], n_prompt)
    assert _max_error(got, want) <= _tolerance(cfg)


@pytest.mark.parametrize("name", ["decode", "decode-past-256", "gemma3-window"])
def test_flash_attention_with_an_f16_cache_agrees_with_the_default_path(tiny_model, name):
    cfg, n, n_prompt, n_ctx, _ = FLASH_CASES[name]
    path, weights = tiny_model(cfg)
    want = _reference(weights, cfg, TOKENS[:n])
    runs = {}
    for flash in (True, False):
        with elelem.LLM(path, kv_type="f16", flash_attn=flash, n_ctx=n_ctx, n_threads=1) as llm:
            runs[flash] = prompt_then_decode(llm, TOKENS[:n], n_prompt)
    assert _max_error(runs[True], want) <= F16_CACHE_TOLERANCE
    assert _max_error(runs[False], want) <= F16_CACHE_TOLERANCE
    assert _max_error(runs[True], runs[False]) <= F16_CACHE_TOLERANCE
