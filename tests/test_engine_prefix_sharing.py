"""Prefixes shared between requests: reused on ggml's 4-column grid, so with
the logits of a fresh evaluation, and evaluated once when requests sharing
one (a system prompt) arrive together."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import elelem
from elelem.engine.engine import MIN_SHARED_WAIT, REUSE_ALIGNMENT
from synthetic import TinyConfig


@pytest.mark.real_model
def test_a_prompt_whose_prefix_is_reused_gets_the_logits_it_gets_afresh(qwen_path):
    # Qwen's ffn_down is repacked Q4_K: ggml evaluates a prompt's columns 4 at
    # a time (gemm) and the last n % 4 one by one (gemv), which round apart.
    # A 27-token prefix reused as it is would put the other 14 on another grid.
    rng = np.random.default_rng(7)
    shared = rng.integers(0, 150000, 27).tolist()
    prompt = shared + rng.integers(0, 150000, 14).tolist()
    other = shared + rng.integers(0, 150000, 9).tolist()
    with elelem.LLM(qwen_path, n_ctx=256, n_threads=2, n_seq_max=3, flash_attn=True) as llm:
        first, second = llm.new_session(), llm.new_session()
        fresh = first.prefill(prompt)
        first.reset()
        first.prefill(other)                        # holds the shared prefix
        before = llm.engine.context.n_evaluated
        forked = second.prefill(prompt)             # forks it from the first session
        np.testing.assert_array_equal(forked, fresh)
        assert llm.engine.context.n_evaluated - before == len(prompt) - 24
        second.reset()
        before = llm.engine.context.n_evaluated
        own = first.prefill(prompt)                 # its own cells, trimmed to the prefix
        np.testing.assert_array_equal(own, fresh)
        assert llm.engine.context.n_evaluated - before == len(prompt) - 24


class _HeldContext:
    """The engine's native context, recording each step's sequences, with the
    first step held until ``go`` is set (so that requests pile up meanwhile)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.go = threading.Event()
        self.steps: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def decode(self, tokens, seqs, *args, **kwargs):
        if not self.steps:
            self.go.wait(30)
        self.steps.append(list(seqs))
        return self._ctx.decode(tokens, seqs, *args, **kwargs)


def test_requests_arriving_together_evaluate_their_shared_prefix_once(tiny_model):
    path, _ = tiny_model(TinyConfig())
    rng = np.random.default_rng(3)
    system = rng.integers(0, 96, 40).tolist()
    assert len(system) % REUSE_ALIGNMENT == 0 and len(system) >= MIN_SHARED_WAIT
    prompts = [system + rng.integers(0, 96, 10).tolist() for _ in range(4)]
    with elelem.LLM(path, n_threads=1, n_seq_max=6, speculative=False) as llm:
        solo = [llm.generate_tokens(p, 6) for p in prompts]
        llm.reset()
        held = _HeldContext(llm.engine._ctx)
        llm.engine._ctx = held
        blocker, sessions = llm.new_session(), [llm.new_session() for _ in prompts]
        outs: list = [None] * len(prompts)

        def stream(i):
            outs[i] = sessions[i].generate_tokens(prompts[i], 6)

        threads = [threading.Thread(target=blocker.eval, args=([1, 2, 3],))]
        threads += [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
            time.sleep(0.05)                        # the blocker's step starts first
        deadline = time.monotonic() + 30
        while len(llm.engine._active) < 1 + len(prompts) and time.monotonic() < deadline:
            time.sleep(0.01)
        held.go.set()                               # all four are waiting for the next step
        for thread in threads:
            thread.join(60)
        llm.engine._ctx = held._ctx
    assert outs == solo
    seqs = [s._seq for s in sessions]
    evaluated = [sum(step.count(seq) for step in held.steps) - (len(out) - (len(out) == 6))
                 for seq, out in zip(seqs, outs)]   # prompt rows: all rows less the fed-back picks
    # One evaluated the system prompt, the other three forked it.
    assert sorted(evaluated) == [10, 10, 10, 50], evaluated
