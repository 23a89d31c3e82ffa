"""Images in: bytes from a data URL, a file or an http(s) URL, decoded to RGB pixels.

Decoding uses Pillow (the ``elelem[vision]`` extra): PNG, JPEG, WebP, GIF
(the first frame) and what else Pillow reads.  Pixels are taken as libmtmd
takes them from stb_image with three channels wanted: palette and greyscale
images expanded to RGB, an alpha channel dropped (not composited).  PNG and
the other lossless formats give libmtmd's pixels exactly; a JPEG is decoded
by libjpeg here and by stb_image in llama.cpp, whose inverse DCTs round
differently, so its pixels may differ by a few levels.

Every source is bounded: bytes (``max_bytes``) before decoding, pixels
(``max_pixels``) before the decoder allocates them.  Local paths are read only
under a directory the caller allows, http(s) only when the caller allows it.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import InvalidArgumentError

DEFAULT_MAX_BYTES = 20 * 1024 * 1024     # 20 MiB, OpenAI's limit for an image
DEFAULT_MAX_PIXELS = 50_000_000          # ~7000 x 7000
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)", re.S)


class ImageError(InvalidArgumentError):
    """An image that cannot be read: a bad source, a refused URL or path, an
    undecodable file, or one past the byte or pixel limits."""


@dataclass(frozen=True)
class ImageLimits:
    """What an image may be and where it may come from."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS
    allowed_dir: Optional[Path] = None     # local files under this directory; None: no local files
    allow_http: bool = False               # fetch http(s) URLs
    http_timeout: float = 30.0


@dataclass(frozen=True)
class Image:
    """Decoded RGB pixels, (height, width, 3) uint8, and the hash that identifies them."""

    pixels: np.ndarray = field(repr=False)
    digest: str = ""

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @classmethod
    def from_pixels(cls, pixels: np.ndarray) -> "Image":
        px = np.ascontiguousarray(pixels, dtype=np.uint8)
        if px.ndim != 3 or px.shape[2] != 3 or px.shape[0] == 0 or px.shape[1] == 0:
            raise ImageError(f"pixels must be (height, width, 3) uint8, got {tuple(pixels.shape)}")
        h = hashlib.sha256(f"{px.shape[0]}x{px.shape[1]}:".encode())
        h.update(px.tobytes())
        return cls(px, h.hexdigest())


def _pillow():
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise ImageError("reading images needs Pillow: pip install 'elelem[vision]'") from None
    return PILImage


def decode(data: bytes, limits: ImageLimits = ImageLimits()) -> Image:
    """Decode an encoded image (PNG, JPEG, WebP, GIF, ...) to RGB pixels."""
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image is {len(data):,} bytes; the limit is {limits.max_bytes:,}")
    if not data:
        raise ImageError("the image is empty")
    PILImage = _pillow()
    try:
        with PILImage.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width <= 0 or height <= 0:
                raise ImageError(f"the image has no pixels ({width}x{height})")
            if width * height > limits.max_pixels:
                raise ImageError(f"the image is {width}x{height} = {width * height:,} pixels; the limit is "
                                 f"{limits.max_pixels:,}")
            img.seek(0)   # the first frame of an animation, as stb_image reads a GIF
            rgb = _to_rgb(img)
    except ImageError:
        raise
    except Exception as e:  # noqa: BLE001 -- Pillow's decoders raise many kinds on bad input (struct.error, ...)
        raise ImageError(f"the image could not be decoded: {type(e).__name__}: {e}") from None
    return Image.from_pixels(np.asarray(rgb, dtype=np.uint8))


def _to_rgb(img):
    """stb_image's 3-channel conversion: grey replicated, palette expanded, alpha dropped.
    16-bit images keep their high byte (stb_image's 16-to-8 conversion is v >> 8)."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.uint32)
        grey = (arr >> 8).astype(np.uint8) if img.mode != "I" else np.clip(arr, 0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    return img.convert("RGB")


def load(source: str, limits: ImageLimits = ImageLimits()) -> Image:
    """An image from a ``data:`` URL (base64), an http(s) URL (if allowed) or a
    local path (if under ``limits.allowed_dir``; a ``file://`` URL too)."""
    if not isinstance(source, str) or not source:
        raise ImageError("an image source must be a non-empty string (a data: URL, a URL or a path)")
    if source.startswith("data:"):
        return decode(_data_url(source, limits), limits)
    if source.startswith(("http://", "https://")):
        if not limits.allow_http:
            raise ImageError("http(s) image URLs are not allowed here; send the image as a data: URL")
        return decode(_fetch(source, limits), limits)
    if source.startswith("file://"):
        source = source[len("file://"):]
    elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", source):
        raise ImageError(f"unsupported image URL scheme in {source[:40]!r}")
    return decode(_read_local(source, limits), limits)


def _data_url(url: str, limits: ImageLimits) -> bytes:
    m = _DATA_URL.fullmatch(url)
    if m is None:
        raise ImageError("a data: URL must be base64: data:image/png;base64,...")
    payload = m.group("data")
    if len(payload) > limits.max_bytes * 4 // 3 + 4:
        raise ImageError(f"the image is over {limits.max_bytes:,} bytes")
    return b64decode(payload)


def b64decode(payload: str) -> bytes:
    """Strict base64 (whitespace allowed), as an image block's data."""
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image's base64 data is malformed") from None


def _read_local(path: str, limits: ImageLimits) -> bytes:
    if limits.allowed_dir is None:
        raise ImageError("local image paths are not allowed here; pass image_dir= to allow a directory")
    root = Path(limits.allowed_dir).resolve()
    target = Path(os.path.expanduser(path))
    target = (root / target if not target.is_absolute() else target).resolve()
    if target != root and root not in target.parents:
        raise ImageError(f"{path} is outside the allowed image directory {root}")
    try:
        size = target.stat().st_size
        if size > limits.max_bytes:
            raise ImageError(f"{path} is {size:,} bytes; the limit is {limits.max_bytes:,}")
        return target.read_bytes()
    except OSError as e:
        raise ImageError(f"cannot read the image {path}: {e.strerror or e}") from None


def _fetch(url: str, limits: ImageLimits) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=limits.http_timeout) as response:
            data = response.read(limits.max_bytes + 1)
    except (OSError, ValueError) as e:
        raise ImageError(f"cannot fetch the image {url[:200]}: {e}") from None
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image at {url[:200]} is over {limits.max_bytes:,} bytes")
    return data
