"""An image's pixels made into the encoder's input, as libmtmd makes them.

gemma3 (``mtmd_image_preprocessor_fixed_size``): the image resized to fit the
encoder's square (bilinear, each side rounded up), centred on black, then
each channel scaled to [0, 1] and normalised with the file's mean and std in
float32 (clip_image_f32::from_u8, normalize).
"""
from __future__ import annotations

import numpy as np

from ..model.projector import ProjectorSpec
from .images import Image
from .resize import resize_padded


def to_float(rgb: np.ndarray, mean: tuple[float, float, float], std: tuple[float, float, float]) -> np.ndarray:
    """(h, w, 3) uint8 -> (3, h, w) float32: v / 255, then (v - mean) / std, each in float32."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def preprocess(image: Image, spec: ProjectorSpec) -> np.ndarray:
    """The encoder's input for ``image``: float32 (3, size, size)."""
    size = spec.image_size
    rgb = resize_padded(image.pixels, size, size, spec.kind.resize)
    return to_float(rgb, spec.image_mean, spec.image_std)
