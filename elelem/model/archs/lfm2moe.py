"""Liquid LFM2 with experts (LFM2-8B-A1B, LFM2-24B-A2B): LFM2's layers, the
first leading_dense_block_count with the dense FFN, the rest with experts
chosen by a sigmoid router with a selection bias (llama.cpp's lfm2moe,
graph/arch_lfm2.pxi)."""
from typing import Any

from ..archspec.hparams import Key
from ..archspec.roles import ATTN, EXPERTS
from ..archspec.shortconv import OUTPUT_NORM, SHORTCONV, lfm2_hparams, state_floats
from ..archspec.spec import Architecture, Experts


def lfm2moe_hparams(h: dict, key: Key, gguf: Any) -> None:
    key("expert_gating_func")   # llama.cpp's lfm2moe requires it (its converter writes sigmoid)
    lfm2_hparams(h, key, gguf)


ARCH = Architecture("lfm2moe", "lfm2", "neox", ATTN + ("q_norm", "k_norm"), recurrent=SHORTCONV,
                    experts=Experts(gating="sigmoid", normalize=True, required=EXPERTS + ("ffn_exp_probs_b",)),
                    recurrent_from_kv_heads=True, recurrent_state=state_floats, recurrent_kind="short convolution",
                    tensor_names=OUTPUT_NORM, derive=lfm2moe_hparams,
                    description="Liquid LFM2 MoE (short-convolution hybrid with experts)")
