"""Qwen2-VL and Qwen2.5-VL's text model: Qwen2 with multi-section RoPE (M-RoPE):
each head's rotated dims split into temporal, height and width sections, so that
an image's rows are placed in 2D (graph/mrope.pxi; llama.cpp's src/models/qwen2vl.cpp)."""
from typing import Any

from ..archspec.deepstack import rope_sections
from ..archspec.hparams import Key
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture


def mrope_hparams(h: dict, key: Key, gguf: Any) -> None:
    rope_sections(h, gguf, "mrope")


ARCH = Architecture("qwen2vl", "decoder", "neox", ATTN_FFN, optional=("bq", "bk", "bv", "bo"), derive=mrope_hparams,
                    description="Qwen2-VL / Qwen2.5-VL (text)")
