"""The served models: each loaded on first use, kept while in use, unloaded when idle.

A model's capacity is ``parallel`` requests at once.  Each request holds a
slot from the moment it is accepted and runs on a session of its own
(one of the model's idle pool, which keeps its cache for prefix reuse, or a
new one), given back or closed before the slot is.  Requests
beyond ``parallel`` wait in a bounded queue for a bounded time; past
either bound they get a 503 with ``Retry-After``, so nothing waits without limit.
The KV cache holds ``parallel`` full contexts, so running requests never
wait for cells (idle sessions' caches give way to them).
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import anyio

from ..api.options import DEFAULT_N_CTX
from .config import ServerConfig
from .errors import APIError, overloaded

log = logging.getLogger("elelem.server")



class ServedModel:
    """One ``--model``: its id, how to open it, and the requests on it."""

    def __init__(self, source: str, config: ServerConfig, open_llm: Callable[..., object]):
        self.source = source
        self.id = Path(source).stem if source.endswith(".gguf") else source
        self._config = config
        self._open_llm = open_llm
        self._llm: Any = None   # the open LLM (or what open_llm made)
        self._load_lock = threading.Lock()  # one load at a time; requests wait for it
        self._state = threading.Lock()      # guards the counts below
        self._sessions: set = set()         # sessions of requests now running (cancel_all)
        self._idle: list = []               # sessions of finished requests, with their caches
        self.in_flight = 0                  # requests holding a slot
        self.queued = 0                     # requests waiting for one
        self._slots: Optional[anyio.Semaphore] = None
        self.last_used = time.monotonic()
        self.loaded_at: Optional[float] = None

    @property
    def llm(self):
        """The open LLM, or None when it is not loaded."""
        return self._llm

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

    def load(self):
        """The LLM, opened now if it is not yet (blocking: call from a worker thread)."""
        with self._load_lock:
            if self._llm is None or self._llm.closed:
                n_ctx = self._config.n_ctx or _default_n_ctx(self.source)
                t0 = time.perf_counter()
                self._llm = self._open_llm(self.source, **self._config.model_options(n_ctx))
                self._llm.tokenizer, self._llm.chat_template  # built now, not in the first request
                self.loaded_at = time.monotonic()
                offload = getattr(self._llm, "offload", None)
                log.info("loaded %s in %.2f s: %s", self.id, time.perf_counter() - t0,
                         offload.summary if offload is not None else "offload unknown")
            return self._llm

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
        llm = self.load()
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

    def unload_if_idle(self, idle_seconds: float) -> bool:
        with self._state:
            idle = self.in_flight == 0 and time.monotonic() - self.last_used >= idle_seconds
        if not idle or self._llm is None:
            return False
        with self._load_lock, self._state:
            if self.in_flight or self._llm is None:  # a request arrived meanwhile
                return False
            self._idle = []
            self._llm.close()  # closes its sessions too
            self._llm = None
            self.loaded_at = None
        log.info("unloaded %s after %.0f s without requests", self.id, idle_seconds)
        return True

    def close(self) -> None:
        with self._load_lock:
            self._idle = []
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


class ModelRegistry:
    """The models of one server, by id (or by the name or path they were given)."""

    def __init__(self, config: ServerConfig, open_llm: Optional[Callable[..., object]] = None):
        if open_llm is None:
            from ..api.llm import LLM  # the native core loads here, not when the app is built
            open_llm = LLM
        self.config = config
        self.models = [ServedModel(source, config, open_llm) for source in config.models]
        self._by_name: dict[str, ServedModel] = {}
        for model in self.models:
            self._by_name.setdefault(model.id, model)
            self._by_name.setdefault(model.source, model)
        self._stop = threading.Event()
        self._reaper: Optional[threading.Thread] = None

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    def get(self, name: Optional[str]) -> ServedModel:
        if name is None and len(self.models) == 1:
            return self.default
        model = self._by_name.get(name) if name is not None else None
        if model is None:
            known = ", ".join(m.id for m in self.models)
            raise APIError(404, f"the model {name!r} does not exist; this server has: {known}",
                           param="model", code="model_not_found")
        return model

    def start_reaper(self) -> None:
        """Unload models idle for ``keep_alive`` seconds, checking a few times per period."""
        keep_alive = self.config.keep_alive
        if keep_alive is None:
            return

        def reap():
            while not self._stop.wait(min(max(keep_alive / 4, 0.05), 5.0)):
                for model in self.models:
                    try:
                        model.unload_if_idle(keep_alive)
                    except Exception:  # the reaper must outlive one failure
                        log.exception("unloading %s failed", model.id)
        self._reaper = threading.Thread(target=reap, name="elelem-server-keep-alive", daemon=True)
        self._reaper.start()

    def cancel_all(self) -> int:
        return sum(model.cancel_all() for model in self.models)

    def close(self) -> None:
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join()
        for model in self.models:
            model.close()
