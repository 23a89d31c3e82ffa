"""Prefix reuse: each chat turn evaluates only what the cache does not already hold."""
from __future__ import annotations

import pytest

import elelem
from elelem.engine.engine import REUSE_ALIGNMENT

pytestmark = pytest.mark.real_model

QUESTIONS = ["My name is Ana. Say hi.", "What is my name?", "Spell it backwards."]


def test_three_chat_turns_evaluate_only_the_new_tokens(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=1024, n_threads=1) as llm:
        history, turns = [], []
        for question in QUESTIONS:
            history.append({"role": "user", "content": question})
            before = llm.n_evaluated
            stream = llm.chat_stream(history, max_tokens=24, temperature=0)
            answer = stream.text()
            evaluated = llm.n_evaluated - before
            history.append({"role": "assistant", "content": answer})
            # decode steps: every generated token is fed back, except a last one cut by max_tokens
            decode_steps = stream.completion_tokens - (stream.finish_reason == "length")
            assert evaluated == (stream.prompt_tokens - stream.reused_tokens) + decode_steps
            turns.append((stream.prompt_tokens, stream.reused_tokens, evaluated, llm.n_past))

    (p1, r1, _, cached1), (p2, r2, _, cached2), (p3, r3, _, _) = turns
    assert r1 == 0
    # turns 2 and 3 find the previous prompt *and answer* in the cache
    assert r2 >= p1 and r3 >= p2
    # all the cache, give or take the last token and the cut to the reuse grid
    assert r2 >= cached1 - REUSE_ALIGNMENT and r3 >= cached2 - REUSE_ALIGNMENT
    assert r2 % REUSE_ALIGNMENT == 0 and r3 % REUSE_ALIGNMENT == 0
    prompt_total = p1 + p2 + p3
    prefill_total = sum(p - r for p, r, _, _ in turns)
    assert prefill_total < 0.6 * prompt_total, turns
