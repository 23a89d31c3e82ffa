"""Qwen3-MoE: Qwen3's attention, and in every layer routed experts (softmax, renormalised)."""
from ..archspec.roles import ATTN
from ..archspec.spec import Architecture, Experts

ARCH = Architecture("qwen3moe", "decoder", "neox", ATTN + ("q_norm", "k_norm"), experts=Experts(),
                    description="Qwen3-MoE, Qwen3-Coder (30B-A3B, 480B-A35B)")
