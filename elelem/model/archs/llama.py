"""Llama 2/3 and the models shaped like it: Qwen2's block with normal
(pairwise) RoPE, usually without biases, with RoPE frequency factors where
the file has them (Llama 3.1+)."""
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture

ARCH = Architecture("llama", "decoder", "normal", ATTN_FFN, optional=("bq", "bk", "bv", "bo"),
                    description="Llama 2/3, SmolLM2, TinyLlama, Mistral-style")
