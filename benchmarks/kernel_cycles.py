#!/usr/bin/env python3
"""Cycles per column-block of elelem's AVX2 small-batch kernels, one thread.

    python benchmarks/kernel_cycles.py [--types q8_0 q5_0 q4_0 q4_1] [--columns 1 2 4 8]
        [--rows 4864] [--repeats 300] [--rounds 3] [--against REV]

Compiles benchmarks/kernels/small_batch_cycles.c around
elelem/_native/kernels/small_batch_avx2.c (with the system C compiler, -O2,
as setup.py builds it) and times one matmul of a rows x 896 random weight by
N random columns, best of --repeats, then the best of --rounds such runs.
The weight (3 MB of Q5_0 at 4864 rows, Qwen2.5-0.5B's FFN) does not fit in
L2, as in a model.  ``--against REV`` also builds the kernel source of a git
revision and runs the two in alternation: the columns "before" and "after",
and whether their products' checksums are equal (the same numbers).

A column-block is one 32-value weight block times one column; the cycles are
core cycles (clock measured by a chain of dependent adds).  Needs an x86 CPU
with AVX2.  The script prints numbers; it asserts nothing.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "elelem" / "_native" / "kernels"
HARNESS = REPO / "benchmarks" / "kernels" / "small_batch_cycles.c"
TYPE_IDS = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q8_0": 8}   # ggml_type
SOURCES = ("small_batch_avx2.c", "small_batch.h", "small_batch_isa.h", "simd.h")


def build(kernel_dir: Path, out: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler (cc/gcc) on PATH")
    cmd = [compiler, "-O2", f"-I{REPO / 'third_party' / 'ggml' / 'include'}", f"-I{kernel_dir}",
           f'-DKERNEL="{kernel_dir / "small_batch_avx2.c"}"', str(HARNESS), "-o", str(out), "-lm"]
    subprocess.run(cmd, check=True)
    return out


def sources_at(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    for name in SOURCES:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:elelem/_native/kernels/{name}"],
                              check=True, capture_output=True, text=True).stdout
        (into / name).write_text(text)
    return into


def run(binary: Path, wtype: str, n: int, rows: int, repeats: int) -> tuple[float, float, str]:
    out = subprocess.run([str(binary), str(TYPE_IDS[wtype]), str(n), str(rows), str(repeats)],
                         check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[2]), out[4]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=list(TYPE_IDS), choices=list(TYPE_IDS))
    ap.add_argument("--columns", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--rows", type=int, default=4864)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", help="a git revision whose kernel to time beside this checkout's")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        kernels = {"after" if args.against else "kernel": build(KERNELS, tmp / "current")}
        if args.against:
            kernels = {"before": build(sources_at(args.against, tmp / "before_src"), tmp / "before"), **kernels}
        label = f", before = {args.against}" if args.against else ""
        print(f"cycles per column-block, one thread, {args.rows} x 896 weight, best of "
              f"{args.rounds} x {args.repeats}{label}")
        print(f"  {'type':<6}{'N':>3}" + "".join(f"{name:>10}" for name in kernels)
              + ("   ratio  same" if args.against else ""))
        for wtype in args.types:
            for n in args.columns:
                best = {name: float("inf") for name in kernels}
                sums = {}
                for _ in range(args.rounds):
                    for name, binary in kernels.items():   # alternating, so drifts in load hit both
                        _, cycles, checksum = run(binary, wtype, n, args.rows, args.repeats)
                        best[name] = min(best[name], cycles)
                        sums[name] = checksum
                line = f"  {wtype:<6}{n:>3}" + "".join(f"{best[name]:>10.2f}" for name in kernels)
                if args.against:
                    line += f"{best['before'] / best['after']:>8.2f}  {'yes' if len(set(sums.values())) == 1 else 'NO'}"
                print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
