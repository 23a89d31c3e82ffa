#!/usr/bin/env python3
"""Hybrid (Gated DeltaNet) models' speed against llama-cpp-python on synthetic Qwen3.5-4B and Qwen3.5-35B-A3B shapes.

    python benchmarks/hybrid.py [--only qwen35 qwen35moe] [--threads 2] [--repeats 2] [--layers N]
        [--skip-build | --rebuild] [--streams 1 4] [--stream-tokens 64] [--no-streams] [--no-costs]
        [--generate-tokens 128]
        [--llama-python "$(python scripts/reference_llamacpp.py --check)"] [--smoke] [--build-only]
        [--json out.json]

The models keep the real models' per-layer shapes and cut the layer count;
they are written and quantized by benchmarks/moe.py's machinery (random
weights in F16, norms and the router F32, then Q4_K_M by the reference
build's ``llama_model_quantize``, as ``llama-quantize`` makes one), cached
in ``$ELELEM_CACHE/bench/``, with SmolLM2's vocabulary (49152 tokens):

- ``qwen35``: Qwen3.5-4B's layers (hidden 2560; attention 16 query / 4 KV
  heads of 256 with an output gate, 64 dims rotated, imrope; Gated DeltaNet
  16 key / 32 value heads of 128, convolution 4; FFN 9216; three DeltaNet
  layers to each attention one), 12 layers instead of 32, embeddings tied;
- ``qwen35moe``: Qwen3.5-35B-A3B's layers (hidden 2048; attention 16 / 2
  heads of 256; the same DeltaNet; 256 experts of FFN 512, 8 used, and a
  gated shared expert of 512), 4 layers instead of 40.

Measured (``--threads`` threads; ``--repeats`` fresh processes per engine,
alternating; medians), all in the same run:

1. benchmarks/moe.py's comparison (compare_llamacpp.py's workers): load,
   prefill of a 512-token prompt, decode of 128 greedy tokens, peak RSS,
   the greedy tokens against llama.cpp's (on a CPU with AMX, which the
   reference build compiles out, elelem also with ``amx=False``: the
   reference's kernels); and elelem's aggregate over
   ``--streams`` concurrent greedy streams against one (concurrent_streams.py).
2. What the recurrent state costs (``--no-costs`` skips it), in one elelem
   process: a snapshot's size (one sequence's state, every recurrent layer;
   scaled to the real model's depth too) and the time to take one and to put
   one back; a one-token step; a verification step (the next token plus 4
   drafted ones, a snapshot taken before it) and the rewind after a fully
   rejected draft (the snapshot restored, the one confirmed token evaluated
   again); and greedy generation (``--generate-tokens``) with prompt lookup off and on
   (``engine.speculative``), from a prompt with nothing to copy (random
   tokens) and from one that repeats a 64-token span four times, with the
   tokens drafted and accepted, and whether both give the same tokens.

The machine this runs on may be shared: the load average is printed with
each repeat.  Prints numbers; asserts nothing; no part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import compare_llamacpp as cmp  # noqa: E402
import moe  # noqa: E402  (the model writer, quantizer and comparison this reuses)

# Layers of the real models, to scale a snapshot's size to them.
REAL_LAYERS = {"qwen35": 32, "qwen35moe": 40}
N_GENERATE = 128
N_STEPS = 16   # steps timed per figure of the costs


def shapes(smoke: bool) -> dict:
    """name -> (TinyConfig keyword arguments, default layers, "q4_k_m", description): moe.py's table's form."""
    common = dict(n_vocab=moe.N_VOCAB, head_dim=256, n_rot=64, n_ctx_train=262144, rope_base=1e7, rms_eps=1e-6,
                  wtype="f16", embd_type="f16", ssm_d_conv=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=32,
                  full_attention_interval=4, rope_sections=(11, 11, 10, 0))
    dense = dict(common, arch="qwen35", n_embd=2560, n_head=16, n_head_kv=4, n_ff=9216, tied=True)
    experts = dict(common, arch="qwen35moe", n_embd=2048, n_head=16, n_head_kv=2, n_ff=512, n_expert=256,
                   n_expert_used=8, n_ff_exp=512, n_ff_shexp=512)
    if smoke:  # the same structure, small enough to build and run in seconds
        small = dict(head_dim=64, n_rot=16, ssm_d_state=32, ssm_n_group=4, ssm_dt_rank=8, rope_sections=(3, 3, 2, 0))
        dense.update(small, n_embd=256, n_head=4, n_head_kv=2, n_ff=512)
        experts.update(small, n_embd=256, n_head=4, n_head_kv=2, n_expert=16, n_expert_used=4, n_ff_exp=128,
                       n_ff_shexp=128)
    return {
        "qwen35": (dense, 4 if smoke else 12, "q4_k_m",
                   "Qwen3.5-4B shape: hidden 2560; attention 16/4 heads of 256, gated; DeltaNet 16/32 heads of "
                   "128; FFN 9216; Q4_K_M by llama_model_quantize from F16"),
        "qwen35moe": (experts, 4, "q4_k_m",
                      "Qwen3.5-35B-A3B shape: hidden 2048; attention 16/2 heads of 256, gated; DeltaNet 16/32 heads "
                      "of 128; 256 experts (8 used) of FFN 512 and a shared one; Q4_K_M by llama_model_quantize"),
    }


# --------------------------------------------------------------------------
# What the recurrent state costs (runs in its own process).

def _median_seconds(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker_costs(path: str, threads: int, real_layers: int, n_generate: int = N_GENERATE) -> dict:
    import numpy as np
    if os.environ.get(cmp.CHECKOUT_ENV):
        sys.path.insert(0, os.environ[cmp.CHECKOUT_ENV])
    from elelem import LLM
    llm = LLM(path, n_threads=threads, n_ctx=1024, n_batch=512)
    ctx, cache = llm.engine.context, llm.engine.context.cache
    h = llm.spec.hparams
    n_recurrent = sum(h["recurrent_layers"])
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(1000, llm.n_vocab, 256)]
    out = dict(state_bytes=cache.state_bytes, recurrent_layers=n_recurrent,
               state_bytes_real=cache.state_bytes // n_recurrent * (real_layers - real_layers // 4),
               max_snapshots=ctx.max_snapshots)
    ctx.decode(prompt, [0] * len(prompt))
    snap = cache.recurrent_state(0)
    out["snapshot_take_s"] = _median_seconds(lambda: cache.recurrent_state(0), 20)
    out["snapshot_restore_s"] = _median_seconds(lambda: cache.set_recurrent_state(0, snap), 20)
    token = [int(rng.integers(1000, llm.n_vocab))]

    def one():
        ctx.decode(token, [0], True, decode_kernels=True)

    def verify_and_reject():   # the next token and 4 guesses; none confirmed: back to after the first
        at = cache.seq_length_of(0)
        t0 = time.perf_counter()
        ctx.decode(token * 5, [0] * 5, True, decode_kernels=True)
        t1 = time.perf_counter()
        ctx.seq_rm(0, at + 1)
        return t1 - t0, time.perf_counter() - t1

    out["one_token_step_s"] = _median_seconds(one, N_STEPS)
    pairs = [verify_and_reject() for _ in range(N_STEPS)]
    out["verify_5_step_s"] = statistics.median(p[0] for p in pairs)
    out["rewind_s"] = statistics.median(p[1] for p in pairs)
    # Generation with prompt lookup off and on: nothing to copy, and a span repeated.
    span = [int(t) for t in rng.integers(1000, llm.n_vocab, 64)]
    for task, ids in (("random", prompt), ("repeated", span * 4)):
        runs = {}
        for mode in ("off", "on", "off", "on"):   # alternating, two each
            llm.engine.speculative = mode == "on"
            llm.reset()
            d0, a0, r0 = llm.engine.drafted_tokens, llm.engine.accepted_tokens, ctx.n_replayed
            t0 = time.perf_counter()
            got = llm.generate_tokens(ids, n_generate)
            runs.setdefault(mode, []).append(dict(
                seconds=time.perf_counter() - t0, tokens=got, drafted=llm.engine.drafted_tokens - d0,
                accepted=llm.engine.accepted_tokens - a0, replayed=ctx.n_replayed - r0))
        out[f"generate_{task}"] = {
            mode: dict(tok_s=statistics.median(len(r["tokens"]) / r["seconds"] for r in rs),
                       drafted=rs[0]["drafted"], accepted=rs[0]["accepted"], replayed=rs[0]["replayed"],
                       n_tokens=len(rs[0]["tokens"]))
            for mode, rs in runs.items()}
        out[f"generate_{task}"]["same_tokens"] = runs["off"][0]["tokens"] == runs["on"][0]["tokens"]
    out["load_avg"] = os.getloadavg()[0]
    return out


def run_costs(path: Path, threads: int, real_layers: int, n_generate: int) -> dict:
    """worker_costs in a process of its own (this checkout's elelem)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "costs", str(path), str(threads), str(real_layers),
           str(n_generate)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **cmp.checkout_env(False)))
    if out.returncode != 0:
        return dict(error=f"costs worker exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_costs(name: str, c: dict) -> None:
    mb = 1 / 1e6
    print(f"   recurrent state ({name}): a snapshot is {c['state_bytes'] * mb:.1f} MB here "
          f"({c['recurrent_layers']} DeltaNet layers), {c['state_bytes_real'] * mb:.1f} MB at the real model's depth; "
          f"at most {c['max_snapshots']} a sequence")
    print(f"     take {1e3 * c['snapshot_take_s']:.2f} ms, put back {1e3 * c['snapshot_restore_s']:.2f} ms; "
          f"one-token step {1e3 * c['one_token_step_s']:.1f} ms; verification of 1+4 tokens "
          f"{1e3 * c['verify_5_step_s']:.1f} ms ({c['verify_5_step_s'] / c['one_token_step_s']:.2f}x a one-token step, "
          f"snapshot included); rewind after a rejected draft {1e3 * c['rewind_s']:.1f} ms")
    for task in ("random", "repeated"):
        g = c[f"generate_{task}"]
        off, on = g["off"], g["on"]
        print(f"     prompt lookup, {task} prompt: off {off['tok_s']:.2f} tok/s, on {on['tok_s']:.2f} tok/s "
              f"({on['tok_s'] / off['tok_s']:.2f}x); drafted {on['drafted']}, accepted {on['accepted']}, "
              f"tokens evaluated again {on['replayed']}; same tokens: {g['same_tokens']}")


# --------------------------------------------------------------------------
# Driver.

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    moe.common_arguments(ap, ["qwen35", "qwen35moe"], "layers of each model (default: 12 and 4)", [1, 4])
    ap.add_argument("--no-costs", dest="costs", action="store_false")
    ap.add_argument("--generate-tokens", type=int, default=N_GENERATE,
                    help="greedy tokens of each prompt-lookup run (default 128)")
    ap.add_argument("--llama-python", help="a python with llama_cpp (default: scripts/reference_llamacpp.py's)")
    ap.add_argument("--elelem-options", default="{}", metavar="JSON", help="more LLM() options for elelem")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="small models of the same structure (a quick check)")
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker_costs(args.worker[1], int(args.worker[2]), int(args.worker[3]), int(args.worker[4]))))
        return
    # moe.measure's switches that this benchmark does not vary
    args.compare, args.profile, args.amx_variant, args.streams_no_flash = True, False, True, False

    llama_python = moe.reference_and_header(args.llama_python)
    table = shapes(args.smoke)
    rows = []
    for name in args.only:
        _, default_layers, _, description = table[name]
        layers = args.layers or default_layers
        path = moe.model_path(name, layers, args.smoke, table, prefix="hybrid")
        if args.rebuild or not path.exists():
            if args.skip_build:
                raise SystemExit(f"--skip-build: {path} is not there")
            moe.build_model(name, layers, args.smoke, llama_python, args.threads, table, prefix="hybrid")
        if args.build_only:
            print(f"{name}: {path} ({path.stat().st_size / 1e9:.2f} GB)")
            continue
        print(f"\n[{time.strftime('%H:%M:%S')}] {name}: {description}; {layers} layers", flush=True)
        row = moe.measure(name, path, args, llama_python)
        row["description"] = description
        if args.costs:
            row["costs"] = run_costs(path, args.threads, REAL_LAYERS[name] if not args.smoke else layers,
                                     args.generate_tokens)
        rows.append(row)
        moe.print_row(row)
        if "costs" in row:
            if "error" in row["costs"]:
                print(f"   costs: ERROR {row['costs']['error']}")
            else:
                print_costs(name, row["costs"])
        sys.stdout.flush()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    if rows:
        print_summary(rows, args)


