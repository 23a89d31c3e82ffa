#!/usr/bin/env python3
"""elelem's GPU offload on a real GPU: what scripts/device_check_cuda.sh runs
there (step 4), with elelem's core compiled for that machine's Python, and
scripts/device_check_metal.sh on an Apple Silicon Mac.

    python scripts/device_check.py [--backend CUDA|Vulkan|Metal] [--quick] [--json FILE]

For the backend asked for (CUDA by default; Vulkan runs with CUDA hidden,
CUDA_VISIBLE_DEVICES="", since a card both backends see is otherwise used
through CUDA only; Metal is macOS's):

1. greedy tokens with every layer on the GPU against the CPU run, teacher-
   forced, with the largest logit difference and the CPU's margin wherever
   the GPU chose another token -- for the three packaged models where this
   machine has them (~/.cache/elelem/models: no network here), else for
   synthetic models of their architectures (tests/support/synthetic.py);
2. Qwen2.5-Coder-0.5B Q4_K_M's shapes (the packaged file, or a synthetic one
   of the same shapes and types with random weights: the speed is the
   same): prefill of 512 tokens and decode tok/s in one stream, with CUDA
   graphs (on in the build; GGML_CUDA_DISABLE_GRAPHS unset), and 8 streams
   decoding together; each decode figure beside its bound, the weights read
   per token over the card's memory bandwidth.

It prints one line per figure and, with --json, writes them all to FILE.  It
fails (exit 1) when there is no device of that backend, or when the GPU's
greedy choice parts from the CPU's where the CPU's top two logits are further
apart than the two runs' logits ever differ (not a near tie).
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

PACKAGED = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")   # elelem.model.hub.KNOWN_MODELS
# Memory bandwidth, bytes/s, by the name nvidia-smi or Metal gives (the bound of a decode step);
# the longest name found in the device's wins ("M2 Pro" before "M2").  Apple's figures are its
# specifications of the unified memory (the M3 Max's and M4 Max's larger configurations).
BANDWIDTH = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H100 NVL": 3.9e12,
             "Apple M1": 68e9, "Apple M1 Pro": 200e9, "Apple M1 Max": 400e9, "Apple M1 Ultra": 800e9,
             "Apple M2": 100e9, "Apple M2 Pro": 200e9, "Apple M2 Max": 400e9, "Apple M2 Ultra": 800e9,
             "Apple M3": 100e9, "Apple M3 Pro": 150e9, "Apple M3 Max": 400e9, "Apple M3 Ultra": 819e9,
             "Apple M4": 120e9, "Apple M4 Pro": 273e9, "Apple M4 Max": 546e9}
QWEN_CODER_SHAPES = dict(arch="qwen2", n_layer=24, n_embd=896, n_head=14, n_head_kv=2, n_ff=4864,
                         n_vocab=151936, n_ctx_train=32768, rope_base=1000000.0)


def say(*parts) -> None:
    print(*parts, flush=True)


# -- models --------------------------------------------------------------------


def packaged(name: str):
    from elelem.model.hub import is_cached, resolve_model
    try:
        return str(resolve_model(name)) if is_cached(name) else None
    except Exception:   # noqa: BLE001 -- an unknown name, or no cache: fall back to a synthetic model
        return None


def synthetic_small(folder: Path) -> dict[str, str]:
    """Small models of the packaged models' architectures (tests/support/synthetic.py), f32 weights."""
    from synthetic import TinyConfig, write_model
    out = {}
    for name, cfg in (("synthetic-llama (smollm2's)", TinyConfig(arch="llama", n_layer=4, n_vocab=512, n_embd=128)),
                      ("synthetic-qwen2 (qwen2.5-coder's)", TinyConfig(arch="qwen2", n_layer=4, n_vocab=512,
                                                                      n_embd=128)),
                      ("synthetic-gemma3 (gemma3-270m's)", TinyConfig(arch="gemma3", n_layer=4, n_vocab=512,
                                                                     n_embd=128, n_swa=64))):
        path = folder / f"{name.split()[0]}.gguf"
        write_model(path, cfg)
        out[name] = str(path)
    return out


def random_blocks(rng, n_blocks: int, block_bytes: int, scale_at: tuple[int, ...]) -> np.ndarray:
    """Random quantized blocks whose f16 scales (at these byte offsets) are small and finite."""
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    small = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    for offset in scale_at:
        blocks[:, offset:offset + 2] = small
    return blocks


# ggml block layouts: (values per block, bytes per block, byte offsets of the f16 scales)
BLOCKS = {"Q5_0": (32, 22, (0,)), "Q8_0": (32, 34, (0,)), "Q4_K": (256, 144, (0, 2)), "Q6_K": (256, 210, (208,))}


