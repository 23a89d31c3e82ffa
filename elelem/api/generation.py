"""The generation loop: prompt ids in, text deltas out.

One :class:`TextStream` is one generation.  Each step samples a token from
the last logits, turns it into text (whole UTF-8 characters only), holds back
anything that may be the start of a stop string, and evaluates the token to
get the next logits.  Nothing is computed until the first ``next()``, and
nothing after the stream is closed or dropped: leaving a stream early stops
the work after the step in progress.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Iterator, Optional

from ..sampling.sampler import Sampler, SamplingParams
from ..text.stop_strings import StopStringFilter

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

log = logging.getLogger("elelem")


class TextStream:
    """An iterator of text deltas from one generation, with its accounting.

    After the stream ends, ``finish_reason`` is ``"stop"`` (an end-of-generation
    token or a stop string) or ``"length"`` (``max_tokens`` reached); it stays
    None for a stream closed early.  ``prompt_tokens`` counts the prompt,
    ``reused_tokens`` the part of it found in the cache (prefix reuse), and
    ``completion_tokens`` the tokens generated, stop string included.
    """

    def __init__(self, session: "Session", prompt_ids: list[int], params: SamplingParams,
                 max_tokens: int, stop: tuple[str, ...], constraint=None):
        self.prompt_tokens = len(prompt_ids)
        self.reused_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: Optional[str] = None
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        # Built now, so bad parameters fail before any compute.
        self._sampler = Sampler(params, n_vocab=session.n_vocab)
        # A TokenConstraint (elelem.sampling.constrained) picks the tokens of a
        # forced tool call; the reply ends when it is complete.
        self._constraint = constraint
        self._steps = self._run(session, list(prompt_ids), max_tokens, stop)

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        return next(self._steps)

    def close(self) -> None:
        """Stop generating; the cache keeps what was evaluated so far."""
        self._steps.close()

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def text(self) -> str:
        """The rest of the text, all at once."""
        return "".join(self)

    def _run(self, session: "Session", seq: list[int], max_tokens: int,
             stop: tuple[str, ...]) -> Iterator[str]:
        tokenizer = session._llm.tokenizer
        eog_ids = tokenizer.eog_ids
        decoder = tokenizer.stream_decoder()
        stops = StopStringFilter(stop)
        sampler = self._sampler
        constraint = self._constraint
        session._start_generation()
        if max_tokens == 0:
            self.finish_reason = "length"
            return
        # The stream holds its session for its whole life, from the first
        # token to the last (or until it is closed or dropped): calls from
        # other threads wait, so each gets the answer it would get alone,
        # rather than re-evaluating after an interleaved call.
        with session._lock:
            t0 = time.perf_counter()
            logits, seen, evaluated = session._logits_after(seq, None)
            self.reused_tokens = len(seq) - evaluated
            self.prefill_seconds = time.perf_counter() - t0
            t0 = time.perf_counter()
            while True:
                token = sampler.sample(logits, seq) if constraint is None else constraint.sample(sampler, logits, seq)
                if token in eog_ids:
                    self.finish_reason = "stop"
                    break
                seq.append(token)
                self.completion_tokens += 1
                text = stops.push(decoder.feed(token))
                if text:
                    yield text
                if stops.stopped or (constraint is not None and constraint.complete):
                    self.finish_reason = "stop"
                    break
                if self.completion_tokens >= max_tokens:
                    # The last token is never evaluated: its logits would go unused.
                    self.finish_reason = "length"
                    break
                logits, seen, _ = session._logits_after(seq, seen)
            self.decode_seconds = time.perf_counter() - t0
            tail = stops.push(decoder.flush()) + stops.flush()
            if tail:
                yield tail
        log.debug("generated %d tokens (%s) after a %d-token prompt (%d reused)",
                  self.completion_tokens, self.finish_reason, self.prompt_tokens, self.reused_tokens)
