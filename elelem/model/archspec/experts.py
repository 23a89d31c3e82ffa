"""Mixture-of-experts hyperparameters: the routing llama.cpp's
build_moe_ffn takes, read as llama.cpp reads them and checked before
anything is sized from them (graph/experts.pxi builds the block)."""
from __future__ import annotations

from typing import Any

from ...errors import ModelShapeError
from .hparams import MAX_WIDTH, Key, flag
from .spec import Experts, HParam

# llama.cpp's LLAMA_MAX_EXPERTS: it refuses more; and the experts one token
# is routed to, at most (graph/experts.pxi's MAX_USED_EXPERTS; real models use 4 to 10).
MAX_EXPERTS = 512
MAX_USED_EXPERTS = 64

# The router's gating functions as HParams.expert_gating numbers (experts.pxi).
GATING = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}
# llama.cpp's LLM_KV_EXPERT_GATING_FUNC values.
_GATING_KEY = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}

HPARAMS = (
    HParam("n_expert", "int", 0, "experts per layer; 0 for a dense model"),
    HParam("n_expert_used", "int", 0, "experts each token is routed to"),
    HParam("n_ff_exp", "int", 0, "each expert's FFN width"),
    HParam("n_layer_dense_lead", "int", 0, "the first layers have the dense FFN instead (GLM)"),
    HParam("expert_gating", "int", 0, "router: 0 softmax, 1 sigmoid, 2 softmax over the chosen logits (gpt-oss)"),
    HParam("expert_norm", "bool", False, "the chosen weights renormalised to sum 1"),
    HParam("expert_scale", "float", 0.0, "and multiplied by this (0 or 1: not)"),
    HParam("expert_swiglu_oai", "bool", False, "gpt-oss's clamped SwiGLU (alpha 1.702, limit 7), else SwiGLU"),
    HParam("expert_gelu", "bool", False, "the experts' activation is GeGLU (tanh GELU), not SwiGLU"),
    HParam("expert_relu_sqr", "bool", False, "the experts have no gate: relu(up)^2 (Nemotron-3-Nano)"),
    HParam("n_expert_shared", "int", 0, "shared experts (read by the checks)", core=False),
    HParam("n_ff_shexp", "int", 0, "the shared experts' FFN width (read by the checks)", core=False),
)


def expert_hparams(h: dict, key: Key, gguf: Any, experts: Experts) -> None:
    """The routing hyperparameters of a mixture-of-experts model, as
    llama.cpp reads them, checked before anything is sized from them."""
    prefix = gguf.get("general.architecture") + "."
    h["n_expert"] = n_expert = int(key("expert_count", 0))
    h["n_expert_used"] = n_used = int(key("expert_used_count", 0))
    if not 0 < n_expert <= MAX_EXPERTS:
        raise ModelShapeError(f"{prefix}expert_count = {n_expert} must be in 1..{MAX_EXPERTS}")
    if not 0 < n_used <= min(n_expert, MAX_USED_EXPERTS):
        raise ModelShapeError(f"{prefix}expert_used_count = {n_used} must be in 1..{prefix}expert_count "
                              f"({n_expert}), and at most {MAX_USED_EXPERTS}")
    h["n_ff_exp"] = int(key("expert_feed_forward_length", h["n_ff"] // n_used))
    h["n_expert_shared"] = int(key("expert_shared_count", 0))
    h["n_ff_shexp"] = h["n_ff_exp"] * h["n_expert_shared"]
    shared_width = int(key("expert_shared_feed_forward_length", 0))   # Qwen's one shared expert
    if shared_width:
        h["n_expert_shared"], h["n_ff_shexp"] = 1, shared_width
    h["n_layer_dense_lead"] = int(key("leading_dense_block_count", 0))
    if not 0 < h["n_ff_exp"] <= MAX_WIDTH or not 0 <= h["n_expert_shared"] <= 64:
        raise ModelShapeError(f"{prefix}expert_feed_forward_length = {h['n_ff_exp']} or "
                              f"expert_shared_count = {h['n_expert_shared']} is out of range")
    if not 0 <= h["n_layer_dense_lead"] <= h["n_layer"]:
        raise ModelShapeError(f"{prefix}leading_dense_block_count = {h['n_layer_dense_lead']} is out of range")
    gating = experts.gating
    if gguf.get(prefix + "expert_gating_func") is not None:
        code = int(key("expert_gating_func"))
        if code != 0:  # 0: unset, the architecture's own
            if code not in _GATING_KEY:
                raise ModelShapeError(f"{prefix}expert_gating_func = {code} is not one elelem knows "
                                      f"(1 softmax, 2 sigmoid, 3 softmax over the chosen)")
            gating = _GATING_KEY[code]
    h["expert_gating"] = GATING[gating]
    h["expert_norm"] = (experts.normalize if experts.normalize is not None
                        else flag(gguf, prefix + "expert_weights_norm", False))
    h["expert_scale"] = float(key("expert_weights_scale", 0.0))
    h["expert_swiglu_oai"] = experts.activation == "swiglu_oai"
    h["expert_gelu"] = experts.activation == "gelu"
    h["expert_relu_sqr"] = experts.activation == "relu_sqr"
