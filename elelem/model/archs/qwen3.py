"""Qwen3 (dense): Qwen2's block without biases, with per-head Q/K RMSNorms.
Qwen3-Reranker is this model with a rank head: the LM head's "yes" and
"no" rows as ``cls.output``, read at the last token, softmaxed."""
from ..archspec import rank as _rank
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture

ARCH = Architecture("qwen3", "decoder", "neox", ATTN_FFN + ("q_norm", "k_norm"),
                    global_optional=("output", "rope_freqs", "cls_out"), derive=_rank.softmax_scores,
                    description="Qwen3")
