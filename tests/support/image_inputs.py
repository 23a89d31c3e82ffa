"""Images the vision tests send: smooth noise of a given size, as PNG data URLs, and the
float32 rows that embedding answers carry as base64."""
from __future__ import annotations

import base64
import io

import numpy as np


def pixels(h: int, w: int) -> np.ndarray:
    """An RGB image of ``h`` x ``w``: 4x4 blocks of random colour with noise on top (smooth
    enough that resizing matters, seeded by the size)."""
    rng = np.random.default_rng(h * 1000 + w)
    smooth = rng.integers(0, 256, (max(1, h // 4 + 1), max(1, w // 4 + 1), 3)).astype(np.float64)
    px = np.kron(smooth, np.ones((4, 4, 1)))[:h, :w] + rng.normal(0, 12, (h, w, 3))
    return np.clip(px, 0, 255).astype(np.uint8)


def floats(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.float32)


def png_url(image: np.ndarray) -> str:
    """``image`` as a PNG data URL."""
    from PIL import Image as PILImage
    buf = io.BytesIO()
    PILImage.fromarray(image).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def png_url_with_alpha(image: np.ndarray) -> str:
    """A PNG of ``image`` with an alpha channel of noise: libmtmd's stb_image drops alpha, and so does elelem."""
    alpha = np.random.default_rng(0).integers(0, 256, image.shape[:2] + (1,), dtype=np.uint8)
    return png_url(np.concatenate([image, alpha], axis=2))
