"""Nomic BERT with experts (nomic-embed-text-v2-moe): BERT's post-norm block
with RoPE instead of absolute positions, fused Q/K/V with biases and a GELU
FFN with biases; every ``moe_every_n_layers``-th layer (from layer 1) has
instead a softmax-routed mixture of experts, each expert GELU(up) then down,
no gate, its weights not renormalised (llama.cpp's nomic-bert-moe: the bert
graph's MoE branch).  Its vocabulary is XLM-RoBERTa's Unigram one."""
from __future__ import annotations

from typing import Any, Mapping

from ...errors import ModelShapeError
from ..archspec import encoder as _encoder
from ..archspec.hparams import Key
from ..archspec.spec import Architecture, Experts, HParam

HPARAMS = (
    HParam("moe_every_n_layers", "int", 0, "layers i with i % this == 1 have experts (nomic-bert-moe)", core=False),
)

EXPERTS = Experts(gating="softmax", normalize=False, activation="gelu",
                  required=("ffn_gate_inp", "ffn_up_exps", "ffn_down_exps"))
_DENSE_FFN = ("ffn_up", "ffn_down")


def nomic_moe_hparams(h: dict, key: Key, gguf: Any) -> None:
    # As llama_model_nomic_bert_moe::load_arch_hparams; the experts are n_ff wide
    # (the converter writes no expert_feed_forward_length).
    _encoder.encoder_hparams(h, key, gguf)
    every = int(key("moe_every_n_layers", 0))
    if not 0 <= every <= h["n_layer"]:
        raise ModelShapeError(f"nomic-bert-moe.moe_every_n_layers = {every} is out of range")
    h["moe_every_n_layers"] = every
    if gguf.get("nomic-bert-moe.expert_feed_forward_length") is None:
        h["n_ff_exp"] = h["n_ff"]


def nomic_moe_layer_roles(h: Mapping[str, Any], i: int, tensors: Mapping[str, Any]):
    """A layer's roles: the experts where ``i % moe_every_n_layers == 1``, else the dense FFN."""
    block = tuple(r for r in _encoder.BLOCK if r not in _DENSE_FFN)
    every = h["moe_every_n_layers"]
    if every > 0 and i % every == 1:
        return block + EXPERTS.required, _encoder.OPTIONAL
    return block + _DENSE_FFN, _encoder.OPTIONAL


ARCH = Architecture("nomic-bert-moe", "bert", "neox", _encoder.BLOCK, optional=_encoder.OPTIONAL,
                    activation="gelu", derive=nomic_moe_hparams, encoder=True, experts=EXPERTS,
                    layer_roles=nomic_moe_layer_roles,
                    global_required=("tok_embd", "tok_norm", "tok_norm_b"),
                    global_optional=_encoder.GLOBAL_OPTIONAL,
                    description="Nomic BERT with experts (nomic-embed-text-v2-moe)")
