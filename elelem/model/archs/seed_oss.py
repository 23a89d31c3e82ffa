"""Seed-OSS (ByteDance Seed-OSS-36B), as llama.cpp's seed_oss graph runs it:
Llama's dense block with Q/K/V biases, NEOX RoPE over whole heads that are
wider than n_embd / n_head, and the FFN's norm stored as
post_attention_norm (it is still applied before the FFN)."""
from typing import Any, Mapping

from ..archspec.hparams import Key, require_rope_over_whole_heads
from ..archspec.roles import ATTN_FFN, POST_ATTENTION_FFN_NORM
from ..archspec.spec import Architecture


def seed_oss_hparams(h: dict, key: Key, gguf: Any) -> None:
    # llama.cpp's seed_oss graph asserts head_dim_k == head_dim_v == n_rot.
    require_rope_over_whole_heads(h, "seed_oss")


def seed_oss_shape(h: Mapping[str, Any]) -> str:
    return f"head width {h['head_dim_k']} ({h['n_head']} x {h['head_dim_k']} = {h['n_head'] * h['head_dim_k']} " \
           f"wide Q for n_embd {h['n_embd']})"


# The biases are optional, as llama.cpp's create_tensor_qkv takes them; the
# output projection has none there (an attn_output.bias is not read).
ARCH = Architecture("seed_oss", "decoder", "neox", ATTN_FFN, optional=("bq", "bk", "bv"),
                    tensor_names=POST_ATTENTION_FFN_NORM, derive=seed_oss_hparams, shape=seed_oss_shape,
                    description="Seed-OSS-36B")
