"""An image's pixels made into the encoder's input, as libmtmd makes them.

gemma3 (``mtmd_image_preprocessor_fixed_size``): the image resized to fit the
encoder's square (bilinear, each side rounded up), centred on black, then
each channel scaled to [0, 1] and normalised with the file's mean and std in
float32 (clip_image_f32::from_u8, normalize).

qwen2vl, qwen25vl (``mtmd_image_preprocessor_dyn_size``): the image resized
(bicubic) to libmtmd's "smart" size (elelem.vision.qwen.smart_size: both sides
multiples of ``patch_size * 2``, between 8 and 4096 merged tokens), the same
normalisation.
"""
from __future__ import annotations

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
    if not spec.kind.dynamic_size:
        return spec.image_size, spec.image_size
    align = spec.hparams["patch_size"] * spec.hparams["n_merge"]
    return smart_size(image.width, image.height, align, QWEN_MIN_TOKENS * align * align,
                      QWEN_MAX_TOKENS * align * align)


def preprocess(image: Image, spec: ProjectorSpec) -> np.ndarray:
    """The encoder's input for ``image``: float32 (3, height, width)."""
    width, height = target_size(image, spec)
    rgb = resize_padded(image.pixels, width, height, spec.kind.resize)
    return to_float(rgb, spec.image_mean, spec.image_std)
