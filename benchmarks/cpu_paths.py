#!/usr/bin/env python3
"""elelem's CPU kernel paths side by side, with llama-cpp-python as the yardstick.

    python benchmarks/cpu_paths.py --llama-python REF/bin/python \
        [--portable-python dist/work/venv/bin/python] [--variants icelake sapphirerapids] [--amx] [--amx-sets q4_K ...]
        [--models ...] [--threads 1 2] [--repeats 3]

Configurations, each run in fresh subprocesses and interleaved run by run:
- ``native``: this interpreter's elelem (the native build);
- ``portable``: ``--portable-python``'s elelem (the portable wheel), best variant;
- ``portable:VARIANT``: the same, forced to one CPU variant (ELELEM_CPU_VARIANT),
  e.g. ``zen4`` or ``icelake`` (AVX-512 repack path) against ``sapphirerapids``;
- with ``--amx``, ``amx-off`` next to each: the same build with ``amx=False``,
  so AMX and the AVX-512 path are compared on one machine;
- with ``--amx-sets q4_K q4_K,q6_K``, ``amx=q4_K`` (...) next to each: AMX for
  those weight types only, to find which types AMX speeds up;
- ``llama.cpp``: ``--llama-python``'s llama-cpp-python (scripts/reference_llamacpp.py
  builds it; on AMX CPUs without AMX).
Prints the medians (prefill of 512 tokens, decode of 128) and each one's ratio
to llama.cpp, and whether the greedy tokens agree.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from compare_llamacpp import REPO, checkout_env, run_worker

FIGURES = (("prefill_tok_s", "prefill tok/s"), ("decode_tok_s", "decode tok/s"), ("load_s", "load s"))


def configurations(args) -> list[tuple[str, str, str, dict, dict]]:
    """(label, python, worker kind, environment, LLM options)."""
    out = [("native", sys.executable, "elelem", checkout_env(False), {})]  # this checkout's build
    if args.portable_python:
        out.append(("portable", args.portable_python, "elelem", {}, {}))
        for v in args.variants:
            out.append((f"portable:{v}", args.portable_python, "elelem", {"ELELEM_CPU_VARIANT": v}, {}))
    elelem_configs = list(out)
    if args.amx:
        out += [(label + " amx-off", py, kind, env, {"amx": False}) for label, py, kind, env, _ in elelem_configs]
    for types in args.amx_sets:  # AMX for these weight types only, the rest on the AVX-512 path
        out += [(f"{label} amx={types}", py, kind, env, {"amx": types.split(",")})
                for label, py, kind, env, _ in elelem_configs]
    if args.llama_python:
        out.append(("llama.cpp", args.llama_python, "llamacpp", {}, {}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--portable-python")
    ap.add_argument("--variants", nargs="*", default=[])
    ap.add_argument("--amx", action="store_true", help="add amx=False runs of each elelem configuration")
    ap.add_argument("--amx-sets", nargs="*", default=[], metavar="TYPES",
                    help="add runs with AMX for these comma-separated weight types only (q4_K,q6_K)")
    ap.add_argument("--llama-python")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO))   # this checkout's elelem
    from elelem.model.hub import resolve_model
    configs = configurations(args)
    results = []
    for threads in args.threads:
        for name in args.models:
            path = str(resolve_model(name))
            runs = {label: [] for label, *_ in configs}
            for _ in range(args.repeats):
                for label, python, kind, env, options in configs:
                    extra = [json.dumps(options)] if kind == "elelem" else []
                    runs[label].append(run_worker(python, kind, path, threads, *extra, env=env))
            med = {label: {k: statistics.median(r[k] for r in rs) for k, _ in FIGURES} for label, rs in runs.items()}
            tokens = {label: rs[0]["tokens"] for label, rs in runs.items()}
            results.append(dict(model=name, threads=threads, medians=med, tokens=tokens))
            _print(name, threads, med, tokens)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def _print(model: str, threads: int, med: dict, tokens: dict) -> None:
    ref = med.get("llama.cpp")
    first = next(iter(tokens.values()))
    print(f"\n{model} @ {threads} thread(s)")
    print(f"  {'configuration':<28}" + "".join(f"{label:>16}" for _, label in FIGURES) + "  same tokens")
    for label, figures in med.items():
        cells = []
        for key, _ in FIGURES:
            ratio = f" ({figures[key] / ref[key]:.2f}x)" if ref and label != "llama.cpp" else ""
            cells.append(f"{figures[key]:.1f}{ratio}" if key != "load_s" else f"{figures[key]:.3f}{ratio}")
        print(f"  {label:<28}" + "".join(f"{c:>16}" for c in cells) + f"  {tokens[label] == first}")


if __name__ == "__main__":
    main()
