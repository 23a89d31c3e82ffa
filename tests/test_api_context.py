"""Context limits are checked before any compute; max_tokens=None runs to the end of the window."""
from __future__ import annotations

import math

import numpy as np

import pytest

import elelem
from elelem.errors import ContextLimitError

pytestmark = pytest.mark.real_model

N_CTX = 48
PROMPT = "A list of animals: cat, dog, horse, cow, sheep, goat, pig,"


@pytest.fixture(scope="module")
def llm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=N_CTX, n_threads=1) as llm:
        yield llm


def test_prompt_plus_max_tokens_over_n_ctx_fails_before_compute(llm):
    n_prompt = len(llm.tokenize(PROMPT, special=True))
    too_many = N_CTX - n_prompt + 1
    before = llm.n_evaluated
    for call in (lambda: llm.generate(PROMPT, max_tokens=too_many),
                 lambda: llm.stream(PROMPT, max_tokens=too_many),
                 lambda: llm.create_completion(PROMPT, max_tokens=too_many, stream=True),
                 lambda: llm.chat([{"role": "user", "content": PROMPT * 3}], max_tokens=1)):
        with pytest.raises(ContextLimitError) as info:
            call()
        assert f"n_ctx={N_CTX}" in str(info.value)
    with pytest.raises(ContextLimitError, match=rf"{n_prompt} tokens and max_tokens is {too_many}"):
        llm.generate(PROMPT, max_tokens=too_many)
    assert llm.n_evaluated == before  # nothing was computed
    assert llm.generate(PROMPT, max_tokens=too_many - 1, temperature=0) is not None  # exactly fits


def test_max_tokens_none_generates_until_the_window_is_full(llm):
    never_end = {t: -math.inf for t in llm.tokenizer.eog_ids}
    stream = llm.stream(PROMPT, max_tokens=None, temperature=0, logit_bias=never_end)
    stream.text()
    n_prompt = len(llm.tokenize(PROMPT, special=True))
    assert stream.finish_reason == "length"
    assert stream.completion_tokens == N_CTX - n_prompt
    assert llm.n_past == N_CTX - 1  # the last token is sampled, never evaluated


def test_create_completion_treats_non_positive_max_tokens_as_unlimited(llm):
    never_end = {t: -math.inf for t in llm.tokenizer.eog_ids}
    out = llm.create_completion(PROMPT, max_tokens=0, temperature=0, logit_bias=never_end)
    assert out["usage"]["total_tokens"] == N_CTX


def test_a_prompt_that_fills_the_window_leaves_no_room(llm):
    long_prompt = " ".join(["word"] * N_CTX)
    with pytest.raises(ContextLimitError, match="no room"):
        llm.generate(long_prompt)


def test_the_cache_is_sized_as_llama_cpp_sizes_its_context(qwen_path):
    # llama.cpp rounds n_ctx up to 256 cells and attends over the used cells rounded up
    # to 256; with 223 cells elelem would sum over 223 (found: a greedy answer that
    # ended after 111 tokens where llama.cpp's ran to 153).  The same prompt must give
    # the same logits, bit for bit, as in a cache of 256 -- and each sequence still
    # holds only n_ctx positions.
    prompt = list(range(1000, 1047))
    logits = {}
    for n_ctx in (223, 256):
        with elelem.LLM(qwen_path, n_ctx=n_ctx, n_threads=2) as model:
            assert model._engine.kv_size == 256
            logits[n_ctx] = model.eval(prompt, all_logits=True)
            if n_ctx == 223:
                with pytest.raises(ContextLimitError):
                    model.generate(prompt, max_tokens=223 - len(prompt) + 1)
    assert np.array_equal(logits[223], logits[256])
