#!/usr/bin/env python3
"""What one step of generated tokens costs, by how many tokens it holds.

    python benchmarks/step_widths.py [--models qwen2.5-coder-0.5b smollm2-135m gemma3-270m]
        [--widths 1 2 4 8] [--threads 2] [--history 40] [--repeats 3] [--flash-attn]

For each model, width N and kernel choice: one context holding 8 sequences,
each with ``--history`` random tokens already evaluated; then a step of N
tokens, one for each of sequences 0..N-1, every row's logits, as the engine
runs a step of N streams' next tokens (``decode(..., decode_kernels=True)``;
N=1 is a plain one-token step).  The step is timed 12 times (its cells taken
back after each), the median of the last 10 printed in ms.

Kernel choices, run in alternating subprocesses, ``--repeats`` rounds:
- ``elelem``: the default, elelem's small-batch kernels where this CPU has
  them (``elelem info --system``);
- ``ggml``: ``ELELEM_SMALL_BATCH=0``, ggml's one-column kernels for every
  column.
Ranges are over the rounds.  The script prints numbers; it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEQUENCES = 8
TIMED, WARMUP = 12, 2


def worker(path: str, widths: list[int], threads: int, history: int, flash_attn: bool) -> dict:
    sys.path.insert(0, str(REPO))
    import numpy as np

    import elelem
    with elelem.LLM(path, n_ctx=max(512, 2 * history), n_threads=threads, n_seq_max=SEQUENCES,
                    flash_attn=flash_attn) as llm:
        ctx = llm.engine.context
        rng = np.random.default_rng(0)
        for seq in range(SEQUENCES):
            prompt = rng.integers(0, llm.n_vocab, history).tolist()
            ctx.decode(prompt, [seq] * len(prompt))
        bases = [ctx.cache.seq_length_of(seq) for seq in range(SEQUENCES)]
        out = {}
        for n in widths:
            tokens = rng.integers(0, llm.n_vocab, n).tolist()
            times = []
            for _ in range(TIMED):
                t0 = time.perf_counter()
                ctx.decode(tokens, list(range(n)), True, decode_kernels=n > 1)
                times.append(time.perf_counter() - t0)
                for seq in range(n):
                    ctx.cache.seq_rm(seq, bases[seq])
            out[n] = statistics.median(times[WARMUP:]) * 1e3
        return out


def resolve(name: str) -> str:
    if name.endswith(".gguf"):
        return name
    sys.path.insert(0, str(REPO))
    from elelem.model.hub import pull_model
    return str(pull_model(name))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"])
    ap.add_argument("--widths", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--history", type=int, default=40, help="tokens each of the 8 sequences already holds")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, path = args.worker
        print(json.dumps(worker(path, args.widths, args.threads, args.history, args.flash_attn)))
        return
    if max(args.widths) > SEQUENCES:
        sys.exit(f"widths go up to {SEQUENCES} (one token per sequence)")
    choices = {"elelem": {}, "ggml": {"ELELEM_SMALL_BATCH": "0"}}
    for name in args.models:
        path = resolve(name)
        runs: dict[str, list[dict]] = {kind: [] for kind in choices}
        for _ in range(args.repeats):
            for kind, env in choices.items():
                cmd = [sys.executable, __file__, "--worker", kind, path, "--widths", *map(str, args.widths),
                       "--threads", str(args.threads), "--history", str(args.history)]
                if args.flash_attn:
                    cmd.append("--flash-attn")
                done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
                if done.returncode != 0:
                    sys.exit(f"{kind} worker failed:\n{done.stderr[-2000:]}")
                runs[kind].append({int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()})
        print(f"\n{Path(path).name}: ms per step of N generated tokens (8 sequences of {args.history} tokens, "
              f"{args.threads} threads{', flash attention' if args.flash_attn else ''}; range over {args.repeats})")
        print(f"  {'kernels':<8}" + "".join(f"{'N=' + str(n):>14}" for n in args.widths))
        for kind, results in runs.items():
            cells = []
            for n in args.widths:
                values = [r[n] for r in results]
                cells.append(f"{min(values):.1f}-{max(values):.1f}")
            print(f"  {kind:<8}" + "".join(f"{c:>14}" for c in cells))
        medians = {kind: {n: statistics.median(r[n] for r in results) for n in args.widths}
                   for kind, results in runs.items()}
        print(f"  {'ratio':<8}" + "".join(f"{medians['ggml'][n] / medians['elelem'][n]:>13.2f}x"
                                          for n in args.widths) + "   (ggml / elelem, medians)")


if __name__ == "__main__":
    main()
