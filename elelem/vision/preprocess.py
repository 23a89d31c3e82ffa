"""An image's pixels made into the encoder's input, as libmtmd makes them.

gemma3 (``mtmd_image_preprocessor_fixed_size``): the image resized to fit the
encoder's square (bilinear, each side rounded up), centred on black, then
each channel scaled to [0, 1] and normalised with the file's mean and std in
float32 (clip_image_f32::from_u8, normalize).

qwen2vl, qwen25vl (``mtmd_image_preprocessor_dyn_size``): the image resized
(bicubic) to libmtmd's "smart" size (elelem.vision.qwen.smart_size: both sides
multiples of ``patch_size * 2``, between 8 and 4096 merged tokens), the same
normalisation.

gemma4v (``mtmd_image_preprocessor_dyn_size``): the image resized, keeping its
aspect ratio, to sides that are multiples of patch_size * n_merge and hold
between the projector's least and most image tokens
(``img_tool::calc_size_preserved_ratio``, in float32 as the C++ computes it),
bicubic, centred on black where the rounding leaves a margin; then normalised
the same way.
"""
from __future__ import annotations

import math

import numpy as np

from ..model.projector import QWEN_MAX_TOKENS, QWEN_MIN_TOKENS, ProjectorSpec
from .images import Image
from .qwen import smart_size
from .resize import resize_padded


def to_float(rgb: np.ndarray, mean: tuple[float, float, float], std: tuple[float, float, float]) -> np.ndarray:
    """(h, w, 3) uint8 -> (3, h, w) float32: v / 255, then (v - mean) / std, each in float32."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def target_size(image: Image, spec: ProjectorSpec) -> tuple[int, int]:
    """(width, height) of the encoder's input for ``image``."""
    align = spec.hparams["patch_size"] * spec.hparams["n_merge"]
    if spec.kind.image_tokens is not None:
        least, most = (n * align * align for n in spec.kind.image_tokens)
        return size_preserving_ratio(image.width, image.height, align, least, most)
    if not spec.kind.dynamic_size:
        return spec.image_size, spec.image_size
    return smart_size(image.width, image.height, align, QWEN_MIN_TOKENS * align * align,
                      QWEN_MAX_TOKENS * align * align)


def preprocess(image: Image, spec: ProjectorSpec) -> np.ndarray:
    """The encoder's input for ``image``: float32 (3, height, width)."""
    width, height = target_size(image, spec)
    rgb = resize_padded(image.pixels, width, height, spec.kind.resize)
    return to_float(rgb, spec.image_mean, spec.image_std)


def size_preserving_ratio(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """mtmd's img_tool::calc_size_preserved_ratio (no longest edge): each side rounded
    to a multiple of ``align``, then scaled down (floored) past ``max_pixels`` or up
    (ceiled) below ``min_pixels``; float32 arithmetic, as in C++."""
    f32 = np.float32
    fa = f32(align)

    def by(op, x) -> int:
        return int(op(f32(f32(x) / fa))) * align

    w_bar = max(align, by(_round_half_away, width))
    h_bar = max(align, by(_round_half_away, height))
    if h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(f32(height) * f32(width)) / f32(max_pixels), dtype=f32)
        h_bar = max(align, by(math.floor, f32(height) / beta))
        w_bar = max(align, by(math.floor, f32(width) / beta))
    elif h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / f32(f32(height) * f32(width)), dtype=f32)
        h_bar = by(math.ceil, f32(height) * beta)
        w_bar = by(math.ceil, f32(width) * beta)
    return w_bar, h_bar


def _round_half_away(x: float) -> float:
    """C's round: halves away from zero (Python's round goes to even)."""
    x = float(x)   # exact for a float32; the + 0.5 in double then rounds nothing away
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)
