"""What ggml's CPU backend does to a matmul's activations, and its GELU, in NumPy.

A quantized weight is never multiplied by float activations: ggml first
quantizes each activation row to the weight type's "vec_dot type" (type_traits_cpu
in ggml-cpu.c) and the kernels then sum integer products per block.  Every
path elelem can take on x86 does this the same way, so one reference covers
them all:

- single-token decode: ggml_vec_dot_* over quantize_row_q8_0 / q8_1 / q8_K
  (ggml-cpu/arch/x86/quants.c; q8_K is quantize_row_q8_K_ref);
- a batch of tokens with Q4_0, Q5_0 or Q8_0 weights: llamafile's tinyBLAS
  (GGML_LLAMAFILE=ON), called on the same Q8_0 rows (ggml_compute_forward_mul_mat's
  second llamafile_sgemm call); Q4_1, Q6_K: ggml's vec_dot loop;
- repacked Q4_0 and Q4_K (CPU_REPACK, AVX2): ggml_quantize_mat_q8_0_4x8 /
  q8_K_4x8 for each group of 4 rows, quantize_row_* for the rest, which scale
  and round exactly like the row quantizers.

So the kernels differ only in float32 summation order.  The quantization itself:

- Q8_0 (Q4_0, Q5_0, Q8_0 weights): blocks of 32, q = round(x * 127/amax)
  (round half to even), scale fp16(amax/127);
- Q8_1 (Q4_1): the same, plus s = fp16(d * sum(q)) with d the float scale; the
  kernel adds the weight block's min times s, not times the sum of the
  dequantized activations, so that term is reproduced separately;
- Q8_K (Q4_K, Q6_K): blocks of 256, scale amax/127 kept in float32;
- F16 weights: activations rounded to fp16.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

VEC_DOT_TYPE = {"f32": None, "f16": "f16", "q4_0": "q8_0", "q5_0": "q8_0", "q8_0": "q8_0",
                "q4_1": "q8_1", "q4_k": "q8_k", "q6_k": "q8_k"}
# MXFP4 (gpt-oss's experts) dots with Q8_0 activations too: type_traits_cpu's
# ggml_vec_dot_mxfp4_q8_0, and the repacked MXFP4 GEMM/GEMV on the same Q8_0 rows.
VEC_DOT_TYPE["mxfp4"] = "q8_0"
_BLOCK = {"q8_0": 32, "q8_1": 32, "q8_k": 256}
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles


def quantized_activations(x: np.ndarray, vec_dot_type: str):
    """``x`` (n, k) as ggml's kernels see it: (dequantized x, per-block s) where s is
    Q8_1's stored fp16(d * sum(q)) (None for other types)."""
    if vec_dot_type == "f16":
        return x.astype(np.float16).astype(np.float64), None
    n, k = x.shape
    bs = _BLOCK[vec_dot_type]
    blocks = x.astype(np.float32).reshape(n, k // bs, bs)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv)                         # float32 product, then round half to even
    d = (amax / np.float32(127)).astype(np.float32)
    if vec_dot_type != "q8_k":
        d_stored = d.astype(np.float16).astype(np.float64)
    else:
        d_stored = d.astype(np.float64)
    deq = (q * d_stored).reshape(n, k)
    s = None
    if vec_dot_type == "q8_1":
        s = (d[..., 0] * q.sum(axis=2)).astype(np.float32).astype(np.float16).astype(np.float64)
    return deq, s


def rounding_flip_allowance(x: np.ndarray, w: np.ndarray, vec_dot_type: str, margin: float) -> np.ndarray:
    """How far x @ w.T may move, per (row, output), if ggml rounds differently any
    activation that lies within ``margin`` (in quantization steps) of a rounding tie.

    elelem's float32 activations differ from this float64 reference in the last
    bits, so an element this close to ``k + 0.5`` steps may round the other way
    there.  That moves it by one step ``d`` of its block, and the product by
    ``d * |w[:, j]|`` (for Q8_1 the block sum ``s`` moves with it, which the
    dequantized Q4_1 weight ``w = d_w*q + m`` already accounts for).
    """
    n, k = x.shape
    bs = _BLOCK[vec_dot_type]
    blocks = x.astype(np.float32).reshape(n, k // bs, bs)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = np.where(amax > 0, blocks * (np.float32(127) / amax), 0).astype(np.float64)
    near = np.abs(np.abs(steps - np.floor(steps)) - 0.5) < margin
    step = np.broadcast_to(amax / 127.0, blocks.shape)
    return (np.where(near, step, 0.0).reshape(n, k)) @ np.abs(w.T)


def q4_1_block_mins(raw: np.ndarray) -> np.ndarray:
    """(n_out, bytes per row) Q4_1 data -> (n_out, blocks) float block mins m."""
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, Q4_1_BLOCK_BYTES)
    return np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0].astype(np.float64)


def matmul(x: np.ndarray, w: np.ndarray, wtype: str, raw: Optional[np.ndarray] = None) -> np.ndarray:
    """x (n, k) @ w.T (w: (n_out, k), dequantized) as ggml computes it for weights of
    ``wtype``; Q4_1 needs the raw rows (``raw``) for its block mins."""
    vdt = VEC_DOT_TYPE[wtype]
    if vdt is None:
        return x @ w.T
    xq, s = quantized_activations(x, vdt)
    out = xq @ w.T
    if s is not None:
        # ggml: sum_b m_b * s_b; the dequantized product above has sum_b m_b * sum(x'_b).
        mins = q4_1_block_mins(raw)
        xsum = xq.reshape(s.shape[0], s.shape[1], -1).sum(axis=2)
        out = out + (s - xsum) @ mins.T
    return out


def gelu_f16_table(x: np.ndarray) -> np.ndarray:
    """tanh-GELU as ggml_vec_geglu_f32 computes it: a lookup in a table of
    fp16(gelu(h)) indexed by h = fp16(x), for -10 < x < 10 (0 below, x above)."""
    h = np.clip(x, -10, 10).astype(np.float16).astype(np.float64)
    g = 0.5 * h * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (h + 0.044715 * h ** 3)))
    table = g.astype(np.float32).astype(np.float16).astype(np.float64)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, table))
