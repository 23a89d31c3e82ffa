"""Qwen2 and Qwen2.5: RMSNorm, GQA attention with Q/K/V biases, NEOX RoPE, a SwiGLU FFN."""
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture

ARCH = Architecture("qwen2", "decoder", "neox", ATTN_FFN, optional=("bq", "bk", "bv", "bo"),
                    description="Qwen2 / Qwen2.5")
