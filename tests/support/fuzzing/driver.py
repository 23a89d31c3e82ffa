"""Runs a campaign: cases written in batches, each batch in a runner subprocess.

A batch amortizes the interpreter's start-up (about 0.3 s with numpy, jinja2
and the core) over many cases.  When the runner dies or stalls, the case it
had started is the culprit (see :mod:`fuzzing.runner`); the rest of the
batch then runs in a fresh process, and the culprit is run once more on its
own to tell a reproducible failure from one that needed the cases before it.
A runner that finishes every case but exits with a status other than 0 (a
crash in a destructor at shutdown, say) fails its last case, the same way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

from .outcomes import CRASH, FAILURES, HANG, Outcome, describe_returncode

TOOLS_PARENT = Path(__file__).resolve().parents[1]  # tests/support/, which holds this package (not the repo root: that would shadow the installed elelem)
STARTUP_TIMEOUT_S = 120.0  # imports and warm-up (tokenizers of three real models; slower under ASan)
_STOP = threading.Event()  # set when the campaign is interrupted: every runner is killed


class CampaignStopped(Exception):
    """A runner was killed because the campaign was interrupted."""


class CaseWriter(Protocol):
    target: str

    def write(self, seed: int, index: int, directory: Path) -> tuple[Path, dict]: ...


@dataclass
class Case:
    index: int
    path: Path
    info: dict


@dataclass
class Failure:
    target: str
    seed: int
    index: int
    outcome: Outcome
    info: dict
    stderr_tail: str = ""
    reproduced: Optional[bool] = None  # crashes and hangs are re-run alone

    def title(self) -> str:
        o = self.outcome
        return f"{self.target} case {self.seed}:{self.index}: {o.status} in {o.stage or '?'}: {o.error}"


@dataclass
class Summary:
    target: str
    seed: int
    first_index: int
    iterations: int = 0
    counts: Counter = field(default_factory=Counter)         # status -> cases
    stage_counts: Counter = field(default_factory=Counter)   # "stage:status" -> cases
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> int:
        return sum(self.counts[s] for s in FAILURES)

    def lines(self) -> list[str]:
        out = [f"{self.target}: {self.iterations} cases (seed {self.seed}, from {self.first_index}) "
               f"in {self.seconds:.1f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))]
        if self.stage_counts:
            out.append("  stages: " + ", ".join(f"{k} {v}" for k, v in sorted(self.stage_counts.items())))
        for failure in self.failures:
            again = {None: "", True: " (reproduced alone)", False: " (NOT reproduced alone)"}[failure.reproduced]
            out.append(f"  FAIL {failure.title()}{again}")
        return out


def runner_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TOOLS_PARENT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["GGML_NO_BACKTRACE"] = "1"   # ggml would otherwise attach gdb to print a backtrace on abort
    # A sanitizer report must reach the runner's stderr, which the driver keeps
    # with the failure (a log file would be separated from its case).
    if "log_path=" in env.get("ASAN_OPTIONS", ""):
        env["ASAN_OPTIONS"] = ":".join(o for o in env["ASAN_OPTIONS"].split(":") if not o.startswith("log_path="))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def run_batch(target: str, cases: list[Case], work: Path, *, case_timeout: float,
              python: str = sys.executable) -> list[tuple[Case, Outcome, str]]:
    """Run ``cases`` in as few runner processes as failures allow; one result per case."""
    results: list[tuple[Case, Outcome, str]] = []
    remaining = list(cases)
    while remaining:
        done, culprit, stderr, returncode = _run_process(target, remaining, work, case_timeout, python)
        results += [(case, outcome, "") for case, outcome in done]
        if culprit is None and len(done) == len(remaining) and returncode != 0:
            # Every case ended, then the process did not exit cleanly.
            case, _, _ = results.pop()
            culprit = (case, Outcome(CRASH, "exit", f"runner {describe_returncode(returncode)} after its last case",
                                     _crash_detail(stderr)))
        if culprit is None and len(done) < len(remaining):
            if not done:  # no case even started: the harness is broken, not elelem
                raise RuntimeError(f"the fuzz runner for {target!r} died before its first case:\n{stderr[-3000:]}")
            # Died between two cases: the last one left something broken behind.
            case, _, _ = results.pop()
            culprit = (case, Outcome(CRASH, "after the case", "runner died between cases", _crash_detail(stderr)))
        if culprit is None:
            break
        case, outcome = culprit
        results.append((case, outcome, stderr))
        remaining = remaining[remaining.index(case) + 1:]
    return results


def _run_process(target: str, cases: list[Case], work: Path, case_timeout: float, python: str):
    """One runner process over ``cases``: (finished cases, culprit or None, stderr, exit status)."""
    fd, list_name = tempfile.mkstemp(prefix="cases-", suffix=".txt", dir=work)
    os.close(fd)
    Path(list_name).write_text("".join(f"{c.path}\n" for c in cases))
    progress = Path(list_name).with_suffix(".progress")
    stderr_path = Path(list_name).with_suffix(".stderr")
    by_path = {str(c.path): c for c in cases}
    done: list[tuple[Case, Outcome]] = []
    started: Optional[tuple[str, float]] = None
    ready = False
    launched = time.monotonic()
    env = runner_env()
    env["ELELEM_FUZZ_CASE_TIMEOUT"] = str(case_timeout)
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen([python, "-m", "fuzzing.runner", target, str(progress), list_name],
                                stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=work)
    offset = 0
    timed_out = False
    try:
        while True:
            exited = proc.poll() is not None
            if progress.exists():
                with open(progress, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                complete = chunk[:chunk.rfind(b"\n") + 1]
                offset += len(complete)
                for line in complete.splitlines():
                    record = json.loads(line)
                    if "ready" in record:
                        ready = True
                    elif "start" in record:
                        started = (record["start"], time.monotonic())
                    else:
                        done.append((by_path[record["end"]], Outcome.from_json(record["outcome"])))
                        started = None
            if exited:
                break
            if _STOP.is_set():
                raise CampaignStopped()
            now = time.monotonic()
            if (started and now - started[1] > case_timeout) or (not ready and now - launched > STARTUP_TIMEOUT_S):
                proc.kill()
                proc.wait()
                timed_out = True
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = stderr_path.read_bytes().decode("utf-8", "replace")[-6000:]
    for path in (Path(list_name), progress, stderr_path):
        path.unlink(missing_ok=True)
    culprit = None
    if started is not None:
        how = HANG if timed_out else CRASH
        error = f"no result after {case_timeout:g} s" if timed_out else describe_returncode(proc.returncode)
        culprit = (by_path[started[0]], Outcome(how, "process", error, _crash_detail(stderr)))
    return done, culprit, stderr, proc.returncode


def _crash_detail(stderr: str) -> str:
    """The lines that say what happened: ggml's assert, the sanitizer's report, the Python traceback."""
    lines = stderr.splitlines()
    keep = [l for l in lines if "third_party/ggml/" in l or any(
        m in l for m in ("GGML_ASSERT", "ERROR: AddressSanitizer", "runtime error:", "Fatal Python error", "SUMMARY:"))]
    return "\n".join(keep[:20] + ["--- stderr tail ---"] + lines[-40:])


def run_campaign(writer: CaseWriter, *, seed: int, iterations: int, first_index: int = 0,
                 work: Optional[Path] = None, batch_size: int = 50, case_timeout: float = 30.0, jobs: int = 1,
                 confirm: bool = True, python: str = sys.executable, seconds: Optional[float] = None,
                 min_iterations: int = 0,
                 on_failure: Optional[Callable[[Failure], None]] = None,
                 on_progress: Optional[Callable[[Summary], None]] = None) -> Summary:
    """Run cases ``first_index .. first_index + iterations - 1`` of ``seed``.

    With ``seconds``, no batch starts after that many seconds (once at least
    ``min_iterations`` cases have run), so ``iterations`` is then a ceiling and
    the campaign is as long as the machine's speed allows.
    """
    summary = Summary(writer.target, seed, first_index)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"elelem-fuzz-{writer.target}-", dir=work or _fast_tmp()) as tmp:
        tmp_dir = Path(tmp)

        def one_batch(indices: range) -> list[tuple[Case, Outcome, str, Optional[bool]]]:
            batch_dir = Path(tempfile.mkdtemp(dir=tmp_dir))
            cases = [Case(i, *writer.write(seed, i, batch_dir)) for i in indices]
            try:
                results = run_batch(writer.target, cases, batch_dir, case_timeout=case_timeout, python=python)
                return [(c, o, e, _reproduces(writer.target, c, batch_dir, case_timeout, python, o)
                         if confirm and o.status in (CRASH, HANG) else None) for c, o, e in results]
            finally:
                for case in cases:
                    case.path.unlink(missing_ok=True)
                batch_dir.rmdir()

        batches = iter([range(i, min(i + batch_size, first_index + iterations))
                        for i in range(first_index, first_index + iterations, batch_size)])
        submitted = [0]  # cases in the batches started so far

        def out_of_time() -> bool:
            return (seconds is not None and submitted[0] >= min_iterations
                    and time.monotonic() - started >= seconds)

        _STOP.clear()
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            pending = deque()

            def submit_next() -> None:
                batch = None if out_of_time() else next(batches, None)
                if batch is not None:
                    submitted[0] += len(batch)
                    pending.append(pool.submit(one_batch, batch))

            try:
                for _ in range(max(1, jobs)):
                    submit_next()
                while pending:
                    results = pending.popleft().result()
                    submit_next()
                    for case, outcome, stderr, reproduced in results:
                        summary.iterations += 1
                        summary.counts[outcome.status] += 1
                        for stage, status in outcome.stages.items():
                            summary.stage_counts[f"{stage}:{status}"] += 1
                        if outcome.failed:
                            failure = Failure(writer.target, seed, case.index, outcome, case.info, stderr,
                                              reproduced)
                            summary.failures.append(failure)
                            if on_failure:
                                on_failure(failure)
                    summary.seconds = time.monotonic() - started
                    if on_progress:
                        on_progress(summary)
            except BaseException:  # Ctrl-C or SIGTERM: stop the runners, then clean up
                _STOP.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    summary.seconds = time.monotonic() - started
    return summary


def _reproduces(target: str, case: Case, work: Path, case_timeout: float, python: str, first: Outcome) -> bool:
    """Does a crashing or hanging case fail the same way when run alone?"""
    done, culprit, _, returncode = _run_process(target, [case], work, case_timeout, python)
    if culprit is None and done and returncode != 0:  # it ended, then the runner exited badly again
        return first.status == CRASH and first.stage == "exit"
    return culprit is not None and culprit[1].status == first.status


def _fast_tmp() -> Optional[str]:
    """/dev/shm when there is one (cases are written and read once), else the default."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
