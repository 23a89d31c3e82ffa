"""How a model's load keeps out of the way of the models answering meanwhile.

Loading Qwen2.5-Coder-0.5B in this process, beside the engines of the other
models, is about 0.07 s of CPU in ``LLM()`` (reading the header, mapping and
repacking the weights, which the core does without the GIL) and 0.2-0.3 s
of Python building the tokenizer and the chat template, which holds the GIL.
``benchmarks/load_gil.py`` splits the other models' request time while loads
run into their own CPU, the OS run queue and time blocked (the GIL); these
take the load out of their way:

- The load runs in a thread of its own at the lowest OS priority (Linux:
  nice 19, which is per thread), so it takes the CPU time the running
  engines leave.  At normal priority it took half of whatever CPU the
  process got: Linux shares the CPUs between sessions first (autogroups),
  then between the threads of one, so on a busy machine the other models'
  requests took twice as long while a load ran, even with the load in a
  process of its own.
- The GIL changes hands every 0.2 ms instead of Python's 5 ms: the engines'
  steps take the GIL back several times per token, and each time waited up
  to 5 ms for the tokenizer's Python to let go.
- The tokenizer's tables are built in C calls of a fraction of a
  millisecond each (:mod:`elelem.gguf.short_holds`): Python hands the GIL
  over only between bytecodes, and one ``dict(zip(...))`` over 151,000
  tokens was a single hold of 30 ms.  Tokenizer metadata that passed its
  checks once in the process is not checked again
  (:func:`~elelem.gguf.tokenizer_metadata.validate_tokenizer_metadata`), so
  a model unloaded and loaded again spends about half the Python it did.
- The cyclic garbage collector is paused during the load: the collections
  that a tokenizer's hundreds of thousands of new objects set off traversed
  them all in one hold of the GIL, up to 30 ms of CPU at a time.  Once it
  is enabled again the next collection traverses them once.  (Not
  ``gc.freeze``: that would keep every object alive at that moment out of
  the collector for good, in a server that loads models for hours, and
  with them any reference cycle among the requests then running.)  The
  tokenizer's big tables are tuples, which a collection looks at once:
  lists of Qwen2's strings were visited item by item at every full
  collection afterwards, 25 ms each.
- Closing the model that makes room (in this thread too) frees its weights
  without the GIL (``Model.close``), and gives their pages back a few
  megabytes at a time before unmapping them (``_native/pages.pxi``): one
  munmap of a 0.5B model's weights held the process's memory-map lock for
  20 ms, and every other thread's mmap and brk (the engines' Python and
  NumPy allocations, mid-request) waited.  (Its Python objects are freed at
  once, 10-15 ms of the GIL: freed in slices, measured, the other model's
  requests lost more, the load's Python running longer between their steps.)
- The scheduler of the new model's context is made without the GIL (ggml
  zeroes its tables: 20 ms).
- Models of one tokenizer share it, and the last unloaded models keep
  theirs (:mod:`.pool`): a model loaded again builds no tokenizer.  Beside
  such a load, the other models' requests took 0.99-1.08x their quiet time
  at p99 (``benchmarks/serve_pool.py``, 2 cores).

What is left: a model's first load builds its tokenizer, 0.1 s of Python
for Qwen2's 151,936 tokens in short holds of the GIL, which beside it costs
the other models' requests a few milliseconds each (``load_gil.py`` without
``--keep-tokenizer``).
"""
from __future__ import annotations

import gc
import logging
import os
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

log = logging.getLogger("elelem.server")

T = TypeVar("T")

LOAD_NICE = 19             # the lowest priority: the load takes only CPU time nothing else wants
LOAD_SWITCH_INTERVAL = 0.0002  # seconds; Python's default is 0.005


class _LoadWindow:
    """The process-wide settings while at least one load runs: short GIL slices, no cyclic GC."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = 0
        self._saved_interval = 0.005
        self._gc_was_enabled = True

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._running == 0:
                self._saved_interval = sys.getswitchinterval()
                self._gc_was_enabled = gc.isenabled()
                sys.setswitchinterval(LOAD_SWITCH_INTERVAL)
                gc.disable()
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    if self._gc_was_enabled:
                        gc.enable()
                    sys.setswitchinterval(self._saved_interval)


load_window = _LoadWindow()


def _lower_this_thread() -> None:
    """This thread to the lowest priority, where the OS sets it per thread (Linux)."""
    if not sys.platform.startswith("linux"):
        return  # elsewhere a nice value is the whole process's
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOAD_NICE)
    except OSError as error:  # a sandbox may refuse; the load then runs at the usual priority
        log.debug("could not lower the load thread's priority: %s", error)


def run_beside(work: Callable[[], T], name: str, low_priority: bool) -> T:
    """``work()`` in a new thread (at the lowest priority with ``low_priority``), waited for;
    its result, or its exception raised here.  A new thread each time, since a thread's
    priority, once lowered, cannot be raised again without privileges."""
    outcome: dict = {}

    def body() -> None:
        if low_priority:
            _lower_this_thread()
        try:
            outcome["value"] = work()
        except BaseException as error:  # noqa: B902 -- handed to the waiting thread as it is
            outcome["error"] = error

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
