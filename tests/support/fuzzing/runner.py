"""The subprocess that runs fuzz cases: ``python -m fuzzing.runner TARGET PROGRESS CASES``.

``CASES`` is a file with one case path per line.  For each case the runner
appends ``{"start": path}`` to ``PROGRESS`` *before* running it and
``{"end": path, "outcome": {...}}`` after, each with one unbuffered
``os.write``: when the process dies, the driver finds the case that killed it
as the last one started and never ended.  ``{"ready": ...}`` comes first, once
the target's imports are done, so start-up time never counts against a case.

The runner enables ``faulthandler`` (a Python traceback on stderr when a
signal kills it), tells ggml not to attach gdb on an abort
(``GGML_NO_BACKTRACE``), and caps its address space for each case (unless a
sanitizer is loaded: their shadow memory needs terabytes of it): what the
process already uses, plus :data:`HEADROOM_BYTES`, plus twice the case file
(the model is mapped, and repacked weights are copied).  A small input that
makes elelem allocate from an unchecked count (a tensor count, a vocabulary
size, a context length read from the file) then fails inside that
allocation -- a ``MemoryError`` or a failed ``malloc``, which the targets
count as failures -- instead of passing because the machine had the memory.

The exit status is the driver's to read: 0 after the last case, anything else
(a crash at interpreter shutdown, say) is a failure of the batch.
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
# What one case may add to the address space (beyond its own file, twice).
# Every stage of a 64-token context on a synthetic model needs a few MB; a
# packaged model's compute buffers stay under 300 MB.
HEADROOM_BYTES = 1 << 30


def address_space_capped(env=os.environ) -> bool:
    """False where the cap is off: under a sanitizer, or with ELELEM_FUZZ_NO_RLIMIT set."""
    return not ("asan" in env.get("LD_PRELOAD", "") or env.get("ELELEM_FUZZ_NO_RLIMIT")) and \
        sys.platform.startswith("linux")


def _address_space_in_use() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _cap_address_space(case: Path) -> None:
    """Lower the soft RLIMIT_AS to what this case may use (the hard limit stays, so it can rise again)."""
    import resource
    try:
        size = case.stat().st_size
    except OSError:
        size = 0
    limit = _address_space_in_use() + HEADROOM_BYTES + 2 * size
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _uncap_address_space() -> None:
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def main(argv: list[str]) -> int:
    target, progress_path, cases_path = argv
    faulthandler.enable()
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    capped = address_space_capped()
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
        if capped:
            _cap_address_space(Path(line))
        started = time.perf_counter()
        outcome = module.execute(Path(line))
        outcome.seconds = round(time.perf_counter() - started, 4)
        if capped:
            _uncap_address_space()
        faulthandler.cancel_dump_traceback_later()
        emit({"end": line, "outcome": outcome.to_json()})
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
