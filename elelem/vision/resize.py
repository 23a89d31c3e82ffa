"""Resizing as libmtmd does it, to the byte.

llama.cpp resizes images with code of its own (tools/mtmd/mtmd-image.cpp,
``img_tool::resize`` and ``resize_pillow``), a port of Pillow's separable
resampling: filter weights computed in double, rounded to fixed point with 22
fractional bits, a horizontal pass then a vertical one, each rounding to 8
bits.  Pillow's own ``Image.resize`` differs in details (it crops the rows the
vertical pass needs, and may reduce first), so this module repeats mtmd's
arithmetic in NumPy rather than calling Pillow: the pixels the encoder sees are
then libmtmd's exactly.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidArgumentError

PRECISION_BITS = 32 - 8 - 2
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}
MAX_SIDE = 65536   # mtmd refuses a resize target past this


def _filter(algo: str, x: np.ndarray) -> np.ndarray:
    if algo == "lanczos":
        return _lanczos(x)
    x = np.abs(x)
    if algo == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5   # Pillow's bicubic (ggml and PyTorch use -0.75)
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _sinc(v: float) -> float:
    if v == 0.0:
        return 1.0
    pi_v = v * 3.141592653589793
    return math.sin(pi_v) / pi_v


def _lanczos(x: np.ndarray) -> np.ndarray:
    """resize_pillow's Lanczos-3: sinc(x) sinc(x / 3) on [-3, 3), the signed x as it comes
    (not |x|: the window is half-open), each value through the C library's sin as
    std::sin takes it (NumPy's vectorised sin may round the last bit otherwise)."""
    flat = [(_sinc(v) * _sinc(v / 3.0)) if -3.0 <= v < 3.0 else 0.0 for v in x.reshape(-1).tolist()]
    return np.asarray(flat, dtype=np.float64).reshape(x.shape)


def _weights(in_size: int, out_size: int, algo: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first input index, count, fixed-point weights (out_size, ksize)) per output
    pixel: resize_pillow's precompute_weights."""
    scale = filterscale = in_size / out_size
    if filterscale < 1.0:
        filterscale = 1.0
    support = _SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    # C's (int) truncates toward zero; center - support + 0.5 may be negative before the clamp.
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize, dtype=np.float64)
    w = _filter(algo, (taps[None, :] + xmin[:, None] - center[:, None] + 0.5) * (1.0 / filterscale))
    w = np.where(taps[None, :] < xmax[:, None], w, 0.0)
    total = _sequential_sum(w)[:, None]   # summed tap by tap, as the C loop does (not pairwise)
    w = np.where(total != 0.0, w / np.where(total != 0.0, total, 1.0), w)
    fixed = w * float(1 << PRECISION_BITS) + np.where(w < 0, -0.5, 0.5)
    return xmin, xmax, np.trunc(fixed).astype(np.int64)


def _sequential_sum(w: np.ndarray) -> np.ndarray:
    out = np.zeros(w.shape[0], dtype=np.float64)
    for j in range(w.shape[1]):
        out = out + w[:, j]
    return out


def _resample(src: np.ndarray, out_size: int, algo: str, axis: int) -> np.ndarray:
    """One pass along ``axis`` of a (height, width, 3) uint8 image."""
    in_size = src.shape[axis]
    xmin, xcnt, k = _weights(in_size, out_size, algo)
    data = np.moveaxis(src, axis, 0).astype(np.int64)           # (in_size, other, 3)
    acc = np.full((out_size,) + data.shape[1:], 1 << (PRECISION_BITS - 1), dtype=np.int64)
    for j in range(k.shape[1]):
        idx = np.minimum(xmin + j, in_size - 1)
        wj = np.where(j < xcnt, k[:, j], 0)
        acc += data[idx] * wj[:, None, None]
    out = np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)
    return np.moveaxis(out, 0, axis)


def resize(rgb: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """(h, w, 3) uint8 -> (height, width, 3): mtmd's resize_pillow (horizontal, then vertical)."""
    if algo not in _SUPPORT:
        raise InvalidArgumentError(f"unknown resize filter {algo!r}")
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise InvalidArgumentError(f"resize target {width}x{height} is out of range (max {MAX_SIDE})")
    out = rgb
    if width != rgb.shape[1]:
        out = _resample(out, width, algo, axis=1)
    if height != rgb.shape[0]:
        out = _resample(out, height, algo, axis=0)
    return np.ascontiguousarray(out)


def resize_padded(rgb: np.ndarray, width: int, height: int, algo: str,
                  pad_color: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """mtmd's img_tool::resize with PAD_CEIL: scale to fit inside width x height
    keeping the aspect ratio (each side rounded up), centre it, fill the rest."""
    h, w = rgb.shape[:2]
    if (w, h) == (width, height):
        return rgb.copy()
    # float32 arithmetic, as in C++: float scale, int * float, ceil.
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    new_w = min(int(math.ceil(np.float32(w) * scale)), width)
    new_h = min(int(math.ceil(np.float32(h) * scale)), height)
    inner = resize(rgb, new_w, new_h, algo)
    out = np.empty((height, width, 3), dtype=np.uint8)
    out[:] = np.asarray(pad_color, dtype=np.uint8)
    x0, y0 = (width - new_w) // 2, (height - new_h) // 2
    out[y0:y0 + new_h, x0:x0 + new_w] = inner
    return out
