#!/usr/bin/env python3
"""One-token steps called from different Python threads, one after another.

    python benchmarks/calling_threads.py [--model qwen2.5-coder-0.5b] [--threads 2] [--steps 30]

Times native one-token steps on one context: from a first thread, from a
second, from the main thread, from a third after that, and again after 2 s
idle.  Sessions in threads and the server's workers step from many threads;
with ggml built on OpenMP each calling thread got a team of its own, and once
the teams outnumbered the cores every step slowed down (measured on 2 cores:
19 ms from the main thread, 37-40 ms from others).  elelem now builds ggml
without OpenMP and gives each context a pool of its own (cpu_backend.pxi), so
the figures should agree.  Last, a second context of the same model steps
in turn with the first, as a draft model and its target do: with ggml's
default thread pools (workers spin for new work long after a step) each
step took twice as long on 2 cores; elelem's pools sleep at once.  Prints ms
per step; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import elelem  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    llm = elelem.LLM(args.model, n_ctx=512, n_threads=args.threads)
    ctx, vocab = llm.engine.context, llm.n_vocab
    rng = np.random.default_rng(0)

    def steps(label: str, other=None) -> None:
        t0, spent = time.perf_counter(), 0.0
        for _ in range(args.steps):
            if other is not None:  # its step is not counted: only how it slows the next
                t1 = time.perf_counter()
                other.decode([int(rng.integers(0, vocab))], [0], True)
                spent += time.perf_counter() - t1
            ctx.decode([int(rng.integers(0, vocab))], [0], True)
        per_step = (time.perf_counter() - t0 - spent) / args.steps * 1000
        print(f"  {label:<28} {per_step:6.1f} ms/step", flush=True)

    def in_thread(label: str) -> None:
        thread = threading.Thread(target=steps, args=(label,))
        thread.start()
        thread.join()

    print(f"{args.model}, {args.threads} threads, {elelem.__file__}")
    in_thread("first thread")
    in_thread("second thread")
    steps("main thread")
    in_thread("third thread")
    time.sleep(2)
    in_thread("fourth thread, after 2 s idle")
    with elelem.LLM(args.model, n_ctx=512, n_threads=args.threads) as second:
        steps("main thread, alone")
        steps("in turn with a 2nd context", other=second.engine.context)
    llm.close()


if __name__ == "__main__":
    main()
