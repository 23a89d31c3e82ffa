#!/usr/bin/env python3
"""Mixture-of-experts speed against llama-cpp-python on synthetic Qwen3-30B-A3B and gpt-oss-20b shapes.

    python benchmarks/moe.py [--only qwen3moe gpt-oss] [--threads 2] [--repeats 2] [--layers N]
        [--skip-build | --rebuild] [--streams 1 8] [--stream-tokens 64] [--no-streams] [--no-profile]
        [--no-compare]
        [--llama-python "$(python scripts/reference_llamacpp.py --check)"] [--elelem-options JSON]
        [--no-amx-variant] [--smoke] [--build-only] [--json out.json]

The models (random weights cost what real ones do), written once into
``$ELELEM_CACHE/bench/`` (default ``~/.cache/elelem/bench``) and reused:

- ``qwen3moe``: Qwen3-30B-A3B's layer (hidden 2048, 32 query / 4 KV heads of
  128, QK norms, 128 experts of FFN 768 with 8 used, softmax router with its
  top 8 renormalised), 4 layers instead of 48 (1.65 GB): written in F16 (router,
  norms F32) and turned into Q4_K_M by the reference build's
  ``llama_model_quantize``, as ``llama-quantize`` makes a Q4_K_M file.
- ``gpt-oss``: gpt-oss-20b's layer (hidden 2880, 64 query / 8 KV heads of 64,
  attention sinks, biases, 128-token sliding window on every other layer,
  YaRN, 32 experts of FFN 2880 with 4 used, softmax over the chosen experts,
  clamped SwiGLU), 4 layers instead of 24 (2.1 GB): experts MXFP4, attention
  and embeddings Q8_0, router, biases and norms F32, written directly with
  ``gguf``.

Both carry SmolLM2's vocabulary (49152 tokens; llama.cpp wants one in the
file): the tensor set and keys are tests/support/synthetic.py's (llama.cpp's
converter's layout), written tensor by tensor so that a 5 GB F16 file never
sits in memory.

Measured for each model (``--threads`` threads, ``--repeats`` fresh processes
per engine, alternating; medians):

1. benchmarks/compare_llamacpp.py's workers: load, prefill of a 512-token
   prompt, decode of 128 greedy tokens, and how many of the first 32 greedy
   tokens are llama.cpp's; peak RSS is the worker's VmHWM (not ru_maxrss,
   which a subprocess inherits from its parent).  On a CPU with AMX, which
   the reference build compiles out, elelem runs twice: as it is (AMX for
   the dense matmuls) and with ``amx=False`` (the reference's kernels: the
   same tokens).  The decode bound is the read bandwidth over the bytes a
   token reads: every expert tensor's n_used / n_expert share, the other
   weights whole, one embedding row.
2. benchmarks/concurrent_streams.py's elelem worker: 8 greedy streams (one
   session each, flash attention as elelem serve runs) against one stream
   alone, ``--stream-tokens`` tokens each.
3. Where the time goes (``--no-profile`` skips it; needs ``perf`` and root):
   uprobes on each engine's libggml-cpu give every ggml node's wall time on
   thread 0, barrier included, for the 512-token prefill and 64 decode steps,
   summed by part of the model: experts (mul_mat_id; bias, GLU, pieces;
   weighting and sum), router (its F32 matmul; soft_max, argsort/top-k,
   get_rows, normalisation), attention (projections; KQ and KQV or flash
   attention; RoPE, softmax, K/V cache copies), the output head, the rest,
   and the time outside ggml's graph compute.  Each probe hit costs a few
   microseconds, so the figures under probes run a little slower.

The script prints numbers; it asserts nothing, and is no part of the test suite.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import compare_llamacpp as cmp  # noqa: E402  (stdlib only at import: the reference python imports this file too)
import concurrent_streams as cs  # noqa: E402

N_VOCAB = 49152  # SmolLM2's vocabulary, borrowed for the tokenizer keys
PROFILE_DECODE = 64

# --------------------------------------------------------------------------
# The shapes.

TARGETS = {  # (at least, goal) as elelem / llama.cpp
    "decode_tok_s": (1.0, 1.15),
    "prefill_tok_s": (1.0, 1.15),
    "peak_rss_mb": (None, None),  # lower is better: at most 1.1x llama.cpp's, goal 1.0x (_ratio_text)
}


def _shapes(smoke: bool) -> dict:
    """name -> (TinyConfig keyword arguments at full size, default layers, how it is made, description)."""
    qwen = dict(arch="qwen3moe", n_vocab=N_VOCAB, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144,
                n_ctx_train=40960, rope_base=1e6, rms_eps=1e-6, wtype="f16", embd_type="f16",
                n_expert=128, n_expert_used=8, n_ff_exp=768)
    oss = dict(arch="gpt-oss", n_vocab=N_VOCAB, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff=2880,
               n_ctx_train=131072, rope_base=150000.0, rms_eps=1e-5, n_swa=128, yarn=32.0, yarn_orig_ctx=4096,
               wtype="q8_0", embd_type="q8_0",
               wtypes=tuple((f"ffn_{k}_exps.weight", "mxfp4") for k in ("gate", "up", "down")),
               n_expert=32, n_expert_used=4, n_ff_exp=2880)
    if smoke:  # the same structure, small enough to build and run in seconds
        qwen.update(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_expert=16, n_expert_used=4,
                    n_ff_exp=256)
        oss.update(n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_ff=256, n_expert=8, n_expert_used=2,
                   n_ff_exp=256)
    return {
        "qwen3moe": (qwen, 2 if smoke else 4, "q4_k_m",
                     "Qwen3-30B-A3B shape: hidden 2048, 32/4 heads of 128, 128 experts (8 used) of FFN 768; "
                     "Q4_K_M by llama_model_quantize from F16"),
        "gpt-oss": (oss, 2 if smoke else 4, "direct",
                    "gpt-oss-20b shape: hidden 2880, 64/8 heads of 64, SWA 128, 32 experts (4 used) of FFN 2880; "
                    "MXFP4 experts, Q8_0 attention and embeddings"),
    }


def cache_dir() -> Path:
    return Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem")) / "bench"


def model_path(name: str, layers: int, smoke: bool, shapes: dict | None = None, prefix: str = "moe") -> Path:
    how = (shapes or _shapes(smoke))[name][2]
    kind = "q4_k_m" if how == "q4_k_m" else "mxfp4"
    return cache_dir() / f"{prefix}-{name}{'-smoke' if smoke else ''}-{layers}L-{kind}.gguf"


# --------------------------------------------------------------------------
# Writing a model tensor by tensor.

def _synthetic():
    sys.path.insert(0, str(REPO / "tests" / "support"))
    import synthetic
    import vocab_metadata
    return synthetic, vocab_metadata


def _tensor_dims(c) -> dict[str, int]:
    """Every length a tensor of tests/support/synthetic.py's make_weights can have, by what it is."""
    d_inner = c.ssm_d_state * c.ssm_dt_rank
    return dict(vocab=c.n_vocab, embd=c.n_embd, embd2=2 * c.n_embd, head=c.hd, heads=c.n_head,
                q=c.n_head * c.hd, q_gated=2 * c.n_head * c.hd, kv=c.n_head_kv * c.hd, ff=c.n_ff,
                experts=c.n_expert, ff_exp=c.n_ff_exp, ff_shexp=c.n_ff_shexp or 2 * c.n_ff_exp,
                ff_shexp_glm=c.n_ff_exp * c.n_expert_shared, conv=c.ssm_d_conv, v_heads=c.ssm_dt_rank,
                ba=2 * c.ssm_dt_rank, state=c.ssm_d_state, inner=d_inner,
                conv_dim=2 * c.ssm_d_state * c.ssm_n_group + d_inner,
                qkvz=2 * c.ssm_d_state * c.ssm_n_group + 2 * d_inner)


