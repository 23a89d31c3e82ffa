"""NumPy quantizers for Q4_K and Q6_K, which the `gguf` package (0.19) can
dequantize but not quantize.

These are plain round-to-nearest quantizers written for the tests from the
block layouts in ggml's ggml-common.h (not ggml's error-minimising search):
they only have to produce valid blocks.  What the tests compare against is
always ``gguf.quants.dequantize`` of the bytes written here, so a packing
mistake would show up as a large round-trip error (checked in
test_core_weight_types.py), never as a silent change of the reference.
"""
from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _blocks(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    if rows.shape[-1] % QK_K:
        raise ValueError(f"K-quant rows must be a multiple of {QK_K} long, got {rows.shape[-1]}")
    return rows.reshape(-1, QK_K)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """(n, k) float -> (n, k // 256 * 144) uint8: per block d, dmin (f16), 12 bytes of
    6-bit sub-block scales and mins, 128 bytes of 4-bit values; w = d*sc*q - dmin*m."""
    n_rows = np.asarray(rows).shape[0]
    x = _blocks(rows).reshape(-1, 8, 32)                       # 8 sub-blocks of 32
    lo = np.minimum(x.min(axis=2), 0.0)                        # the min is stored negated, >= 0
    step = (x.max(axis=2) - lo) / 15.0
    d = _f16(step.max(axis=1) / 63.0)
    dmin = _f16(-lo.min(axis=1) / 63.0)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(step / df[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dminf[:, None] > 0, np.rint(-lo / dminf[:, None]), 0).clip(0, 63).astype(np.uint8)
        scale = df[:, None] * sc
        q = np.where(scale[..., None] > 0, np.rint((x + (dminf[:, None] * mn)[..., None]) / scale[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8)
    # get_scale_min_k4: sub-blocks 0-3 keep 6 bits in bytes 0-3 (scales) and 4-7 (mins);
    # 4-7 put their low 4 bits in bytes 8-11 and their top 2 bits in the top of bytes 0-7.
    packed = np.zeros((x.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    # Each 32 bytes of qs hold sub-block 2j in the low nibbles and 2j+1 in the high ones.
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed, qs], axis=1)
    return out.reshape(n_rows, -1)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """(n, k) float -> (n, k // 256 * 210) uint8: per block 128 bytes of low 4 bits,
    64 of high 2 bits, 16 int8 sub-block scales, d (f16); w = d*sc*(q - 32)."""
    n_rows = np.asarray(rows).shape[0]
    x = _blocks(rows).reshape(-1, 16, 16)                      # 16 sub-blocks of 16
    step = np.abs(x).max(axis=2) / 31.0
    d = _f16(step.max(axis=1) / 127.0)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(step / df[:, None]), 0).clip(-128, 127).astype(np.int8)
        scale = df[:, None] * sc
        q = np.where(scale[..., None] != 0, np.rint(x / scale[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [half][quarter][l]
    # dequantize_row_q6_K: in each 128-value half, quarter 0/1 are the low nibbles of
    # ql[0:32]/ql[32:64], quarter 2/3 their high nibbles; qh[l] holds 2 bits of each quarter.
    ql = np.concatenate([q[:, :, 0] & 0xF | (q[:, :, 2] & 0xF) << 4,
                         q[:, :, 1] & 0xF | (q[:, :, 3] & 0xF) << 4], axis=2)      # (nb, 2, 64)
    qh = (q[:, :, 0] >> 4) | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8),
                          d.view(np.uint8).reshape(-1, 2)], axis=1)
    return out.reshape(n_rows, -1)
