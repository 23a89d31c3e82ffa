#!/usr/bin/env python
"""Kill test for the test suite: does it fail when elelem is deliberately broken?

    python scripts/kill_test.py                      # baseline, then every mutation
    python scripts/kill_test.py --only rope-base-1pct swa-window-plus-1
    python scripts/kill_test.py --list

Each mutation is one exact text replacement in one of elelem's Python files
(no native rebuild), applied to a throw-away copy: the package is copied
(Python files with the compiled elelem/_core*.so, and elelem/_lib/ where the
build has one) next to copies of tests/, scripts/ and pyproject.toml in a
temporary tree, the replacement must match exactly once (else the script
stops: the code it targets has moved), and pytest runs there with that tree
first on PYTHONPATH, ``-x -q -p no:cacheprovider`` (``--maxfail N`` to see
more than the first failure), on the tests chosen for the mutation (those
meant to catch it first, then a fast general set; ``--tests`` to choose
others).  A plugin in the pytest process checks that ``elelem`` and
``elelem._core`` are imported from the copy, so neither the checkout nor the
installed package is ever touched.  CI=true is set, as in CI: a test that
skips fails instead of passing unseen, and Hypothesis runs its derandomized CI
profile (the plugin only turns shrinking off, which can take minutes on a
mutant and does not change whether it is caught).

The first row runs the unmutated copy on the union of all selections: it must
pass, or the verdicts below it mean nothing.  A mutation is KILLED when
pytest reports failed tests, SURVIVED when every selected test passed, and
ERROR when pytest could not run (collection error, wrong import, crash).

Not part of CI: it runs the slow tests once per mutation (minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE_PARTS = ("tests", "scripts", "pyproject.toml")  # what the tests read relative to the repository root


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str          # relative to the package directory
    old: str           # must occur exactly once
    new: str
    why: str           # the bug it stands for
    tests: tuple[str, ...]  # pytest node ids, the ones meant to catch it first


# A fast general set, run after each mutation's own tests (with -x it only runs when they all passed).
# Node ids, not whole files: pytest folds `f.py::t f.py` into f.py's order, which would move t off the front.
GENERAL = (
    "tests/test_core_forward.py::test_architecture_matches_reference",
    "tests/test_core_forward.py::test_logits_match_reference_at_every_position",
    "tests/test_core_forward.py::test_incremental_decoding_equals_one_batch",
    "tests/test_sampling.py::test_penalties_only_touch_recent_tokens",
    "tests/test_sampling_reference.py::test_the_candidates_and_their_probabilities_match_the_reference",
)

MUTATIONS = (
    Mutation(
        "rope-base-1pct", "model/architectures.py",
        '"rope_base": float(key("rope.freq_base", 10000.0)),',
        '"rope_base": float(key("rope.freq_base", 10000.0)) * 1.01,',
        "RoPE base read 1% high",
        ("tests/test_core_rope.py::test_rope_variant_matches_reference_at_long_positions",
         "tests/test_core_long_context.py::test_positions_past_the_256_padding_and_the_window",
         "tests/test_arch_llamacpp.py::test_logits_match_llamacpp_exactly"),
    ),
    Mutation(
        "swa-window-plus-1", "model/archs/gemma3.py",
        'h["n_swa"] = int(key("attention.sliding_window", 0))\n',
        'h["n_swa"] = int(key("attention.sliding_window", 0))\n    h["n_swa"] += h["n_swa"] > 0\n',
        "sliding window one token wider than the file says",
        ("tests/test_core_long_context.py::test_positions_past_the_256_padding_and_the_window",
         "tests/test_core_forward.py::test_architecture_matches_reference",
         "tests/test_arch_llamacpp.py::test_logits_match_llamacpp_exactly"),
    ),
    Mutation(
        "qwen2-qkv-bias-dropped", "model/archs/qwen2.py",
        'Architecture("qwen2", "decoder", "neox", ATTN_FFN, optional=("bq", "bk", "bv", "bo"),',
        'Architecture("qwen2", "decoder", "neox", ATTN_FFN, optional=("bo",),',
        "Qwen2's Q/K/V biases treated as absent",
        ("tests/test_core_forward.py::test_architecture_matches_reference",
         "tests/test_arch_llamacpp.py::test_logits_match_llamacpp_exactly",
         "tests/test_real_models.py::test_logits_agree_with_numpy_reference"),
    ),
    Mutation(
        "repeat-window-plus-1", "sampling.py",
        "recent_tokens[-last_n:]",
        "recent_tokens[-last_n - 1:]",
        "penalties look at repeat_last_n + 1 recent tokens",
        ("tests/test_sampling.py::test_penalty_window_is_the_newest_last_n_tokens",
         "tests/test_sampling.py::test_penalties_only_touch_recent_tokens",
         "tests/test_sampling_reference.py::test_greedy_generation_with_penalties_follows_the_reference",
         "tests/test_sampling_reference.py::test_the_candidates_and_their_probabilities_match_the_reference"),
    ),
    Mutation(
        "repeat-window-wrong-end", "sampling.py",
        "recent_tokens[-last_n:]",
        "recent_tokens[:last_n]",
        "penalty window taken from the oldest tokens instead of the newest",
        ("tests/test_sampling.py::test_penalty_window_is_the_newest_last_n_tokens",
         "tests/test_sampling.py::test_penalties_only_touch_recent_tokens",
         "tests/test_sampling_reference.py::test_greedy_generation_with_penalties_follows_the_reference",
         "tests/test_sampling_reference.py::test_the_candidates_and_their_probabilities_match_the_reference"),
    ),
    Mutation(
        "gemma3-swa-rope-base-global", "model/archs/gemma3.py",
        'float(key("rope.freq_base_swa", 10000.0))',
        'float(key("rope.freq_base_swa", h["rope_base"]))',
        "Gemma 3's sliding layers default to the global RoPE base (llama.cpp: 10000)",
        ("tests/test_core_forward.py::test_architecture_matches_reference",
         "tests/test_real_models.py::test_logits_agree_with_numpy_reference"),
    ),
)

# Loaded into the pytest process with -p: proves which elelem it imports and records every outcome.
PLUGIN = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path

    _outcomes = {"passed": [], "failed": [], "skipped": [], "xfailed": []}

    # Hypothesis under CI=true: its derandomized CI profile (what CI runs), minus shrinking and
    # explaining, which can take minutes on a mutant and do not change whether it is caught.
    try:
        from hypothesis import Phase, settings
        settings.register_profile("kill-test", parent=settings.get_profile("ci"),
                                  phases=(Phase.explicit, Phase.reuse, Phase.generate))
        settings.load_profile("kill-test")
    except ImportError:
        pass

    def pytest_sessionstart(session):
        import elelem, elelem._core
        want = Path(os.environ["KILL_TEST_PACKAGE"]).resolve()
        for module in (elelem, elelem._core):
            got = Path(module.__file__).resolve()
            if want not in got.parents:
                raise SystemExit(f"kill_test: {module.__name__} imported from {got}, not from the copy {want}")
        _outcomes["elelem_file"] = elelem.__file__

    def pytest_runtest_logreport(report):
        if report.failed:
            _outcomes["failed"].append(report.nodeid)
        elif report.when == "call" and report.passed:
            _outcomes["passed"].append(report.nodeid)
        elif report.skipped:
            _outcomes["xfailed" if hasattr(report, "wasxfail") else "skipped"].append(report.nodeid)

    def pytest_sessionfinish(session, exitstatus):
        Path(os.environ["KILL_TEST_REPORT"]).write_text(json.dumps(_outcomes))
''')


def package_dir() -> Path:
    """The elelem that ``import elelem`` finds (the editable install's source tree here)."""
    spec = find_spec("elelem")
    if spec is None or spec.origin is None:
        raise SystemExit("kill_test: elelem is not importable")
    return Path(spec.origin).resolve().parent


def make_tree(dest: Path, pkg: Path, mutation: Mutation | None) -> None:
    """dest/: a copy of the package (mutated) and of what the tests read from the repository root."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache", "*.cpp", "*.o")
    shutil.copytree(pkg, dest / "elelem", ignore=ignore)  # includes _core*.so and _lib/ when the build has one
    for part in TREE_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        else:
            shutil.copy2(src, dest / part)
    (dest / "_kill_test_plugin.py").write_text(PLUGIN)
    if mutation is not None:
        path = dest / "elelem" / mutation.file
        path.write_text(mutated(path, mutation), encoding="utf-8")


def mutated(path: Path, mutation: Mutation) -> str:
    """The text of ``path`` with the mutation applied; stops the script unless its target occurs exactly once."""
    text = path.read_text(encoding="utf-8")
    count = text.count(mutation.old)
    if count != 1:
        raise SystemExit(f"kill_test: {mutation.name}: the target text occurs {count} times in "
                         f"elelem/{mutation.file} (must be exactly once; has the code moved?):\n{mutation.old}")
    return text.replace(mutation.old, mutation.new)


@dataclass
class Row:
    name: str
    ran: int
    failed: list[str]
    skipped: int
    verdict: str
    seconds: float


def run_suite(name: str, pkg: Path, mutation: Mutation | None, tests: list[str], maxfail: int,
              log_dir: Path) -> Row:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"kill-{name}-") as tmp:
        tree = Path(tmp)
        make_tree(tree, pkg, mutation)
        report = tree / "outcomes.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep), KILL_TEST_PACKAGE=str(tree / "elelem"), KILL_TEST_REPORT=str(report), CI="true",
            PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, "-m", "pytest", f"--maxfail={maxfail}", "-q", "-p", "no:cacheprovider",
               "-p", "_kill_test_plugin", *tests]
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        (log_dir / f"{name}.log").write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
        outcomes = json.loads(report.read_text()) if report.exists() else None
    seconds = time.monotonic() - start
    if outcomes is None or "elelem_file" not in outcomes:
        return Row(name, 0, [], 0, f"ERROR rc={done.returncode}", seconds)
    failed = outcomes["failed"]
    ran = len(outcomes["passed"]) + len(set(failed))
    if mutation is None:
        verdict = "PASS" if done.returncode == 0 else f"FAIL rc={done.returncode}"
    elif done.returncode == 1 and failed:
        verdict = "KILLED"
    elif done.returncode == 0:
        verdict = "SURVIVED"
    else:
        verdict = f"ERROR rc={done.returncode}"
    return Row(name, ran, failed, len(outcomes["skipped"]), verdict, seconds)


def selection(mutation: Mutation, override: list[str] | None = None) -> list[str]:
    tests = list(dict.fromkeys(override or mutation.tests + GENERAL))
    whole_files = [t for t in tests if "::" not in t]
    if any(t.startswith(f + "::") for f in whole_files for t in tests):
        raise SystemExit(f"kill_test: {mutation.name}: a whole file and a test in it are both selected; "
                         f"pytest would reorder them")
    return tests


HEADER = f"{'mutation':<28} {'run':>4} {'fail':>4} {'skip':>4} {'verdict':<9} {'time':>6}  failed tests (first 3)"


def print_row(r: Row) -> None:
    names = ", ".join(f.split("/")[-1] for f in r.failed[:3]) + (" ..." if len(r.failed) > 3 else "")
    print(f"{r.name:<28} {r.ran:>4} {len(r.failed):>4} {r.skipped:>4} {r.verdict:<9} {r.seconds:>5.0f}s  {names}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations (after the baseline)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--maxfail", type=int, default=1, help="stop each run after this many failures (1: -x)")
    parser.add_argument("--logs", type=Path, default=None, help="keep pytest's output per run here")
    parser.add_argument("--tests", nargs="+", metavar="NODE",
                        help="run these pytest node ids for every row instead of each mutation's own selection")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests, run nothing")
    args = parser.parse_args()

    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.why}\n  elelem/{m.file}: {m.old.strip()!r} -> {m.new.strip()!r}")
            print("".join(f"\n    {t}" for t in selection(m, args.tests)).lstrip("\n"))
        return 0

    pkg = package_dir()
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="kill-test-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"package: {pkg}\npytest logs: {log_dir}")
    for m in chosen:  # stop before running anything if a target has moved
        mutated(pkg / m.file, m)

    rows = []
    print(HEADER, flush=True)
    if not args.no_baseline:
        union = list(dict.fromkeys(t for m in chosen for t in selection(m, args.tests)))
        rows.append(run_suite("baseline-unmutated", pkg, None, union, args.maxfail, log_dir))
        print_row(rows[0])
        if rows[0].verdict != "PASS":
            print(f"\nthe unmutated copy does not pass: see {log_dir}; verdicts would mean nothing", file=sys.stderr)
            return 2
    for m in chosen:
        rows.append(run_suite(m.name, pkg, m, selection(m, args.tests), args.maxfail, log_dir))
        print_row(rows[-1])
    print(f"\n{HEADER}")
    for r in rows:
        print_row(r)
    survivors = [r.name for r in rows if r.verdict == "SURVIVED"]
    errors = [r.name for r in rows if r.verdict.startswith("ERROR")]
    if survivors:
        print(f"\nsurvived: {', '.join(survivors)}")
    return 1 if survivors or errors else 0


if __name__ == "__main__":
    sys.exit(main())
