"""gpt-oss: sliding-window and full attention layers alternating, attention
sinks, and experts with biases, routed by a softmax over the chosen logits,
through a clamped SwiGLU (llama.cpp's openai-moe graph)."""
import math
from typing import Any

from ..archspec.hparams import Key, swa_pattern
from ..archspec.roles import ATTN, EXPERT_BIASES, EXPERTS, POST_ATTENTION_FFN_NORM
from ..archspec.spec import Architecture, Experts, Role

ROLES = (
    # one learned logit per head, a cell no token fills
    Role("attn_sinks", "blk.{i}.attn_sinks.weight", lambda h: (h["n_head"],),
         "optional (n_head): each head's sink logit"),
)


def gpt_oss_hparams(h: dict, key: Key, gguf: Any) -> None:
    # Sliding-window and full attention layers alternate (pattern 2: even
    # layers slide), both with the same RoPE unless the file gives the
    # window's own base; Q.K is scaled by 1/sqrt(n_rot).
    h["n_swa"] = int(key("attention.sliding_window"))
    swa_pattern(h, key, gguf, 2)
    h["rope_base_swa"] = float(key("rope.freq_base_swa", h["rope_base"]))
    h["rope_scale_swa"] = h["rope_scale"]
    h["attn_scale"] = 1.0 / math.sqrt(h["n_rot"])
    h["late_output_rows"] = True


ARCH = Architecture("gpt-oss", "decoder", "neox", ATTN + ("bq", "bk", "bv", "bo", "attn_sinks"),
                    experts=Experts(gating="softmax_weight", normalize=False, activation="swiglu_oai",
                                    required=EXPERTS + EXPERT_BIASES),
                    tensor_names=POST_ATTENTION_FFN_NORM, derive=gpt_oss_hparams,
                    description="gpt-oss (20b, 120b)")
