"""Cancellation: leaving a stream, cancel() from another thread, an abort mid-prefill, Ctrl-C in user code.

After each, the cache must agree with its bookkeeping and the next call must
give the same answer as on a fresh model.
"""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import elelem
from elelem.engine.engine import REUSE_ALIGNMENT

pytestmark = pytest.mark.real_model

PROMPT = "Here is a long story about a dragon who"


@pytest.fixture(scope="module")
def llm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=1) as llm:
        yield llm


@pytest.fixture(scope="module")
def reference(llm):
    llm.reset()
    return llm.generate(PROMPT, max_tokens=8, temperature=0)


def assert_consistent(llm):
    assert llm.n_past == len(llm.cached_tokens)


def test_closing_a_stream_stops_compute(llm, reference):
    stream = llm.stream(PROMPT, max_tokens=100, temperature=0)
    next(stream), next(stream)
    stream.close()
    after = llm.n_evaluated
    with pytest.raises(StopIteration):
        next(stream)
    assert llm.n_evaluated == after and stream.finish_reason is None
    assert_consistent(llm)
    assert llm.generate(PROMPT, max_tokens=8, temperature=0) == reference


def test_dropping_a_stream_also_stops_it(llm, reference):
    for i, _ in enumerate(llm.stream(PROMPT, max_tokens=100, temperature=0)):
        if i == 2:
            break  # the loop drops the stream; nothing runs after this step
    after = llm.n_evaluated
    assert llm.generate(PROMPT, max_tokens=8, temperature=0) == reference
    # the prompt's last tokens again (as many as give its fresh logits, on the reuse grid: see the
    # engine), then 7 picks fed back
    tail = llm.engine.exact_tail(len(llm.tokenize(PROMPT)))
    assert llm.n_evaluated - after <= (tail + REUSE_ALIGNMENT - 1) + 7


def test_cancel_from_another_thread_raises_keyboard_interrupt(llm, reference):
    never_end = {t: -math.inf for t in llm.tokenizer.eog_ids}
    timer = threading.Timer(0.3, llm.cancel)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPT, max_tokens=400, temperature=0, logit_bias=never_end)
    timer.join()
    assert_consistent(llm)
    assert llm.generate(PROMPT, max_tokens=8, temperature=0) == reference


def test_a_cancel_with_nothing_running_does_not_hit_the_next_call(llm, reference):
    llm.cancel()
    assert llm.generate(PROMPT, max_tokens=8, temperature=0) == reference


def test_abort_in_the_middle_of_a_chunked_prefill_keeps_the_finished_chunks(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_batch=8, n_threads=1) as llm:
        ids = llm.tokenize(" ".join(["alpha beta gamma delta"] * 40))[:300]
        want = llm.eval(ids)
        llm.reset()
        done = threading.Event()

        def keep_aborting():
            while not done.is_set():
                llm.engine.context.request_abort()

        aborter = threading.Thread(target=keep_aborting)
        aborter.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                for _ in range(50):  # the abort lands within a few tries
                    llm.reset()
                    llm.eval(ids)
        finally:
            done.set()
            aborter.join()
        assert_consistent(llm)
        assert llm.n_past % 8 == 0 and llm.n_past < len(ids)
        assert llm.cached_tokens == ids[:llm.n_past]
        got = llm.prefill(ids)  # continues from the chunks that finished
        np.testing.assert_allclose(got, want, atol=1e-3 * np.abs(want).max())


def test_keyboard_interrupt_in_the_consumer_leaves_the_llm_usable(llm, reference):
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(llm.chat_stream([{"role": "user", "content": "Tell me a story."}], max_tokens=50)):
            if i == 3:
                raise KeyboardInterrupt  # as Ctrl-C would, between two steps
    assert_consistent(llm)
    assert llm.generate(PROMPT, max_tokens=8, temperature=0) == reference


def test_cancel_while_this_thread_holds_the_engine_lock_is_deferred(llm, reference, monkeypatch):
    """What a signal handler's llm.cancel() meets when the signal lands while
    the main thread plans a step (prompt-lookup drafting runs under the
    engine's lock): it used to deadlock; now the cancel is recorded and
    applied at the driver's next safe point."""
    from elelem.engine.speculative import PromptLookup
    propose = PromptLookup.propose
    calls = []

    def propose_then_cancel(self, limit):
        calls.append(llm.engine._cv._is_owned())
        if len(calls) == 3:
            llm.cancel()          # as a handler would, with the lock held by this very thread
        return propose(self, limit)

    monkeypatch.setattr(PromptLookup, "propose", propose_then_cancel)
    never_end = {t: -math.inf for t in llm.tokenizer.eog_ids}
    outcome = []

    def generate():
        try:
            llm.generate(PROMPT, max_tokens=200, temperature=0, logit_bias=never_end, speculative=True)
            outcome.append("finished")
        except KeyboardInterrupt:
            outcome.append("cancelled")

    worker = threading.Thread(target=generate, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "deadlocked"
    assert calls[2] is True and outcome == ["cancelled"] and len(calls) < 50
    monkeypatch.undo()
    assert_consistent(llm)
    assert llm.generate(PROMPT, max_tokens=8, temperature=0) == reference
