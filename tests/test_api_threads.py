"""Threads: one LLM shared by several threads, and independent sessions over one model."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import elelem
from elelem.errors import ClosedError
from near_ties import assert_same_or_near_tie

pytestmark = pytest.mark.real_model

PROMPTS = ["The capital of Italy is", "def add(a, b):", "Roses are red,"]


@pytest.fixture(scope="module")
def llm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=1) as llm:
        yield llm


@pytest.fixture(scope="module")
def references(llm):
    return [llm.generate(p, max_tokens=8, temperature=0) for p in PROMPTS]


def check_answers(llm, prompts, results, references):
    for prompt, got, want in zip(prompts, results, references):
        assert_same_or_near_tie(llm, prompt, got, want, 8)


def test_one_llm_shared_by_threads_batches_calls(llm, references):
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda p: llm.generate(p, max_tokens=8, temperature=0), PROMPTS * 2))
    check_answers(llm, PROMPTS * 2, results, references * 2)


def test_interleaved_streams_on_one_llm_each_get_their_own_text(llm, references):
    # Two streams advanced in turn, in one thread: they run on sessions of their own.
    a = llm.stream(PROMPTS[0], max_tokens=8, temperature=0)
    b = llm.stream(PROMPTS[1], max_tokens=8, temperature=0)
    out_a, out_b = [], []
    for _ in range(20):
        out_a.append(next(a, ""))
        out_b.append(next(b, ""))
    check_answers(llm, PROMPTS[:2], ["".join(out_a), "".join(out_b)], references[:2])


def test_sessions_share_the_weights_and_keep_their_own_caches(llm, references):
    sessions = [llm.new_session() for _ in PROMPTS]
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            results = list(pool.map(lambda sp: sp[0].generate(sp[1], max_tokens=8, temperature=0),
                                    zip(sessions, PROMPTS)))
        check_answers(llm, PROMPTS, results, references)
        assert [s.cached_tokens[:3] for s in sessions] != [sessions[0].cached_tokens[:3]] * 3
        assert sessions[0].n_ctx == llm.n_ctx and all(s._engine is llm.engine for s in sessions)
    finally:
        for s in sessions:
            s.close()


def test_concurrent_sessions_share_steps(llm, references):
    """Two threads generating at once are batched: some steps carry a token of each."""
    sessions = [llm.new_session() for _ in PROMPTS[:2]]
    engine = llm.engine
    shared = engine.shared_steps
    start = threading.Barrier(2)

    def generate(pair):
        session, prompt = pair
        start.wait()
        return session.generate(prompt, max_tokens=8, temperature=0)

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(generate, zip(sessions, PROMPTS)))
        check_answers(llm, PROMPTS[:2], results, references[:2])
        # Each stream needs 8 steps (a prefill, then 7 decodes); started together,
        # most of them carry both streams' tokens.
        assert engine.shared_steps - shared >= 3
    finally:
        for s in sessions:
            s.close()


def test_closing_the_llm_closes_its_sessions(smollm_path):
    llm = elelem.LLM(smollm_path, n_ctx=64, n_threads=1)
    session = llm.new_session(n_ctx=32)
    assert session.n_ctx == 32
    llm.close()
    assert session.closed
    with pytest.raises(ClosedError):
        session.generate("hi")
    with pytest.raises(ClosedError):
        llm.new_session()
