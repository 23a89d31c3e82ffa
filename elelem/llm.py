"""``elelem.LLM``: a loaded model with one session over it."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Iterable, Optional, Sequence

import numpy as np

from . import _core
from .architectures import ModelSpec, model_spec
from .errors import InvalidArgumentError, InvalidTokenError
from .gguf_reader import GGUFFile, read_gguf
from .hub import resolve_model

log = logging.getLogger("elelem")

DEFAULT_N_CTX = 4096


def default_n_threads() -> int:
    """The CPUs this process may run on (ggml's matmuls want one thread per core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class LLM:
    """A GGUF model, opened for generation.

    ``model_path`` is a path to a ``.gguf`` file or a packaged model name
    (see ``elelem models``).  ``n_ctx`` defaults to the smaller of the model's
    trained context and 4096.  ``kv_type`` is ``"f16"`` (as llama.cpp) or
    ``"f32"``.  ``flash_attn`` selects ggml's fused attention kernel; the
    default path (mul_mat + softmax) is llama.cpp's default and gives its
    exact tokens.  Calls on one LLM are serialized by a lock, so it can be shared
    between threads.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, *, n_ctx: Optional[int] = None,
                 n_threads: Optional[int] = None, n_batch: int = 512, kv_type: str = "f16",
                 flash_attn: bool = False, repack: bool = True):
        t0 = time.perf_counter()
        self._lock = threading.RLock()
        self._session = None
        self._model = None
        self.path = resolve_model(model_path)
        self.gguf: GGUFFile = read_gguf(self.path)
        self.spec: ModelSpec = model_spec(self.gguf)
        n_ctx = min(self.spec.hparams["n_ctx_train"], DEFAULT_N_CTX) if n_ctx is None else n_ctx
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise InvalidArgumentError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        self._model = _core.open_model(self.path, self.spec.arch.name, self.spec.hparams,
                                       self.spec.global_tensors, self.spec.layer_tensors,
                                       self.spec.description, self.spec.matmul_weights(), repack)
        self._session = _core.new_session(self._model, n_ctx, n_batch,
                                          default_n_threads() if n_threads is None else n_threads,
                                          kv_type, flash_attn)
        self._cached: list[int] = []  # the tokens whose K/V are in the cache, in order
        self.load_time = time.perf_counter() - t0
        log.info("loaded %s (%s) in %.3f s", self.path, self.spec.description, self.load_time)

    # -- facts ---------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self._session_or_raise().n_ctx

    @property
    def n_vocab(self) -> int:
        return self.spec.hparams["n_vocab"]

    @property
    def n_past(self) -> int:
        return self._session_or_raise().n_past

    @property
    def n_evaluated(self) -> int:
        """Tokens evaluated by this LLM's session since it was opened."""
        return self._session_or_raise().n_evaluated

    @property
    def hparams(self) -> dict:
        return dict(self.spec.hparams)

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def eos_ids(self) -> frozenset[int]:
        ids = set()
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            value = self.gguf.get(key)
            if isinstance(value, int) and 0 <= value < self.n_vocab:
                ids.add(value)
        return frozenset(ids)

    # -- evaluation ------------------------------------------------------------

    def eval(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` after what is cached; returns float32 logits."""
        with self._lock:
            session = self._session_or_raise()
            out = session.eval(tokens, all_logits=all_logits)
            self._cached.extend(int(t) for t in np.asarray(tokens).reshape(-1))
            return out

    def reset(self) -> None:
        """Forget the cached context."""
        with self._lock:
            self._session_or_raise().rewind(0)
            self._cached.clear()

    def rewind(self, n_past: int) -> None:
        with self._lock:
            self._session_or_raise().rewind(n_past)
            del self._cached[n_past:]

    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Bring the cache to exactly ``prompt_ids`` and return the last logits.

        Only the tokens after the longest common prefix with the cache are
        evaluated; at least one is, because its logits are the result.
        """
        ids = self._check_ids(prompt_ids, "prompt")
        with self._lock:
            session = self._session_or_raise()
            keep = _common_prefix(self._cached, ids)
            keep = min(keep, len(ids) - 1)
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

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
            if self._model is not None:
                self._model.close()
            self._session = None
            self._model = None

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checks ----------------------------------------------------------------

    def _session_or_raise(self):
        from .errors import ClosedError
        if self._session is None:
            raise ClosedError("this LLM is closed")
        return self._session

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
