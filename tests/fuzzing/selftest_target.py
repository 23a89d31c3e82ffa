"""A target that misbehaves on request, to test the harness itself (tests/test_fuzz.py).

A case file holds one word: ``ok``, ``reject`` (an allowed ValueError),
``raise`` (an unexpected TypeError), ``abort`` (SIGABRT, as a GGML_ASSERT
does), ``segv`` (SIGSEGV) or ``hang`` (sleeps past any time limit).
"""
from __future__ import annotations

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
    except Exception as error:  # noqa: BLE001
        return from_exception(error, "selftest", (ValueError,))
    return Outcome(PASS, "selftest")
