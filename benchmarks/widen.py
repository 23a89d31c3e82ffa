#!/usr/bin/env python3
"""Q8_0 copies of Q5_0 weights (LLM(widen=...)): native step time by width.

    python benchmarks/widen.py [--model qwen2.5-coder-0.5b] [--widths 1 2 4 8 32 64]
        [--steps 30] [--threads 2] [--json out.json]

Opens the model twice in one process, ``widen=False`` and ``widen=True``,
evaluates the same 200-token prefix on each, then times native
``Context.decode`` steps of each width (the logits of the last row only, as
a prompt chunk), the two variants alternating step by step so that load on
the machine falls on both alike; after each step the sequence is trimmed
back to the prefix.  Prints the median step time of each and their ratio
(below 1: widening is faster); asserts nothing.  The open time and the
memory of the copies are printed too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import elelem  # noqa: E402

PREFIX = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 32, 64])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()

    llms, opened = {}, {}
    for widen in (False, True):
        t = time.perf_counter()
        llms[widen] = elelem.LLM(args.model, n_ctx=PREFIX + max(args.widths), n_threads=args.threads,
                                 n_batch=max(512, max(args.widths)), widen=widen)
        opened[widen] = time.perf_counter() - t
    n_widened, widened_bytes = llms[True].widened
    print(f"{args.model}: {n_widened} weights widened, {widened_bytes / 2**20:.0f} MiB of copies; "
          f"open {opened[False]:.2f} s -> {opened[True]:.2f} s; load {os.getloadavg()[0]:.2f}")
    contexts = {w: llm._engine.context for w, llm in llms.items()}
    rng = np.random.default_rng(0)
    vocab = llms[False].n_vocab
    prefix = rng.integers(0, vocab, PREFIX).tolist()
    for ctx in contexts.values():
        ctx.decode(prefix, [0] * PREFIX)
    rows = []
    for width in args.widths:
        times = {False: [], True: []}
        for step in range(args.steps + 1):
            tokens = rng.integers(0, vocab, width).tolist()
            for widen in ((False, True) if step % 2 else (True, False)):
                ctx = contexts[widen]
                t = time.perf_counter()
                ctx.decode(tokens, [0] * width)
                if step:  # the first step of each width warms up
                    times[widen].append(time.perf_counter() - t)
                ctx.cache.seq_rm(0, PREFIX)
        plain, wide = (statistics.median(times[w]) * 1000 for w in (False, True))
        rows.append({"width": width, "q5_0_ms": round(plain, 2), "widened_ms": round(wide, 2),
                     "ratio": round(wide / plain, 3)})
        print(f"  {width:4d} tokens: Q5_0 {plain:7.1f} ms  widened {wide:7.1f} ms  ratio {wide / plain:.3f}",
              flush=True)
    print(f"load at end {os.getloadavg()[0]:.2f}")
    for llm in llms.values():
        llm.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "n_widened": n_widened, "widened_bytes": widened_bytes,
                       "open_s": opened, "steps": rows}, f, indent=2)


if __name__ == "__main__":
    main()
