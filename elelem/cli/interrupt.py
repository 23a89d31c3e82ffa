"""Ctrl-C that stops an answer at once, even in the middle of a long native step.

While ggml computes, the main thread is inside native code and Python's own
SIGINT handler cannot run until the step ends (seconds, for a long prefill).
So the signal is also written to a wakeup pipe, which a watcher thread reads
at once and turns into ``session.cancel()``: the native step aborts, and the
generating call raises ``KeyboardInterrupt`` itself.  While an answer is being
generated, the Python-level handler only records the interrupt, so exactly one
``KeyboardInterrupt`` comes out of the generation; anywhere else Ctrl-C
raises ``KeyboardInterrupt`` as usual.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator, Optional


class AnswerInterrupts:
    """Install once (main thread); wrap each answer in :meth:`generating`."""

    def __init__(self) -> None:
        self._session = None
        self.interrupted = False
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals only reach the main thread; keep Python's default
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._on_sigint)
        threading.Thread(target=self._watch, args=(read_fd,), name="elelem-sigint", daemon=True).start()
        self._installed = True

    @contextlib.contextmanager
    def generating(self, session) -> Iterator["AnswerInterrupts"]:
        """Ctrl-C inside this block cancels ``session``'s generation (and sets ``interrupted``)."""
        self.interrupted = False
        self._session = session
        try:
            yield self
        finally:
            self._session = None

    def _on_sigint(self, signum, frame) -> None:
        session: Optional[object] = self._session
        if session is None:
            raise KeyboardInterrupt
        # Only record it: the watcher thread cancels.  Cancelling here, in the main
        # thread, deadlocked when the signal landed while this thread held the
        # engine's lock (planning a step, drafting tokens): cancel() takes that lock.
        self.interrupted = True

    def _watch(self, read_fd: int) -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            session = self._session
            if session is not None and signal.SIGINT in data:
                session.cancel()
