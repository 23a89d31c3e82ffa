#!/usr/bin/env python3
"""Many models behind one ``elelem serve``: what switching costs, and what a load costs the others.

    python benchmarks/serve_pool.py [--model smollm2-135m] [--third qwen2.5-coder-0.5b] [--threads 1]
        [--tokens 32] [--requests 16] [--latency-requests 40] [--rounds 2] [--load-by request|endpoint]
        [--json out.json]

One server subprocess (``python -m elelem serve``, this checkout) serves three
models under ``--max-loaded 2``: ``a`` and ``b``, the same ``--model`` file
under two names (two engines, each with its weights and KV cache, and the
same speed, so their figures compare), and ``c``, the ``--third`` model.

- Switching: one client sends ``--requests`` streamed chat completions one
  after the other (greedy, ``--tokens`` tokens each, the end tokens banned),
  all to ``a``, then as many alternating ``a``, ``b``, ``a``, ... with both
  loaded.  ``tok/s`` is the generated tokens over the wall time.
- A load beside: one client sends ``--latency-requests`` short requests (8
  tokens) to ``a`` one after the other, first with nothing else running
  (quiet), then while a second client keeps asking ``c`` and ``b`` in turn
  for one token, each after unloading the other (``POST /models/unload``),
  so that every one of its requests loads its model and ``a`` stays.  With
  ``--load-by endpoint`` the second client loads them with ``POST
  /models/load`` instead: the loads alone, without the loaded model's
  prompt and token computed beside ``a``'s.  The figures are ``a``'s
  latency p50 and p99 in each phase, their ratios (the target: p99
  within 1.10), and the latency of the requests that loaded a model.

Each round runs every measurement once (the two tok/s figures in turns);
the figures are over all rounds.  The script prints numbers; it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = ["Write a Python function that reverses a string.", "Explain what a hash map is.",
             "Name three uses of a queue.", "How does binary search work?"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(folder: Path, args, port: int) -> subprocess.Popen:
    models = [arg for name in ("a", "b", "c") for arg in ("--model", str(folder / f"{name}.gguf"))]
    return subprocess.Popen(
        [sys.executable, "-m", "elelem", "serve", *models, "--max-loaded", "2", "--port", str(port),
         "--parallel", "2", "--ctx", "512", "--threads", str(args.threads), "--keep-alive", "-1"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_ready(url: str, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {process.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def chat(client: httpx.Client, model: str, question: str, tokens: int, no_end: dict, stream: bool = False) -> int:
    """One greedy chat completion; returns its completion tokens."""
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": tokens,
            "temperature": 0, "logit_bias": no_end}
    if not stream:
        answer = client.post("/v1/chat/completions", json=body)
        answer.raise_for_status()
        return answer.json()["usage"]["completion_tokens"]
    body.update(stream=True, stream_options={"include_usage": True})
    completion = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                completion = usage["completion_tokens"] if usage else completion
    return completion


def tok_s(client: httpx.Client, models: list[str], args, no_end: dict) -> float:
    t0, tokens = time.perf_counter(), 0
    for i in range(args.requests):
        tokens += chat(client, models[i % len(models)], QUESTIONS[i % len(QUESTIONS)], args.tokens, no_end,
                       stream=True)
    return tokens / (time.perf_counter() - t0)


def latencies(client: httpx.Client, args, no_end: dict, loading: bool) -> tuple[list[float], list[float]]:
    """``a``'s request latencies, and those of the loading requests run beside them when ``loading``."""
    stop, loads = threading.Event(), []

    def load_in_turn() -> None:
        with httpx.Client(base_url=client.base_url, timeout=300) as other:
            turn = 0
            while not stop.is_set():
                t0 = time.perf_counter()
                name, other_name = ("c", "b")[turn % 2], ("b", "c")[turn % 2]
                # The other one out first: left to the pool's least-recently-used choice,
                # the room would now and then be made by unloading a, whose requests run
                # back to back (between two of them it is idle, and may be the older).
                while (answer := other.post("/models/unload", json={"model": other_name})).status_code == 409:
                    time.sleep(0.005)   # its last request's slot is given back just after the answer
                answer.raise_for_status()
                if args.load_by == "endpoint":
                    other.post("/models/load", json={"model": name}).raise_for_status()
                else:
                    chat(other, name, "Hi", 1, {})
                loads.append(time.perf_counter() - t0)
                turn += 1
    loader = threading.Thread(target=load_in_turn) if loading else None
    if loader is not None:
        loader.start()
        while not loads:  # the first load is under way or done: measure from here
            time.sleep(0.01)
    seen = []
    for i in range(args.latency_requests):
        t0 = time.perf_counter()
        chat(client, "a", QUESTIONS[i % len(QUESTIONS)], 8, no_end)
        seen.append(time.perf_counter() - t0)
    stop.set()
    if loader is not None:
        loader.join()
    return seen, loads


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def end_tokens(path: str) -> dict:
    sys.path.insert(0, str(REPO))
    import elelem
    with elelem.LLM(path, n_ctx=64, n_threads=1) as llm:
        return {str(t): -100 for t in sorted(llm.tokenizer.eog_ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="served twice, as a and b")
    parser.add_argument("--third", default="qwen2.5-coder-0.5b", help="c, loaded while a answers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=16, help="requests per tok/s figure")
    parser.add_argument("--latency-requests", type=int, default=40, help="a's requests per latency phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--load-by", choices=("request", "endpoint"), default="request",
                        help="how the second client loads c and b: a 1-token chat request, or POST /models/load")
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from elelem.model.hub import resolve_model
    model, third = str(resolve_model(args.model)), str(resolve_model(args.third))
    no_end = end_tokens(model)
    started_load = os.getloadavg()[0]  # the machine's: on a shared one, the figures move with it
    with tempfile.TemporaryDirectory() as folder:
        for name, target in (("a", model), ("b", model), ("c", third)):
            (Path(folder) / f"{name}.gguf").symlink_to(target)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_server(Path(folder), args, port)
        figures: dict[str, list] = {"one": [], "switching": [], "quiet": [], "loading": [], "loads": []}
        try:
            wait_ready(url, process)
            with httpx.Client(base_url=url, timeout=300) as client:
                for name in ("a", "b"):
                    chat(client, name, "Hello", 4, no_end)  # warm-up: both loaded
                for round_ in range(args.rounds):
                    # Each round swaps the order, so a drift in the machine's load hits both alike.
                    for kind in (("one", "switching") if round_ % 2 == 0 else ("switching", "one")):
                        figures[kind].append(tok_s(client, ["a"] if kind == "one" else ["a", "b"], args, no_end))
                    figures["quiet"] += latencies(client, args, no_end, loading=False)[0]
                    seen, loads = latencies(client, args, no_end, loading=True)
                    figures["loading"] += seen
                    figures["loads"] += loads
                    chat(client, "b", "Hello", 1, no_end)  # a and b loaded again for the next round
                    print(f"round {round_ + 1}: one model {figures['one'][-1]:.1f} tok/s, switching "
                          f"{figures['switching'][-1]:.1f} tok/s; {len(loads)} loads beside", flush=True)
        finally:
            process.terminate()
            process.wait(30)
    one, switching = statistics.median(figures["one"]), statistics.median(figures["switching"])
    print(f"\n{args.model} as a and b, {args.third} as c, --max-loaded 2, {args.threads} thread(s); "
          f"load average at the start {started_load:.1f}, at the end {os.getloadavg()[0]:.1f}")
    print(f"switching: one model {one:.1f} tok/s, a and b alternating {switching:.1f} tok/s "
          f"(ratio {switching / one:.3f}; medians of {args.rounds} rounds of {args.requests} requests)")
    quiet, loading = figures["quiet"], figures["loading"]
    for name, values in (("quiet", quiet), ("loading c/b beside", loading)):
        print(f"a's latency, {name:>18}: p50 {percentile(values, 0.5) * 1000:6.0f} ms, "
              f"p99 {percentile(values, 0.99) * 1000:6.0f} ms ({len(values)} requests)")
    print(f"a's latency beside loads / quiet: p50 ratio {percentile(loading, 0.5) / percentile(quiet, 0.5):.3f}, "
          f"p99 ratio {percentile(loading, 0.99) / percentile(quiet, 0.99):.3f} (target: p99 ratio <= 1.10)")
    if figures["loads"]:
        what = "unload of the other, POST /models/load" if args.load_by == "endpoint" else \
            "unload of the other, load, 1 token"
        print(f"the loading requests ({what}): p50 "
              f"{percentile(figures['loads'], 0.5) * 1000:.0f} ms over {len(figures['loads'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
