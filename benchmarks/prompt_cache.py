#!/usr/bin/env python3
"""The persistent prompt cache, side by side with llama-cpp-python's disk cache.

    python benchmarks/prompt_cache.py [--models smollm2-135m qwen2.5-coder-0.5b]
        [--threads 2] [--system-tokens 1500] [--llama-python PATH]

A coding agent starts process after process under the same long system
prompt.  For each engine, each in fresh subprocesses (greedy, 32 tokens):

* cold:  an empty cache folder, question B;
* prime: another fresh process asks question A (the cache gets the system prompt);
* warm:  a fresh process asks question B again, over the primed folder.

Reported: time to first token (from the request, the model loaded and its
tokenizer and template built: elelem builds them on first use, llama.cpp at
load), warm / cold (goal for elelem: <= 0.25), the load time, whether warm
gives cold's greedy answer, and the cache's size on disk per 1,000 tokens.  llama-cpp-python
runs with ``Llama.set_cache(LlamaDiskCache(folder))``, its documented disk
cache.  Its reference build: ``python scripts/reference_llamacpp.py --check``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's elelem, not site-packages'

N_NEW = 32
QUESTIONS = {
    "A": "Write a Python function that returns the n-th Fibonacci number.",
    "B": "Rename the function parse_config to load_config in: def parse_config(path): return open(path).read()",
}
_RULE_TOPICS = ["reading files", "editing files", "running tests", "naming", "error handling", "logging",
                "dependencies", "documentation", "commits", "reviews", "security", "performance"]


def system_prompt(n_rules: int) -> str:
    rules = [f"Rule {i + 1} ({_RULE_TOPICS[i % len(_RULE_TOPICS)]}): when you work on {_RULE_TOPICS[i % len(_RULE_TOPICS)]}, "
             f"check the project's conventions first, keep the change small (at most {10 + i % 7} lines where "
             f"possible), and explain in one sentence why it is needed."
             for i in range(n_rules)]
    return "You are a careful coding agent working in a large Python repository.\n" + "\n".join(rules)


# -- workers: one fresh process per measurement, one JSON line out -----------------------------

def worker_elelem(model: str, folder: str, question: str, threads: int, n_rules: int) -> dict:
    import elelem
    t0 = time.perf_counter()
    llm = elelem.LLM(model, n_ctx=4096, n_threads=threads, prompt_cache=folder)
    llm.detokenize(llm.tokenize("warm up"))       # the tokenizer and its decode table, built on first use
    llm.assets.chat_template
    load = time.perf_counter() - t0
    messages = [{"role": "system", "content": system_prompt(n_rules)}, {"role": "user", "content": QUESTIONS[question]}]
    t0 = time.perf_counter()
    stream = llm.chat_stream(messages, max_tokens=N_NEW, temperature=0.0)
    pieces = []
    ttft = None
    for piece in stream:
        if ttft is None:
            ttft = time.perf_counter() - t0
        pieces.append(piece)
    total = time.perf_counter() - t0
    cache = llm.engine.prompt_cache
    loaded = cache.loaded_tokens
    llm.close()                      # waits for the cache's write
    return dict(ttft_s=ttft, total_s=total, text="".join(pieces), loaded_tokens=loaded, load_s=load)


def worker_llamacpp(model: str, folder: str, question: str, threads: int, n_rules: int) -> dict:
    from llama_cpp import Llama, LlamaDiskCache
    t0 = time.perf_counter()
    llm = Llama(model, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    load = time.perf_counter() - t0
    llm.set_cache(LlamaDiskCache(cache_dir=folder))
    messages = [{"role": "system", "content": system_prompt(n_rules)}, {"role": "user", "content": QUESTIONS[question]}]
    t0 = time.perf_counter()
    pieces = []
    ttft = None
    for chunk in llm.create_chat_completion(messages, max_tokens=N_NEW, temperature=0.0, stream=True):
        piece = chunk["choices"][0]["delta"].get("content")
        if piece:
            if ttft is None:
                ttft = time.perf_counter() - t0
            pieces.append(piece)
    total = time.perf_counter() - t0
    return dict(ttft_s=ttft, total_s=total, text="".join(pieces), loaded_tokens=None, load_s=load)


# -- the driver ----------------------------------------------------------------------------------

def run_worker(python: str, engine: str, model: str, folder: str, question: str, args) -> dict:
    cmd = [python, __file__, "--worker", engine, "--model-path", model, "--folder", folder,
           "--question", question, "--threads", str(args.threads), "--rules", str(args.rules)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=Path(__file__).parent)
    if out.returncode != 0:
        raise SystemExit(f"{engine} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def folder_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def measure(engine: str, python: str, model: str, n_tokens: int, args) -> dict:
    with tempfile.TemporaryDirectory() as cold_dir, tempfile.TemporaryDirectory() as warm_dir:
        cold = run_worker(python, engine, model, cold_dir, "B", args)
        prime = run_worker(python, engine, model, warm_dir, "A", args)
        size = folder_bytes(warm_dir)
        warm = run_worker(python, engine, model, warm_dir, "B", args)
    stored = n_tokens + N_NEW      # the primed sequence: system prompt, question A and its answer
    return dict(cold_ttft_s=cold["ttft_s"], warm_ttft_s=warm["ttft_s"], ratio=warm["ttft_s"] / cold["ttft_s"],
                same_answer=warm["text"] == cold["text"], loaded_tokens=warm["loaded_tokens"],
                disk_mib_per_1k=size / 2**20 / (stored / 1000), prime_ttft_s=prime["ttft_s"], load_s=warm["load_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--system-tokens", type=int, default=1500, help="about this many tokens of system prompt")
    parser.add_argument("--llama-python", default=None, help="a python with llama_cpp (default: the reference build)")
    parser.add_argument("--worker", choices=["elelem", "llamacpp"], help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--question", help=argparse.SUPPRESS)
    parser.add_argument("--rules", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        work = worker_elelem if args.worker == "elelem" else worker_llamacpp
        print(json.dumps(work(args.model_path, args.folder, args.question, args.threads, args.rules)))
        return

    import elelem
    from elelem.model.hub import resolve_model
    llama_python = args.llama_python or _reference_python()
    print(f"# load average {os.getloadavg()[0]:.2f}; {args.threads} threads; {N_NEW} greedy tokens; "
          f"llama-cpp-python: {llama_python or 'not found (elelem only)'}")
    print(f"{'model':22} {'engine':16} {'sys tok':>7} {'cold TTFT':>10} {'warm TTFT':>10} {'warm/cold':>9} "
          f"{'same':>5} {'MiB/1k tok':>10} {'load':>7}")
    for name in args.models:
        path = str(resolve_model(name))
        with elelem.LLM(path, n_ctx=4096) as llm:
            args.rules = _rules_for(llm, args.system_tokens)
            n_tokens = len(llm.tokenize(system_prompt(args.rules)))
        engines = [("elelem", sys.executable)] + ([("llama-cpp-python", llama_python)] if llama_python else [])
        for label, python in engines:
            r = measure("elelem" if label == "elelem" else "llamacpp", python, path, n_tokens, args)
            print(f"{name:22} {label:16} {n_tokens:7d} {r['cold_ttft_s']:9.3f}s {r['warm_ttft_s']:9.3f}s "
                  f"{r['ratio']:9.3f} {str(r['same_answer']):>5} {r['disk_mib_per_1k']:10.1f} {r['load_s']:6.2f}s",
                  flush=True)


def _rules_for(llm, target_tokens: int) -> int:
    n = 1
    while len(llm.tokenize(system_prompt(n))) < target_tokens:
        n += 1
    return n


def _reference_python():
    out = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "reference_llamacpp.py"),
                          "--check"], capture_output=True, text=True, check=False)
    lines = out.stdout.strip().splitlines()
    return lines[-1] if out.returncode == 0 and lines and os.path.exists(lines[-1]) else None


if __name__ == "__main__":
    main()
