"""What the engine puts in one step: generated tokens and prompts apart, so
that each takes its kernels and a stream keeps its solo numbers."""
from __future__ import annotations

import threading

import numpy as np

import elelem
from elelem.engine.request import Request
from synthetic import TinyConfig


class _RecordingContext:
    """The engine's native context, recording each step's sequences and kernels."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.steps: list[tuple[list[int], bool]] = []

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def decode(self, tokens, seqs, *args, decode_kernels=False, **kwargs):
        self.steps.append((list(seqs), decode_kernels))
        return self._ctx.decode(tokens, seqs, *args, decode_kernels=decode_kernels, **kwargs)


def _greedy(seq, prompt, n, rows, on_pick=lambda: None):
    """A request picking greedily, keeping every row of logits it was given."""
    def pick(logits):
        rows.append(np.array(logits))
        on_pick()
        return int(np.argmax(logits)), len(rows) < n
    return Request(seq, prompt=prompt, pick=pick, max_new=n)


def test_a_prompt_arriving_while_a_stream_generates_steps_apart_from_it(tiny_model):
    # A step of generated tokens takes the one-token kernels (elelem's small-batch
    # kernels, Q8_0 here), a prompt's step the batch ones (tinyBLAS), which round
    # otherwise.  A stream whose step a new prompt joined would get the prompt's:
    # at a near-tie another token than alone (gpt-oss's 8 streams: 7 of 8 kept
    # their solo answers).  So the two kinds of
    # steps alternate.  This tiny model's numbers happen to come out alike in a
    # joined step, so the steps themselves are checked too.
    path, _ = tiny_model(TinyConfig(arch="qwen3moe", wtype="q8_0", n_embd=128, n_ff=256))
    rng = np.random.default_rng(9)
    first, second = rng.integers(3, 96, 12).tolist(), rng.integers(3, 96, 20).tolist()
    with elelem.LLM(path, n_threads=2, n_seq_max=3, speculative=False) as llm:
        engine = llm.engine
        session, other = llm.new_session(), llm.new_session()
        alone: list = []
        engine.run(_greedy(session._seq, first, 12, alone))
        session.reset()
        recording = _RecordingContext(engine._ctx)
        engine._ctx = recording
        arrival = threading.Thread(target=other.generate_tokens, args=(second, 4))
        rows: list = []
        engine.run(_greedy(session._seq, first, 12, rows,   # the other prompt arrives after 3 picks
                           on_pick=lambda: len(rows) == 3 and arrival.start()))
        arrival.join(60)
        engine._ctx = recording._ctx
    np.testing.assert_array_equal(np.array(rows), np.array(alone))
    steps = recording.steps
    assert steps[0] == ([session._seq] * len(first), False)                   # the stream's prompt
    assert any(other._seq in seqs and not kernels for seqs, kernels in steps)  # the other's prompt...
    assert not [s for s in steps[1:] if session._seq in s[0] and not s[1]], steps   # ...never with the stream
