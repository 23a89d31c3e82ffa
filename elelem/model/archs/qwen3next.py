"""Qwen3-Next, as llama.cpp's llama_model_qwen3next reads it: Qwen3.5's
layers with NEOX RoPE, value heads grouped by key head, and in every layer
experts plus one shared expert, gated."""
from typing import Any

from ..archspec.delta_net import delta_net_hparams, state_floats
from ..archspec.hparams import Key
from ..archspec.roles import ATTN, EXPERTS, POST_ATTENTION_FFN_NORM
from ..archspec.spec import Architecture, Experts, Role


def _conv_dim(h) -> int:
    return 2 * h["ssm_d_state"] * h["ssm_n_group"] + h["ssm_d_inner"]


# Beta and alpha in one projection, head group by head group; in older files
# also Q, K, V and z in one (ssm_in), where newer ones have attn_qkv and attn_gate.
ROLES = (
    Role("ssm_in", "blk.{i}.ssm_in.weight", lambda h: (h["n_embd"], _conv_dim(h) + h["ssm_d_inner"]),
         "optional (n_embd, 2 * key heads * ssm_d_state + 2 * ssm_d_inner)", matmul=True),
    Role("ssm_ba", "blk.{i}.ssm_ba.weight", lambda h: (h["n_embd"], 2 * h["ssm_dt_rank"]),
         "(n_embd, 2 * ssm_dt_rank)", matmul=True),
)

DELTA_NET_BY_GROUP = ("attn_norm", "ffn_norm", "wqkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_ba",
                      "ssm_norm", "ssm_out")


def qwen3next_hparams(h: dict, key: Key, gguf: Any) -> None:
    # The shared expert's width defaults to feed_forward_length.
    delta_net_hparams(h, key, gguf)
    h["ssm_v_grouped"] = True
    if h["n_expert_shared"] == 0:
        h["n_expert_shared"], h["n_ff_shexp"] = 1, h["n_ff"]


ARCH = Architecture("qwen3next", "qwen35", "neox", ATTN + ("q_norm", "k_norm"), recurrent=DELTA_NET_BY_GROUP,
                    recurrent_fused={"ssm_in": ("wqkv", "attn_gate")},
                    experts=Experts(required=EXPERTS + ("ffn_gate_inp_shexp",)),
                    tensor_names=POST_ATTENTION_FFN_NORM,
                    recurrent_state=state_floats, recurrent_kind="Gated DeltaNet", derive=qwen3next_hparams,
                    mtp_builder="qwen35_mtp",
                    description="Qwen3-Next, Qwen3-Coder-Next (Gated DeltaNet hybrid with experts)")