def tensor_plan(cfg) -> list[tuple[str, tuple, str]]:
    """(name, numpy shape, type) of every tensor tests/support/synthetic.py's make_weights
    writes for cfg, in its order, without making them: make_weights runs on a
    copy of cfg whose every dimension is a distinct small number, mapped back."""
    synthetic, _ = _synthetic()
    dims = dict(n_vocab=11, n_embd=13, n_head=7, n_head_kv=3, head_dim=5, n_ff=23, n_expert=17, n_ff_exp=19,
                ssm_d_conv=4, ssm_d_state=29, ssm_n_group=3, ssm_dt_rank=6)
    tiny = cfg.but(**dims, n_rot=None)
    real: dict[int, int] = {}
    for what, small in _tensor_dims(tiny).items():
        big = _tensor_dims(cfg)[what]
        assert real.setdefault(small, big) == big, f"tiny dimensions must be distinct ({what})"
    plan = []
    for name, arr in synthetic.make_weights(tiny).items():
        plan.append((name, tuple(real[d] for d in arr.shape), cfg.tensor_type(name, arr)))
    return plan


def _add_keys(writer, cfg, extra_metadata) -> None:
    """The keys tests/support/synthetic.py's write_model writes, in its order."""
    synthetic, _ = _synthetic()
    synthetic.add_shape_keys(writer, cfg)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_rope_freq_base(cfg.rope_base)
    if cfg.head_dim is not None:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    if cfg.n_swa:
        writer.add_sliding_window(cfg.n_swa)
    if cfg.n_rot is not None:
        writer.add_rope_dimension_count(cfg.n_rot)
    synthetic.add_moe_keys(writer, cfg)
    extra_metadata(writer)


