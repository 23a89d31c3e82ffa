"""One served model: its slots, its sessions, and opening and closing its ``LLM``.

A model's capacity is ``parallel`` requests at once.  Each request holds a
slot from the moment it is accepted and runs on a session of its own
(one of the model's idle pool, which keeps its cache for prefix reuse, or a
new one), given back or closed before the slot is.  Requests
beyond ``parallel`` wait in a bounded queue for a bounded time; past
either bound they get a 503 with ``Retry-After``, so nothing waits without limit.
The KV cache holds ``parallel`` full contexts, so running requests never
wait for cells (idle sessions' caches give way to them).

The slots are the model's reference count: it is unloaded (when idle for
``keep_alive``, or to make room for another model in the pool) only while
no request holds one, so a request never sees its model closed under it.
Which model loads and which gives way is the pool's decision
(:mod:`.pool`); this class only does what it is told, once at a time.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import anyio

from ..api.options import DEFAULT_N_CTX, padded_cells
from .config import ServerConfig
from .errors import overloaded

log = logging.getLogger("elelem.server")

_FIRST_PART = re.compile(r"-00001-of-\d{5}$")


class ServedModel:
    """One ``--model``: its id, how to open it, and the requests on it."""

    def __init__(self, source: str, config: ServerConfig, open_llm: Callable[..., object],
                 id: Optional[str] = None):
        self.source = source
        # A split model is named by its first part's file, less the part's number.
        self.id = id or (_FIRST_PART.sub("", Path(source).stem) if source.endswith(".gguf") else source)
        self._config = config
        self._open_llm = open_llm
        self._llm: Any = None   # the open LLM (or what open_llm made)
        self.load_lock = threading.Lock()   # one load or unload at a time; requests wait for it
        self._state = threading.Lock()      # guards the counts below
        self._sessions: set = set()         # sessions of requests now running (cancel_all)
        self._idle: list = []               # sessions of finished requests, with their caches
        self.in_flight = 0                  # requests holding a slot
        self.queued = 0                     # requests waiting for one
        self._slots: Optional[anyio.Semaphore] = None
        self.last_used = time.monotonic()
        self.loaded_at: Optional[float] = None
        self.loading = False                # being opened now (the pool counts it as loaded)
        self.load_error: Optional[str] = None  # why the last load failed, until one succeeds
        self._footprint: Optional[int] = None
        # How a request's session gets its LLM: the pool puts its own loader here, which makes room first.
        self.loader: Callable[[ServedModel], Any] = ServedModel.load
        self.on_release: Callable[[], None] = lambda: None  # the pool hears of every slot given back
        self.on_unload: Callable[[ServedModel], None] = lambda model: None  # ... and of every unload
        # The tokenizer of the LLM last unloaded, kept (while the pool likes) for the next load to
        # share: loading again then builds none (api/assets.py).
        self.kept_tokenizer: Any = None

    def configure(self, config: ServerConfig) -> None:
        """This model's own settings (its preset's), before it is first used."""
        self._config = config

    @property
    def llm(self):
        """The open LLM, or None when it is not loaded."""
        return self._llm

    @property
    def loaded(self) -> bool:
        llm = self._llm
        return llm is not None and not llm.closed

    @property
    def state(self) -> str:
        """``loaded``, ``loading``, ``unloaded``, or ``failed`` (the last load raised)."""
        if self.loading:
            return "loading"
        if self.loaded:
            return "loaded"
        return "failed" if self.load_error is not None else "unloaded"

    async def reserve(self) -> None:
        """Take a slot for one request, waiting in the queue for at most ``queue_timeout``
        seconds; a 503 with Retry-After when the queue is full or the wait too long."""
        config = self._config
        with self._state:
            if self.in_flight + self.queued >= config.parallel + (config.max_queue or 0):
                raise overloaded(f"model {self.id!r} is running {self.in_flight} requests (--parallel) and "
                                 f"{self.queued} wait, the most it queues; retry shortly", config.retry_after_seconds)
            self.queued += 1
            if self._slots is None:  # made in the event loop, which alone takes and returns slots
                self._slots = anyio.Semaphore(config.parallel)
        try:
            with anyio.fail_after(config.queue_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise overloaded(f"model {self.id!r} had no free slot for {config.queue_timeout:g} s; retry shortly",
                             config.retry_after_seconds) from None
        finally:
            with self._state:
                self.queued -= 1
        with self._state:
            self.in_flight += 1
            self.last_used = time.monotonic()

    def release(self) -> None:
        """Give the slot back (in the event loop), once the request's session is closed."""
        with self._state:
            self.in_flight -= 1
            self.last_used = time.monotonic()
        if self._slots is not None:  # made by the reserve() that took this slot
            self._slots.release()
        self.on_release()

    def load(self):
        """The LLM, opened now if it is not yet (blocking: call from a worker thread)."""
        with self.load_lock:
            return self.open()

    def open(self):
        """The LLM, opened now if it is not yet; the caller holds ``load_lock``."""
        if not self.loaded:
            n_ctx = self._config.n_ctx or _default_n_ctx(self.source)
            t0 = time.perf_counter()
            self.loading = True
            try:
                self._llm = self._open_llm(self.source, **self._config.model_options(n_ctx))
                self._llm.chat_template  # built now, not in the first request; the tokenizer's tables too
                getattr(self._llm.tokenizer, "build_tables", lambda: None)()
            except BaseException as error:
                self._llm = None
                self.load_error = f"{type(error).__name__}: {error}"
                raise
            finally:
                self.loading = False
            self.load_error = None
            self.kept_tokenizer = None   # the LLM holds it now (shared, if it was this one)
            self.loaded_at = self.last_used = time.monotonic()
            offload = getattr(self._llm, "offload", None)
            log.info("loaded %s in %.2f s: %s", self.id, time.perf_counter() - t0,
                     offload.summary if offload is not None else "offload unknown")
        return self._llm

    def footprint(self) -> int:
        """The memory the model takes loaded, estimated before loading it: the file's
        weights and a KV cache of ``parallel`` contexts in f16 (what the memory budget counts)."""
        if self._footprint is None:
            self._footprint = _estimate_bytes(self.source, self._config)
        return self._footprint

    @property
    def offload(self) -> Optional[dict]:
        """Where the loaded model's layers run (LLM.offload), None while it is not loaded."""
        llm = self._llm
        offload = getattr(llm, "offload", None) if llm is not None and not llm.closed else None
        return offload.as_dict() if offload is not None else None

    @contextmanager
    def session(self) -> Iterator[object]:
        """A session for one request, in its slot: an idle one if there is one, else a new one.

        After a request that ended normally the session goes back to the idle
        pool with its cache, so the next request shares the prefix it holds
        (the chat template's preamble, an earlier turn of the conversation);
        the engine drops idle sessions' cells, least recently used first,
        when running requests need them.  After a failure or a cancel (the
        client left) the session is closed, its cells freed at once.
        """
        llm = self.loader(self)
        with self._state:
            session = self._idle.pop() if self._idle else None
            if session is not None and session.closed:  # the LLM was reloaded meanwhile
                session = None
        if session is None:
            session = llm.new_session()
        with self._state:
            self._sessions.add(session)
        reusable = False
        try:
            yield session
            reusable = True
        finally:
            with self._state:
                self._sessions.discard(session)
                if reusable and not session.closed:
                    self._idle.append(session)
                    session = None
            if session is not None:
                session.close()

    def close_idle_sessions(self) -> int:
        """Close the idle pool's sessions, freeing their cells; returns how many."""
        with self._state:
            idle, self._idle = self._idle, []
        for session in idle:
            session.close()
        return len(idle)

    @property
    def idle_sessions(self) -> int:
        return len(self._idle)

    def cancel_all(self) -> int:
        """Stop every running request's generation (shutdown); returns how many."""
        with self._state:
            sessions = list(self._sessions)
        for session in sessions:
            session.cancel()
        return len(sessions)

    def unload(self, why: str, idle_seconds: float = 0.0) -> bool:
        """Close the LLM if no request holds a slot (and none did for ``idle_seconds``);
        False when it is in use or not loaded.  Blocking: call from a worker thread."""
        with self._state:
            idle = self.in_flight == 0 and time.monotonic() - self.last_used >= idle_seconds
        if not idle or self._llm is None:
            return False
        with self.load_lock, self._state:
            if self.in_flight or self._llm is None:  # a request arrived meanwhile
                return False
            self._idle = []
            llm, self._llm = self._llm, None
            self.loaded_at = None
        llm.close()  # closes its sessions too; no request can reach it now
        self.kept_tokenizer = getattr(llm, "tokenizer", None)
        log.info("unloaded %s: %s", self.id, why)
        self.on_unload(self)
        return True

    def unload_if_idle(self, idle_seconds: float) -> bool:
        return self.unload(f"{idle_seconds:.0f} s without requests", idle_seconds)

    def drop_kept_tokenizer(self) -> None:
        """Let the kept tokenizer go (freed unless a loaded model shares it)."""
        self.kept_tokenizer = None

    def close(self) -> None:
        with self.load_lock:
            self._idle = []
            self.kept_tokenizer = None
            if self._llm is not None:
                self._llm.close()
                self._llm = None


def _default_n_ctx(source: str) -> int:
    """The LLM's own default (the trained context, at most 4096), read from the header
    before opening it, since the KV cache is sized from it."""
    from ..gguf.reader import read_gguf
    from ..model.architectures import model_spec
    from ..model.hub import resolve_model
    return min(model_spec(read_gguf(resolve_model(source))).hparams["n_ctx_train"], DEFAULT_N_CTX)


def _estimate_bytes(source: str, config: ServerConfig) -> int:
    from ..api.devices import kv_layer_bytes
    from ..gguf.reader import read_gguf
    from ..model.architectures import model_spec
    from ..model.hub import resolve_model
    path = resolve_model(source)
    try:
        h = model_spec(read_gguf(path)).hparams
    except Exception:  # noqa: B902 -- an estimate; loading it reports what is wrong
        return os.path.getsize(path)
    n_ctx = config.n_ctx or min(h["n_ctx_train"], DEFAULT_N_CTX)
    cells = padded_cells(n_ctx * config.parallel)
    kv = h["n_layer"] * kv_layer_bytes(cells, h.get("n_head_kv", h.get("n_head", 0)), h.get("head_dim_k", 0),
                                       h.get("head_dim_v", 0), "f16", "f16")
    return os.path.getsize(path) + kv
