"""Qwen3 (dense): Qwen2's block without biases, with per-head Q/K RMSNorms."""
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture

ARCH = Architecture("qwen3", "decoder", "neox", ATTN_FFN + ("q_norm", "k_norm"), description="Qwen3")
