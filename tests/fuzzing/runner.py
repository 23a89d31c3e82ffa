"""The subprocess that runs fuzz cases: ``python -m fuzzing.runner TARGET PROGRESS CASES``.

``CASES`` is a file with one case path per line.  For each case the runner
appends ``{"start": path}`` to ``PROGRESS`` *before* running it and
``{"end": path, "outcome": {...}}`` after, each with one unbuffered
``os.write``: when the process dies, the driver finds the case that killed it
as the last one started and never ended.  ``{"ready": ...}`` comes first, once
the target's imports are done, so start-up time never counts against a case.

The runner enables ``faulthandler`` (a Python traceback on stderr when a
signal kills it), tells ggml not to attach gdb on an abort
(``GGML_NO_BACKTRACE``), and caps its address space (unless a sanitizer is
loaded: their shadow memory needs terabytes of it) so a runaway allocation is a
``MemoryError`` rather than a machine-wide out-of-memory kill.
"""
from __future__ import annotations

import faulthandler
import importlib
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

TARGET_MODULES = {
    "gguf": "fuzzing.gguf_target",
    "tokenizer": "fuzzing.tokenizer_target",
    "template": "fuzzing.template_target",
    "selftest": "fuzzing.selftest_target",
}
ADDRESS_SPACE_LIMIT = 12 << 30


def _limit_address_space() -> None:
    if "asan" in os.environ.get("LD_PRELOAD", "") or os.environ.get("ELELEM_FUZZ_NO_RLIMIT"):
        return
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    except (ImportError, ValueError, OSError):
        pass


def main(argv: list[str]) -> int:
    target, progress_path, cases_path = argv
    faulthandler.enable()
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    _limit_address_space()
    module = importlib.import_module(TARGET_MODULES[target])
    if hasattr(module, "warm_up"):
        module.warm_up()
    fd = os.open(progress_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(record: dict) -> None:
        os.write(fd, (json.dumps(record) + "\n").encode())

    # Shortly before the driver kills a stalled case, print where it is stuck.
    stall_s = float(os.environ.get("ELELEM_FUZZ_CASE_TIMEOUT", "30")) * 0.9
    emit({"ready": time.time()})
    for line in Path(cases_path).read_text().splitlines():
        if not line:
            continue
        emit({"start": line, "t": time.time()})
        faulthandler.dump_traceback_later(stall_s, exit=False)
        started = time.perf_counter()
        outcome = module.execute(Path(line))
        outcome.seconds = round(time.perf_counter() - started, 4)
        faulthandler.cancel_dump_traceback_later()
        emit({"end": line, "outcome": outcome.to_json()})
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
