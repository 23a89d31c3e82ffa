"""Qwen2-VL's and Qwen2.5-VL's image input, as libmtmd makes it.

- :func:`smart_size`: the size an image is resized to (mtmd-image.cpp,
  ``img_tool::calc_size_preserved_ratio`` for ``mtmd_image_preprocessor_dyn_size``):
  each side rounded to a multiple of ``patch_size * 2``, then scaled down past
  the pixel budget or up below its floor, in float32 as the C++ does;
- :func:`encoder_inputs`: the graph's inputs besides the pixels
  (clip.cpp's ``clip_image_batch_encode``): each patch's 2D rotary position,
  and for Qwen2.5-VL's window attention the order of the merged tokens by
  window, its inverse, and the mask that keeps each window to itself.

Where the text model puts an image's rows (M-RoPE) is the core's:
elelem/_native/graph/mrope.pxi.
"""
from __future__ import annotations

import math

import numpy as np

MERGE = 2   # clip_graph_qwen2vl merges 2 x 2 patches


def _round_half_away(v: np.float32) -> int:
    return int(math.floor(float(v) + 0.5)) if v >= 0 else -int(math.floor(-float(v) + 0.5))


def smart_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) libmtmd resizes a ``width`` x ``height`` image to."""
    f = np.float32(align)
    w_bar = max(align, _round_half_away(np.float32(width) / f) * align)
    h_bar = max(align, _round_half_away(np.float32(height) / f) * align)
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(np.float32(height) * np.float32(width) / np.float32(max_pixels))
        h_bar = max(align, int(math.floor(np.float32(np.float32(height) / beta) / f)) * align)
        w_bar = max(align, int(math.floor(np.float32(np.float32(width) / beta) / f)) * align)
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(np.float32(min_pixels) / (np.float32(height) * np.float32(width)))
        h_bar = int(math.ceil(np.float32(np.float32(height) * beta) / f)) * align
        w_bar = int(math.ceil(np.float32(np.float32(width) * beta) / f)) * align
    return w_bar, h_bar


def _window_order(pw: int, ph: int, grid: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Merged tokens (raster order, pw x ph) grouped by grid x grid windows: raster index ->
    window-order index, its inverse, and each window's [start, end) in window order."""
    idx = np.empty(pw * ph, dtype=np.int32)
    inv = np.empty(pw * ph, dtype=np.int32)
    spans = []
    dst = 0
    for y in range(0, ph, grid):
        for x in range(0, pw, grid):
            start = dst
            for dy in range(min(grid, ph - y)):
                for dx in range(min(grid, pw - x)):
                    src = (y + dy) * pw + x + dx
                    idx[src] = dst
                    inv[dst] = src
                    dst += 1
            spans.append((start, dst))
    return idx, inv, spans


def encoder_inputs(nx: int, ny: int, patch_size: int, n_wa_pattern: int = 0,
                   attn_window: int = 112) -> dict[str, np.ndarray]:
    """The encoder's named inputs for an ``nx`` x ``ny`` (pixels) image
    (elelem/_native/graph/vision_qwen2vl.pxi reads them)."""
    ipw, iph = nx // patch_size, ny // patch_size
    pw, ph = ipw // MERGE, iph // MERGE
    n_pos = ipw * iph
    mpow = MERGE * MERGE
    inputs: dict[str, np.ndarray] = {}
    if n_wa_pattern > 0:
        grid = attn_window // patch_size // MERGE
        idx, inv, spans = _window_order(pw, ph, grid)
        mask = np.full((n_pos, n_pos), np.finfo(np.float32).min, dtype=np.float32)
        for start, end in spans:
            mask[start * mpow:end * mpow, start * mpow:end * mpow] = 0.0
        inputs.update(window_idx=idx, inv_window_idx=inv, window_mask=mask)
    else:
        idx = np.arange(pw * ph, dtype=np.int32)
    # Patches in merge-block order (each 2 x 2 block's four together), blocks in raster order,
    # or in window order where windows regroup them.
    by, bx = np.meshgrid(np.arange(ph), np.arange(pw), indexing="ij")
    dy, dx = np.meshgrid(np.arange(MERGE), np.arange(MERGE), indexing="ij")
    ys = (by.reshape(-1, 1) * MERGE + dy.reshape(1, -1)).reshape(-1)
    xs = (bx.reshape(-1, 1) * MERGE + dx.reshape(1, -1)).reshape(-1)
    ptr = np.arange(n_pos)
    remap = idx[ptr // mpow] * mpow + ptr % mpow
    positions = np.empty((4, n_pos), dtype=np.int32)
    positions[0, remap] = ys
    positions[1, remap] = xs
    positions[2, remap] = ys
    positions[3, remap] = xs
    inputs["positions"] = positions.reshape(-1)
    return inputs
