"""``Session``: one sequence over a loaded model -- its own KV cache and lock.

An :class:`~elelem.LLM` is itself a session (over the model it opened), and
``LLM.new_session()`` makes more over the same weights.  Each session's calls
are serialized by its lock; different sessions run in parallel, because the
native compute releases the GIL.

The cache bookkeeping lives here: ``_cached`` lists the tokens whose K/V the
native session holds, in order.  Every call first re-aligns it with the
native ``n_past`` (:meth:`_sync_cache`), so an interruption at any point -- a
``KeyboardInterrupt`` mid-prefill, an abort from another thread -- leaves a
cache that is shorter, never wrong.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

import numpy as np

from ..errors import ClosedError, InvalidArgumentError, InvalidTokenError
from .text_api import TextAPI

if TYPE_CHECKING:  # pragma: no cover
    from .llm import LLM


class Session(TextAPI):
    """A sequence (KV cache) over an open model, with the full text API.

    Made by :meth:`elelem.LLM.new_session`; an ``LLM`` is a session too.
    """

    def __init__(self, llm: "LLM", native) -> None:
        self._llm = llm
        self._session = native
        self._lock = threading.RLock()
        self._cached: list[int] = []  # the tokens whose K/V are in the cache, in order
        # Bumped whenever the cache changes, so a stream can tell whether the
        # cache still holds exactly its own tokens between two of its steps.
        self._cache_version = 0
        self._cancel_requested = False

    # -- facts ---------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self._session_or_raise().n_ctx

    @property
    def n_vocab(self) -> int:
        return self._llm.spec.hparams["n_vocab"]

    @property
    def n_past(self) -> int:
        return self._session_or_raise().n_past

    @property
    def n_evaluated(self) -> int:
        """Tokens evaluated by this session since it was opened."""
        return self._session_or_raise().n_evaluated

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._llm._metadata_eos_ids

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the tokens whose keys and values are in the cache."""
        with self._lock:
            self._sync_cache()
            return list(self._cached)

    # -- evaluation ------------------------------------------------------------

    def eval(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` after what is cached; returns float32 logits."""
        with self._lock:
            session = self._session_or_raise()
            self._sync_cache()
            ids = np.asarray(tokens).reshape(-1)
            before = session.n_past
            try:
                return session.eval(tokens, all_logits=all_logits)
            finally:
                # After an abort part-way through a long input, the chunks
                # that finished are cached: record exactly those.
                self._cached.extend(int(t) for t in ids[:session.n_past - before])
                self._cache_version += 1

    def reset(self) -> None:
        """Forget the cached context."""
        self.rewind(0)

    def rewind(self, n_past: int) -> None:
        with self._lock:
            session = self._session_or_raise()
            self._sync_cache()
            session.rewind(n_past)
            del self._cached[n_past:]
            self._cache_version += 1

    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Bring the cache to exactly ``prompt_ids`` and return the last logits.

        Only the tokens after the longest common prefix with the cache are
        evaluated: at least two (of a longer prompt), because ggml computes a
        lone token with other kernels than a batch (gemv rather than gemm),
        and a prompt whose last token alone were re-evaluated could then get
        other logits, and at a near-tie another greedy answer, than it gets
        evaluated afresh.
        """
        ids = self._check_ids(prompt_ids, "prompt")
        with self._lock:
            session = self._session_or_raise()
            self._sync_cache()
            keep = max(0, min(_common_prefix(self._cached, ids), len(ids) - 2))
            session.rewind(keep)
            del self._cached[keep:]
            return self.eval(ids[keep:])

    def generate_tokens(self, prompt_ids: Sequence[int], max_tokens: int, *,
                        stop_ids: Optional[Iterable[int]] = None) -> list[int]:
        """Greedy generation: prefill once, then one step per token.

        Stops after ``max_tokens`` tokens or at an end-of-generation id
        (the model's EOS, or any of ``stop_ids``), which is not returned.
        """
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        stops = self.eos_ids | self._check_stop_ids(stop_ids)
        ids = self._check_ids(prompt_ids, "prompt")
        out: list[int] = []
        with self._lock:
            if max_tokens == 0:
                return out
            logits = self.prefill(ids)
            while True:
                token = int(np.argmax(logits))
                if token in stops:
                    break
                out.append(token)
                if len(out) >= max_tokens or self.n_past >= self.n_ctx:
                    break
                logits = self.eval([token])
        return out

    # -- used by streams ---------------------------------------------------------

    def _logits_after(self, ids: list[int], seen: Optional[tuple[int, int]]) -> tuple[np.ndarray, tuple[int, int], int]:
        """Logits after the sequence ``ids``: one step of a generation.

        ``seen`` is what the previous call returned.  When the cache is
        unchanged since then it holds ``ids[:-1]``, and only the last token is
        evaluated; otherwise another call ran in between, and ``ids`` is
        prefilled again (reusing the common prefix).  Returns the logits, the
        new ``seen`` and how many tokens were evaluated.
        """
        with self._lock:
            if self._cancel_requested:
                self._cancel_requested = False
                raise KeyboardInterrupt("generation cancelled")
            before = self.n_evaluated
            if seen == (self._cache_version, len(self._cached)) and len(self._cached) == len(ids) - 1:
                logits = self.eval(ids[-1:])
            else:
                logits = self.prefill(ids)
            return logits, (self._cache_version, len(self._cached)), self.n_evaluated - before

    def cancel(self) -> None:
        """Stop the generation running on this session, from another thread.

        The running call raises ``KeyboardInterrupt`` (as Ctrl-C would) once
        the current step ends -- at once, if that step is native compute -- and
        the session stays usable.
        """
        self._cancel_requested = True
        session = self._session
        if session is not None:
            session.request_abort()

    def _start_generation(self) -> None:
        # A cancel() that arrived while nothing was running must not kill the next call.
        self._cancel_requested = False

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        """Free this session's cache (waits for a call in progress)."""
        with self._lock:
            if self._session is not None:
                self._session.close()
            self._session = None

    @property
    def closed(self) -> bool:
        return self._session is None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checks ----------------------------------------------------------------

    def _session_or_raise(self):
        if self._session is None:
            raise ClosedError(f"this {type(self).__name__} is closed")
        return self._session

    def _sync_cache(self) -> None:
        """Make ``_cached`` and the native cache agree, trimming whichever is longer."""
        session = self._session_or_raise()
        keep = min(len(self._cached), session.n_past)
        if keep != session.n_past:
            session.rewind(keep)
        if keep != len(self._cached):
            del self._cached[keep:]

    def _check_ids(self, ids: Sequence[int], what: str) -> list[int]:
        arr = np.asarray(ids)
        if arr.size == 0:
            raise InvalidArgumentError(f"the {what} is empty")
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise InvalidTokenError(f"the {what} must be a flat list of integer token ids")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.n_vocab:
            raise InvalidTokenError(f"token id {lo if lo < 0 else hi} in the {what} is outside [0, {self.n_vocab})")
        return [int(t) for t in arr]

    def _check_stop_ids(self, stop_ids: Optional[Iterable[int]]) -> frozenset[int]:
        if stop_ids is None:
            return frozenset()
        ids = frozenset(int(t) for t in stop_ids)
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidTokenError(f"stop id {bad[0]} is outside [0, {self.n_vocab})")
        return ids


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
