"""Images cut into slices plus an overview, as libmtmd cuts them for SmolVLM
(projector type ``idefics3``) and LFM2-VL (``lfm2``), and the text that stands
between the slices.

mtmd_image_preprocessor_idefics3::preprocess (tools/mtmd/mtmd-image.cpp), for a
file with the preprocessor's longest edge (``clip.vision.preproc_image_size``,
which the converter always writes):

1. the image resized (Lanczos), keeping its aspect ratio, so that its longer
   side is the longest edge and the other side even (truncated, then rounded up
   to even, in double arithmetic);
2. that resized again, without keeping the ratio, to the next multiples of the
   encoder's square (``image_size``) on each side;
3. the result cut into ``image_size`` squares, row by row (the slices), and
   resized once more to one square (the overview).

mtmd.cpp's mtmd_tokenizer::add_media then lays them out (MTMD_SLICE_TMPL_IDEFICS3):
each slice after ``<fake_token_around_image><row_R_col_C>`` (1-based), a newline
token after each row but the last, then the overview between the tokens
``\\n\\n``, ``<fake_token_around_image>``, ``<global-img>`` and
``<fake_token_around_image>``; there is no begin or end text around the whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from ..errors import InvalidArgumentError
from .resize import resize, resize_padded


@dataclass(frozen=True)
class Piece:
    """A token looked up by its exact text (mtmd's lookup_token: the first id whose piece it is)."""

    text: str


# What stands around an image: text to tokenize (special tokens parsed), a Piece, or the index
# of one of the image's squares (the slices in row-major order, then the overview).
Layout = list[Union[str, Piece, int]]


def idefics3_sizes(width: int, height: int, longest_edge: int, tile: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((width, height) after step 1, (columns, rows) of slices) for a ``width`` x ``height`` image."""
    aspect = width / height                   # double, as in C++
    if width >= height:
        w = longest_edge
        h = int(longest_edge / aspect)        # C's (int): toward zero
        h += h % 2
    else:
        h = longest_edge
        w = int(longest_edge * aspect)
        w += w % 2
    if w <= 0 or h <= 0:
        # libmtmd would assert in its resize: the image is too thin to keep any row or column.
        raise InvalidArgumentError(f"a {width}x{height} image is too thin for this projector: its short side "
                                   f"would be resized to no pixels (longest edge {longest_edge})")
    return (w, h), (-(-w // tile), -(-h // tile))


def idefics3_squares(rgb: np.ndarray, longest_edge: int, tile: int) -> tuple[list[np.ndarray], tuple[int, int]]:
    """(h, w, 3) uint8 -> the slices (row-major) and the overview last, each (tile, tile, 3)
    uint8, and the slices' (columns, rows)."""
    (w, h), (cols, rows) = idefics3_sizes(rgb.shape[1], rgb.shape[0], longest_edge, tile)
    resized = resize(rgb, w, h, "lanczos") if (w, h) != (rgb.shape[1], rgb.shape[0]) else rgb
    refined = resize(resized, cols * tile, rows * tile, "lanczos") if (w, h) != (cols * tile, rows * tile) \
        else resized
    squares = [np.ascontiguousarray(refined[y * tile:(y + 1) * tile, x * tile:(x + 1) * tile])
               for y in range(rows) for x in range(cols)]
    overview = resize(refined, tile, tile, "lanczos") if refined.shape[:2] != (tile, tile) else refined.copy()
    squares.append(overview)
    return squares, (cols, rows)


def idefics3_layout(cols: int, rows: int) -> Layout:
    """The text and squares of an image cut into ``cols`` x ``rows`` slices (the overview's
    index is cols * rows)."""
    out: Layout = []
    for y in range(rows):
        for x in range(cols):
            out += [f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>", y * cols + x]
        if y != rows - 1:
            out.append(Piece("\n"))
    out += [Piece("\n\n"), Piece("<fake_token_around_image>"), Piece("<global-img>"), cols * rows,
            Piece("<fake_token_around_image>")]
    return out


# LFM2-VL (mtmd_image_preprocessor_lfm2, after Liquid's processor_config.json): an image whose
# pixels, each side rounded to whole tokens, pass twice the most a single image may hold is cut
# into 512-pixel tiles, 2 to 10 of them, the grid whose aspect ratio is nearest the image's.
LFM2_TILE = 512
LFM2_MIN_TILES, LFM2_MAX_TILES = 2, 10
LFM2_TOLERANCE = 2.0


def lfm2_should_tile(width: int, height: int, patch_size: int, align: int, max_pixels: int) -> bool:
    """mtmd_image_preprocessor_lfm2::should_tile: each side rounded (half to even, std::nearbyint)
    to a multiple of ``align``, at least a patch, in double."""
    h_bar = max(patch_size, round(height / align) * align)
    w_bar = max(patch_size, round(width / align) * align)
    return float(h_bar) * float(w_bar) > float(max_pixels) * LFM2_TOLERANCE


def lfm2_target_ratios() -> list[tuple[int, int]]:
    """(columns, rows) of the grids allowed, by area (get_target_ratios; within an area in the order
    they were found, which is what the final insertion sort of libstdc++'s std::sort leaves)."""
    ratios: list[tuple[int, int]] = []
    for n in range(LFM2_MIN_TILES, LFM2_MAX_TILES + 1):
        for w in range(1, n + 1):
            for h in range(1, n + 1):
                if LFM2_MIN_TILES <= w * h <= LFM2_MAX_TILES and (w, h) not in ratios:
                    ratios.append((w, h))
    return sorted(ratios, key=lambda r: r[0] * r[1])


def lfm2_grid(width: int, height: int) -> tuple[int, int]:
    """(columns, rows): find_closest_aspect_ratio over lfm2_target_ratios, in float32 as the C++."""
    f32 = np.float32
    aspect = f32(f32(width) / f32(height))
    area = f32(width * height)
    best_diff = f32(np.finfo(np.float32).max)
    best = (1, 1)
    for w, h in lfm2_target_ratios():
        diff = f32(abs(f32(aspect - f32(f32(w) / f32(h)))))
        if diff < best_diff:
            best_diff, best = diff, (w, h)
        elif diff == best_diff and area > f32(0.5) * f32(LFM2_TILE * LFM2_TILE * w * h):
            best = (w, h)
    return best


def lfm2_squares(rgb: np.ndarray, overview: tuple[int, int], tiled: bool) -> tuple[list[np.ndarray], tuple[int, int]]:
    """(h, w, 3) uint8 -> the tiles (row-major) and the thumbnail last, and the tiles' (columns,
    rows); an image not tiled is one square, resized to ``overview`` (mtmd's slice_image: the
    thumbnail resized directly, the tiles cut from the image fitted into the grid, centred on black)."""
    height, width = rgb.shape[:2]
    thumb = resize(rgb, overview[0], overview[1], "bilinear")
    if not tiled:
        return [thumb], (0, 0)
    cols, rows = lfm2_grid(width, height)
    refined = resize_padded(rgb, cols * LFM2_TILE, rows * LFM2_TILE, "bilinear")
    tiles = [np.ascontiguousarray(refined[y * LFM2_TILE:(y + 1) * LFM2_TILE, x * LFM2_TILE:(x + 1) * LFM2_TILE])
             for y in range(rows) for x in range(cols)]
    return tiles + [thumb], (cols, rows)


def lfm2_layout(cols: int, rows: int) -> Layout:
    """MTMD_SLICE_TMPL_LFM2: ``<|image_start|>``, each tile after ``<|img_row_R_col_C|>``, the thumbnail
    after ``<|img_thumbnail|>``, ``<|image_end|>``; a single image between the first and the last alone."""
    if cols == 0:
        return ["<|image_start|>", 0, "<|image_end|>"]
    out: Layout = ["<|image_start|>"]
    for y in range(rows):
        for x in range(cols):
            out += [f"<|img_row_{y + 1}_col_{x + 1}|>", y * cols + x]
    out += [Piece("<|img_thumbnail|>"), cols * rows, "<|image_end|>"]
    return out
