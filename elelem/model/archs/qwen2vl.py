"""Qwen2-VL and Qwen2.5-VL's text model: Qwen2 with multi-section RoPE (M-RoPE):
each head's rotated dims split into temporal, height and width sections, so that
an image's rows are placed in 2D (graph/mrope.pxi; llama.cpp's src/models/qwen2vl.cpp)."""
from typing import Any

from ...errors import ModelShapeError
from ..archspec.hparams import Key, int_list
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture


def mrope_hparams(h: dict, key: Key, gguf: Any) -> None:
    """rope.dimension_sections: four section widths, in rotated-dim pairs (llama.cpp reads 4, the
    converter writes them padded with 0), that ggml_rope_multi cycles through."""
    prefix = gguf.get("general.architecture") + "."
    sections = int_list(gguf.get(prefix + "rope.dimension_sections"))
    if sections is None or not 3 <= len(sections) <= 4 or not all(0 <= x <= h["n_rot"] for x in sections) \
            or sum(sections) == 0:
        raise ModelShapeError(f"{prefix}rope.dimension_sections must be 3 or 4 section widths, got {sections}")
    h["rope_sections"] = (list(sections) + [0])[:4]
    h["rope_type"] = "mrope"


ARCH = Architecture("qwen2vl", "decoder", "neox", ATTN_FFN, optional=("bq", "bk", "bv", "bo"), derive=mrope_hparams,
                    description="Qwen2-VL / Qwen2.5-VL (text)")
