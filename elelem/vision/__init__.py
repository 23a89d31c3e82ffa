"""Images in (the layer beside the engine): decoding, libmtmd's preprocessing,
and projectors that encode images into embeddings a text model takes as tokens.

- :mod:`.images`     bytes from data URLs, files and URLs, decoded with Pillow, bounded;
- :mod:`.resize`     libmtmd's resampling, to the byte;
- :mod:`.preprocess` an image made into the encoder's input;
- :mod:`.projector`  :class:`Projector`: a projector file, its encoder, and the embeddings of each image.

The projector needs the native core; it is imported on first use, so that
decoding and preprocessing work without it.
"""
from __future__ import annotations

from typing import Any

from .images import Image, ImageError, ImageLimits, decode, load

__all__ = ["Image", "ImageEmbeddings", "ImageError", "ImageLimits", "Projector", "decode", "load"]


def __getattr__(name: str) -> Any:
    if name in ("Projector", "ImageEmbeddings"):
        from . import projector
        return getattr(projector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
