"""The model pool: the models of one server, by name, and which of them are loaded.

Every model of ``--model`` and ``--models-dir`` is known from the start;
each is opened on first use, one engine (one ``LLM``, with its own slots and
KV cache) per loaded model, all in this process.  A process of its own per
model, as llama.cpp's router runs them, would cost a second copy of the HTTP
side and a hop per token; here the engines share the process (their compute
runs with the GIL released) and a model that fails to load only fails the
requests that asked for it.

Past ``max_loaded`` models, or ``max_memory`` bytes of weights and KV caches
(estimated from the files before loading), the model to load makes room by
unloading the least recently used model that no request holds; when every
loaded model is in use it waits for one to finish, for at most
``load_timeout`` seconds (then a 503).  A model is loaded once however many
requests ask for it at the same time: the others wait for that load, for
the same bounded time.  A load runs in a thread of its own (never in the
event loop), at the lowest OS priority while other models are loaded, so the
requests for those go on meanwhile at nearly their own speed (:mod:`.quiet_load`).
The last few models unloaded keep their tokenizer (``KEPT_TOKENIZERS``), so
that loading one of them again is the weights alone.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Optional

from .config import ServerConfig
from .errors import APIError, overloaded
from .quiet_load import load_window, run_beside
from .served import ServedModel

log = logging.getLogger("elelem.server")

#: unloaded models that keep their tokenizer for their next load, the last unloaded ones
#: (a tokenizer is 15-65 MB of Python objects: SmolLM2's, Qwen2's, Gemma 3's)
KEPT_TOKENIZERS = 4


class ModelPool:
    """The models of one server, by id (or by the name or path they were given)."""

    def __init__(self, config: ServerConfig, open_llm: Optional[Callable[..., object]] = None):
        if open_llm is None:
            from ..api.llm import LLM  # the native core loads here, not when the app is built
            open_llm = LLM
        self.config = config
        self.models: list[ServedModel] = []
        self._by_name: dict[str, ServedModel] = {}
        for source in config.models:
            if source in self._by_name:
                continue  # given twice (a --model inside --models-dir)
            model = ServedModel(source, config, open_llm)
            if model.id in self._by_name:  # two files of one name in different folders: the path tells them apart
                model.id = source
            model.configure(config.for_model(model.id, source))
            model.loader = self.load
            model.on_release = self._released
            model.on_unload = self._unloaded
            self.models.append(model)
            self._by_name.setdefault(model.id, model)
            self._by_name.setdefault(source, model)
        self._cond = threading.Condition()  # guards which models are loaded or loading; notified on every change
        self._evicting: set[ServedModel] = set()
        self._stop = threading.Event()
        self._reaper: Optional[threading.Thread] = None
        self._kept: list[ServedModel] = []  # unloaded models keeping their tokenizer, the last unloaded last
        self._kept_lock = threading.Lock()

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

    def load_at_startup(self) -> None:
        """The first ``--model``, before the server accepts requests (none with ``--models-dir`` alone)."""
        if self.config.preload and self.models:
            self.load(self.default)

    def load(self, model: ServedModel):
        """``model``'s LLM, loaded now if it is not, after making room (blocking: call from a
        worker thread).  A failed load is an error for the request that asked, and the next
        request tries again."""
        if model.loaded:
            return model.llm
        timeout = self.config.load_timeout
        if not model.load_lock.acquire(timeout=-1 if math.isinf(timeout) else timeout):
            raise overloaded(f"the model {model.id!r} is still loading after {timeout:g} s; retry shortly",
                             self.config.retry_after_seconds)
        try:
            if model.loaded:  # another request loaded it while this one waited
                return model.llm
            others_loaded = any(m.loaded for m in self.models if m is not model)
            llm = run_beside(lambda: self._load_now(model), f"elelem-load-{model.id}", low_priority=others_loaded)
            engine = getattr(llm, "engine", None)  # absent from what a test's open_llm makes
            if others_loaded and engine is not None:
                engine.restart_threads()  # its steps' workers at this thread's priority, not the load's
            return llm
        finally:
            model.load_lock.release()

    def _load_now(self, model: ServedModel):
        """Make room for ``model`` and open it (in the load's own thread; the caller holds its load_lock)."""
        self._make_room(model)
        try:
            with load_window():
                return model.open()
        except Exception as error:  # noqa: B902 -- any failure of the file or the library
            log.error("loading %s failed: %s", model.id, model.load_error)
            raise APIError(500, f"the model {model.id!r} failed to load: {model.load_error}",
                           type="server_error", code="model_load_failed") from error
        finally:
            model.loading = False
            with self._cond:
                self._cond.notify_all()

    def unload(self, model: ServedModel) -> bool:
        """Unload ``model`` now; False if a request holds it (or it is not loaded)."""
        return model.unload("asked to")

    def _make_room(self, model: ServedModel) -> None:
        """Unload the least recently used idle models until ``model`` fits; marks it loading."""
        deadline = time.monotonic() + self.config.load_timeout
        with self._cond:
            while True:
                resident = [m for m in self.models if m is not model and (m.loaded or m.loading)]
                if not self._over(model, resident):
                    break
                idle = [m for m in resident if m.loaded and not m.loading and m.in_flight == 0
                        and m not in self._evicting]
                if idle:
                    victim = min(idle, key=lambda m: m.last_used)
                    self._evicting.add(victim)
                    self._cond.release()  # closing a model takes a while; the others need not wait for it
                    try:
                        victim.unload(f"making room for {model.id} (least recently used)")
                    finally:
                        self._cond.acquire()
                        self._evicting.discard(victim)
                        self._cond.notify_all()
                    continue
                if not resident:  # it alone is over the memory budget: nothing to give way
                    log.warning("%s needs %.0f MiB, past --max-memory alone; loading it anyway",
                                model.id, model.footprint() / 2**20)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    raise overloaded(f"the model {model.id!r} cannot be loaded: every loaded model is in use "
                                     f"({', '.join(m.id for m in resident)}); retry shortly",
                                     self.config.retry_after_seconds)
                self._cond.wait(None if math.isinf(remaining) else remaining)
            model.loading = True  # counted from now on, so two loads do not both take the last place

    def _over(self, model: ServedModel, resident: list[ServedModel]) -> bool:
        config = self.config
        if config.max_loaded is not None and len(resident) + 1 > config.max_loaded:
            return True
        return config.max_memory is not None and \
            sum(m.footprint() for m in resident) + model.footprint() > config.max_memory

    def _unloaded(self, model: ServedModel) -> None:
        """``model`` keeps its tokenizer, so that loading it again builds none; the models
        unloaded before the last ``KEPT_TOKENIZERS`` let theirs go."""
        with self._kept_lock:
            self._kept = [m for m in self._kept if m is not model and m.kept_tokenizer is not None] + [model]
            older, self._kept = self._kept[:-KEPT_TOKENIZERS], self._kept[-KEPT_TOKENIZERS:]
        for old in older:
            old.drop_kept_tokenizer()

    def _released(self) -> None:
        with self._cond:  # a model may have become free to unload for one waiting to load
            self._cond.notify_all()

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
        with self._cond:
            self._cond.notify_all()
        if self._reaper is not None:
            self._reaper.join()
        for model in self.models:
            model.close()
