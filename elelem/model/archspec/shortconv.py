"""LFM2's short gated convolution layer (llama.cpp's build_shortconv_block):
its tensors, its width (``shortconv.l_cache``), and which layers are
convolutions, as llama.cpp reads them (graph/arch_lfm2.pxi builds it).

A convolution layer projects its input to three channels of n_embd (B, C
and x), convolves B*x causally over the last ``l_cache`` positions, one
kernel per channel, and projects C times that back.  Its memory of a
sequence is the last ``l_cache - 1`` values of B*x: the recurrent state the
one cache keeps per sequence, beside the attention layers' cells.
"""
from __future__ import annotations

from typing import Any, Mapping

from ...errors import ModelShapeError
from .hparams import Key, array
from .spec import HParam, Role

ROLES = (
    Role("shortconv_conv", "blk.{i}.shortconv.conv.weight", lambda h: (h["shortconv_l_cache"], h["n_embd"]),
         "(shortconv_l_cache, n_embd), F32: ggml_ssm_conv takes F32", f32=True),
    Role("shortconv_in_proj", "blk.{i}.shortconv.in_proj.weight", lambda h: (h["n_embd"], 3 * h["n_embd"]),
         "(n_embd, 3 * n_embd): B, C and x", matmul=True),
    Role("shortconv_out_proj", "blk.{i}.shortconv.out_proj.weight", lambda h: (h["n_embd"], h["n_embd"]),
         "(n_embd, n_embd)", matmul=True),
)

HPARAMS = (
    HParam("shortconv_l_cache", "int", 0,
           "the short convolution's width (its state keeps l_cache - 1 columns); 0: none"),
)

# A convolution layer's roles (its FFN is the dense one or the experts, as the attention layers').
SHORTCONV = ("attn_norm", "ffn_norm", "shortconv_conv", "shortconv_in_proj", "shortconv_out_proj")
# What LFM2 files name the final norm (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2).
OUTPUT_NORM = {"output_norm": "token_embd_norm.weight"}


def layer_kinds_from_kv_heads(h: dict, gguf: Any, arch_name: str) -> None:
    """Which layers recur, from ``attention.head_count_kv`` as llama.cpp's
    LFM2 reads it: a layer with 0 KV heads is a convolution layer
    (is_recr(il) = n_head_kv(il) == 0).  The attention layers share one KV
    head count (llama.cpp asserts n_embd_k_gqa == n_embd_v_gqa), which
    becomes ``n_head_kv``."""
    name = f"{arch_name}.attention.head_count_kv"
    raw = gguf.get(name)
    n = h["n_layer"]
    full = array(raw)
    if full is None:
        if raw is None or isinstance(raw, bool) or not isinstance(raw, int):
            raise ModelShapeError(f"{name} must be a number or an integer per layer ({n} layers)")
        full = [raw] * n
    if len(full) < n or not all(isinstance(v, int) and not isinstance(v, bool) for v in full):
        raise ModelShapeError(f"{name} must be a number or an integer per layer ({n} layers), "
                              f"0 for a convolution layer")
    counts = [int(v) for v in full[:n]]
    attending = sorted({v for v in counts if v != 0})
    if any(v < 0 or v >= 2**31 for v in counts) or len(attending) > 1:
        raise ModelShapeError(f"{name} = {counts}: each layer's must be 0 (a convolution layer) or the "
                              f"attention layers' one KV head count")
    if not attending:
        raise ModelShapeError(f"{name} = {counts} has no attention layer")
    h["n_head_kv"] = attending[0]
    h["recurrent_layers"] = [v == 0 for v in counts]


def lfm2_hparams(h: dict, key: Key, gguf: Any) -> None:
    """LFM2's convolution width, and the variants elelem refuses: the
    bidirectional (embedding) conversions, the sliding-window one (LFM2.5's
    audio tokenizer) and the ColBERT projection, whose graphs llama.cpp
    builds otherwise."""
    prefix = gguf.get("general.architecture") + "."
    if any(h["recurrent_layers"]):
        h["shortconv_l_cache"] = int(key("shortconv.l_cache"))
        if not 2 <= h["shortconv_l_cache"] <= 64:
            raise ModelShapeError(f"{prefix}shortconv.l_cache = {h['shortconv_l_cache']} must be in 2..64")
    causal = gguf.get(prefix + "attention.causal", True)
    if causal is not True:
        raise ModelShapeError(f"{prefix}attention.causal = {causal!r}: elelem runs causal LFM2 models only "
                              f"(not the bidirectional embedding conversions)")
    if int(key("attention.sliding_window", 0)) > 0:
        raise ModelShapeError(f"{prefix}attention.sliding_window: elelem does not run LFM2 with a sliding window "
                              f"(LFM2.5's audio tokenizer)")
    if "dense_2_out.weight" in gguf.tensors:
        raise ModelShapeError("tensor 'dense_2_out.weight': elelem does not run LFM2's ColBERT projection "
                              "(an embedding model)")
    if h["head_dim_k"] != h["head_dim_v"] or h["n_head"] * h["head_dim_k"] != h["n_embd"]:
        raise ModelShapeError(f"{prefix}attention: n_head ({h['n_head']}) heads of {h['head_dim_k']} must make "
                              f"n_embd ({h['n_embd']}), K and V of one width (llama.cpp's LFM2 needs both)")


def state_floats(h: Mapping[str, Any]) -> dict[str, int]:
    """A convolution layer's state per sequence, in floats: its last l_cache - 1 inputs."""
    return {"convolution": (h["shortconv_l_cache"] - 1) * h["n_embd"]}
