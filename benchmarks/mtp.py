#!/usr/bin/env python3
"""MTP drafting on Qwen3.5-shaped synthetic files, against elelem without drafts and llama-cpp-python.

    python benchmarks/mtp.py --llama-python "$(python scripts/reference_llamacpp.py --check)" \
        [--repeats 2] [--threads 1] [--layers 24]

Two files of one shape (Qwen3.5: Gated DeltaNet layers, full attention every 4th; n_embd 768,
``--layers`` layers, FFN 2048, one MTP block, Q8_0 (embeddings and output too), SmolLM2's vocabulary
so that llama.cpp loads them), written once to ``$ELELEM_CACHE/bench/`` by tests/support/synthetic.py:

- "agree": the layers barely move the residual stream and the MTP block computes the model's next
  token from the current one (synthetic.py's ``mtp="agree"``), so the head's drafts are confirmed;
- "disagree": random weights, so the head's drafts are refused and the draft planner should turn
  drafting off (its probes aside).

Each run is a fresh process: a 512-token prompt evaluated, then 128 greedy tokens generated, in
decode tok/s -- elelem with speculative decoding off, elelem with it on (prompt lookup and the MTP
head, as the planner picks), and llama.cpp (llama-cpp-python, no drafting), one after the other in
each repeat; also in tokens per CPU second of the decoding process, steadier than the wall clock where
other work shares the machine.  elelem runs with flash attention off and without AMX, as the
reference build.  Also printed: the load average, the drafters' verified and kept tokens, and
whether the greedy tokens are the same in all three.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO / "benchmarks"))

import compare_llamacpp as cmp  # noqa: E402

N_PROMPT, N_DECODE = cmp.N_PROMPT, cmp.N_DECODE


def model_path(kind: str, layers: int) -> Path:
    from synthetic import TinyConfig, write_model
    from vocab_metadata import vocab_writer

    cache = Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem"))
    path = cache / "bench" / f"qwen35-mtp-{kind}-{layers}l-768-q8_0.gguf"
    if not path.exists():
        cfg = TinyConfig(arch="qwen35", n_vocab=49152, n_embd=768, n_layer=layers, n_head=12, n_head_kv=2,
                         head_dim=64, n_rot=32, n_ff=2048, ssm_d_state=64, ssm_n_group=4, ssm_dt_rank=8,
                         rope_sections=(11, 11, 10, 0), wtype="q8_0", embd_type="q8_0",
                         n_ctx_train=4096, seed=7, mtp="agree" if kind == "agree" else True)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        write_model(partial, cfg, extra_metadata=vocab_writer(cache / "models" / "smollm2-135m-instruct-q4_1.gguf"))
        partial.replace(path)
    return path


def worker_elelem(path: str, threads: int, speculative: str) -> dict:
    if os.environ.get(cmp.CHECKOUT_ENV):
        sys.path.insert(0, os.environ[cmp.CHECKOUT_ENV])
    from elelem import LLM
    llm = LLM(path, n_threads=threads, n_ctx=1024, n_batch=512, flash_attn=False, amx=False,
              speculative=speculative == "on")
    prompt = cmp._prompt(llm.n_vocab)
    t0 = time.perf_counter()
    llm.prefill(prompt)
    ttft = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    out = llm.generate_tokens(prompt, N_DECODE, stop_ids=())
    decode, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(prefill_tok_s=N_PROMPT / ttft, decode_tok_s=len(out) / decode, decode_cpu_tok_s=len(out) / cpu,
                tokens=out[:32], n=len(out), drafters=llm.engine.drafter_stats())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--kinds", nargs="+", default=["agree", "disagree"], choices=["agree", "disagree"])
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker_elelem(args.worker[0], int(args.worker[1]), args.worker[2])))
        return
    for kind in args.kinds:
        path = str(model_path(kind, args.layers))
        runs: dict[str, list[dict]] = {"elelem": [], "elelem+drafts": [], "llama.cpp": []}
        for _ in range(args.repeats):
            for name, spec in (("elelem", "off"), ("elelem+drafts", "on")):
                cmd = [sys.executable, os.path.abspath(__file__), "--llama-python", "-", "--worker", path,
                       str(args.threads), spec]
                runs[name].append(_run(cmd))
            runs["llama.cpp"].append(cmp.run_worker(args.llama_python, "llamacpp", path, args.threads))
        print(f"{kind}: {Path(path).name}, {args.threads} threads, median of {args.repeats}")
        print(f"  load average {os.getloadavg()[0]:.1f}")
        # Wall clock (what a user sees), and tokens per CPU second (the work done:
        # steadier than the wall clock on a machine that others share).
        for key, label in (("decode_tok_s", "decode"), ("decode_cpu_tok_s", "per CPU s")):
            base = statistics.median(r[key] for r in runs["elelem"])
            ref = statistics.median(r[key] for r in runs["llama.cpp"])
            for name, rs in runs.items():
                d = statistics.median(r[key] for r in rs)
                print(f"  {name:14s} {label:9s} {d:8.2f} tok/s  x{d / base:.2f} of elelem, x{d / ref:.2f} of llama.cpp")
        print("  drafters:", runs["elelem+drafts"][-1]["drafters"])
        first = {name: rs[0]["tokens"] for name, rs in runs.items()}
        print("  same first 32 greedy tokens:", first["elelem"] == first["elelem+drafts"] == first["llama.cpp"])


def _run(cmd: list[str]) -> dict:
    import subprocess
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, **cmp.checkout_env(False)))
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
