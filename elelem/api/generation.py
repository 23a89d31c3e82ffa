"""The generation loop: prompt ids in, text deltas out.

One :class:`TextStream` is one generation, run by the engine as a request on
its session's sequence, batched with whatever else runs.  The engine samples
each token (in the thread that runs the step); the stream turns the tokens
into text (whole UTF-8 characters only) and holds back anything that may be
the start of a stop string.  Nothing is computed until the first ``next()``,
and nothing after the stream is closed or dropped: leaving a stream early
stops its work at the end of the step in progress.

With ``speculative``, the engine also verifies tokens guessed by prompt
lookup (:mod:`elelem.engine.speculative`) or by a draft model
(:mod:`elelem.engine.draft_model`) in the same steps: the text is the
one decoding token by token gives (see there for the one exception, a
near-tie flipped by batched arithmetic), and the same seed gives the same
sampled text.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, Generator, Optional

from ..engine.engine import Engine
from ..engine.request import Request
from ..sampling.logprobs import TokenLogprob, checked_top_count, token_logprob
from ..sampling.sampler import Sampler, SamplingParams
from ..text.stop_strings import StopStringFilter
from ..text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from .reasoning import ReplyParser

log = logging.getLogger("elelem")


class StreamStats:
    """The accounting of one generation (read through the TextStream)."""

    def __init__(self, prompt_tokens: int):
        self.prompt_tokens = prompt_tokens
        self.reused_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: Optional[str] = None
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.request: Optional[Request] = None   # while running: what cancel() stops
        # With logprobs: one entry per generated token, and the text each added.
        self.logprobs: Optional[list[TokenLogprob]] = None
        self.token_texts: list[str] = []


class GenerationTarget:
    """Where a stream runs: the engine, the sequence, its limit, its lock."""

    def __init__(self, engine: Engine, seq: int, n_ctx: int, n_vocab: int, lock: threading.RLock,
                 lora: Optional[tuple[float, ...]] = None):
        self.engine = engine
        self.lora = lora    # the LoRA adapters' scales (None: the engine's)
        self.seq = seq
        self.n_ctx = n_ctx
        self.n_vocab = n_vocab
        self.lock = lock


class TextStream:
    """An iterator of text deltas from one generation, with its accounting.

    After the stream ends, ``finish_reason`` is ``"stop"`` (an end-of-generation
    token or a stop string) or ``"length"`` (``max_tokens`` reached); it stays
    None for a stream closed early.  ``prompt_tokens`` counts the prompt,
    ``reused_tokens`` the part of it found in the cache (prefix reuse), and
    ``completion_tokens`` the tokens generated, stop string included.
    Speculative decoding: ``drafted_tokens`` guessed tokens were verified,
    and ``accepted_tokens`` of them confirmed by the model (each accepted one
    saved a step).
    """

    def __init__(self, target: GenerationTarget, tokenizer: Tokenizer, prompt_ids: list[int],
                 params: SamplingParams, max_tokens: int, stop: tuple[str, ...], constraint=None,
                 on_end: Optional[Callable[[], None]] = None,
                 on_evaluated: Optional[Callable[[int], None]] = None, speculative: bool = False,
                 logprobs: Optional[int] = None, preserved: frozenset = frozenset()):
        self._stats = StreamStats(len(prompt_ids))
        #: How a chat reply is read (reasoning, tool calls): a
        #: :class:`~elelem.api.reasoning.ReplyParser`, or None for plain text.
        self.reply: Optional[ReplyParser] = None
        # Built now, so bad parameters fail before any compute.
        sampler = Sampler(params, n_vocab=target.n_vocab)
        if logprobs is not None:
            logprobs = checked_top_count(logprobs, "logprobs")
            self._stats.logprobs = []
        self._steps = _run(self._stats, target, tokenizer, sampler, constraint, list(prompt_ids), max_tokens, stop,
                           on_evaluated, speculative, logprobs, preserved)
        self.tokenizer = tokenizer
        # ``on_end`` (an LLM's lease on a session) runs once: when the stream
        # ends, is closed, or is dropped without ever being read.
        self._on_end = weakref.finalize(self, on_end) if on_end is not None else None
        self._target = target

    @property
    def prompt_tokens(self) -> int:
        return self._stats.prompt_tokens

    @property
    def reused_tokens(self) -> int:
        return self._stats.reused_tokens

    @property
    def completion_tokens(self) -> int:
        return self._stats.completion_tokens

    @property
    def finish_reason(self) -> Optional[str]:
        return self._stats.finish_reason

    @property
    def prefill_seconds(self) -> float:
        return self._stats.prefill_seconds

    @property
    def decode_seconds(self) -> float:
        return self._stats.decode_seconds

    @property
    def drafted_tokens(self) -> int:
        return self._stats.drafted_tokens

    @property
    def accepted_tokens(self) -> int:
        return self._stats.accepted_tokens

    @property
    def logprobs(self) -> Optional[list[TokenLogprob]]:
        """With ``logprobs=N``: each generated token's log-probability and its
        N likeliest alternatives, so far (see :mod:`elelem.sampling.logprobs`)."""
        return self._stats.logprobs

    @property
    def token_texts(self) -> list[str]:
        """With ``logprobs``: the text each generated token added (whole
        characters: a character split over tokens counts for the last one)."""
        return self._stats.token_texts

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        try:
            return next(self._steps)
        except BaseException:
            self._end()
            raise

    def close(self) -> None:
        """Stop generating; the cache keeps what was evaluated so far."""
        self._steps.close()
        self._end()

    def cancel(self, error: Optional[BaseException] = None) -> None:
        """Stop from another thread, at the end of the step in progress."""
        request = self._stats.request
        if request is not None:
            self._target.engine.cancel(request, error)

    def _end(self) -> None:
        if self._on_end is not None:
            self._on_end()

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def text(self) -> str:
        """The rest of the text, all at once."""
        return "".join(self)


class _PreservingDecoder:
    """A stream decoder that also shows the text of some control tokens: the markup
    a tool-call format is read by (gpt-oss's ``<|channel|>``, Mistral's
    ``[TOOL_CALLS]``), as llama.cpp renders its preserved tokens."""

    def __init__(self, tokenizer: Tokenizer, ids: frozenset):
        self._decoder = tokenizer.stream_decoder()
        self._tokenizer = tokenizer
        self._ids = ids

    def feed(self, token: int) -> str:
        if token in self._ids:
            return self._tokenizer.decode([token], special=True).decode("utf-8", "replace")
        return self._decoder.feed(token)

    def flush(self) -> str:
        return self._decoder.flush()


def _run(stats: StreamStats, target: GenerationTarget, tokenizer: Tokenizer, sampler: Sampler, constraint,
         seq: list[int], max_tokens: int, stop: tuple[str, ...],
         on_evaluated: Optional[Callable[[int], None]], speculative: bool,
         n_logprobs: Optional[int], preserved: frozenset = frozenset()) -> Generator[str, None, None]:
    # A module function, not a method: the generator must not refer to its
    # TextStream, or an unread stream would be a reference cycle.
    if max_tokens == 0:
        stats.finish_reason = "length"
        return
    eog_ids = tokenizer.eog_ids
    decoder = tokenizer.stream_decoder() if not preserved else _PreservingDecoder(tokenizer, preserved)
    stops = StopStringFilter(stop)
    picked = [0]
    reason = ["length"]
    logprob_entries = stats.logprobs  # a list where n_logprobs is given

    def pick(logits):  # runs in whichever thread runs the step
        token = sampler.sample(logits, seq) if constraint is None else constraint.sample(sampler, logits, seq)
        if token in eog_ids:
            reason[0] = "stop"
            return None, False
        if n_logprobs is not None and logprob_entries is not None:
            logprob_entries.append(token_logprob(logits, token, n_logprobs))
        seq.append(token)
        picked[0] += 1
        if constraint is not None and constraint.complete:
            reason[0] = "stop"
            return token, False
        return token, picked[0] < max_tokens

    engine = target.engine
    # The stream holds its session for its whole life, from the first token to
    # the last (or until it is closed or dropped): calls from other threads on
    # the same session wait.  Other sessions' requests run batched with it.
    with target.lock:
        # The drafter reads ``seq`` live: the prompt, then each token ``pick`` appends.
        request = Request(target.seq, prompt=list(seq), pick=pick, n_ctx=target.n_ctx, streamed=True,
                          max_new=max_tokens, drafter=engine.new_drafter(target.seq, seq) if speculative else None,
                          ends=eog_ids, lora=target.lora)
        stats.request = request
        t0 = time.perf_counter()
        try:
            first = True
            while True:
                token = engine.next_token(request)
                stats.drafted_tokens, stats.accepted_tokens = request.drafted, request.accepted
                if first:
                    stats.reused_tokens = request.reused
                    stats.prefill_seconds = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    first = False
                if token is None:
                    stats.finish_reason = reason[0]
                    break
                stats.completion_tokens += 1
                piece = decoder.feed(token)
                if n_logprobs is not None:
                    stats.token_texts.append(piece)
                text = stops.push(piece)
                if text:
                    yield text
                if stops.stopped:
                    stats.finish_reason = "stop"
                    break
            stats.decode_seconds = time.perf_counter() - t0
            tail = stops.push(decoder.flush()) + stops.flush()
            if tail:
                yield tail
        finally:
            engine.cancel(request)  # a no-op once it is done
            stats.request = None
            stats.drafted_tokens, stats.accepted_tokens = request.drafted, request.accepted
            if on_evaluated is not None:
                on_evaluated(request.evaluated)
    log.debug("generated %d tokens (%s) after a %d-token prompt (%d reused)",
              stats.completion_tokens, stats.finish_reason, stats.prompt_tokens, stats.reused_tokens)
