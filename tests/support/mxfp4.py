"""MXFP4 (OCP Microscaling FP4) in NumPy, written from the format, in float64.

A block holds 32 values in 17 bytes: one E8M0 scale byte, then 16 bytes of
4-bit E2M1 codes.  As ggml lays them out (block_mxfp4 in ggml-common.h,
dequantize_row_mxfp4 in ggml-quants.c), byte j's low nibble is element j and
its high nibble element j + 16 (the OCP spec's own packing puts consecutive
elements in one byte; ggml's does not).

- E2M1: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa;
  exponent 0 is subnormal (0.5 * mantissa).  The magnitudes are
  0, 0.5, 1, 1.5, 2, 3, 4, 6.
- E8M0: an unsigned power of two, 2^(e - 127); e = 255 is NaN in the spec.
  ggml's ggml_e8m0_to_fp32_half does not handle it (it reads 2^127 there):
  no quantizer writes it, so this module returns NaN and the tests leave it out.

ggml stores half the scale and doubles the E2M1 table (kvalues_mxfp4 =
2 * E2M1), which is the same product; this module keeps the definitions.
"""
from __future__ import annotations

import numpy as np

BLOCK = 32
BLOCK_BYTES = 1 + BLOCK // 2


def e2m1(codes: np.ndarray) -> np.ndarray:
    """4-bit E2M1 codes -> their values (float64)."""
    codes = np.asarray(codes, dtype=np.uint8)
    sign = np.where(codes & 0b1000, -1.0, 1.0)
    exp = (codes >> 1) & 0b11
    man = (codes & 0b1).astype(np.float64)
    magnitude = np.where(exp == 0, 0.5 * man, (1.0 + 0.5 * man) * np.exp2(exp.astype(np.float64) - 1.0))
    return sign * magnitude


def e8m0(scales: np.ndarray) -> np.ndarray:
    """E8M0 scale bytes -> 2^(e - 127) (float64); NaN for 255."""
    e = np.asarray(scales, dtype=np.uint8).astype(np.float64)
    return np.where(e == 255, np.nan, np.exp2(e - 127.0))


def dequantize(raw: np.ndarray) -> np.ndarray:
    """MXFP4 rows, (..., n_blocks * 17) uint8 -> (..., n_blocks * 32) float64."""
    raw = np.asarray(raw, dtype=np.uint8)
    if raw.shape[-1] % BLOCK_BYTES:
        raise ValueError(f"an MXFP4 row is a multiple of {BLOCK_BYTES} bytes, got {raw.shape[-1]}")
    blocks = raw.reshape(*raw.shape[:-1], raw.shape[-1] // BLOCK_BYTES, BLOCK_BYTES)
    scale = e8m0(blocks[..., 0])[..., None]
    qs = blocks[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)     # elements 0..15, then 16..31
    return (e2m1(codes) * scale).reshape(*raw.shape[:-1], -1)
