"""MiniMax-M2 (M2, M2.1, M2.5), as llama.cpp's minimax-m2 graph runs it: a
mixture of experts in every layer, chosen by sigmoid with a selection bias
(exp_probs_b) and renormalised; Q and K each RMS-normed over all their heads
together, before they are split into heads; NEOX RoPE over part of each
head (rotary_dim 64 of 128)."""
from typing import Any, Mapping

from ...errors import ModelShapeError
from ..archspec.hparams import Key
from ..archspec.roles import ATTN, EXPERTS
from ..archspec.spec import Architecture, Experts, Role

ROLES = (
    Role("q_norm_all", "blk.{i}.attn_q_norm.weight", lambda h: (h["n_head"] * h["head_dim_k"],),
         "(n_head * head_dim_k): one RMSNorm over all of Q's heads together (MiniMax-M2)"),
    Role("k_norm_all", "blk.{i}.attn_k_norm.weight", lambda h: (h["n_head_kv"] * h["head_dim_k"],),
         "(n_head_kv * head_dim_k): the same over all of K's heads"),
)


def minimax_m2_hparams(h: dict, key: Key, gguf: Any) -> None:
    prefix = "minimax-m2."
    if h["head_dim_v"] != h["head_dim_k"]:   # llama.cpp's graph asserts it
        raise ModelShapeError(f"{prefix}attention.value_length = {h['head_dim_v']} must equal "
                              f"{prefix}attention.key_length = {h['head_dim_k']}")
    # llama.cpp reads the gating from the file, with no default (build_moe_ffn
    # aborts on none); the converter writes sigmoid (2) from scoring_func.
    if not gguf.get(prefix + "expert_gating_func"):
        raise ModelShapeError(f"{prefix}expert_gating_func is missing (the converter writes 2, sigmoid)")
    # llama.cpp shapes the experts by feed_forward_length (the converter writes
    # intermediate_size as it and as expert_feed_forward_length).
    if gguf.get(prefix + "expert_feed_forward_length") is not None and h["n_ff_exp"] != h["n_ff"]:
        raise ModelShapeError(f"{prefix}expert_feed_forward_length = {h['n_ff_exp']} differs from "
                              f"{prefix}feed_forward_length = {h['n_ff']}")
    h["n_ff_exp"] = h["n_ff"]
    # Keys llama_model_minimax_m2::load_arch_hparams does not read: its experts
    # are never scaled, and it has no shared experts nor leading dense layers.
    h["expert_scale"] = 0.0
    h["n_expert_shared"] = h["n_ff_shexp"] = h["n_layer_dense_lead"] = 0


def minimax_m2_shape(h: Mapping[str, Any]) -> str:
    return (f"Q/K RMSNorm over all heads ({h['n_head']} x {h['head_dim_k']}, {h['n_head_kv']} x {h['head_dim_k']}); "
            f"RoPE over {h['n_rot']} of {h['head_dim_k']} dims; sigmoid routing with a selection bias")


# The output head is required (llama.cpp does not tie it); Q/K/V biases are
# taken where present, as create_tensor_qkv takes them.
ARCH = Architecture("minimax-m2", "decoder", "neox", ATTN + ("q_norm_all", "k_norm_all"),
                    optional=("bq", "bk", "bv"),
                    experts=Experts(gating="sigmoid", normalize=True, required=EXPERTS + ("ffn_exp_probs_b",)),
                    global_required=("tok_embd", "output_norm", "output"), global_optional=(),
                    derive=minimax_m2_hparams, shape=minimax_m2_shape,
                    description="MiniMax-M2, M2.1, M2.5")
