"""Qwen3-VL-MoE's text model: Qwen3-MoE with Qwen3-VL's interleaved
multi-section RoPE and deepstack features (archspec/deepstack.py;
llama.cpp's src/models/qwen3vlmoe.cpp)."""
from ..archspec.deepstack import qwen3vl_hparams
from ..archspec.roles import ATTN
from ..archspec.spec import Architecture, Experts

ARCH = Architecture("qwen3vlmoe", "decoder", "neox", ATTN + ("q_norm", "k_norm"), experts=Experts(),
                    derive=qwen3vl_hparams, description="Qwen3-VL-MoE (text; 30B-A3B, 235B-A22B)")
