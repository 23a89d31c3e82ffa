"""What Gemma 4 and its drafter read alike about their full and sliding-window layers' heads."""
from __future__ import annotations

from ...errors import ModelShapeError
from .hparams import Key


def checked_head_widths(h: dict, key: Key, prefix: str, dims_swa: tuple[int, int], model: str) -> int:
    """The full and the sliding layers' K and V widths, each pair equal and in
    range; returns the sliding layers' rotated dims (rope.dimension_count_swa)."""
    for name, (k_dim, v_dim) in (("key_length", (h["head_dim_k"], h["head_dim_v"])), ("key_length_swa", dims_swa)):
        if k_dim != v_dim:
            raise ModelShapeError(f"{prefix}attention.{name} = {k_dim} differs from the value length {v_dim}: "
                                  f"{model} needs them equal")
        if not 0 < k_dim <= 4096:
            raise ModelShapeError(f"{prefix}attention.{name} = {k_dim} is out of range")
    n_rot_swa = int(key("rope.dimension_count_swa", h["n_rot"]))
    if not 0 < n_rot_swa <= dims_swa[0] or n_rot_swa % 2:
        raise ModelShapeError(f"{prefix}rope.dimension_count_swa = {n_rot_swa} must be even and at most "
                              f"{prefix}attention.key_length_swa = {dims_swa[0]}")
    return n_rot_swa
