#!/usr/bin/env python
"""Fuzz campaigns against elelem, and replays of saved crashers.

    python scripts/fuzz.py --target gguf --iterations 20000 --seed 7 --out fuzz-out
    python scripts/fuzz.py --target template --seconds 600          # a new seed, printed
    python scripts/fuzz.py --target gguf --real smollm2-135m gemma3-270m --iterations 2000
    python scripts/fuzz.py --target tokenizer --iterations 50000 --jobs 2
    python scripts/fuzz.py --target template --engine atheris --iterations 100000
    python scripts/fuzz.py --replay tests/support/fixtures/crashers/*.json

Cases are deterministic in (seed, index): a campaign can be split with
``--start`` and rerun exactly.  Without ``--seed`` each run draws a new seed
and prints it.  ``--seconds`` bounds a campaign by time (``--iterations`` is
then a ceiling).  Each case runs in a subprocess (see
tests/support/fuzzing/runner.py); every distinct failure is saved once as a regression
fixture in tests/support/fixtures/crashers/ (``--fixtures``; ``--no-fixtures`` to skip),
which tests/test_fuzz.py replays.  ``--out`` receives summary.json and one
JSON record per failing case.

``--engine atheris`` runs the coverage-guided atheris/libFuzzer engine instead
of the seeded mutator (needs ``pip install atheris``); its failures are saved
the same way.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the fuzzing package; elelem itself comes from the install

from fuzzing import crashers  # noqa: E402
from fuzzing.driver import Case, Failure, Summary, run_batch, run_campaign  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=("gguf", "tokenizer", "template"))
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--seed", type=lambda text: int(text, 0), default=None,
                   help="default: a new random seed, printed ($ELELEM_FUZZ_SEED also sets it)")
    p.add_argument("--seconds", type=float, default=None, help="stop starting batches after this long")
    p.add_argument("--start", type=int, default=0, help="first case index (to split or resume a campaign)")
    p.add_argument("--out", type=Path, default=ROOT / "fuzz-out")
    p.add_argument("--fixtures", type=Path, default=crashers.FIXTURES_DIR, help="where new crashers are saved")
    p.add_argument("--no-fixtures", action="store_true", help="do not save crashers as fixtures")
    p.add_argument("--jobs", type=int, default=1, help="runner processes at once")
    p.add_argument("--batch", type=int, default=None, help="cases per runner process")
    p.add_argument("--case-timeout", type=float, default=30.0, help="seconds before a case counts as a hang")
    p.add_argument("--engine", choices=("mutator", "atheris"), default="mutator")
    p.add_argument("--replay", type=Path, nargs="+", help="run saved crasher fixtures and report")
    gguf = p.add_argument_group("gguf target")
    gguf.add_argument("--real", nargs="*", default=None, metavar="MODEL",
                      help="also mutate these cached packaged models (no names: all three)")
    gguf.add_argument("--no-synthetic", action="store_true", help="only the packaged models")
    gguf.add_argument("--copy-data", action="store_true",
                      help="copy real tensor data into each case (default: a sparse hole of zeros)")
    tmpl = p.add_argument_group("template target")
    tmpl.add_argument("--template-timeout", type=float, default=0.3,
                      help="RenderLimits.timeout_s for each render (the module default is 2 s)")
    args = p.parse_args(argv)
    if not args.replay and not args.target:
        p.error("--target is required (or --replay)")
    if args.seed is None:
        from fuzzing.session import campaign_seed
        args.seed = campaign_seed()
    if args.seconds is not None and "--iterations" not in argv:
        args.iterations = 10**9  # the time bound ends it
    return args


def case_writer(args: argparse.Namespace):
    if args.target == "gguf":
        from fuzzing.gguf_target import GGUFCases
        from fuzzing.seeds import REAL_MODEL_NAMES
        real = () if args.real is None else tuple(args.real or REAL_MODEL_NAMES)
        return GGUFCases(args.out / "seeds", synthetic=not args.no_synthetic, real=real, copy_data=args.copy_data)
    if args.target == "tokenizer":
        from fuzzing.tokenizer_target import TokenizerCases
        return TokenizerCases()
    from fuzzing.template_target import TemplateCases
    return TemplateCases(timeout_s=args.template_timeout)


def record_failure(args: argparse.Namespace, failure: Failure) -> None:
    failures_dir = args.out / "failures"
    failures_dir.mkdir(parents=True, exist_ok=True)
    record = {"signature": crashers.signature(failure), "seed": failure.seed, "index": failure.index,
              "outcome": failure.outcome.to_json(), "reproduced_alone": failure.reproduced,
              "info": {k: v for k, v in failure.info.items() if k != "input"}, "stderr_tail": failure.stderr_tail}
    name = f"{failure.target}-{failure.seed}-{failure.index}.json"
    (failures_dir / name).write_text(json.dumps(record, indent=1) + "\n")
    note = ""
    if not args.no_fixtures:
        path, new = crashers.save(failure, args.fixtures, shrink_timeout=args.case_timeout)
        note = f" -> new fixture {path}" if new else f" (known: {path.name})"
    print(f"FAIL {failure.title()}: {crashers.signature(failure)}{note}", flush=True)


def campaign(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    writer = case_writer(args)
    batch = args.batch or (25 if args.target == "gguf" else 250)
    last = [time.monotonic()]

    def progress(summary: Summary) -> None:
        if time.monotonic() - last[0] > 10:
            last[0] = time.monotonic()
            print(f"  ... {summary.iterations} cases, {summary.failed} failing", flush=True)

    print(f"{args.target}: seed {args.seed} (replay with --seed {args.seed})", flush=True)
    summary = run_campaign(writer, seed=args.seed, iterations=args.iterations, first_index=args.start,
                           batch_size=batch, case_timeout=args.case_timeout, jobs=args.jobs, seconds=args.seconds,
                           on_failure=lambda f: record_failure(args, f), on_progress=progress)
    return report(args, summary)


def report(args: argparse.Namespace, summary: Summary) -> int:
    signatures: dict[str, int] = {}
    for failure in summary.failures:
        sig = crashers.signature(failure)
        signatures[sig] = signatures.get(sig, 0) + 1
    (args.out / f"summary-{summary.target}.json").write_text(json.dumps({
        "target": summary.target, "seed": summary.seed, "first_index": summary.first_index,
        "iterations": summary.iterations, "seconds": round(summary.seconds, 1), "counts": dict(summary.counts),
        "stages": dict(summary.stage_counts), "distinct_failures": signatures}, indent=1) + "\n")
    print(summary.lines()[0])
    if len(summary.lines()) > 1 and summary.stage_counts:
        print(summary.lines()[1])
    for sig, count in sorted(signatures.items(), key=lambda kv: -kv[1]):
        print(f"  {count:5d} x {sig}")
    return 1 if summary.failed else 0


def atheris_campaign(args: argparse.Namespace) -> int:
    """Run the atheris engine in a subprocess, then save what it found like any other failure."""
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / f"atheris-{args.target}"
    work.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "fuzzing.atheris_engine", args.target, str(work),
               f"-runs={args.iterations}", f"-seed={args.seed or 1}", f"-artifact_prefix={work}/",
               f"-timeout={int(args.case_timeout)}", "-rss_limit_mb=8192"]
    from fuzzing.driver import runner_env
    started = time.monotonic()
    proc = subprocess.run(command, env=runner_env(), cwd=ROOT)
    print(f"atheris {args.target}: exit {proc.returncode} after {time.monotonic() - started:.0f} s")
    current = work / "current-case"
    if proc.returncode == 0 or not current.exists():
        return proc.returncode
    # The engine wrote each case to current-case before running it: that one failed.
    return replay_files(args, [current], target=args.target, save=True)


def replay_files(args: argparse.Namespace, paths: list[Path], *, target: str | None = None,
                 save: bool = False) -> int:
    """Run fixtures (or raw case files of ``target``) once each, in their own runner."""
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            work = Path(tempfile.mkdtemp(dir=tmp))
            if target is None:
                fixture = crashers.load(path)
                case_path = crashers.write_case(fixture, work)
                case_target = fixture["target"]
                if case_path is None:
                    print(f"SKIP {path.name}: needs a packaged model that is not in the cache")
                    continue
            else:
                fixture, case_target = None, target
                case_path = work / ("case.gguf" if target == "gguf" else "case.json")
                case_path.write_bytes(path.read_bytes())
            [(case, outcome, stderr)] = run_batch(case_target, [Case(0, case_path, {})], work,
                                                  case_timeout=args.case_timeout)
            status = "FAIL" if outcome.failed else "ok  "
            failed += outcome.failed
            label = fixture["signature"] if fixture else str(path)
            print(f"{status} {path.name}: {outcome.status} {outcome.stage} {outcome.error} -- {label}")
            if outcome.failed and save and not args.no_fixtures:
                info = {"input": _case_input(case_target, case_path), "engine": "atheris"}
                failure = Failure(case_target, args.seed, -1, outcome, info, stderr)
                record_failure(args, failure)
    return 1 if failed else 0


def _case_input(target: str, case_path: Path) -> dict:
    if target == "gguf":
        from fuzzing.gguf_target import fixture_input
        return fixture_input([case_path.read_bytes()])
    return json.loads(case_path.read_text(encoding="utf-8"))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so runners are killed and temporary files removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.replay:
        return replay_files(args, args.replay)
    if args.engine == "atheris":
        return atheris_campaign(args)
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
