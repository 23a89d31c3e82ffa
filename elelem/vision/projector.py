"""A projector: the file's encoder, opened in the native core, and the
embeddings of the images it has encoded, kept by the hash of their pixels so
that an image sent again (the same screenshot in each turn of a
conversation) is encoded once."""
from __future__ import annotations

import collections
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np


from .._core import open_vision_model  # names, not the package
from ..errors import ClosedError, InvalidArgumentError
from ..model.projector import ProjectorSpec, read_projector
from .images import Image
from .preprocess import preprocess, target_size, to_float
from .qwen import encoder_inputs
from .slices import Layout, idefics3_layout, idefics3_squares, lfm2_layout, lfm2_should_tile, lfm2_squares

log = logging.getLogger("elelem")

DEFAULT_CACHED_IMAGES = 16


@dataclass(frozen=True)
class ImageEmbeddings:
    """One image's embeddings, ``(n_tokens, n_embd)`` float32, and the hash of its pixels.
    ``grid``: (columns, rows) of the embeddings where the text model places them in
    2D (M-RoPE, Qwen-VL), else None."""

    digest: str
    embeddings: np.ndarray = field(repr=False)
    grid: Optional[tuple[int, int]] = None

    @property
    def n_tokens(self) -> int:
        return int(self.embeddings.shape[0])


@dataclass(frozen=True)
class EncodedImage:
    """An image as the text model takes it: ``layout`` lists, in order, text to tokenize
    (special tokens parsed), tokens looked up by their text (elelem.vision.slices.Piece)
    and indices into ``squares``, the embeddings of each encoded square (one for most
    projectors; the slices then the overview for a sliced one)."""

    digest: str
    layout: Layout
    squares: list[ImageEmbeddings] = field(repr=False)

    @property
    def n_tokens(self) -> int:
        return sum(sq.n_tokens for sq in self.squares)


def _square_digest(digest: str, index: int) -> str:
    """A digest for one square of an image: its ids (elelem.engine.media) must not be another square's."""
    return hashlib.sha256(f"{digest}/{index}".encode()).hexdigest()


