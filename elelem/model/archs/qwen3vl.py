"""Qwen3-VL's text model (dense): Qwen3 with interleaved multi-section RoPE,
an image's rows placed in 2D, and deepstack features from the projector added
after the first layers (archspec/deepstack.py; llama.cpp's src/models/qwen3vl.cpp)."""
from ..archspec.deepstack import qwen3vl_hparams
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture

ARCH = Architecture("qwen3vl", "decoder", "neox", ATTN_FFN + ("q_norm", "k_norm"), global_optional=("output",),
                    derive=qwen3vl_hparams, description="Qwen3-VL (text)")
