#!/usr/bin/env python3
"""deepseek2 (multi-head latent attention) against llama-cpp-python on a GLM-4.7-Flash-shaped file.

    python benchmarks/mla.py --llama-python "$(python scripts/reference_llamacpp.py --check)" \
        [--repeats 2] [--threads 2] [--elelem-options '{"flash_attn": false, "amx": false}']

The model: GLM-4.7-Flash's layer shapes (hidden 2048, 20 heads, q_lora_rank 768, kv_lora_rank
512, 192 + 64 Q/K head dims, V 256; a dense first layer of FFN 10240, then 64 experts of 1536
with 4 used and a shared expert), cut to its first 2 layers (so both engines route by softmax:
llama.cpp infers GLM-4.7-Flash's sigmoid from 47 or 48 layers; the cost is the same), Q8_0
(router and norms F32), with
SmolLM2's vocabulary (llama.cpp wants one), written once to ``$ELELEM_CACHE/bench/`` by
tests/support/synthetic_mla.py.  Measured by benchmarks/compare_llamacpp.py's workers, each in
a fresh process, the engines alternating: prefill of a 512-token prompt, 128 greedy decode
steps, peak RSS, and whether the first 32 greedy tokens are llama.cpp's.  elelem runs with
flash attention off (llama-cpp-python's default) and, by default, without AMX (the reference
build has none), so that both run the same kernels and give the same tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO / "benchmarks"))

import compare_llamacpp as cmp  # noqa: E402


def model_path() -> Path:
    from synthetic_mla import MLAConfig, write_mla_model
    from vocab_metadata import vocab_writer

    cache = Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem"))
    path = cache / "bench" / "glm47-flash-shape-2l-q8_0.gguf"
    if not path.exists():
        cfg = MLAConfig(n_vocab=49152, n_embd=2048, n_layer=2, n_head=20, q_lora_rank=768, kv_lora_rank=512,
                        qk_nope=192, qk_rope=64, v_head_dim=256, n_ff=10240, n_expert=64, n_expert_used=4,
                        n_ff_exp=1536, n_expert_shared=1, n_dense_lead=1, gating=None, vocab_size_key=154880,
                        rope_base=1e6,
                        rms_eps=1e-5, wtype="q8_0", embd_type="q8_0", n_ctx_train=202752)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        write_mla_model(partial, cfg, extra_metadata=vocab_writer(cache / "models" / "smollm2-135m-instruct-q4_1.gguf"))
        partial.replace(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--elelem-options", default=json.dumps({"flash_attn": False, "amx": False}))
    args = ap.parse_args()
    path = str(model_path())
    runs: dict[str, list[dict]] = {"elelem": [], "llama.cpp": []}
    for _ in range(args.repeats):
        runs["elelem"].append(cmp.run_worker(sys.executable, "elelem", path, args.threads, args.elelem_options,
                                             env=cmp.checkout_env(False)))
        runs["llama.cpp"].append(cmp.run_worker(args.llama_python, "llamacpp", path, args.threads))
    for key in ("prefill_tok_s", "decode_tok_s", "peak_rss_mb"):
        e = statistics.median(r[key] for r in runs["elelem"])
        ll = statistics.median(r[key] for r in runs["llama.cpp"])
        print(f"{key:14s} elelem {e:9.2f}  llama.cpp {ll:9.2f}  ratio {e / ll:.3f}")
    print("same first 32 greedy tokens:", runs["elelem"][0]["tokens"] == runs["llama.cpp"][0]["tokens"])


if __name__ == "__main__":
    main()
