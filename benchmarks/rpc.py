#!/usr/bin/env python3
"""Decode and prefill speed of a model split over two loopback RPC servers, against local.

    python benchmarks/rpc.py [--model smollm2-135m] [--threads 2] [--prompt-tokens 512]
                             [--decode-tokens 128] [--repeats 3] [--json]

Starts two `elelem rpc-server` processes on free loopback ports; the split
run gives each a third of the layers (the local CPU keeps the rest).  The
layers of one step run one after another, so the three processes take turns
on the CPUs and each may use all ``--threads``: the difference from the local
run is the protocol's cost (graph serialization, the activations sent between
the processes, one round trip per server per step), not less compute.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's elelem, not site-packages'

from elelem.api.benchmark import run_benchmark  # noqa: E402
from elelem.api.devices import check_server  # noqa: E402
from elelem.errors import RPCError  # noqa: E402
from elelem.model.hub import resolve_model  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(threads: int):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "elelem", "rpc-server", "--port", str(port),
                             "--threads", str(threads)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            check_server(endpoint, timeout=2.0)
            return proc, endpoint
        except RPCError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a path or a packaged model name")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="threads of each process")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = resolve_model(args.model)
    options = dict(n_threads=args.threads, n_prompt=args.prompt_tokens, n_decode=args.decode_tokens,
                   repeats=args.repeats, speculative=False)
    load_before = os.getloadavg()
    local = run_benchmark(path, **options)
    servers = [start_server(args.threads) for _ in range(2)]
    try:
        split = run_benchmark(path, rpc_servers=[endpoint for _, endpoint in servers], **options)
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait()
    result = {
        "model": str(path), "threads": args.threads, "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens, "repeats": args.repeats,
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "local": {"prefill_tok_s": local.prefill_tok_s, "decode_tok_s": local.decode_tok_s},
        "split_over_2_servers": {"prefill_tok_s": split.prefill_tok_s, "decode_tok_s": split.decode_tok_s},
        "decode_ratio": split.decode_tok_s / local.decode_tok_s,
        "prefill_ratio": split.prefill_tok_s / local.prefill_tok_s,
        # what the protocol adds to each token's step (decode) and to each prompt token (prefill)
        "decode_overhead_ms_per_token": 1000 * (1 / split.decode_tok_s - 1 / local.decode_tok_s),
        "prefill_overhead_ms_per_token": 1000 * (1 / split.prefill_tok_s - 1 / local.prefill_tok_s),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"model    {result['model']} ({args.threads} threads per process, median of {args.repeats})")
    print(f"load     {' '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' '.join(f'{x:.2f}' for x in result['load_average_after'])} after")
    print(f"{'':24} {'prefill tok/s':>14} {'decode tok/s':>13}")
    print(f"{'local':24} {local.prefill_tok_s:14.1f} {local.decode_tok_s:13.1f}")
    print(f"{'2 loopback RPC servers':24} {split.prefill_tok_s:14.1f} {split.decode_tok_s:13.1f}")
    print(f"{'ratio (split / local)':24} {result['prefill_ratio']:14.2f} {result['decode_ratio']:13.2f}")
    print(f"{'overhead, ms per token':24} {result['prefill_overhead_ms_per_token']:14.3f} "
          f"{result['decode_overhead_ms_per_token']:13.3f}")


if __name__ == "__main__":
    main()
