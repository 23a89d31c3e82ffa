"""Failing inputs kept as regression fixtures (``tests/support/fixtures/crashers/*.json``).

One JSON file per distinct failure, named by the target and a hash of the
failure's *signature* (the assert or sanitizer line for a crash, the exception
type and the innermost elelem frame for an unexpected exception), so a
campaign that hits the same bug a thousand times keeps one input for it.

A fixture is self-contained: the case input (for GGUF, the mutated bytes
compressed inline; tensor data of a packaged model by file name), what was
seen, how it was found, and a ``status``: ``"open"`` while the bug is not
fixed (the replay test expects the failure and xfails), ``"fixed"`` once it
is (the replay test then requires a pass).  Fixing a bug means flipping its
fixture to ``"fixed"``; the strict xfail reminds whoever fixes it.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Optional

from .driver import Failure
from .outcomes import CRASH, HANG, UNEXPECTED

ROOT = Path(__file__).resolve().parents[3]
FIXTURES_DIR = ROOT / "tests" / "support" / "fixtures" / "crashers"

# What a dying process says, most specific first: ggml's abort message
# ("path/file.cpp:123: message"), a sanitizer's report, Python's last words
# (faulthandler's "Fatal Python error: Segmentation fault").
_CRASH_LINES = (
    re.compile(r"(third_party/ggml/\S+:\d+): (GGML_ASSERT\(.*?\) failed|[^:\n]*)"),
    re.compile(r"ERROR: AddressSanitizer: ([\w-]+)"),
    re.compile(r"(\S+:\d+:\d+: runtime error: [^\n]*)"),
    re.compile(r"Fatal Python error: (\w+)"),
)
# One name per kind of death, whichever tool reported it, so that a bug has
# the same signature with and without the sanitizers.
_CANONICAL = {"Segmentation": "SEGV", "SEGV": "SEGV", "Aborted": "abort", "Bus": "SIGBUS",
              "Floating": "SIGFPE", "Illegal": "SIGILL"}
_PY_FRAME = re.compile(r'File "[^"]*?/?((?:elelem|tools)/[^"]+)", line (\d+)(?:, in | in )(\S+)')


def signature(failure: Failure) -> str:
    """A short, stable description of *which* bug a failure is (not which input)."""
    o = failure.outcome
    text = f"{o.detail}\n{failure.stderr_tail}"
    if o.status in (CRASH, HANG):
        parts = [o.status]
        for pattern in _CRASH_LINES:
            match = pattern.search(text)
            if match:
                found = ": ".join(g for g in match.groups() if g)
                parts.append(_CANONICAL.get(found, found if pattern is _CRASH_LINES[0] or pattern is
                                            _CRASH_LINES[2] else f"ASan {found}")[:200])
                break
        # The innermost elelem frame of faulthandler's dump (most recent call
        # first), by file and function, not line: elelem's own files change.
        frames = [f for f in _PY_FRAME.findall(text) if f[0].startswith("elelem/")]
        if frames:
            path, _, func = frames[0]
            parts.append(f"{path} {func}")
        return " | ".join(p for p in parts if p)
    if o.status == UNEXPECTED:
        frames = [f for f in _PY_FRAME.findall(o.detail) if f[0].startswith("elelem/")]
        where = f" at {frames[-1][0]} {frames[-1][2]}" if frames else ""
        # Cython frames look like: File "elelem/_core.pyx", line 338, in elelem._core._fill_hparams
        cython = re.findall(r'File "(elelem/[^"]+\.(?:pyx|pxi))", line \d+, in (\S+)', o.detail)
        if cython:
            where = f" at {cython[-1][0]} {cython[-1][1]}"
        return f"unexpected {o.error} in {o.stage}{where}"
    return f"{o.status} {o.error} in {o.stage}"


def fixture_name(target: str, sig: str) -> str:
    return f"{target}-{hashlib.sha1(sig.encode()).hexdigest()[:10]}.json"


def save(failure: Failure, directory: Path = FIXTURES_DIR, *, shrink_timeout: float = 60.0) -> tuple[Path, bool]:
    """Write the failure's fixture unless one with the same signature exists; (path, new)."""
    sig = signature(failure)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / fixture_name(failure.target, sig)
    if path.exists():
        return path, False
    failure = shrink(failure, sig, shrink_timeout)
    o = failure.outcome
    record = {
        "target": failure.target,
        "signature": sig,
        "status": "open",
        "seen": {"status": o.status, "stage": o.stage, "error": o.error, "detail": o.detail[-3000:],
                 "reproduced_alone": failure.reproduced},
        "found": {"seed": failure.seed, "index": failure.index,
                  **{k: v for k, v in failure.info.items() if k != "input"}},
        "replay": f"python scripts/fuzz.py --replay tests/support/fixtures/crashers/{path.name}",
        "input": failure.info["input"],
    }
    path.write_text(json.dumps(record, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    return path, True


def shrink(failure: Failure, sig: str, case_timeout: float) -> Failure:
    """A GGUF failure with its tensor data zeroed, when it still fails the same way.

    Random weights do not compress, so this takes a fixture from ~150 KB to a
    few KB; the bugs a mutated header finds rarely depend on the weights.
    """
    pieces = failure.info["input"].get("pieces", []) if failure.target == "gguf" else []
    if len(pieces) < 2 or "zlib_b64" not in pieces[-1]:
        return failure
    import base64
    import dataclasses
    import tempfile
    import zlib
    from .driver import Case, run_batch
    from .gguf_target import write_fixture_input

    zeroed = [pieces[0]] + [{"zeros": len(zlib.decompress(base64.b64decode(p["zlib_b64"])))}
                            if "zlib_b64" in p else p for p in pieces[1:]]
    with tempfile.TemporaryDirectory() as tmp:
        case_path = write_fixture_input({"pieces": zeroed}, Path(tmp) / "shrunk.gguf")
        [(_, outcome, stderr)] = run_batch("gguf", [Case(0, case_path, {})], Path(tmp), case_timeout=case_timeout)
    candidate = dataclasses.replace(failure, outcome=outcome, stderr_tail=stderr,
                                    info={**failure.info, "input": {"pieces": zeroed}, "tensor_data": "zeroed"})
    return candidate if outcome.failed and signature(candidate) == sig else failure


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def all_fixtures(directory: Path = FIXTURES_DIR) -> list[Path]:
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def write_case(fixture: dict, directory: Path, *, copy_data: bool = False) -> Optional[Path]:
    """The fixture's input as a case file for the runner; None when it needs a model that is not cached."""
    target = fixture["target"]
    if target == "gguf":
        from .gguf_target import write_fixture_input
        try:
            return write_fixture_input(fixture["input"], directory / "replay.gguf", copy_data=copy_data)
        except FileNotFoundError:
            return None
    case = fixture["input"]
    if target == "tokenizer":
        from .tokenizer_target import available_vocabs
        if case["vocab"] not in available_vocabs():
            return None
    path = directory / f"replay-{target}.json"
    path.write_text(json.dumps(case), encoding="utf-8")
    return path
