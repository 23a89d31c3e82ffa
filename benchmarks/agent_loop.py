#!/usr/bin/env python3
"""A coding agent's loop on a hybrid model: tokens evaluated and time to first token per turn.

    python benchmarks/agent_loop.py [--smoke] [--threads 2] [--system 2000] [--turn 201] [--turns 5]
        [--reasoning 13] [--answer 32] [--llama-python "$(python scripts/reference_llamacpp.py --check)"]
        [--before-python PYTHON]

The model is benchmarks/hybrid.py's synthetic ``qwen35`` (the Qwen3.5-4B
shape, or with ``--smoke`` a small one of the same structure), built and
cached as there.  The loop: a ``--system``-token prompt, then turn after
turn a greedy answer of ``--answer`` tokens whose first ``--reasoning``
tokens the next prompt leaves out (as Qwen3.5's template drops reasoning
from history: the prompt parts from the cache where the last prompt ended),
and a new message of ``--turn`` tokens.

elelem runs the loop on one session, as a user would; a turn's time to
first token is its prefill (``Session.prefill``), then the answer.  Printed
per turn: the prompt's length, the new tokens, the tokens elelem evaluated
(``Context.n_evaluated`` around the prefill) and the time to first token;
with ``--before-python``, the same for the elelem installed there (an
earlier build, to compare); then llama-cpp-python, which cannot resume a recurrent state inside the cache
(0.3.36 fails from the third turn of such a loop), evaluating the last
turn's prompt from the start, with flash attention as elelem's.

Prints numbers; asserts nothing; no part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hybrid  # noqa: E402
import moe  # noqa: E402


def elelem_loop(path: str, threads: int, plan: dict) -> dict:
    import numpy as np

    import elelem

    rng = np.random.default_rng(0)
    vocab = plan["vocab"]
    prompt = rng.integers(100, vocab, plan["system"]).tolist()
    turns = []
    with elelem.LLM(path, n_threads=threads, n_ctx=8192) as llm:   # defaults: prompt lookup on
        session = llm.new_session()
        for _ in range(plan["turns"]):
            before = llm.engine.context.n_evaluated
            t0 = time.perf_counter()
            session.prefill(prompt)
            ttft = time.perf_counter() - t0
            evaluated = llm.engine.context.n_evaluated - before
            answer = session.generate_tokens(prompt, plan["answer"])
            turns.append(dict(prompt=len(prompt), evaluated=evaluated, ttft=ttft))
            prompt = prompt + answer[plan["reasoning"]:] + rng.integers(100, vocab, plan["turn"]).tolist()
        turns[-1]["tokens"] = prompt   # the next turn's prompt, for the reference
    for before, turn in zip(turns, turns[1:]):
        turn["new"] = turn["prompt"] - before["prompt"]   # the cache parts where the last prompt ended
    return dict(turns=turns)


LLAMA_WORKER = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, tokens = sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3]))
llm = Llama(model_path=path, n_ctx=8192, n_batch=512, n_threads=threads, flash_attn=True, verbose=False)
times = []
for _ in range(2):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    times.append(time.perf_counter() - t0)
print(json.dumps(dict(ttft=min(times))))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--system", type=int, default=2000)
    ap.add_argument("--turn", type=int, default=201)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--reasoning", type=int, default=13)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--llama-python")
    ap.add_argument("--before-python", help="a Python with an earlier elelem installed, run beside this checkout's")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        path, plan = args.worker
        print(json.dumps(elelem_loop(path, args.threads, json.loads(plan))))
        return
    llama_python = moe.reference_and_header(args.llama_python)
    table = hybrid.shapes(args.smoke)
    _, layers, _, description = table["qwen35"]
    path = moe.model_path("qwen35", layers, args.smoke, table, prefix="hybrid")
    if not path.exists():
        moe.build_model("qwen35", layers, args.smoke, llama_python, args.threads, table, prefix="hybrid")
    print(f"{description}; {layers} layers; {args.threads} threads")
    plan = dict(vocab=moe.N_VOCAB, system=args.system, turn=args.turn, turns=args.turns,
                reasoning=args.reasoning, answer=args.answer)
    runs = {}
    engines = [("elelem", sys.executable, {"PYTHONPATH": str(HERE.parent)})]
    if args.before_python:
        engines.append((f"elelem under {args.before_python}", args.before_python, {}))
    for label, python, env in engines:
        out = subprocess.run([python, __file__, "--threads", str(args.threads), "--worker", str(path),
                              json.dumps(plan)], capture_output=True, text=True, check=True,
                             env={**os.environ, **env}, cwd="/")
        runs[label] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"\n{label}: turn, prompt, new, evaluated, time to first token")
        for i, turn in enumerate(runs[label]["turns"], 1):
            print(f"  {i}  {turn['prompt']:6d}  {turn.get('new', turn['prompt']):5d}  {turn['evaluated']:6d}"
                  f"  {turn['ttft'] * 1000:8.1f} ms")
    last = runs["elelem"]["turns"][-1]
    tokens_file = Path("/tmp") / f"agent_loop_tokens_{time.time_ns()}.json"
    ref = json.loads(subprocess.run([llama_python, "-c", LLAMA_WORKER, str(path), str(args.threads),
                                     str(_last_prompt(runs, plan, tokens_file))],
                                    capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    print(f"\nllama-cpp-python, turn {args.turns}'s prompt ({last['prompt']} tokens) from the start: "
          f"{ref['ttft'] * 1000:.1f} ms; elelem's time to first token {last['ttft'] * 1000:.1f} ms "
          f"({last['ttft'] / ref['ttft']:.2f}x)")


def _last_prompt(runs: dict, plan: dict, path: Path) -> Path:
    """The last turn's prompt: the loop's final 'next prompt' minus what the last turn added."""
    final = runs["elelem"]["turns"][-1]["tokens"]
    last_len = runs["elelem"]["turns"][-1]["prompt"]
    path.write_text(json.dumps(final[:last_len]))
    return path


if __name__ == "__main__":
    main()