def print_summary(rows: list[dict], args) -> None:
    print(f"\nSummary, {args.threads} thread(s), {args.repeats} repeat(s), medians, elelem / llama.cpp "
          f"(targets: decode and prefill at least 1.0x, goal 1.15x; {max(args.streams or [1])} streams "
          f"over one, goal 2.5x):")
    for row in rows:
        med = row.get("median", {})
        if "llama.cpp" not in med or "elelem" not in med:
            print(f"  {row['model']:<10} (no comparison: {row.get('errors')})")
            continue
        l = med["llama.cpp"]
        for label in (k for k in med if k != "llama.cpp"):
            e = med[label]
            gain = moe.stream_gain(row) if label == "elelem" else None
            agg = f"; {gain[0]} streams {gain[1]:.2f}x one" if gain else ""
            print(f"  {row['model']:<10} {label:<17} prefill {e['prefill_tok_s'] / l['prefill_tok_s']:.3f}, decode "
                  f"{e['decode_tok_s'] / l['decode_tok_s']:.3f}, RSS {e['peak_rss_mb'] / l['peak_rss_mb']:.3f}{agg}; "
                  f"greedy tokens {row['same_tokens'][label]}/{len(row['tokens']['llama.cpp'])} the same")

if __name__ == "__main__":
    main()
