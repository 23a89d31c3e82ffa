#!/usr/bin/env python3
"""elelem against llama-cpp-python, side by side, on the same GGUF and prompt.

    python benchmarks/compare_llamacpp.py [--models qwen2.5-coder-0.5b smollm2-135m gemma3-270m]
        [--threads 1 2] [--repeats 3] [--llama-python /path/to/venv/bin/python] [--installed]

elelem is this checkout's (``--installed``: the one installed for this Python).
Each measurement runs in a fresh subprocess (so peak RSS is the engine's own),
and the two engines alternate run by run.  Reported: medians of load time,
prefill tok/s (512-token prompt), time to first token, decode tok/s (128
greedy tokens) and peak RSS, the ratio elelem / llama.cpp, and decode as a
share of the memory-bandwidth bound (measured read bandwidth / bytes of
weights read per token).

llama-cpp-python is a dev-only reference: build it from its sdist (same ggml
0.25.3 as elelem's vendored copy) in its own venv, e.g.
    python -m venv /tmp/ref && /tmp/ref/bin/pip install numpy \
        && /tmp/ref/bin/pip install llama-cpp-python==0.3.36 --no-binary llama-cpp-python
and pass --llama-python /tmp/ref/bin/python.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

N_PROMPT, N_DECODE = 512, 128


# --------------------------------------------------------------------------
# Workers: one measurement each, printed as one JSON line.

def _prompt(n_vocab: int) -> list[int]:
    import numpy as np
    rng = np.random.default_rng(0)
    return [int(t) for t in rng.integers(100, min(n_vocab, 30000), N_PROMPT)]


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_elelem(path: str, threads: int, options: str = "{}") -> dict:
    import numpy as np
    if os.environ.get(CHECKOUT_ENV):  # this checkout's elelem, not an installed one
        sys.path.insert(0, os.environ[CHECKOUT_ENV])
    from elelem import LLM  # imported before the clock starts, as llama_cpp is
    t0 = time.perf_counter()
    llm = LLM(path, n_threads=threads, n_ctx=1024, n_batch=512, **json.loads(options))
    load = time.perf_counter() - t0
    prompt = _prompt(llm.n_vocab)
    t0 = time.perf_counter()
    token = int(np.argmax(llm.eval(prompt)))
    ttft = time.perf_counter() - t0
    out = [token]
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(N_DECODE):
        token = int(np.argmax(llm.eval([token])))
        out.append(token)
    decode, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(load_s=load, prefill_tok_s=N_PROMPT / ttft, ttft_s=ttft, decode_tok_s=N_DECODE / decode,
                decode_cpu_tok_s=N_DECODE / cpu, peak_rss_mb=_peak_rss_mb(), tokens=out[:32])


def worker_llamacpp(path: str, threads: int) -> dict:
    import numpy as np
    from llama_cpp import Llama
    t0 = time.perf_counter()
    llm = Llama(path, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    load = time.perf_counter() - t0
    prompt = _prompt(llm.n_vocab())

    def last_logits():  # a view of llama.cpp's own buffer: no copy, as fair as it gets
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    t0 = time.perf_counter()
    llm.eval(prompt)
    token = int(np.argmax(last_logits()))
    ttft = time.perf_counter() - t0
    out = [token]
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(N_DECODE):
        llm.eval([token])
        token = int(np.argmax(last_logits()))
        out.append(token)
    decode, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(load_s=load, prefill_tok_s=N_PROMPT / ttft, ttft_s=ttft, decode_tok_s=N_DECODE / decode,
                decode_cpu_tok_s=N_DECODE / cpu, peak_rss_mb=_peak_rss_mb(), tokens=out[:32])


def worker_bandwidth(threads: int) -> dict:
    """Read bandwidth: numpy sums over a 1 GiB array, split across threads
    (numpy releases the GIL in reductions)."""
    import numpy as np
    data = np.ones(1 << 27, dtype=np.float64)  # 1 GiB, touched once here
    chunks = np.array_split(data, threads)
    best = 0.0
    for _ in range(5):
        ts = [threading.Thread(target=np.sum, args=(c,)) for c in chunks]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, data.nbytes / (time.perf_counter() - t0))
    return dict(read_gb_s=best / 1e9)


def bytes_per_token(path: str) -> int:
    """Weights read per decoded token: every tensor fully, the token embedding
    as one row (unless it is also the tied output matrix)."""
    from elelem.gguf.reader import read_gguf
    g = read_gguf(path)
    total = 0
    tied = "output.weight" not in g.tensors
    for name, t in g.tensors.items():
        if name == "token_embd.weight" and not tied:
            total += t.nbytes // t.shape[1]
        else:
            total += t.nbytes
    return total


# --------------------------------------------------------------------------
# Driver.

REPO = Path(__file__).resolve().parent.parent
#: Set for an elelem worker that imports the checkout at this path (see checkout_env).
CHECKOUT_ENV = "ELELEM_BENCH_CHECKOUT"


def checkout_env(installed: bool) -> dict:
    """The environment of an elelem worker: this checkout's elelem, unless
    ``installed`` (then the one installed for the worker's Python).  A worker
    started as ``python benchmarks/...`` would otherwise find whatever elelem
    site-packages holds, since its path starts at benchmarks/."""
    return {} if installed else {CHECKOUT_ENV: str(REPO)}


def run_worker(python: str, kind: str, *args, env: dict | None = None) -> dict:
    cmd = [python, os.path.abspath(__file__), "--worker", kind, *map(str, args)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=None if env is None else dict(os.environ, **env))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama-python", default=sys.executable,
                    help="a Python interpreter that can import llama_cpp (default: this one)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--installed", action="store_true",
                    help="measure the elelem installed for this Python, not this checkout's")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        kind, *rest = args.worker
        if kind == "bandwidth":
            print(json.dumps(worker_bandwidth(int(rest[0]))))
        else:
            fn = worker_elelem if kind == "elelem" else worker_llamacpp
            print(json.dumps(fn(rest[0], int(rest[1]), *rest[2:])))
        return

    if not args.installed:
        sys.path.insert(0, str(REPO))
    from elelem.model.hub import resolve_model
    rows = []
    for threads in args.threads:
        bw = run_worker(sys.executable, "bandwidth", threads)["read_gb_s"]
        print(f"\n== {threads} thread(s): read bandwidth {bw:.1f} GB/s", flush=True)
        for name in args.models:
            path = str(resolve_model(name))
            runs = {"elelem": [], "llama.cpp": []}
            for _ in range(args.repeats):  # interleaved
                runs["elelem"].append(run_worker(sys.executable, "elelem", path, threads,
                                                 env=checkout_env(args.installed)))
                runs["llama.cpp"].append(run_worker(args.llama_python, "llamacpp", path, threads))
            med = {eng: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "tokens"}
                   for eng, rs in runs.items()}
            same = runs["elelem"][0]["tokens"] == runs["llama.cpp"][0]["tokens"]
            bound = bw * 1e9 / bytes_per_token(path)
            row = dict(model=name, threads=threads, bandwidth_gb_s=bw, decode_bound_tok_s=bound,
                       same_tokens=same, elelem=med["elelem"], llamacpp=med["llama.cpp"])
            rows.append(row)
            _print_row(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def _print_row(row: dict) -> None:
    e, l = row["elelem"], row["llamacpp"]
    print(f"\n{row['model']} @ {row['threads']} thread(s); same greedy tokens: {row['same_tokens']}")
    print(f"  {'figure':<16}{'elelem':>12}{'llama.cpp':>12}{'ratio':>8}")
    for key, label, fmt in (("load_s", "load (s)", "{:.3f}"), ("prefill_tok_s", "prefill tok/s", "{:.1f}"),
                            ("ttft_s", "ttft (s)", "{:.3f}"), ("decode_tok_s", "decode tok/s", "{:.1f}"),
                            ("peak_rss_mb", "peak RSS (MB)", "{:.0f}")):
        print(f"  {label:<16}{fmt.format(e[key]):>12}{fmt.format(l[key]):>12}{e[key] / l[key]:>8.2f}")
    bound = row["decode_bound_tok_s"]
    print(f"  decode bound {bound:.1f} tok/s: elelem {100 * e['decode_tok_s'] / bound:.0f}%, "
          f"llama.cpp {100 * l['decode_tok_s'] / bound:.0f}%")


if __name__ == "__main__":
    main()
