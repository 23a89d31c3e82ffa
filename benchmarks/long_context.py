#!/usr/bin/env python3
"""Decode speed after a long context, elelem beside llama-cpp-python, in alternating turns.

    python benchmarks/long_context.py --llama-python "$(python scripts/reference_llamacpp.py --check)" \\
        [--model qwen2.5-coder-0.5b] [--context 4000] [--kv f16 q8_0] [--turns 6] [--threads 2] [--json out.json]

For each KV type, one subprocess per engine loads the model with that cache
(a quantized cache with flash attention, as both engines need for a
quantized V), evaluates ``--context`` random token ids (the same ids in
both), and waits.  The driver then gives the engines turns: in each, one of
them decodes 16 tokens, one step each (the native step in elelem,
``Llama.eval`` in llama-cpp-python), while the other is idle; the order
alternates turn by turn.  Taking turns puts both under the same conditions
at nearly the same time: on a shared 2-core machine, sequential runs of the
same engine have been seen to differ by 15% (benchmarks/agent_workload.py's
long-context workload measures whole generations, one engine after the
other).  Prints the median ms per token of each, their ratio, and the KV
cache's size per 1,000 tokens; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOKENS_PER_TURN = 16
GGML_TYPE_IDS = {"f16": 1, "q8_0": 8, "q4_0": 2}   # llama.cpp's type_k / type_v values


def worker(engine: str, model: str, kv: str, context: int, threads: int) -> None:
    import numpy as np
    rng = np.random.default_rng(0)
    n_ctx = context + 256
    flash = kv != "f16"
    if engine == "elelem":
        sys.path.insert(0, ROOT)
        import elelem
        llm = elelem.LLM(model, n_ctx=n_ctx, n_threads=threads, type_k=kv, type_v=kv, flash_attn=flash)
        ctx, vocab = llm.engine.context, llm.n_vocab
        prompt = rng.integers(0, vocab, context).tolist()
        for i in range(0, context, 512):
            ctx.decode(prompt[i:i + 512], [0] * len(prompt[i:i + 512]))
        bytes_per_1k = ctx.cache.bytes_per_cell * 1000

        def step() -> None:
            ctx.decode([int(rng.integers(0, vocab))], [0])
    else:
        from llama_cpp import Llama
        options = {"type_k": GGML_TYPE_IDS[kv], "type_v": GGML_TYPE_IDS[kv], "flash_attn": True} if flash else {}
        llm = Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                    verbose=False, **options)
        vocab = llm.n_vocab()
        llm.eval(rng.integers(0, vocab, context).tolist())
        bytes_per_1k = None

        def step() -> None:
            llm.eval([int(rng.integers(0, vocab))])
    print(json.dumps({"ready": True, "bytes_per_1k": bytes_per_1k}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            return
        t0 = time.perf_counter()
        for _ in range(TOKENS_PER_TURN):
            step()
        print((time.perf_counter() - t0) / TOKENS_PER_TURN * 1000, flush=True)


def measure(args, kv: str, path: str) -> dict:
    pythons = {"elelem": sys.executable, "llama.cpp": args.llama_python}
    procs = {name: subprocess.Popen([python, os.path.abspath(__file__), "--worker", name, path, kv,
                                     str(args.context), str(args.threads)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for name, python in pythons.items()}
    try:
        ready = {name: json.loads(p.stdout.readline()) for name, p in procs.items()}
        times: dict[str, list[float]] = {name: [] for name in procs}
        for turn in range(args.turns):
            order = list(procs) if turn % 2 == 0 else list(reversed(procs))
            for name in order:
                procs[name].stdin.write("go\n")
                procs[name].stdin.flush()
                times[name].append(float(procs[name].stdout.readline()))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.stdin.write("quit\n")
                p.stdin.flush()
                p.wait(timeout=60)
    median = {name: statistics.median(t) for name, t in times.items()}
    row = {"kv": kv, "ms_per_token": median, "turns": times,
           "elelem_speed_over_llamacpp": median["llama.cpp"] / median["elelem"],
           "kv_mib_per_1k_tokens": ready["elelem"]["bytes_per_1k"] / 2**20}
    print(f"  {kv:<6} elelem {median['elelem']:6.1f} ms/token  llama.cpp {median['llama.cpp']:6.1f} ms/token  "
          f"elelem speed {row['elelem_speed_over_llamacpp']:.2f}x  (turns: elelem "
          f"{min(times['elelem']):.1f}-{max(times['elelem']):.1f}, llama.cpp "
          f"{min(times['llama.cpp']):.1f}-{max(times['llama.cpp']):.1f})  "
          f"KV {row['kv_mib_per_1k_tokens']:.1f} MiB per 1k tokens", flush=True)
    return row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        engine, path, kv, context, threads = sys.argv[2:7]
        worker(engine, path, kv, int(context), int(threads))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-python", required=True)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--context", type=int, default=4000)
    parser.add_argument("--kv", nargs="+", default=["f16", "q8_0"])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from elelem.model.hub import resolve_model
    path = str(resolve_model(args.model))
    print(f"{args.model}: decode after {args.context} tokens, {args.threads} threads, "
          f"{args.turns} turns of {TOKENS_PER_TURN} tokens each; load {os.getloadavg()[0]:.2f}")
    rows = [measure(args, kv, path) for kv in args.kv]
    if len(rows) > 1:
        base = rows[0]
        for row in rows[1:]:
            print(f"  {row['kv']} / {base['kv']} decode speed: elelem "
                  f"{base['ms_per_token']['elelem'] / row['ms_per_token']['elelem']:.2f}, llama.cpp "
                  f"{base['ms_per_token']['llama.cpp'] / row['ms_per_token']['llama.cpp']:.2f}")
    print(f"load at end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "context": args.context, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
