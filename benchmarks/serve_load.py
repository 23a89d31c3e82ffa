#!/usr/bin/env python3
"""Load on an OpenAI-compatible server: throughput, time to first token and inter-token latency.

    python benchmarks/serve_load.py [--model smollm2-135m] [--clients 1 4 8] [--requests 2]
        [--tokens 64] [--threads 2] [--ctx 1024]
        [--llama-python "$(python scripts/reference_llamacpp.py --check)"] [--json out.json]

Both servers run at once, idle but for the one being measured: each N runs
on one, then the other, so a change in the machine's load hits both alike.
Each is one subprocess on a free loopback port, with the same model file and
the same requests:
- elelem: ``python -m elelem serve --parallel 8`` (this checkout's elelem);
- llama-cpp-python (``--llama-python``, a Python whose ``llama_cpp`` has its
  server extra: ``python -m llama_cpp.server``), which runs one request at a
  time; ``--interrupt_requests False``, or each new request would cut the
  running stream off.

Each of N clients (threads) sends ``--requests`` streamed chat completions
one after the other (client i, request j gets its own short question),
greedy, ``max_tokens=--tokens``, with the end-of-generation tokens banned
through ``logit_bias`` so every answer has ``--tokens`` tokens.  One request
is sent alone first, untimed (warm-up).

Figures per server and N:
- ``tok/s``: generated tokens of all requests / wall time from the start of
  the first request to the end of the last.  The tokens are the usage's
  ``completion_tokens`` (``stream_options.include_usage``), or the content
  chunks where a server sends no usage: a chunk is one token there, but
  elelem's speculative decoding can confirm several tokens in one step and
  send them in one chunk;
- ``TTFT p50/p99``: from sending a request to its first content chunk;
- ``ITL p50/p99``: between successive content chunks of one request (a
  chunk of several tokens counts once);
- ``errors``: requests that failed or got fewer tokens than asked.
The script prints numbers; it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = ["Write a Python function that reverses a string.", "Explain what a hash map is.",
             "Name three uses of a queue.", "How does binary search work?", "What is recursion?",
             "Describe a linked list.", "Why are tests useful?", "What does a compiler do?"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_elelem(path: str, args, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "elelem", "serve", "--model", path, "--port", str(port), "--parallel",
         str(max(args.clients)), "--ctx", str(args.ctx), "--threads", str(args.threads), "--keep-alive", "-1"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def start_llamacpp(path: str, args, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [args.llama_python, "-m", "llama_cpp.server", "--model", path, "--port", str(port), "--host", "127.0.0.1",
         "--n_ctx", str(args.ctx), "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
         "--interrupt_requests", "False",  # by default a new request cuts the running stream off
         "--verbose", "False"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_ready(url: str, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {process.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def one_request(url: str, model: str, question: str, args, no_end: dict) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": args.tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "logit_bias": no_end}
    times = []
    usage_tokens = None
    t0 = time.perf_counter()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    times.append(time.perf_counter())
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
    except (httpx.HTTPError, ValueError) as error:
        return {"error": f"{type(error).__name__}: {error}", "times": times, "start": t0, "tokens": len(times)}
    tokens = usage_tokens if usage_tokens is not None else len(times)
    return {"error": None if tokens >= args.tokens else f"{tokens} tokens in {len(times)} chunks",
            "times": times, "start": t0, "tokens": tokens}


def run_load(url: str, model: str, n_clients: int, args, no_end: dict) -> dict:
    results: list[dict] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n_clients)

    def client(index: int) -> None:
        barrier.wait()
        for j in range(args.requests):
            result = one_request(url, model, QUESTIONS[(index + j) % len(QUESTIONS)] + f" ({index}.{j})",
                                 args, no_end)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    start = min(r["start"] for r in results)
    end = max([r["times"][-1] for r in results if r["times"]] or [start])
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["times"][0] - r["start"] for r in results if r["times"]]
    itl = [b - a for r in results for a, b in zip(r["times"], r["times"][1:])]
    return {"clients": n_clients, "requests": len(results), "tokens": tokens,
            "tok_s": tokens / (end - start) if end > start else 0.0,
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99),
            "errors": [r["error"] for r in results if r["error"]]}


def percentile(values: list, q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


class Running:
    """One server subprocess, ready, with the id of its model."""

    def __init__(self, name: str, start, path: str, args):
        self.name = name
        self.url = f"http://127.0.0.1:{free_port()}"
        self.process = start(path, args, int(self.url.rsplit(":", 1)[1]))
        wait_ready(self.url, self.process)
        self.model = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def bench(servers: list, args, no_end: dict) -> list[dict]:
    """Each N on every server in turn, so a change in the machine's load hits them alike."""
    for server in servers:
        one_request(server.url, server.model, "Hello", args, no_end)  # warm-up
    rows = []
    for n in args.clients:
        for server in servers:
            row = {"server": server.name, **run_load(server.url, server.model, n, args, no_end)}
            print(f"{server.name:>18} {n:>3} clients: {row['tok_s']:7.1f} tok/s  "
                  f"TTFT p50 {row['ttft_p50'] * 1e3:7.0f} ms  p99 {row['ttft_p99'] * 1e3:7.0f} ms  "
                  f"ITL p50 {row['itl_p50'] * 1e3:6.1f} ms  p99 {row['itl_p99'] * 1e3:6.1f} ms  "
                  f"errors {len(row['errors'])}", flush=True)
            rows.append(row)
    return rows


def end_tokens(path: str) -> dict:
    sys.path.insert(0, str(REPO))
    import elelem
    with elelem.LLM(path, n_ctx=64, n_threads=1) as llm:
        return {str(t): -100 for t in sorted(llm.tokenizer.eog_ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--llama-python", default=None, help="a Python with llama_cpp and its server extra")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from elelem.model.hub import resolve_model
    path = str(resolve_model(args.model))
    no_end = end_tokens(path)
    print(f"model {path}; {args.clients} clients x {args.requests} requests x {args.tokens} tokens, "
          f"{args.threads} threads, ctx {args.ctx}", flush=True)
    servers = []
    try:
        servers.append(Running("elelem", start_elelem, path, args))
        if args.llama_python:
            servers.append(Running("llama-cpp-python", start_llamacpp, path, args))
        rows = bench(servers, args, no_end)
    finally:
        for server in servers:
            server.stop()
    if args.llama_python:
        for n in args.clients:
            ours = next(r for r in rows if r["server"] == "elelem" and r["clients"] == n)
            theirs = next(r for r in rows if r["server"] != "elelem" and r["clients"] == n)
            print(f"{n:>3} clients: throughput x{ours['tok_s'] / theirs['tok_s']:.2f}, "
                  f"TTFT p99 {ours['ttft_p99'] * 1e3:.0f} vs {theirs['ttft_p99'] * 1e3:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
