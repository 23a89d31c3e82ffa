"""Context limits are checked before any compute; max_tokens=None runs to the end of the window."""
from __future__ import annotations

import math

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