class Projector:
    """A projector file (mmproj GGUF) ready to encode images.

    ``n_threads``: the encoder's threads (default: the CPU's cores, at most 8);
    ``flash_attn``: clip.cpp's flash-attention path (libmtmd's default on the
    CPU) or its plain softmax(KQ)V; ``cached_images``: how many images'
    embeddings are kept, by the hash of their pixels."""

    def __init__(self, path: str | os.PathLike, *, n_threads: Optional[int] = None, flash_attn: bool = True,
                 cached_images: int = DEFAULT_CACHED_IMAGES):
        self.spec: ProjectorSpec = read_projector(path)
        self.path = Path(path)
        self.n_threads = n_threads or max(1, min(8, os.cpu_count() or 1))
        self.flash_attn = flash_attn
        self._cached_images = max(0, int(cached_images))
        self._cache: collections.OrderedDict[str, EncodedImage] = collections.OrderedDict()
        self._lock = threading.Lock()
        s = self.spec
        self._native = open_vision_model(str(self.path), s.projector_type, s.hparams, s.global_tensors,
                                         s.layer_tensors, clamps=s.clamps)
        log.info("projector %s: %s, %d layers, %d tokens per image (at most)", self.path.name, s.projector_type,
                 s.hparams["n_layer"], s.n_image_tokens)

    @property
    def projector_type(self) -> str:
        return self.spec.projector_type

    @property
    def n_encoded(self) -> int:
        """Squares the encoder has run on: one per image but for a sliced projector's
        (an image found in the cache is not counted)."""
        return int(self._native.n_encoded)

    def check_text_model(self, n_embd: int, n_deepstack: int = 0) -> None:
        """Refuse a text model whose width is not the projector's output width, or that
        takes another number of deepstack parts (Qwen3-VL) than each row carries."""
        if n_embd != self.spec.n_embd_out:
            raise InvalidArgumentError(
                f"the projector {self.path.name} gives {self.spec.n_embd_out}-wide embeddings; the text model "
                f"is {n_embd} wide: they are not a pair")
        if n_deepstack != self.spec.n_deepstack:
            raise InvalidArgumentError(
                f"the projector {self.path.name} gives {self.spec.n_deepstack} deepstack features per image token; "
                f"the text model takes {n_deepstack}: they are not a pair")

    def pixels(self, image: Image) -> np.ndarray:
        """The encoder's input for ``image`` (libmtmd's preprocessing): float32 (3, height, width).
        A sliced projector's inputs are several: :meth:`squares`."""
        if self.spec.kind.slices is not None:
            raise InvalidArgumentError(f"a {self.projector_type} projector cuts an image into several squares: "
                                       f"use squares()")
        return preprocess(image, self.spec)

    def squares(self, image: Image) -> tuple[list[np.ndarray], Layout]:
        """The encoder's inputs for ``image`` (float32 (3, height, width) each) and how they stand
        in the text: one square between the projector type's begin and end text, or a sliced
        image's slices and overview (elelem.vision.slices)."""
        kind = self.spec.kind
        if kind.slices == "idefics3":
            rgb, (cols, rows) = idefics3_squares(image.pixels, self.spec.hparams["longest_edge"], self.spec.image_size)
            return ([to_float(sq, self.spec.image_mean, self.spec.image_std) for sq in rgb],
                    idefics3_layout(cols, rows))
        if kind.slices == "lfm2":
            h = self.spec.hparams
            align = h["patch_size"] * h["n_merge"]
            assert kind.image_tokens is not None
            most = kind.image_tokens[1] * align * align
            tiled = lfm2_should_tile(image.width, image.height, h["patch_size"], align, most)
            rgb, (cols, rows) = lfm2_squares(image.pixels, target_size(image, self.spec), tiled)
            return ([to_float(sq, self.spec.image_mean, self.spec.image_std) for sq in rgb],
                    lfm2_layout(cols, rows))
        return [self.pixels(image)], [kind.image_begin, 0, kind.image_end]

    def encode(self, image: Image) -> ImageEmbeddings:
        """The embeddings of ``image`` (a sliced image's squares one after the other, in the
        order the text takes them: :meth:`encode_image` says where the text goes between)."""
        encoded = self.encode_image(image)
        if len(encoded.squares) == 1:
            return encoded.squares[0]
        rows = np.concatenate([sq.embeddings for sq in encoded.squares])
        rows.setflags(write=False)
        return ImageEmbeddings(image.digest, rows)

    def encode_image(self, image: Image) -> EncodedImage:
        """``image`` encoded, from the cache when its pixels were encoded before."""
        with self._lock:
            if self._native.is_closed:
                raise ClosedError("this projector is closed")
            hit = self._cache.get(image.digest)
            if hit is not None:
                self._cache.move_to_end(image.digest)
                return hit
            started = time.perf_counter()
            inputs, layout = self.squares(image)
            squares = []
            for i, pixels in enumerate(inputs):
                grid, named = self._grid_and_inputs(pixels)
                embeddings = self._native.encode(pixels, self.n_threads, self.flash_attn, named)
                embeddings.setflags(write=False)
                digest = image.digest if len(inputs) == 1 else _square_digest(image.digest, i)
                squares.append(ImageEmbeddings(digest, embeddings, grid))
            result = EncodedImage(image.digest, layout, squares)
            log.debug("encoded a %dx%d image into %d embeddings (%d squares) in %.3f s", image.width, image.height,
                      result.n_tokens, len(squares), time.perf_counter() - started)
            if self._cached_images:
                self._cache[image.digest] = result
                while len(self._cache) > self._cached_images:
                    self._cache.popitem(last=False)
            return result

    def _grid_and_inputs(self, pixels: np.ndarray) -> tuple[Optional[tuple[int, int]], Optional[dict]]:
        """The merged-token grid and the encoder's named inputs of a dynamic-size (Qwen-VL) projector."""
        h = self.spec.hparams
        if not self.spec.kind.dynamic_size:
            return None, None
        ny, nx = pixels.shape[1:]
        side = h["patch_size"] * h["n_merge"]
        inputs = encoder_inputs(nx, ny, h["patch_size"], h["n_wa_pattern"], h["attn_window"])
        return (nx // side, ny // side), inputs

    def close(self) -> None:
        with self._lock:
            self._cache.clear()
            self._native.close()

    def __enter__(self) -> "Projector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
