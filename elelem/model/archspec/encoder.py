"""What the BERT-family encoders (bert, nomic-bert) share: post-norm
LayerNorms with biases, a biased FFN, Q/K/V separate or fused, and the
hyperparameters llama.cpp reads for them (graph/arch_bert.pxi builds both)."""
from __future__ import annotations

import math
from typing import Any

from ...errors import ModelShapeError
from .hparams import Key
from .spec import HParam, Role

ROLES = (
    Role("attn_out_norm", "blk.{i}.attn_output_norm.weight", lambda h: (h["n_embd"],),
         "LayerNorm after attention + residual (n_embd)"),
    Role("attn_out_norm_b", "blk.{i}.attn_output_norm.bias", lambda h: (h["n_embd"],)),
    Role("ffn_up_b", "blk.{i}.ffn_up.bias", lambda h: (h["n_ff"],), "(n_ff)"),
    Role("ffn_down_b", "blk.{i}.ffn_down.bias", lambda h: (h["n_embd"],), "(n_embd)"),
    Role("layer_out_norm", "blk.{i}.layer_output_norm.weight", lambda h: (h["n_embd"],),
         "LayerNorm after the FFN + residual (n_embd)"),
    Role("layer_out_norm_b", "blk.{i}.layer_output_norm.bias", lambda h: (h["n_embd"],)),
)

HPARAMS = (
    HParam("n_token_types", "int", 0, "the token-type table's height (read by the checks)", core=False),
)

BLOCK = ("wo", "attn_out_norm", "attn_out_norm_b", "ffn_up", "ffn_down", "layer_out_norm", "layer_out_norm_b")
OPTIONAL = ("wq", "wk", "wv", "bq", "bk", "bv", "wqkv", "bqkv", "bo", "ffn_up_b", "ffn_down_b")
GLOBAL_OPTIONAL = ("type_embd",)


def encoder_hparams(h: dict, key: Key, gguf: Any) -> None:
    # As llama.cpp reads a BERT-family file: LayerNorm's epsilon is required,
    # attention is causal unless the file says otherwise (converters write
    # false), and the token-type table's height is the tokenizer's count.
    h["encoder"] = True
    h["norm_eps"] = float(key("attention.layer_norm_epsilon"))
    causal_key = gguf.get("general.architecture") + ".attention.causal"
    causal = gguf.get(causal_key, True)
    if not isinstance(causal, bool):
        raise ModelShapeError(f"{causal_key} = {causal!r} must be a boolean")
    h["causal"] = causal
    types = gguf.get("tokenizer.ggml.token_type_count", 0)
    if isinstance(types, bool) or not isinstance(types, int) or not 0 < types <= 1024:
        raise ModelShapeError(f"tokenizer.ggml.token_type_count = {types!r}: a BERT-family model needs "
                              f"a token type count in 1..1024")
    h["n_token_types"] = types
    if not (h["norm_eps"] > 0 and math.isfinite(h["norm_eps"])):
        raise ModelShapeError(f"attention.layer_norm_epsilon = {h['norm_eps']} must be positive")
