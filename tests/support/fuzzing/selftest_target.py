"""A target that misbehaves on request, to test the harness itself (tests/test_fuzz.py).

A case file holds one word: ``ok``, ``reject`` (an allowed ValueError),
``raise`` (an unexpected TypeError), ``abort`` (SIGABRT, as a GGML_ASSERT
does), ``segv`` (SIGSEGV), ``hang`` (sleeps past any time limit) or
``exit-later`` (passes, but makes the runner exit with status 3 at shutdown)
or ``allocate`` (asks for 2 GiB at once, over the runner's memory cap).
"""
from __future__ import annotations

import atexit
import ctypes
import os
import time
from pathlib import Path

from .outcomes import PASS, Outcome, from_exception


def execute(path: Path) -> Outcome:
    action = path.read_text().strip()
    try:
        if action == "reject":
            raise ValueError("refused, as documented")
        if action == "raise":
            raise TypeError("nobody expected this")
        if action == "abort":
            os.abort()
        if action == "segv":
            ctypes.string_at(0)
        if action == "hang":
            time.sleep(3600)
        if action == "allocate":
            bytearray(2 << 30)
        if action == "exit-later":
            atexit.register(os._exit, 3)
    except Exception as error:  # noqa: BLE001
        return from_exception(error, "selftest", (ValueError,))
    return Outcome(PASS, "selftest")
