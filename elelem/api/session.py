"""``Session``: one sequence of the model's engine, with the full text API.

Made by :meth:`elelem.LLM.new_session`.  A session holds a sequence id in the
engine's KV cache (shared by every session of the model) and the tokens that
sequence holds live in the cache alone: a session keeps no KV state of its
own.  Calls on one session are serialized by its lock; calls on different
sessions run batched together, step by step, in the engine.

An interruption at any point -- a ``KeyboardInterrupt`` mid-prefill, a
``cancel()`` from another thread -- leaves a cache that is shorter, never
wrong: a step that fails leaves the cache as it was before it.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ..engine.engine import Engine
from ..engine.media import image_run
from ..engine.request import Request
from ..errors import ClosedError, ContextLimitError, InvalidArgumentError, InvalidTokenError
from .assets import ModelAssets
from .generation import GenerationTarget, TextStream
from .lora import resolve_scales
from .states import LLMState, cache_settings, check_state, make_state, model_file_identity
from .text_api import TextAPI


class Session(TextAPI):
    """A sequence over an open model, with the full text API."""

    def __init__(self, engine: Engine, assets: ModelAssets, *, n_ctx: int):
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or not 1 <= n_ctx <= engine.n_ctx:
            raise InvalidArgumentError(f"a session's n_ctx must be an integer in [1, {engine.n_ctx}] "
                                       f"(the model's n_ctx), got {n_ctx!r}")
        self.assets = assets
        self._engine = engine
        self._seq = engine.open_sequence()
        self._n_ctx = n_ctx
        self._lock = threading.RLock()
        self._evaluated = 0
        self._running: Optional[Request] = None     # the request in progress, for cancel()
        self._stream: Optional["weakref.ref[TextStream]"] = None
        # Frees the sequence's cells when the session is closed or dropped.
        self._release = weakref.finalize(self, engine.close_sequence, self._seq)

    # -- facts ---------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        self._check_open()
        return self._n_ctx

    @property
    def n_vocab(self) -> int:
        return self.assets.n_vocab

    @property
    def seq(self) -> int:
        """The engine sequence this session holds."""
        return self._seq

    @property
    def n_past(self) -> int:
        """Positions the cache holds for this session."""
        self._check_open()
        return self._engine.length(self._seq)

    @property
    def n_evaluated(self) -> int:
        """Tokens evaluated by this session since it was opened."""
        self._check_open()
        return self._evaluated

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.assets.eos_ids

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the tokens whose keys and values are in the cache."""
        with self._lock:
            self._check_open()
            return self._engine.tokens(self._seq)

    # -- evaluation ------------------------------------------------------------

    def eval(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` after what is cached; returns float32 logits:
        ``(n_vocab,)`` for the last token, or ``(len(tokens), n_vocab)``."""
        with self._lock:
            self._check_open()
            ids = self._check_ids(tokens, "tokens")
            held = self._engine.length(self._seq)
            if held + len(ids) > self._n_ctx:
                raise ContextLimitError(f"{held} cached + {len(ids)} new tokens = {held + len(ids)} "
                                        f"exceeds n_ctx={self._n_ctx}")
            return self._run(Request(self._seq, tokens=ids, all_logits=all_logits, n_ctx=self._n_ctx)).logits()

    def reset(self) -> None:
        """Forget the cached context."""
        self.rewind(0)

    def rewind(self, n_past: int) -> None:
        """Forget every cached position from ``n_past`` on."""
        with self._lock:
            self._check_open()
            self._engine.trim(self._seq, n_past)

    def save_state(self) -> LLMState:
        """The tokens this session's cache holds and their keys and values,
        to give back to :meth:`load_state` later (on this or another session
        of a model opened with the same settings)."""
        with self._lock:
            self._check_open()
            tokens, kv = self._engine.read_state(self._seq)
            return make_state(tokens, kv, self._state_settings())

    def load_state(self, state: LLMState) -> None:
        """Make the cache hold exactly what it held at :meth:`save_state`.
        A state saved under other settings (another model, K/V types or CPU
        kernels) raises :class:`~elelem.errors.StateError`."""
        with self._lock:
            self._check_open()
            check_state(state, self._state_settings())
            if len(state.tokens) > self._n_ctx:
                raise ContextLimitError(f"the state holds {len(state.tokens)} tokens; n_ctx is {self._n_ctx}")
            self._engine.load_state(self._seq, list(state.tokens), state.kv)

    def _state_settings(self) -> dict:
        return cache_settings(self._engine.context, model_file_identity(self.assets.path))

    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Bring the cache to exactly ``prompt_ids`` and return the last logits.

        Only the tokens after the longest prefix already cached -- by this
        session, or by another one, whose cells are then shared -- are
        evaluated: at least two of a longer prompt (see the engine).
        """
        ids = self._check_ids(prompt_ids, "prompt")
        with self._lock:
            self._check_open()
            if len(ids) > self._n_ctx:
                raise ContextLimitError(f"the prompt has {len(ids)} tokens; n_ctx is {self._n_ctx}")
            return self._run(Request(self._seq, prompt=ids, n_ctx=self._n_ctx)).logits()

    def generate_tokens(self, prompt_ids: Sequence[int], max_tokens: int, *,
                        stop_ids: Optional[Iterable[int]] = None) -> list[int]:
        """Greedy generation: prefill once, then one step per token (or, with
        speculative decoding, per run of confirmed drafted guesses).

        Stops after ``max_tokens`` tokens, at the end of the context, or at an
        end-of-generation id (the model's EOS, or any of ``stop_ids``), which
        is not returned.
        """
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        stops = self.eos_ids | self._check_stop_ids(stop_ids)
        ids = self._check_ids(prompt_ids, "prompt")
        if max_tokens == 0:
            return []
        out: list[int] = []
        history = list(ids)  # what the drafter looks tokens up in

        def pick(logits):
            token = int(np.argmax(logits))
            if token in stops:
                return None, False
            out.append(token)
            history.append(token)
            return token, len(out) < max_tokens

        with self._lock:
            self._check_open()
            if len(ids) > self._n_ctx:
                raise ContextLimitError(f"the prompt has {len(ids)} tokens; n_ctx is {self._n_ctx}")
            drafter = self._engine.new_drafter(self._seq, history) if self._engine.speculative else None
            self._run(Request(self._seq, prompt=ids, pick=pick, n_ctx=self._n_ctx,
                              max_new=min(max_tokens, self._n_ctx - len(ids)), drafter=drafter, ends=stops))
        return out

    def _run(self, request: Request) -> Request:
        self._running = request
        try:
            return self._engine.run(request)
        finally:
            self._running = None
            self._evaluated += request.evaluated

    # -- streams ---------------------------------------------------------------

    def _open_stream(self, ids, params, budget, stop, constraint, on_end=None,
                     speculative: Optional[bool] = None, logprobs: Optional[int] = None,
                     preserved: frozenset = frozenset(), lora: Any = None) -> TextStream:
        self._check_open()
        scales = resolve_scales(lora, len(self._engine.lora_scales), self._engine.lora_scales)
        target = GenerationTarget(self._engine, self._seq, self._n_ctx, self.n_vocab, self._lock, scales)
        stream = TextStream(target, self.assets.tokenizer, ids, params, budget, stop, constraint,
                            on_end=on_end, on_evaluated=self._count,
                            speculative=self._engine.speculative if speculative is None else bool(speculative),
                            logprobs=logprobs, preserved=preserved)
        self._stream = weakref.ref(stream)
        return stream

    def _count(self, n: int) -> None:
        self._evaluated += n

    def cancel(self) -> None:
        """Stop the generation running on this session, from another thread.

        The running call raises ``KeyboardInterrupt`` (as Ctrl-C would) once
        the current step ends -- at once, if that step is native compute -- and
        the session stays usable.  Other sessions' work goes on.
        """
        interrupt = KeyboardInterrupt("generation cancelled")
        request = self._running
        if request is not None:
            self._engine.cancel(request, interrupt)
        stream = self._stream() if self._stream is not None else None
        if stream is not None:
            stream.cancel(interrupt)

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        """Free this session's sequence and its cells, at once (waits for a call in progress)."""
        with self._lock:
            self._release()

    @property
    def closed(self) -> bool:
        return not self._release.alive or self._engine.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checks ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"this {type(self).__name__} is closed")

    def _check_ids(self, ids: Sequence[int], what: str) -> list[int]:
        # No dtype forced on the conversion: that would truncate 1.5 to 1.
        arr = np.asarray(ids)
        if arr.size == 0:
            raise InvalidArgumentError(f"the {what} is empty")
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise InvalidTokenError(f"the {what} must be a flat list of integers (token ids), "
                                    f"got shape {arr.shape} of {arr.dtype}")
        lo, hi = int(arr.min()), int(arr.max())
        if hi >= self.n_vocab or (lo < 0 and not self._images_known(arr)):
            raise InvalidTokenError(f"token id {lo if lo < 0 else hi} in the {what} is outside [0, {self.n_vocab})")
        return [int(t) for t in arr]

    def _images_known(self, ids: np.ndarray) -> bool:
        """Whether every negative id stands for an image the engine holds embeddings of
        (elelem/engine/media.py; the ids ``LLM.images`` gives a prompt's images)."""
        values = [int(t) for t in ids]
        i = 0
        while i < len(values):
            run = image_run(values[i:])
            if run:
                if not self._known_run(values[i:i + run]):
                    return False
                i += run
            else:
                i += 1
        return True

    def _known_run(self, run: list[int]) -> bool:
        try:
            self._engine.media.rows(run)
        except InvalidArgumentError:
            return False
        return True

    def _check_stop_ids(self, stop_ids: Optional[Iterable[int]]) -> frozenset[int]:
        if stop_ids is None:
            return frozenset()
        ids = frozenset(int(t) for t in stop_ids)
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidTokenError(f"stop id {bad[0]} is outside [0, {self.n_vocab})")
        return ids
