"""Qwen3-VL's text side (qwen3vl, qwen3vlmoe): interleaved multi-section RoPE
(imrope), and "deepstack": an image's embedding rows carry, after the main
embedding, one more n_embd-wide part per deepstack layer of the projector,
each added to the hidden state after one of the first layers
(llama.cpp's src/models/qwen3vl.cpp; hparams.n_deepstack_layers)."""
from __future__ import annotations

from typing import Any

from ...errors import ModelShapeError
from .hparams import Key, int_list
from .spec import HParam

HPARAMS = (
    HParam("n_deepstack", "int", 0,
           "n_deepstack_layers: an image row's extra n_embd-wide parts, part k added after layer k"),
)


def rope_sections(h: dict, gguf: Any, rope_type: str) -> None:
    """rope.dimension_sections: four section widths, in rotated-dim pairs (llama.cpp reads 4, the
    converter writes them padded with 0), that ggml_rope_multi cycles through (``rope_type``
    "mrope": Qwen2-VL's sections one after the other; "imrope": Qwen3-VL's interleaved)."""
    prefix = gguf.get("general.architecture") + "."
    sections = int_list(gguf.get(prefix + "rope.dimension_sections"))
    if sections is None or not 3 <= len(sections) <= 4 or not all(0 <= x <= h["n_rot"] for x in sections) \
            or sum(sections) == 0:
        raise ModelShapeError(f"{prefix}rope.dimension_sections must be 3 or 4 section widths, got {sections}")
    h["rope_sections"] = (list(sections) + [0])[:4]
    h["rope_type"] = rope_type


def qwen3vl_hparams(h: dict, key: Key, gguf: Any) -> None:
    """The sections of imrope, and n_deepstack_layers."""
    rope_sections(h, gguf, "imrope")
    prefix = gguf.get("general.architecture") + "."
    n_deepstack = key("n_deepstack_layers", 0)
    if not isinstance(n_deepstack, int) or not 0 <= n_deepstack < h["n_layer"]:
        # llama.cpp adds part k after layer k, before the last layer drops the unwanted rows.
        raise ModelShapeError(f"{prefix}n_deepstack_layers = {n_deepstack!r} must be 0 .. block_count - 1 "
                              f"({h['n_layer'] - 1})")
    h["n_deepstack"] = int(n_deepstack)