def write_streaming(path: Path, cfg, seed: int = 0) -> None:
    """cfg's model with random weights, one tensor in memory at a time."""
    import gguf
    import numpy as np
    synthetic, vocab_metadata = _synthetic()
    from elelem.model.hub import resolve_model
    add_vocab = vocab_metadata.vocab_writer(resolve_model("smollm2-135m"))
    plan = tensor_plan(cfg)
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    _add_keys(writer, cfg, add_vocab)
    for name, shape, wtype in plan:
        qtype = synthetic.QTYPES[wtype]
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = math.prod(shape) // block * type_size
        if wtype in ("f32", "f16"):
            writer.add_tensor_info(name, shape, np.dtype(np.float32 if wtype == "f32" else np.float16), nbytes)
        else:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    t0, done = time.perf_counter(), 0
    for name, shape, wtype in plan:
        qtype = synthetic.QTYPES[wtype]
        rows = shape[:-1]
        n_in = shape[-1]
        if name.endswith("norm.weight"):
            scale, offset = 0.1, 1.0
        elif name.endswith(".bias"):
            scale, offset = 0.1, 0.0
        elif name.endswith("attn_sinks.weight"):
            scale, offset = 1.0, 0.0
        elif name.endswith((".ssm_a", ".ssm_dt.bias")):   # Gated DeltaNet's decay: A_log and dt's bias
            scale, offset = 0.5, 0.0
        elif name.endswith("ffn_gate_inp.weight"):  # a router scaled up, as synthetic.py's: a clear-cut choice
            scale, offset = 4.0 / math.sqrt(n_in), 0.0
        elif name == "token_embd.weight":
            scale, offset = 1.0, 0.0
        else:
            scale, offset = 1.0 / math.sqrt(n_in), 0.0
        flat_rows = math.prod(rows) if rows else 1
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = n_in // block * type_size
        out = np.empty((flat_rows, row_bytes), dtype=np.uint8)
        step = max(1, (1 << 23) // n_in)  # about 8M values at a time
        for start in range(0, flat_rows, step):
            stop = min(flat_rows, start + step)
            x = rng.standard_normal((stop - start, n_in), dtype=np.float32)
            x *= np.float32(scale)
            x += np.float32(offset)
            if name.endswith(".ssm_a"):  # -exp(A_log), as the converter writes it: every state decays
                x = -np.exp(x)
            if wtype == "f32":
                data = x
            elif wtype == "f16":
                data = x.astype(np.float16)
            else:
                data = gguf.quants.quantize(x, qtype)
            out[start:stop] = data.view(np.uint8).reshape(stop - start, row_bytes)
        writer.write_tensor_data(out)
        done += out.nbytes
        if out.nbytes > (64 << 20):
            print(f"  {name} {shape} {wtype}: {done / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    writer.close()


def _vm_status() -> dict:
    """VmHWM and VmRSS of this process, MB.  Not ru_maxrss: a child started by
    subprocess inherits its parent's high-water mark there (vfork + exec)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) / 1024
    return out


def worker_engine(kind: str, path: str, threads: int, options: str) -> dict:
    """compare_llamacpp's worker (load, prefill 512, decode 128), and this process's peak RSS."""
    r = cmp.worker_elelem(path, threads, options) if kind == "elelem" else cmp.worker_llamacpp(path, threads)
    r["peak_rss_mb"] = _vm_status()["VmHWM"]
    return r


def worker_quantize(src: str, dst: str, threads: int) -> dict:
    """Runs in the reference python: src (F16) -> dst (Q4_K_M), as llama-quantize does."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    return dict(rc=rc, seconds=time.perf_counter() - t0)


def build_model(name: str, layers: int, smoke: bool, llama_python: str, threads: int,
                shapes: dict | None = None, prefix: str = "moe") -> Path:
    synthetic, _ = _synthetic()
    kw, _, how, _ = (shapes or _shapes(smoke))[name]
    cfg = synthetic.TinyConfig(n_layer=layers, **kw)
    dst = model_path(name, layers, smoke, shapes, prefix)
    dst.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = dst.with_name(dst.name + ".partial")
    if how == "q4_k_m":
        src = dst.with_name(dst.stem + ".f16.partial")
        print(f"[{name}] writing F16 {src}", file=sys.stderr, flush=True)
        try:
            write_streaming(src, cfg)
            print(f"[{name}] F16 {src.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s; "
                  f"llama_model_quantize -> Q4_K_M", file=sys.stderr, flush=True)
            out = subprocess.run([llama_python, os.path.abspath(__file__), "--worker", "quantize", str(src), str(tmp),
                                  str(max(threads, 2))], capture_output=True, text=True)
            if out.returncode != 0 or json.loads(out.stdout.strip().splitlines()[-1])["rc"] != 0:
                raise SystemExit(f"llama_model_quantize failed:\n{out.stderr[-3000:]}")
        finally:
            src.unlink(missing_ok=True)
    else:
        print(f"[{name}] writing {tmp}", file=sys.stderr, flush=True)
        write_streaming(tmp, cfg)
    os.replace(tmp, dst)
    print(f"[{name}] {dst}: {dst.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr, flush=True)
    return dst


def stream_gain(row: dict):
    """(N, aggregate wall tok/s of the most streams over one stream's), medians; None without streams."""
    if not row.get("streams"):
        return None
    top = str(max(int(n) for n in row["streams"][0]))
    return int(top), statistics.median(r[top]["wall_tok_s"] for r in row["streams"]) / statistics.median(
        r["1"]["wall_tok_s"] for r in row["streams"])


def stream_bound(facts: dict, n_streams: int) -> float:
    """The most N streams can gain over one, aggregate, where a step is bound
    by the weights it reads: a step of N tokens reads the dense weights once
    and every expert that any token chose.  With uniform independent routing
    (random weights route so; real models' choices correlate, which reads
    fewer), an expert goes unread with probability (1 - k/E)^N."""
    e, k = facts["n_expert"], facts["n_expert_used"]
    if not e or not k:
        return float(n_streams)   # no experts: every step reads the same weights
    dense = facts["active_bytes_per_token"] - facts["expert_bytes"] * k / e
    read = dense + facts["expert_bytes"] * (1 - (1 - k / e) ** n_streams)
    return n_streams * facts["active_bytes_per_token"] / read


def model_facts(path: Path) -> dict:
    """Size, tensor types and the bytes one decoded token reads."""
    from elelem.gguf.reader import read_gguf
    g = read_gguf(str(path))
    arch = g.get("general.architecture")
    n_expert = g.get(f"{arch}.expert_count")
    n_used = g.get(f"{arch}.expert_used_count")
    types: dict[str, Counter] = defaultdict(Counter)
    total = active = experts = 0
    tied = "output.weight" not in g.tensors
    for tname, t in g.tensors.items():
        kind = re.sub(r"^blk\.\d+\.", "", tname)
        types[kind][t.type_name] += 1
        total += t.nbytes
        if "_exps." in tname:
            active += t.nbytes * n_used // n_expert
            experts += t.nbytes
        elif tname == "token_embd.weight" and not tied:
            active += t.nbytes // t.shape[1]
        else:
            active += t.nbytes
    return dict(file_bytes=path.stat().st_size, tensor_bytes=total, active_bytes_per_token=active,
                expert_bytes=experts,
                n_expert=n_expert, n_expert_used=n_used,
                types={k: dict(v) for k, v in types.items()})


# --------------------------------------------------------------------------
# Where the time goes: every ggml node's wall time, from uprobes.
#
# ggml's CPU backend calls ggml_cpu_extra_compute_forward(params, node) at the
# start of every node on every thread (ggml_compute_forward, inlined, asks the
# extra buffer types first), and the threads meet at a barrier after each
# node.  So on thread 0 (the caller's thread) the time from one node's call to
# the next is that node's wall time, its barrier included; the last node ends
# when ggml_graph_compute returns.  A uprobe there reads the node's op, shape
# and sources' names (struct ggml_tensor's offsets below, the same in elelem's
# vendored ggml and the reference's 0.25.3), so each node is put in a part of
# the model by what it computes on: a mul_mat on blk.N.ffn_gate_inp.weight is
# the router, a soft_max with a mask is attention, and so on (node_part).

T_NE, T_OP, T_SRC, T_NAME = 16, 80, 152, 256  # offsetof(struct ggml_tensor, ne / op / src / name)
PROBE_GROUP = "elelemmoe"


def ggml_ops(header: Path) -> list[str]:
    """ggml's enum ggml_op, in order, from its header."""
    text = header.read_text()
    body = text[text.index("enum ggml_op {"):]
    body = body[:body.index("GGML_OP_COUNT,")]
    return re.findall(r"GGML_OP_(\w+)", body)


def engine_libs(kind: str, llama_python: str) -> tuple[Path, Path]:
    """(libggml-cpu.so, ggml.h) of an engine."""
    if kind == "elelem":
        return (REPO / "elelem" / "_lib" / "libggml-cpu.so").resolve(), REPO / "third_party/ggml/include/ggml.h"
    site = subprocess.run([llama_python, "-c", "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    lib = Path(site) / "lib"  # libggml.so.0 loads libggml-cpu.so.0 (a copy of libggml-cpu.so, not a link)
    lib = next(p for p in (lib / "libggml-cpu.so.0", lib / "libggml-cpu.so") if p.exists())
    return lib.resolve(), Path(site).parent / "include" / "ggml.h"


def _symbol(lib: Path, name: str) -> str:
    """The address of a function the library exports: a probe there, not on its PLT entry too."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return "0x" + parts[0]
    raise RuntimeError(f"{lib} does not export {name}")


def add_probes(prefix: str, lib: Path) -> list[str]:
    """Uprobes on lib: every node's start (with its op, shape and sources), and
    ggml_graph_compute's entry and return; their event names."""
    src0, src1 = f"+{T_SRC}(%si)", f"+{T_SRC + 8}(%si)"
    node = (f"{PROBE_GROUP}:{prefix}_node={_symbol(lib, 'ggml_cpu_extra_compute_forward')} ith=+0(%di):s32 "
            f"op=+{T_OP}(%si):u32 ne0=+{T_NE}(%si):s64 ne1=+{T_NE + 8}(%si):s64 ne2=+{T_NE + 16}(%si):s64 "
            f"s0op=+{T_OP}({src0}):u32 s0n=+{T_NAME}({src0}):string s1={src1}:u64 s1op=+{T_OP}({src1}):u32 "
            f"s1n=+{T_NAME}({src1}):string")
    graph = _symbol(lib, "ggml_graph_compute")
    for spec in (node, f"{PROBE_GROUP}:{prefix}_gin={graph}", f"{PROBE_GROUP}:{prefix}_gout={graph}%return"):
        out = subprocess.run(["perf", "probe", "-q", "-x", str(lib), "--add", spec], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"perf probe {spec.split()[0]}: {out.stderr.strip()[-500:]}")
    return [f"{PROBE_GROUP}:{prefix}_node", f"{PROBE_GROUP}:{prefix}_gin", f"{PROBE_GROUP}:{prefix}_gout__return"]


def del_probes() -> None:
    subprocess.run(["perf", "probe", "-q", "--del", f"{PROBE_GROUP}:*"], capture_output=True)


def worker_profile(engine: str, path: str, threads: int, phase: str, ctl: str, ack: str, options: str) -> dict:
    """Load, then time one phase, with perf's events on only for it (its
    control FIFO): the 512-token prefill, or PROFILE_DECODE greedy steps
    after it.  Runs in the engine's own python."""
    import numpy as np
    if engine == "elelem":
        sys.path.insert(0, str(REPO))
        from elelem import LLM
        llm = LLM(path, n_threads=threads, n_ctx=1024, n_batch=512, **json.loads(options))
        n_vocab = llm.n_vocab

        def step(tokens):
            return int(np.argmax(llm.eval(tokens)))
    else:
        from llama_cpp import Llama
        llm = Llama(path, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
        n_vocab = llm.n_vocab()

        def step(tokens):
            llm.eval(tokens)
            return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
    prompt = cmp._prompt(n_vocab)
    ctl_f, ack_f = open(ctl, "w"), open(ack, "r")

    def perf(cmd: str) -> None:
        ctl_f.write(cmd + "\n")
        ctl_f.flush()
        ack_f.readline()

    token = step(prompt) if phase == "decode" else None
    perf("enable")
    t0 = time.perf_counter()
    if phase == "prefill":
        step(prompt)
        n = len(prompt)
    else:
        for _ in range(PROFILE_DECODE):
            token = step([token])
        n = PROFILE_DECODE
    seconds = time.perf_counter() - t0
    perf("disable")
    return dict(phase=phase, seconds=seconds, tokens=n, tok_s=n / seconds)


def node_part(op: str, f: dict) -> str:
    """The part of the model a node belongs to, from its op and sources."""
    s0n, s1n = f.get("s0n", ""), f.get("s1n", "")
    if op == "MUL_MAT_ID":
        return "experts: mul_mat_id"
    if op == "MUL_MAT":
        if "ffn_gate_inp" in s0n:
            return "router: matmul"
        if ".attn_" in s0n:
            return "attention: projections"
        if s0n in ("output.weight", "token_embd.weight"):
            return "output head"
        return "attention: KQ, KQV"
    if op in ("ADD_ID", "GLU", "CONCAT"):
        return "experts: bias, GLU, pieces"
    if op == "SOFT_MAX":
        return "attention: rest" if f.get("s1", 0) else "router: rest"
    if op in ("ARGSORT", "TOP_K", "SUM_ROWS", "DIV", "CLAMP"):
        return "router: rest"
    if op == "GET_ROWS":
        return "norms, residuals, embedding, rest" if "token_embd" in s0n else "router: rest"
    if op in ("FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "CPY", "DUP", "CONT"):
        return "attention: rest"
    if op == "ADD":
        if ".attn_" in s1n:
            return "attention: projections"   # their biases (gpt-oss)
        if "ffn_gate_inp" in s1n:
            return "router: rest"
        if "VIEW" in (f.get("s0op"), f.get("s1op")):
            return "experts: weighting, sum"   # the sum of the chosen experts' outputs, view by view
        return "norms, residuals, embedding, rest"
    if op == "MUL":
        if "attn_q_norm" in s1n or "attn_k_norm" in s1n:
            return "attention: rest"
        return "norms, residuals, embedding, rest" if s1n.endswith("norm.weight") else "experts: weighting, sum"
    if op == "RMS_NORM" and f.get("ne0") == f.get("head_dim"):
        return "attention: rest"   # the QK norms (qwen3moe)
    return "norms, residuals, embedding, rest"


_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def node_times(script: str, ops: list[str], hp: dict) -> dict:
    """perf script's probe lines -> seconds per part and per op on thread 0, graphs, ggml's own gaps."""
    parts: Counter = Counter()
    by_op: Counter = Counter()
    graphs = nodes = 0
    graph_s = 0.0
    pending = None  # (time, part, op) of the node thread 0 is in
    t_in = None
    for line in script.splitlines():
        m = re.match(r"\s*\S+\s+(\d+)\s+\[\d+\]\s+([\d.]+):\s+\S+:(\w+):", line) or \
            re.match(r"\s*\S*\s*(\d+)\s+([\d.]+):\s+\S+:(\w+):", line)
        if not m:
            continue
        t, event = float(m.group(2)), m.group(3)
        if event.endswith("_gin"):
            t_in, pending = t, None
            continue
        if "_gout" in event:
            if pending is not None:
                parts[pending[1]] += t - pending[0]
                by_op[pending[2]] += t - pending[0]
            if t_in is not None:
                graphs += 1
                graph_s += t - t_in
            pending, t_in = None, None
            continue
        f = {}
        for k, v in _FIELD.findall(line):
            if v.startswith('"'):
                f[k] = v[1:-1]
            else:
                try:
                    f[k] = int(v, 0)
                except ValueError:
                    f[k] = v
        if f.get("ith") != 0 or t_in is None:
            continue
        op = ops[f["op"]] if isinstance(f.get("op"), int) and f["op"] < len(ops) else "?"
        for key in ("s0op", "s1op"):
            if isinstance(f.get(key), int) and f[key] < len(ops):
                f[key] = ops[f[key]]
        f.update(hp)
        nodes += 1
        if pending is None:
            parts["ggml: graph start"] += t - t_in
        else:
            parts[pending[1]] += t - pending[0]
            by_op[pending[2]] += t - pending[0]
        pending = (t, node_part(op, f), op)
    return dict(parts=dict(parts), ops=dict(by_op.most_common(12)), graphs=graphs, graph_s=graph_s, nodes=nodes)


def profile(engine: str, python: str, path: Path, threads: int, phase: str, options: str, events: list[str],
            ops: list[str], hp: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="elelem-moe-perf-") as tmp:
        ctl, ack, data = f"{tmp}/ctl", f"{tmp}/ack", f"{tmp}/perf.data"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        cmd = ["perf", "record", "-q", *[a for e in events for a in ("-e", e)], "-D", "-1",
               "--control", f"fifo:{ctl},{ack}", "-o", data, "--",
               python, os.path.abspath(__file__), "--worker", "profile", engine, str(path), str(threads), phase,
               ctl, ack, options]
        env = dict(os.environ, **cmp.checkout_env(False)) if engine == "elelem" else None
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            return dict(error=out.stderr[-2000:])
        timing = json.loads(out.stdout.strip().splitlines()[-1])
        script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,cpu,time,event,trace"],
                                capture_output=True, text=True)
    times = node_times(script.stdout, ops, hp)
    times["parts"]["outside ggml (Python, graph building, sampling)"] = max(
        0.0, timing["seconds"] - times["graph_s"])
    return dict(timing, **times)


def profiles(path: Path, args, llama_python: str, hp: dict) -> dict:
    """{engine: {phase: profile}}, or {"error": why}."""
    result: dict = {}
    try:
        del_probes()
        for engine, python in (("elelem", sys.executable), ("llama.cpp", llama_python)):
            lib, header = engine_libs("elelem" if engine == "elelem" else "llamacpp", llama_python)
            events = add_probes("eln" if engine == "elelem" else "lcpp", lib)
            ops = ggml_ops(header)
            result[engine] = {phase: profile(engine, python, path, args.threads, phase, args.elelem_options,
                                             events, ops, hp) for phase in ("prefill", "decode")}
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        result["error"] = str(e)
    finally:
        del_probes()
    return result


# --------------------------------------------------------------------------
# Driver.

def _run(python: str, kind: str, *args, env=None) -> dict:
    """A worker of this script (kind "engine") or of compare_llamacpp's, in its own process."""
    script = os.path.abspath(__file__) if kind == "engine" else os.path.abspath(cmp.__file__)
    cmd = [python, script, "--worker", kind, *map(str, args)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=None if env is None else dict(os.environ, **env))
    if out.returncode != 0:
        return dict(error=f"{' '.join(map(str, args[:1]))} worker exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def elelem_variants(args) -> dict[str, str]:
    """label -> LLM() options (JSON) of each elelem measured against llama.cpp: the
    one asked for, and on a CPU with AMX (which the reference build compiles out)
    the same without AMX, whose kernels are the reference's own."""
    variants = {"elelem": args.elelem_options}
    opts = json.loads(args.elelem_options)
    if args.amx_variant and "amx" not in opts and "amx_tile" in _cpu_flags():
        variants["elelem amx=false"] = json.dumps(dict(opts, amx=False))
    return variants


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def measure(name: str, path: Path, args, llama_python: str) -> dict:
    facts = model_facts(path)
    row: dict = dict(model=name, path=str(path), facts=facts, threads=args.threads)
    bw = _run(sys.executable, "bandwidth", args.threads).get("read_gb_s", float("nan"))
    row["bandwidth_gb_s"] = bw
    row["decode_bound_tok_s"] = bw * 1e9 / facts["active_bytes_per_token"]
    variants = elelem_variants(args)
    row["variants"] = variants
    runs: dict[str, list] = {label: [] for label in [*variants, "llama.cpp"]}
    row["load_avg"] = []
    for r in range(args.repeats if args.compare else 0):  # interleaved
        for label, options in variants.items():
            runs[label].append(_run(sys.executable, "engine", "elelem", str(path), args.threads, options,
                                    env=cmp.checkout_env(False)))
        runs["llama.cpp"].append(_run(llama_python, "engine", "llamacpp", str(path), args.threads, "{}"))
        row["load_avg"].append(os.getloadavg()[0])
        print(f"[{time.strftime('%H:%M:%S')}] {name} repeat {r + 1}: "
              + "; ".join(f"{eng} prefill {x.get('prefill_tok_s', float('nan')):.1f} decode "
                          f"{x.get('decode_tok_s', float('nan')):.2f} tok/s RSS {x.get('peak_rss_mb', 0):.0f} MB"
                          for eng, x in ((e, rs[-1]) for e, rs in runs.items()))
              + f" (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    row["errors"] = [x["error"] for rs in runs.values() for x in rs if "error" in x]
    ok = {eng: [x for x in rs if "error" not in x] for eng, rs in runs.items()}
    row["runs"] = ok
    row["median"] = {eng: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "tokens"}
                     for eng, rs in ok.items() if rs}
    if ok["llama.cpp"] and len(row["median"]) > 1:
        ref = ok["llama.cpp"][0]["tokens"]
        row["tokens"] = {"llama.cpp": ref}
        row["same_tokens"] = {}
        for label in variants:
            if ok[label]:
                row["tokens"][label] = ok[label][0]["tokens"]
                row["same_tokens"][label] = cs._matched(ok[label][0]["tokens"], ref)
    if args.streams:
        spec = dict(streams=args.streams, tokens=args.stream_tokens, threads=args.threads, n_ctx=512,
                    installed=False, flash_attn=not args.streams_no_flash,
                    elelem_options=json.loads(args.elelem_options))
        stream_runs = []
        for _ in range(args.repeats):
            try:
                stream_runs.append(cs.run_worker(sys.executable, "elelem", str(path), spec))
            except SystemExit as e:
                row["errors"].append(f"streams: {e}")
                break
        if stream_runs:
            row["streams"] = [cs.summarize(r) for r in stream_runs]
            row["stream_prompt_tokens"] = stream_runs[0]["prompt_tokens"]
    if args.profile:
        kw = _shapes(args.smoke)[name][0]
        row["profile"] = profiles(path, args, llama_python, dict(head_dim=kw["head_dim"]))
    return row


def _ratio_text(ratio: float, key: str) -> str:
    lo, goal = TARGETS.get(key, (None, None))
    if key == "peak_rss_mb":
        # Less memory is better: the target is at most 1.1x llama.cpp's peak, the goal at most 1.0x.
        return "goal met" if ratio <= 1.0 else ("at least met" if ratio <= 1.1 else "ABOVE 1.1x")
    if lo is None:
        return ""
    return "goal met" if ratio >= goal else ("at least met" if ratio >= lo else "BELOW 1.0x")


def print_row(row: dict) -> None:
    f = row["facts"]
    print(f"\n== {row['model']} @ {row['threads']} thread(s): {row['path']}")
    print(f"   {f['file_bytes'] / 1e9:.2f} GB; {f['n_expert']} experts, {f['n_expert_used']} used; "
          f"{f['active_bytes_per_token'] / 1e6:.0f} MB of weights read per decoded token")
    types = {k: v for k, v in f["types"].items() if not k.endswith((".bias", "norm.weight"))}
    print("   types: " + ", ".join(f"{k} {'/'.join(f'{t}x{c}' for t, c in v.items())}" for k, v in types.items()))
    for err in row.get("errors", []):
        print(f"   ERROR: {err}")
    med = row.get("median", {})
    if "llama.cpp" in med and len(med) > 1:
        l = med["llama.cpp"]
        labels = [k for k in med if k != "llama.cpp"]
        for label in labels:
            n = row["same_tokens"][label]
            total = len(row["tokens"]["llama.cpp"])
            print(f"   greedy tokens, {label} vs llama.cpp: {n} of the first {total} the same"
                  + ("" if n == total else f" (from there elelem {row['tokens'][label][n:n + 6]}, llama.cpp "
                                           f"{row['tokens']['llama.cpp'][n:n + 6]})"))
        head = "".join(f"{lab:>19}{'ratio':>7}" for lab in labels)
        print(f"   {'figure':<22}{head}{'llama.cpp':>11}  targets ({labels[0]})")
        for key, label, fmt in (("load_s", "load (s)", "{:.2f}"),
                                ("prefill_tok_s", f"prefill({cmp.N_PROMPT}) tok/s", "{:.1f}"),
                                ("decode_tok_s", f"decode({cmp.N_DECODE}) tok/s", "{:.2f}"),
                                ("peak_rss_mb", "peak RSS (MB)", "{:.0f}")):
            cells = "".join(f"{fmt.format(med[lab][key]):>19}{med[lab][key] / l[key]:>7.3f}" for lab in labels)
            print(f"   {label:<22}{cells}{fmt.format(l[key]):>11}  {_ratio_text(med[labels[0]][key] / l[key], key)}")
        for eng, rs in row["runs"].items():
            print(f"   {eng} runs: prefill " + ", ".join(f"{x['prefill_tok_s']:.1f}" for x in rs)
                  + "; decode " + ", ".join(f"{x['decode_tok_s']:.2f}" for x in rs)
                  + "; RSS " + ", ".join(f"{x['peak_rss_mb']:.0f}" for x in rs)
                  + "; load " + ", ".join(f"{x['load_s']:.2f}" for x in rs))
        bound = row["decode_bound_tok_s"]
        print(f"   decode bound {bound:.1f} tok/s (read {row['bandwidth_gb_s']:.1f} GB/s): "
              + ", ".join(f"{lab} {100 * med[lab]['decode_tok_s'] / bound:.0f}%" for lab in [*labels, "llama.cpp"])
              + f"; load average after each repeat {', '.join(f'{x:.2f}' for x in row['load_avg'])}")
    if row.get("streams"):
        figs = row["streams"]
        print(f"   elelem streams (flash attention, prompts of {row['stream_prompt_tokens']} tokens):")
        base = {k: statistics.median(r["1"][k] for r in figs) for k in ("wall_tok_s", "decode_tok_s")}
        for n in figs[0]:
            wall = [r[n]["wall_tok_s"] for r in figs]
            dec = [r[n]["decode_tok_s"] for r in figs]
            counts = sorted({c for r in figs for c in r[n]["counts"]})
            same = min(r[n]["same"] for r in figs)
            print(f"     N={n}: wall {cs._fmt_range(wall)} tok/s ({statistics.median(wall) / base['wall_tok_s']:.2f}x), "
                  f"decode {cs._fmt_range(dec)} tok/s ({statistics.median(dec) / base['decode_tok_s']:.2f}x); "
                  f"tokens/stream {counts[0]}..{counts[-1]}; "
                  + ("(solo)" if n == "1" else f"same as solo {same}/{n}; "
                     f"bound from the weights read {stream_bound(row['facts'], int(n)):.2f}x"))
    prof = row.get("profile")
    if prof:
        print_profile(prof)


PART_ORDER = ("experts: mul_mat_id", "experts: bias, GLU, pieces", "experts: weighting, sum", "router: matmul",
              "router: rest", "attention: projections", "attention: KQ, KQV", "attention: rest", "output head",
              "norms, residuals, embedding, rest", "ggml: graph start",
              "outside ggml (Python, graph building, sampling)")


def print_profile(prof: dict) -> None:
    if "error" in prof:
        print(f"   where the time goes: not measured ({prof['error'][-300:]})")
        return
    for phase in ("prefill", "decode"):
        e, l = prof["elelem"][phase], prof["llama.cpp"][phase]
        if "error" in e or "error" in l:
            print(f"   {phase} profile: ERROR {(e.get('error') or l.get('error'))[-500:]}")
            continue
        unit = "ms per 512-token prompt" if phase == "prefill" else "ms per token"
        div = 1 if phase == "prefill" else e["tokens"]
        print(f"   where the {phase} time goes ({unit}; wall time of each ggml node on thread 0, barrier "
              f"included; uprobes)")
        print(f"     {'part':<50}{'elelem':>9}{'share':>7}{'llama.cpp':>11}{'share':>7}{'e/l':>7}")
        names = [n for n in PART_ORDER if n in e["parts"] or n in l["parts"]]
        names += sorted((set(e["parts"]) | set(l["parts"])) - set(names))
        for name in names + ["total"]:
            if name == "total":
                ev, lv = e["seconds"], l["seconds"]
            else:
                ev, lv = e["parts"].get(name, 0.0), l["parts"].get(name, 0.0)
            ratio = f"{ev / lv:7.2f}" if lv > 0 else f"{'':>7}"
            print(f"     {name:<50}{1000 * ev / div:9.2f}{100 * ev / e['seconds']:6.1f}%"
                  f"{1000 * lv / div:11.2f}{100 * lv / l['seconds']:6.1f}%{ratio}")
        print(f"     under the probes: elelem {e['tok_s']:.1f} tok/s ({e['graphs']} graphs of "
              f"{e.get('nodes', 0) / max(1, e['graphs']):.0f} nodes), llama.cpp {l['tok_s']:.1f} tok/s "
              f"({l['graphs']} graphs of {l.get('nodes', 0) / max(1, l['graphs']):.0f} nodes)")
        print("     elelem by op: " + ", ".join(f"{k} {1000 * v / div:.2f}" for k, v in e["ops"].items()))
        print("     llama.cpp by op: " + ", ".join(f"{k} {1000 * v / div:.2f}" for k, v in l["ops"].items()))


def print_summary(rows: list[dict], args) -> None:
    print(f"\nSummary, {args.threads} thread(s), {args.repeats} repeat(s), medians, elelem / llama.cpp:")
    print(f"  {'model':<10}{'elelem':<18}{'prefill':>9}{'decode':>9}{'RSS':>7}{'8 streams':>11}  same tokens")
    for row in rows:
        med = row.get("median", {})
        if "llama.cpp" not in med or len(med) < 2:
            print(f"  {row['model']:<10} (no comparison: {row.get('errors')})")
            continue
        l = med["llama.cpp"]
        for label in (k for k in med if k != "llama.cpp"):
            e = med[label]
            gain = stream_gain(row) if label == "elelem" else None
            agg = f"{gain[1]:.2f}x" if gain else ""
            print(f"  {row['model']:<10}{label:<18}{e['prefill_tok_s'] / l['prefill_tok_s']:>9.3f}"
                  f"{e['decode_tok_s'] / l['decode_tok_s']:>9.3f}{e['peak_rss_mb'] / l['peak_rss_mb']:>7.3f}"
                  f"{agg:>11}  {row['same_tokens'][label]}/{len(row['tokens']['llama.cpp'])}")
    print("  targets: decode and prefill at least 1.0x (goal 1.15x), peak RSS at most 1.1x (goal 1.0x), 8 streams goal 3x one")


def reference_and_header(llama_python) -> str:
    """The llama.cpp reference's python (``--llama-python``, else scripts/reference_llamacpp.py's),
    after printing the command line and the machine's load."""
    sys.path.insert(0, str(REPO))
    if not llama_python:
        out = subprocess.run([sys.executable, str(REPO / "scripts" / "reference_llamacpp.py"), "--check"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit("no llama.cpp reference: run scripts/reference_llamacpp.py, or pass --llama-python")
        llama_python = out.stdout.strip()
    print("command: " + " ".join([os.path.relpath(sys.argv[0], REPO) if sys.argv[0].endswith(".py") else sys.argv[0]]
                                 + sys.argv[1:]))
    print(f"reference: {llama_python}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs")
    return llama_python


def common_arguments(ap: argparse.ArgumentParser, models: list[str], layers_help: str, streams: list[int]) -> None:
    """The options this script, benchmarks/hybrid.py and benchmarks/families.py share."""
    ap.add_argument("--only", nargs="+", choices=models, default=models)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--layers", type=int, help=layers_help)
    build = ap.add_mutually_exclusive_group()
    build.add_argument("--skip-build", action="store_true", help="use the cached model files; fail if absent")
    build.add_argument("--rebuild", action="store_true", help="write the model files even if cached")
    ap.add_argument("--streams", nargs="+", type=int, default=streams)
    ap.add_argument("--no-streams", dest="streams", action="store_const", const=[])
    ap.add_argument("--stream-tokens", type=int, default=64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(ap, ["qwen3moe", "gpt-oss"], "layers of each model (default: 4: 1.65 and 2.1 GB)", [1, 8])
    ap.add_argument("--streams-no-flash", action="store_true", help="streams without flash attention")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--no-compare", dest="compare", action="store_false",
                    help="skip the load/prefill/decode/RSS comparison (streams and profile only)")
    ap.add_argument("--llama-python", help="a python with llama_cpp (default: scripts/reference_llamacpp.py's)")
    ap.add_argument("--elelem-options", default="{}", metavar="JSON", help="more LLM() options for elelem")
    ap.add_argument("--no-amx-variant", dest="amx_variant", action="store_false",
                    help="on an AMX CPU, do not also measure elelem with amx=False (the reference's kernels)")
    ap.add_argument("--build-only", action="store_true", help="write the model files, measure nothing")
    ap.add_argument("--smoke", action="store_true", help="small models of the same structure (a quick check)")
    ap.add_argument("--json", help="also write every measurement to this file")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        kind, *rest = args.worker
        if kind == "quantize":
            print(json.dumps(worker_quantize(rest[0], rest[1], int(rest[2]))))
        elif kind == "engine":
            print(json.dumps(worker_engine(rest[0], rest[1], int(rest[2]), rest[3])))
        elif kind == "profile":
            print(json.dumps(worker_profile(rest[0], rest[1], int(rest[2]), rest[3], rest[4], rest[5], rest[6])))
        return

    llama_python = reference_and_header(args.llama_python)
    shapes = _shapes(args.smoke)
    rows = []
    for name in args.only:
        _, default_layers, _, description = shapes[name]
        layers = args.layers or default_layers
        path = model_path(name, layers, args.smoke)
        if args.rebuild or not path.exists():
            if args.skip_build:
                raise SystemExit(f"--skip-build: {path} is not there")
            build_model(name, layers, args.smoke, llama_python, args.threads)
        if args.build_only:
            print(f"{name}: {path} ({path.stat().st_size / 1e9:.2f} GB)")
            continue
        print(f"\n[{time.strftime('%H:%M:%S')}] {name}: {description}; {layers} layers", flush=True)
        row = measure(name, path, args, llama_python)
        row["description"] = description
        rows.append(row)
        print_row(row)
        sys.stdout.flush()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    if rows:
        print_summary(rows, args)


if __name__ == "__main__":
    main()
