"""Images in a prompt: their embeddings, and the ids that stand for them.

An image's embeddings (from a projector, elelem.vision) take one cell each in
the KV cache, as tokens do.  In a prompt, and in the cells, each stands as a
negative id: ``-(first + i)`` for the image's i-th embedding, ``first``
derived from the hash of the image's pixels.  So a prompt with images is a
list of ints like any other, prefix reuse compares it as it compares tokens
(the same screenshot sent again matches its cells, and is not evaluated
again), and no id ever collides with a vocabulary's.

Two different images share their ids only if their hashes give the same
``first`` (about one pair in 2^31 / n_tokens): their cells would then be
taken for each other's.

The engine evaluates a run of one image's ids as a step of its own, as
libmtmd does (mtmd_helper_eval_chunk_single): an image is never split
between steps that hold other tokens, and a reused prefix never ends inside
one (:func:`outside_images`), since an image's rows attend to each other
both ways where the model wants it (``bidirectional``).  An image longer
than n_batch is evaluated n_batch rows at a time from its start, as
mtmd_helper_decode_image_chunk cuts it: each piece attends both ways within
itself and to every cell before it, not to the pieces after it.

An image may carry its grid of embeddings (columns, rows): a text model with
multi-section RoPE (Qwen2-VL) places its rows in 2D, and the step hands the
core the grid and where in the image its rows start (:meth:`MediaTable.placement`).
"""
from __future__ import annotations

import collections
import threading
from typing import Optional, Sequence

import numpy as np

from ..errors import InvalidArgumentError

#: Ids of one image: at most this many embeddings.
MAX_IMAGE_TOKENS = 1 << 20
_ID_SPACE = (1 << 31) - MAX_IMAGE_TOKENS - 2
DEFAULT_KEPT_IMAGES = 64


def image_ids(digest: str, n_tokens: int) -> list[int]:
    """The negative ids standing for an image's ``n_tokens`` embeddings."""
    if not 0 < n_tokens <= MAX_IMAGE_TOKENS:
        raise InvalidArgumentError(f"an image of {n_tokens} embeddings")
    first = 1 + int(digest[:16], 16) % _ID_SPACE
    return [-(first + i) for i in range(n_tokens)]


def image_run(ids: Sequence[int]) -> int:
    """How many of ``ids``' first ids are one image's (0 if it starts with a token)."""
    if not ids or ids[0] >= 0:
        return 0
    n = 1
    while n < len(ids) and ids[n] == ids[n - 1] - 1:
        n += 1
    return n


def text_run(ids: Sequence[int]) -> int:
    """How many of ``ids``' first ids are tokens."""
    for i, token in enumerate(ids):
        if token < 0:
            return i
    return len(ids)


def next_prompt_run(pending: Sequence[int], budget: int) -> tuple[int, bool]:
    """How many of a prompt's ``pending`` ids its next step takes (at most ``budget``),
    and whether they are an image's: one image's run, else the tokens before the next image."""
    run = image_run(pending)
    if run:
        return min(run, budget), True
    return min(budget, text_run(pending)), False


def outside_images(ids: Sequence[int], n: int) -> int:
    """The largest cut ``m <= n`` of ``ids`` that does not fall inside an image."""
    while 0 < n < len(ids) and ids[n] < 0 and ids[n - 1] == ids[n] + 1:
        n -= 1
    return n


class MediaTable:
    """The embeddings of the images recent prompts hold, by their ids (the
    ``kept`` most recent images).  Thread-safe."""

    def __init__(self, kept: int = DEFAULT_KEPT_IMAGES, bidirectional: bool = False):
        self.kept = kept
        # An image's rows attend to each other both ways (libmtmd's
        # mtmd_decode_use_non_causal for the projector type).
        self.bidirectional = bidirectional
        self._images: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # first id -> rows
        self._grids: dict[int, tuple[int, int]] = {}   # first id -> (columns, rows), images placed in 2D
        self._lock = threading.Lock()
        self.images_evaluated = 0     # image runs evaluated (an image found in the cache is not)

    def add(self, digest: str, embeddings: np.ndarray, grid: Optional[tuple[int, int]] = None) -> list[int]:
        """Keep an image's embeddings ``(n_tokens, n_embd)`` (and their grid, columns x rows,
        where the text model places them in 2D); returns the ids standing for them."""
        ids = image_ids(digest, int(embeddings.shape[0]))
        if grid is not None and grid[0] * grid[1] != len(ids):
            raise InvalidArgumentError(f"an image of {len(ids)} embeddings on a {grid[0]} x {grid[1]} grid")
        with self._lock:
            self._images[ids[0]] = embeddings
            self._images.move_to_end(ids[0])
            if grid is not None:
                self._grids[ids[0]] = (int(grid[0]), int(grid[1]))
            while len(self._images) > self.kept:
                first, _ = self._images.popitem(last=False)
                self._grids.pop(first, None)
        return ids

    def placement(self, ids: Sequence[int]) -> tuple[Optional[tuple[int, int]], int]:
        """The grid of the image whose run of ids ``ids`` is (None: not placed in 2D), and the
        index in the image of its first id."""
        with self._lock:
            for first, rows in self._images.items():
                offset = first - ids[0]
                if 0 <= offset and offset + len(ids) <= rows.shape[0]:
                    return self._grids.get(first), offset
        return None, 0

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        """The embeddings of one image's run of ids (image_run's)."""
        with self._lock:
            for first, rows in self._images.items():
                offset = first - ids[0]
                if 0 <= offset and offset + len(ids) <= rows.shape[0]:
                    return rows[offset:offset + len(ids)]
        raise InvalidArgumentError("a prompt holds an image whose embeddings are no longer kept; send it again")

    def find(self, first: int) -> Optional[np.ndarray]:
        with self._lock:
            return self._images.get(first)
