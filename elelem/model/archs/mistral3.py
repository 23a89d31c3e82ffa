"""Mistral 3: Llama's block with an attention temperature that grows with
the position (llama.cpp's llama-4-style tuning)."""
from typing import Any

from ...errors import ModelShapeError
from ..archspec.hparams import Key
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture


def mistral3_hparams(h: dict, key: Key, gguf: Any) -> None:
    # Q is scaled by 1 + temperature_scale * log(floor(pos / n_ctx_orig_yarn) + 1).
    h["attn_temp_scale"] = float(key("attention.temperature_scale", 0.0))
    h["attn_temp_floor"] = h["n_ctx_orig"]
    if h["attn_temp_scale"] != 0.0 and not 0 < h["attn_temp_floor"] < 2**31:
        raise ModelShapeError("attention temperature scaling needs rope.scaling.original_context_length > 0")


ARCH = Architecture("mistral3", "decoder", "normal", ATTN_FFN, optional=("bo",), derive=mistral3_hparams,
                    description="Mistral 3: Ministral 3, Devstral Small 2, Mistral Small 3.x")