def synthetic_qwen_coder(path: Path) -> str:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M's shapes and types, as llama-quantize made the packaged
    file (its 896-wide rows are no multiple of 256, so most matmuls are Q5_0), random weights."""
    import gguf
    c = QWEN_CODER_SHAPES
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), c["arch"])
    w.add_context_length(c["n_ctx_train"])
    w.add_embedding_length(c["n_embd"])
    w.add_block_count(c["n_layer"])
    w.add_feed_forward_length(c["n_ff"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_head_kv"])
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(1e-6)

    def quantized(name, width, rows, type_name):
        per_block, size, scales = BLOCKS[type_name]
        blocks = random_blocks(rng, rows * width // per_block, size, scales)
        w.add_tensor(name, blocks.reshape(rows, width // per_block * size),   # the shape in bytes, as gguf takes it
                     raw_dtype=getattr(gguf.GGMLQuantizationType, type_name))

    def vector(name, n, value=1.0, noise=0.0):
        w.add_tensor(name, (value + noise * rng.standard_normal(n)).astype(np.float32))

    e, f, kv = c["n_embd"], c["n_ff"], c["n_head_kv"] * (c["n_embd"] // c["n_head"])
    quantized("token_embd.weight", e, c["n_vocab"], "Q5_0")
    quantized("output.weight", e, c["n_vocab"], "Q8_0")
    vector("output_norm.weight", e)
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        vector(p + "attn_norm.weight", e)
        vector(p + "ffn_norm.weight", e)
        quantized(p + "attn_q.weight", e, e, "Q5_0")
        quantized(p + "attn_k.weight", e, kv, "Q5_0")
        quantized(p + "attn_v.weight", e, kv, "Q8_0" if il % 2 else "Q5_0")
        quantized(p + "attn_output.weight", e, e, "Q5_0")
        vector(p + "attn_q.bias", e, 0.0, 0.01)
        vector(p + "attn_k.bias", kv, 0.0, 0.01)
        vector(p + "attn_v.bias", kv, 0.0, 0.01)
        quantized(p + "ffn_gate.weight", e, f, "Q5_0")
        quantized(p + "ffn_up.weight", e, f, "Q5_0")
        quantized(p + "ffn_down.weight", f, e, "Q6_K" if il % 2 else "Q4_K")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# -- checks --------------------------------------------------------------------


def greedy_forced(path: str, n: int = 16) -> dict:
    from elelem import LLM
    prompt = [1, 450, 7, 99, 23, 310, 42, 5]

    def run(n_gpu_layers, forced=None):
        with LLM(path, n_ctx=256, n_gpu_layers=n_gpu_layers, flash_attn=False) as llm:
            ctx = llm.engine.context
            prompt_ids = [t % llm.n_vocab for t in prompt]
            rows = [ctx.decode(prompt_ids, [0] * len(prompt_ids))[-1]]
            tokens = []
            for i in range(n):
                token = int(np.argmax(rows[-1])) if forced is None else forced[i]
                tokens.append(token)
                rows.append(ctx.decode([token], [0], decode_kernels=True)[-1])
            return tokens, np.array(rows), llm.offload.summary

    cpu_tokens, cpu_rows, _ = run(0)
    _, gpu_rows, summary = run(-1, cpu_tokens)
    gap = float(np.abs(cpu_rows - gpu_rows).max())
    partings = []
    for step, (c, g) in enumerate(zip(cpu_rows, gpu_rows)):
        if int(np.argmax(c)) != int(np.argmax(g)):
            top = np.sort(c)[-2:]
            partings.append({"step": step, "cpu_margin": float(top[1] - top[0])})
    return {"offload": summary, "largest_logit_difference": gap, "largest_logit": float(np.abs(cpu_rows).max()),
            "same_greedy_steps": len(cpu_rows) - len(partings), "steps": len(cpu_rows), "partings": partings}


def speed(path: str, n_gpu_layers: int, quick: bool) -> dict:
    from elelem import LLM
    n_prompt, n_decode, n_streams = (128, 16, 8) if quick else (512, 128, 8)
    rng = np.random.default_rng(1)
    out = {}
    with LLM(path, n_ctx=1024, n_batch=512, n_seq_max=n_streams + 1, n_gpu_layers=n_gpu_layers) as llm:
        ctx = llm.engine.context
        out["offload"] = llm.offload.summary
        prompt = rng.integers(100, llm.n_vocab, n_prompt).tolist()
        ctx.decode(prompt[:32], [0] * 32)                          # warm-up: kernels, graphs
        ctx.seq_rm(0)
        t0 = time.perf_counter()
        logits = ctx.decode(prompt, [0] * n_prompt)
        out["prefill_tok_s"] = n_prompt / (time.perf_counter() - t0)
        token = int(np.argmax(logits[-1]))
        for _ in range(3):                                         # warm-up of the one-token graph
            token = int(np.argmax(ctx.decode([token], [0], decode_kernels=True)[-1]))
        t0 = time.perf_counter()
        for _ in range(n_decode):
            token = int(np.argmax(ctx.decode([token], [0], decode_kernels=True)[-1]))
        out["decode_tok_s"] = n_decode / (time.perf_counter() - t0)
        ctx.seq_rm(0)
        seqs = list(range(1, n_streams + 1))
        for s in seqs:
            ctx.decode(prompt[:32], [s] * 32)
        tokens = [token] * n_streams
        for _ in range(3):
            tokens = [int(np.argmax(r)) for r in ctx.decode(tokens, seqs, decode_kernels=True)]
        t0 = time.perf_counter()
        for _ in range(n_decode // 2):
            tokens = [int(np.argmax(r)) for r in ctx.decode(tokens, seqs, decode_kernels=True)]
        out[f"decode_{n_streams}_streams_tok_s"] = n_streams * (n_decode // 2) / (time.perf_counter() - t0)
        spec = llm.spec
        out["weight_bytes_per_token"] = sum(llm.gguf.tensors[n].nbytes for t in spec.layer_tensors
                                            for n in t.values() if n) + \
            llm.gguf.tensors[spec.global_tensors.get("output") or spec.global_tensors["tok_embd"]].nbytes
    return out


def bandwidth_of(name: str):
    found = [k for k in BANDWIDTH if k in name]
    return BANDWIDTH[max(found, key=len)] if found else None


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception:   # noqa: BLE001
        return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("CUDA", "Vulkan", "Metal"), default="CUDA")
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    if args.backend == "Vulkan":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""   # before the modules load: the card through Vulkan
    from elelem.api.offload import gpu_devices, gpu_modules
    registry = {m.backend: m.registry for m in gpu_modules("darwin")}[args.backend]   # Metal's calls itself MTL
    devices, modules = gpu_devices()
    say(f"== {args.backend}: devices {[f'{d.name} ({d.description})' for d in devices]}")
    for m in modules:
        say(f"   module {m.backend}: {m.state} {m.reason}")
    if not devices or devices[0].backend != registry:
        say(f"FAIL: no {args.backend} device")
        return 1
    failed = False
    report = {"backend": args.backend, "device": devices[0].description, "checks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        models = {name: packaged(name) for name in PACKAGED}
        if not all(models.values()):
            say(f"   packaged models here: {[n for n, p in models.items() if p]}; synthetic ones stand in for the rest")
            models = {n: p for n, p in models.items() if p} | synthetic_small(Path(tmp))
        for name, path in models.items():
            result = greedy_forced(path, 8 if args.quick else 16)
            report["checks"][name] = result
            say(f"   {name}: {result['offload']}; greedy {result['same_greedy_steps']}/{result['steps']} steps "
                f"as the CPU's; largest logit difference {result['largest_logit_difference']:.3g} of "
                f"{result['largest_logit']:.3g}; partings {result['partings']}")
            wide = [p for p in result["partings"] if p["cpu_margin"] > result["largest_logit_difference"]]
            if wide:
                say(f"FAIL: {name}: the GPU parts from the CPU where the CPU's choice was clear: {wide}")
                failed = True
        coder = models.get("qwen2.5-coder-0.5b") or synthetic_qwen_coder(Path(tmp) / "coder.gguf")
        for label, layers in (("gpu", -1), ("cpu", 0)):
            figures = speed(coder, layers, args.quick)
            report[f"speed_{label}"] = figures
            bound = ""
            bandwidth = bandwidth_of(devices[0].description if args.backend == "Metal" else gpu_name())
            if label == "gpu" and bandwidth:
                bound = (f" (bound: {figures['weight_bytes_per_token'] / 2**20:.0f} MiB of weights per token over "
                         f"{bandwidth / 1e12:.2f} TB/s = {bandwidth / figures['weight_bytes_per_token']:.0f} tok/s)")
            say(f"   Qwen2.5-Coder-0.5B shapes, {figures['offload']}: prefill {figures['prefill_tok_s']:.0f} tok/s, "
                f"decode {figures['decode_tok_s']:.1f} tok/s{bound}, 8 streams "
                f"{figures['decode_8_streams_tok_s']:.1f} tok/s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
