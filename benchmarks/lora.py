#!/usr/bin/env python3
"""What a LoRA adapter costs: prefill and decode with and without one, elelem beside llama-cpp-python.

    python benchmarks/lora.py [--threads 2] [--prompt 256] [--decode 64] [--rank 16] [--streams 4]
        [--llama-python "$(python scripts/reference_llamacpp.py --check)"]

The model is SmolLM2-135M (packaged); the adapter, written as
convert_lora_to_gguf.py writes one (tests/support/synthetic_lora.py), changes
every layer's attn_q and attn_v (PEFT's default target modules) at ``--rank``,
in F16 (a typical --outtype).  Printed: prompt and decode tokens/s without and
with the adapter (scale 1), each side; and for elelem, ``--streams`` streams
decoding together, all at one scale, then each at its own (one adapter at
four scales, as per-request scales in the server), which elelem batches in
the same steps.  Flash attention off on both sides (llama-cpp-python's
default).

Prints numbers; asserts nothing; no part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

LLAMA_SCRIPT = r"""
import json, sys, time
import numpy as np
import llama_cpp
model, adapter, threads, n_prompt, n_decode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
out = {}
for name, lora in (("base", None), ("lora", adapter)):
    llm = llama_cpp.Llama(model, n_ctx=1024, n_threads=threads, verbose=False, lora_path=lora, lora_scale=1.0)
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 49000, n_prompt).tolist()
    t0 = time.perf_counter(); llm.eval(prompt); t1 = time.perf_counter()
    for t in rng.integers(100, 49000, n_decode).tolist():
        llm.eval([t])
    t2 = time.perf_counter()
    out[name] = {"prompt_tps": n_prompt / (t1 - t0), "decode_tps": n_decode / (t2 - t1)}
    del llm
print(json.dumps(out))
"""


def elelem_run(model, adapter, threads, n_prompt, n_decode, streams):
    import numpy as np

    import elelem
    out = {}
    for name, lora in (("base", []), ("lora", [(adapter, 1.0)])):
        with elelem.LLM(model, n_ctx=1024, n_threads=threads, flash_attn=False, lora=lora,
                        speculative=False) as llm:
            rng = np.random.default_rng(0)
            prompt = rng.integers(100, 49000, n_prompt).tolist()
            t0 = time.perf_counter()
            llm.eval(prompt)
            t1 = time.perf_counter()
            for t in rng.integers(100, 49000, n_decode).tolist():
                llm.eval([t])
            t2 = time.perf_counter()
            out[name] = {"prompt_tps": n_prompt / (t1 - t0), "decode_tps": n_decode / (t2 - t1)}
    with elelem.LLM(model, n_ctx=1024, n_threads=threads, flash_attn=False, lora=[(adapter, 1.0)],
                    speculative=False) as llm:
        for label, scales in (("one scale", [1.0] * streams), ("own scales", [0.25 * (i + 1) for i in range(streams)])):
            texts = [None] * streams

            def run(i, scales=scales, texts=texts):
                texts[i] = llm.generate(f"Story {i}: once upon a time", max_tokens=n_decode, temperature=0,
                                        lora=[scales[i]])
            steps = llm.engine.steps
            t0 = time.perf_counter()
            threads_ = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
            for t in threads_:
                t.start()
            for t in threads_:
                t.join()
            seconds = time.perf_counter() - t0
            tokens = sum(len(llm.tokenize(t)) for t in texts)
            out[f"{streams} streams, {label}"] = {"tps": tokens / seconds, "steps": llm.engine.steps - steps}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--llama-python", default=None)
    args = ap.parse_args()
    from synthetic_lora import weight_shapes, write_lora

    from elelem.model.hub import resolve_model
    model = resolve_model("smollm2-135m")
    shapes = weight_shapes(model)
    targets = {n: s for n, s in shapes.items() if n.endswith(("attn_q.weight", "attn_v.weight"))}
    with tempfile.TemporaryDirectory() as tmp:
        adapter = Path(tmp) / "adapter.gguf"
        write_lora(adapter, "llama", targets, rank=args.rank, alpha=2.0 * args.rank, dtype="f16")
        print(f"SmolLM2-135M, adapter on {len(targets)} weights at rank {args.rank} (F16), "
              f"{args.threads} threads, {args.prompt}-token prompt, {args.decode} decoded")
        ours = elelem_run(str(model), str(adapter), args.threads, args.prompt, args.decode, args.streams)
        theirs = None
        if args.llama_python:
            done = subprocess.run([args.llama_python, "-c", LLAMA_SCRIPT, str(model), str(adapter), str(args.threads),
                                   str(args.prompt), str(args.decode)], capture_output=True, text=True)
            theirs = json.loads(done.stdout) if done.returncode == 0 else None
            if theirs is None:
                print("llama-cpp-python failed:", done.stderr[-2000:])
    for name in ("base", "lora"):
        line = f"{name:5} elelem prompt {ours[name]['prompt_tps']:7.1f} tok/s, decode {ours[name]['decode_tps']:6.1f} tok/s"
        if theirs:
            line += (f" | llama-cpp-python prompt {theirs[name]['prompt_tps']:7.1f} tok/s, "
                     f"decode {theirs[name]['decode_tps']:6.1f} tok/s")
        print(line)
    for name, value in ours.items():
        if "streams" in name:
            print(f"elelem {name}: {value['tps']:.1f} tok/s in {value['steps']} steps")


if __name__ == "__main__":
    main()
