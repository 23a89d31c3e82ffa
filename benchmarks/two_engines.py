#!/usr/bin/env python3
"""Two models generating at once, in one process, against each alone.

    python benchmarks/two_engines.py [--model smollm2-135m] [--threads 1] [--requests 4] [--tokens 48]

Two LLMs of ``--model`` (two engines, as a server of several models holds
them) answer ``--requests`` completions each, in two Python threads at once,
against one of them alone; greedy and at temperature 0.8, with Python's
switch interval at its 5 ms and at 0.5 ms.  What it shows is what the two
engines' Python costs each other through the GIL: each step's Python (the
sampler, NumPy letting the GIL go on big arrays) waits for the other's.
With ``--threads 1`` on 2 cores the two computations have a core each.
Prints tok/s per stream and the ratio to alone; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def generate(llm, requests: int, tokens: int, temperature: float, no_end: dict, out: list) -> None:
    t0 = time.perf_counter()
    for i in range(requests):
        llm.create_completion(f"Question {i}: explain what a hash map is.", max_tokens=tokens,
                              temperature=temperature, logit_bias=no_end, seed=1)
    out.append(requests * tokens / (time.perf_counter() - t0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per model")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    import elelem
    from elelem.model.hub import resolve_model
    path = str(resolve_model(args.model))
    first = elelem.LLM(path, n_ctx=512, n_threads=args.threads)
    second = elelem.LLM(path, n_ctx=512, n_threads=args.threads)
    no_end = {t: -100.0 for t in first.tokenizer.eog_ids}
    generate(first, 1, 8, 0.0, no_end, [])   # warm-up
    generate(second, 1, 8, 0.0, no_end, [])
    print(f"{args.model}, {args.threads} thread(s) per model, {args.requests} x {args.tokens} tokens per stream; "
          f"load average {os.getloadavg()[0]:.1f}")
    for temperature in (0.0, 0.8):
        for interval in (0.005, 0.0005):
            sys.setswitchinterval(interval)
            alone: list[float] = []
            generate(first, args.requests, args.tokens, temperature, no_end, alone)
            both: list[float] = []
            threads = [threading.Thread(target=generate, args=(llm, args.requests, args.tokens, temperature,
                                                                no_end, both)) for llm in (first, second)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print(f"temperature {temperature}, switch interval {interval * 1000:.1f} ms: alone {alone[0]:.1f} tok/s, "
                  f"two at once {both[0]:.1f} and {both[1]:.1f} tok/s ({min(both) / alone[0]:.2f} of alone)")
    first.close()
    second.close()


if __name__ == "__main__":
    main()
