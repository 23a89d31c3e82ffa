#!/usr/bin/env python3
"""The 2026 families' speed against llama-cpp-python on synthetic GLM-4.7-Flash and Nemotron-3-Nano shapes.

    python benchmarks/families.py [--only glm47-flash nemotron3-nano] [--threads 2] [--repeats 2]
        [--layers N] [--skip-build | --rebuild] [--streams 1 4] [--stream-tokens 64] [--no-streams]
        [--llama-python "$(python scripts/reference_llamacpp.py --check)"] [--elelem-options JSON]
        [--no-amx-variant] [--no-compare] [--smoke] [--build-only] [--json out.json]

The models keep the real models' per-layer shapes and cut the layer count
(random weights cost what real ones do), Q8_0 (norms, the router, biases and
Mamba-2's small tensors F32), with SmolLM2's vocabulary (49152 tokens;
llama.cpp wants one in the file), written once into ``$ELELEM_CACHE/bench/``
by the tests' family writers in llama.cpp's converter's layout
(tests/support/synthetic_mla.py, synthetic_mamba2.py), tensor by tensor
(synthetic_stream.py: a stack of experts is never whole in float32):

- ``glm47-flash`` (``deepseek2``): GLM-4.7-Flash's layers (hidden 2048;
  multi-head latent attention with 20 heads, q_lora_rank 768, kv_lora_rank
  512, 192 + 64 Q/K head dims, V 256; a dense first layer of FFN 10240, then
  64 experts of 1536 with 4 used, sigmoid routing with a selection bias, and
  a shared expert), 4 layers (the dense one and 3 of experts) instead of 47.
  The real files carry no ``expert_gating_func`` (llama.cpp infers sigmoid
  from 47 or 48 layers); this one writes it, so a cut file routes as the
  real model does.
- ``nemotron3-nano`` (``nemotron_h_moe``): Nemotron-3-Nano-30B-A3B's layers
  (hidden 2688; Mamba-2 with 64 heads of 64, state 128, 8 groups,
  convolution 4; attention 32 query / 2 KV heads of 128; 128 experts of 1856
  with 6 used, ReLU², and a shared expert of 3712), its first 6 layers
  ``MEMEM*`` (Mamba-2, experts, attention: the real interleave) instead of 52.

Measured by benchmarks/moe.py's comparison (``--threads`` threads;
``--repeats`` fresh processes per engine, alternating; medians; the load
average after each repeat): load, prefill of a 512-token prompt, decode of
128 greedy tokens, peak RSS (VmHWM), the greedy tokens against llama.cpp's
(on a CPU with AMX, which the reference build compiles out, elelem also with
``amx=False``: the reference's kernels); and elelem's aggregate over
``--streams`` concurrent greedy streams against one, and whether each stream
gets its solo tokens (concurrent_streams.py).  elelem runs as it ships
(flash attention on), llama-cpp-python as it ships (off).

Prints numbers; asserts nothing; no part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import moe  # noqa: E402  (the comparison, stream runs and printing this reuses)

# Nemotron-3-Nano-30B-A3B's hybrid_override_pattern (52 layers; M Mamba-2, E experts, * attention).
NEMOTRON_3_NANO = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def shapes(smoke: bool) -> dict:
    """name -> (writer keyword arguments, default layers, family, description)."""
    glm = dict(n_vocab=moe.N_VOCAB, n_embd=2048, n_head=20, q_lora_rank=768, kv_lora_rank=512, qk_nope=192,
               qk_rope=64, v_head_dim=256, n_ff=10240, n_expert=64, n_expert_used=4, n_ff_exp=1536,
               n_expert_shared=1, n_dense_lead=1, gating="sigmoid", vocab_size_key=154880, rope_base=1e6,
               rms_eps=1e-5, n_ctx_train=202752, wtype="q8_0", embd_type="q8_0")
    nemotron = dict(arch="nemotron_h_moe", n_vocab=moe.N_VOCAB, n_embd=2688, n_head=32, n_head_kv=2, head_dim=128,
                    n_ctx_train=262144, norm_eps=1e-5, ssm_d_conv=4, ssm_d_state=128, ssm_n_group=8,
                    ssm_n_head=64, ssm_head_dim=64, n_expert=128, n_expert_used=6, n_ff_exp=1856,
                    n_ff_shexp=3712, expert_norm=True, expert_scale=2.5, wtype="q8_0", embd_type="q8_0")
    if smoke:  # the same structure, small enough to build and run in seconds
        glm.update(n_embd=256, n_head=4, q_lora_rank=128, kv_lora_rank=64, qk_nope=32, qk_rope=32, v_head_dim=32,
                   n_ff=512, n_expert=16, n_ff_exp=128)
        nemotron.update(n_embd=256, n_head=4, head_dim=64, ssm_d_state=32, ssm_n_group=2, ssm_n_head=8,
                        ssm_head_dim=32, n_expert=16, n_expert_used=4, n_ff_exp=128, n_ff_shexp=256)
    return {
        "glm47-flash": (glm, 4, "mla",
                        "GLM-4.7-Flash shape (deepseek2): hidden 2048; MLA 20 heads, q_lora 768, kv_lora 512, "
                        "192+64 / 256 head dims; dense FFN 10240, then 64 experts (4 used) of 1536 + shared; Q8_0"),
        "nemotron3-nano": (nemotron, 6, "mamba2",
                           "Nemotron-3-Nano-30B-A3B shape (nemotron_h_moe): hidden 2688; Mamba-2 64x64, state 128, "
                           "8 groups; attention 32/2 heads of 128; 128 experts (6 used) of 1856 + shared 3712; Q8_0"),
    }


def model_path(name: str, layers: int, smoke: bool) -> Path:
    return moe.cache_dir() / f"family-{name}{'-smoke' if smoke else ''}-{layers}L-q8_0.gguf"


def build_model(name: str, layers: int, smoke: bool) -> Path:
    """Write the model tensor by tensor (tests/support's family writers, stream=True)."""
    sys.path.insert(0, str(REPO / "tests" / "support"))
    sys.path.insert(0, str(REPO))
    from vocab_metadata import vocab_writer
    from elelem.model.hub import resolve_model
    kw, _, family, _ = shapes(smoke)[name]
    add_vocab = vocab_writer(resolve_model("smollm2-135m"))
    dst = model_path(name, layers, smoke)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".partial")
    t0 = time.perf_counter()
    print(f"[{name}] writing {tmp}", file=sys.stderr, flush=True)
    if family == "mla":
        from synthetic_mla import MLAConfig, write_mla_model
        write_mla_model(tmp, MLAConfig(n_layer=layers, **kw), add_vocab, stream=True)
    else:
        from synthetic_mamba2 import Mamba2Config, write_mamba2_model
        write_mamba2_model(tmp, Mamba2Config(pattern=NEMOTRON_3_NANO[:layers], **kw), add_vocab, stream=True)
    os.replace(tmp, dst)
    print(f"[{name}] {dst}: {dst.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr, flush=True)
    return dst


def print_summary(rows: list[dict], args) -> None:
    n = max(args.streams or [1])
    print(f"\nSummary, {args.threads} thread(s), {args.repeats} repeat(s), medians, elelem / llama.cpp "
          f"(targets: decode and prefill at least 1.0x, goal 1.15x; peak RSS at most 1.1x, goal 1.0x; "
          f"{n} streams over one, goal 2x, each its solo tokens):")
    for row in rows:
        med = row.get("median", {})
        gain = moe.stream_gain(row)
        agg = ""
        if gain:
            same = min(r[str(gain[0])]["same"] for r in row["streams"])
            agg = f"; {gain[0]} streams {gain[1]:.2f}x one ({same}/{gain[0]} their solo tokens)"
        if "llama.cpp" not in med or "elelem" not in med:
            print(f"  {row['model']:<15} (no comparison{': ' + str(row['errors']) if row.get('errors') else ''}){agg}")
            continue
        l = med["llama.cpp"]
        for label in (k for k in med if k != "llama.cpp"):
            e = med[label]
            agg = agg if label == "elelem" else ""
            print(f"  {row['model']:<15} {label:<17} prefill {e['prefill_tok_s'] / l['prefill_tok_s']:.3f}, decode "
                  f"{e['decode_tok_s'] / l['decode_tok_s']:.3f}, RSS {e['peak_rss_mb'] / l['peak_rss_mb']:.3f}{agg}; "
                  f"greedy tokens {row['same_tokens'][label]}/{len(row['tokens']['llama.cpp'])} the same")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    moe.common_arguments(ap, ["glm47-flash", "nemotron3-nano"], "layers of each model (default: 4 and 6)", [1, 4])
    ap.add_argument("--llama-python", help="a python with llama_cpp (default: scripts/reference_llamacpp.py's)")
    ap.add_argument("--elelem-options", default="{}", metavar="JSON", help="more LLM() options for elelem")
    ap.add_argument("--no-amx-variant", dest="amx_variant", action="store_false",
                    help="on an AMX CPU, do not also measure elelem with amx=False (the reference's kernels)")
    ap.add_argument("--no-compare", dest="compare", action="store_false",
                    help="skip the load/prefill/decode/RSS comparison (streams only)")
    ap.add_argument("--build-only", action="store_true", help="write the model files, measure nothing")
    ap.add_argument("--smoke", action="store_true", help="small models of the same structure (a quick check)")
    ap.add_argument("--json", help="also write every measurement to this file")
    args = ap.parse_args()
    # moe.measure's switches that this benchmark does not vary
    args.profile, args.streams_no_flash = False, False

    llama_python = moe.reference_and_header(args.llama_python)
    table = shapes(args.smoke)
    rows = []
    for name in args.only:
        _, default_layers, _, description = table[name]
        layers = args.layers or default_layers
        path = model_path(name, layers, args.smoke)
        if args.rebuild or not path.exists():
            if args.skip_build:
                raise SystemExit(f"--skip-build: {path} is not there")
            build_model(name, layers, args.smoke)
        if args.build_only:
            print(f"{name}: {path} ({path.stat().st_size / 1e9:.2f} GB)")
            continue
        print(f"\n[{time.strftime('%H:%M:%S')}] {name}: {description}; {layers} layers", flush=True)
        row = moe.measure(name, path, args, llama_python)
        row["description"] = description
        rows.append(row)
        moe.print_row(row)
        sys.stdout.flush()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    if rows:
        print_summary(rows, args)


if __name__ == "__main__":
    main()
