"""Q8_0 copies of Q5_0 weights (elelem/_native/widen.pxi): the claim is that
they change the speed of steps of two or more tokens and nothing else, so
every logit must be bit for bit the one the Q5_0 weights give.

Fixtures: tiny random models written by tests/support/synthetic.py (Q5_0 quantized
by the `gguf` package), and the packaged Qwen2.5-Coder-0.5B and Gemma-3-270M Q4_K_M
files, whose 896- and 640-wide rows make most of their weights Q5_0.
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem import cpu
from synthetic import TinyConfig

# Steps of every width the kernels treat apart: one token (vec_dot), then
# tinyBLAS' tiles of 4 rows by 2 (AVX2) or 4 (AVX-512) columns and their remainders.
STEP_WIDTHS = (1, 2, 3, 4, 5, 8, 13)
# Steps of generated tokens (Context.decode(decode_kernels=True)): up to 8
# columns run ggml's one-column kernels, vec_dot of the Q8_0 copy against
# vec_dot of the Q5_0 weight.
DECODE_KERNEL_WIDTHS = (2, 3, 5, 8)
Q5_0 = TinyConfig(n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_layer=2, wtype="q5_0")


def _widening_possible() -> bool:
    return cpu.widen_status(elelem._core.cpu_backend_info())[0]


def _step_logits(llm, seed: int) -> list[np.ndarray]:
    """Logits of every row of a prompt, then of steps of each STEP_WIDTHS width."""
    ctx = llm._engine.context
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, llm.n_vocab, 29).tolist()
    out = [ctx.decode(prompt, [0] * len(prompt), outputs=True)]
    for n in STEP_WIDTHS:
        out.append(ctx.decode(rng.integers(0, llm.n_vocab, n).tolist(), [0] * n, outputs=True))
    for n in DECODE_KERNEL_WIDTHS:
        out.append(ctx.decode(rng.integers(0, llm.n_vocab, n).tolist(), [0] * n, outputs=True,
                              decode_kernels=True))
    return out


def _assert_bitwise_equal(path, expected_widened: int, **kw):
    with elelem.LLM(path, widen=False, n_ctx=256, n_threads=2, **kw) as narrow:
        assert narrow.widened == (0, 0)
        want = _step_logits(narrow, seed=3)
    with elelem.LLM(path, widen=True, n_ctx=256, n_threads=2, **kw) as wide:
        assert wide.widened[1] == 0   # chosen at load, made by the first prompt
        got = _step_logits(wide, seed=3)
        n, nbytes = wide.widened
    if not _widening_possible():
        assert n == 0
        pytest.skip("this CPU module has no AVX2 tinyBLAS: nothing is widened")
    assert n == expected_widened and nbytes > 0
    widths = ("prompt",) + STEP_WIDTHS + tuple(f"{n} (decode kernels)" for n in DECODE_KERNEL_WIDTHS)
    assert len(want) == len(got) == len(widths)
    for width, (a, b) in zip(widths, zip(want, got)):
        assert a.shape == b.shape
        assert np.array_equal(a, b), f"step of {width}: max |diff| {np.abs(a - b).max()}"


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_widened_weights_give_the_same_logits_bit_for_bit(tiny_model, tied):
    cfg = Q5_0.but(tied=tied, embd_type="q5_0", wtypes=() if tied else (("output.weight", "q5_0"),))
    path, _ = tiny_model(cfg)
    # Seven matmul weights a layer, and the output projection (the tied one a copy of token_embd).
    _assert_bitwise_equal(path, 7 * cfg.n_layer + 1, kv_type="f32")


def test_only_q5_0_weights_are_widened(tiny_model):
    cfg = Q5_0.but(wtypes=(("ffn_down.weight", "q8_0"), ("attn_q.weight", "q4_1")))
    path, _ = tiny_model(cfg)
    _assert_bitwise_equal(path, 5 * cfg.n_layer + 1)  # and the output


def test_qwen_q4_k_m_is_bitwise_unchanged(qwen_path):
    # 132 Q5_0 weights: 5.5 of the 7 in each of 24 layers (its output is Q8_0).
    _assert_bitwise_equal(qwen_path, 132)


def test_gemma3_q4_k_m_is_bitwise_unchanged(gemma_path):
    # 640 wide: 81 of its matmul weights are Q5_0; sliding-window layers too.
    _assert_bitwise_equal(gemma_path, 81)


def test_the_copies_are_made_by_the_first_step_of_several_tokens(tiny_model):
    path, _ = tiny_model(Q5_0)
    if not _widening_possible():
        pytest.skip("this CPU module has no AVX2 tinyBLAS: nothing is widened")
    with elelem.LLM(path, widen=True, n_ctx=64, n_threads=2) as llm:
        ctx = llm.engine.context
        n = llm.widened[0]
        assert n == 7 * Q5_0.n_layer + 1 and llm.widened[1] == 0
        ctx.decode([5], [0])                                  # one token: the Q5_0 weights
        ctx.decode([6, 7, 8], [0] * 3, decode_kernels=True)   # generated tokens: the Q5_0 weights too
        assert llm.widened == (n, 0)
        ctx.decode([9, 10], [0] * 2)                          # a prompt: tinyBLAS, which takes the copies
        assert llm.widened[0] == n and llm.widened[1] > 0


def test_by_default_the_copies_wait_until_prompts_have_paid_for_them(tiny_model, monkeypatch):
    path, _ = tiny_model(Q5_0)
    if not _widening_possible():
        pytest.skip("this CPU module has no AVX2 tinyBLAS: nothing is widened")
    monkeypatch.setattr(cpu, "WIDEN_AFTER_PROMPT_TOKENS", 40)
    with elelem.LLM(path, n_ctx=128, n_threads=2) as llm:
        ctx = llm.engine.context
        n = llm.widened[0]
        assert n > 0
        ctx.decode(list(range(1, 31)), [0] * 30)       # 30 prompt tokens: not yet
        assert llm.widened == (n, 0)
        ctx.decode(list(range(1, 11)), [1] * 10)       # 40: now
        assert llm.widened[1] > 0


def test_the_switches(tiny_model, monkeypatch):
    path, _ = tiny_model(Q5_0)
    with elelem.LLM(path, repack=False, n_ctx=64) as llm:
        assert llm.widened == (0, 0)  # weights as stored
    monkeypatch.setattr(cpu, "WIDEN_AUTO_LIMIT", 0)
    with elelem.LLM(path, n_ctx=64) as llm:
        assert llm.widened == (0, 0)  # past the automatic limit
    with elelem.LLM(path, widen=True, n_ctx=64) as llm:
        assert llm.widened[0] == (7 * Q5_0.n_layer + 1 if _widening_possible() else 0)
