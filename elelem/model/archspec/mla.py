"""Multi-head latent attention (MLA), as llama.cpp runs it for DeepSeek-V2
and its descendants: the tensors, the hyperparameters and their checks.

K and V of every head are made from one compressed latent per token
(``kv_lora_rank`` wide) plus a RoPE part shared by the heads (``n_rot``
wide).  llama.cpp caches only those (the latent then the RoPE part, one row
of ``kv_lora_rank + n_rot`` a cell, V the row's first ``kv_lora_rank``
values) and attends in the absorbed form: each head's no-RoPE query is
multiplied by ``wk_b`` into latent space, the attention runs as one KV head
over the latent, and ``wv_b`` turns each head's latent output into its V
width (llm_build_deepseek2 with build_attn's v_mla).  graph/mla.pxi builds it.

Here ``head_dim_k`` and ``head_dim_v`` are the per-head widths of the
projections (``key_length_mla``, ``value_length_mla``), which the roles of Q
and of the output are shaped by; the file's ``key_length`` and
``value_length`` are the cached widths, checked against the latent's.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ...errors import ModelShapeError
from .hparams import MAX_WIDTH, Key
from .spec import HParam, Role


def _nope(h: Mapping[str, Any]) -> int:
    return h["head_dim_k"] - h["n_rot"]


def _q(h: Mapping[str, Any]) -> int:
    return h["n_head"] * h["head_dim_k"]


ROLES = (
    # Q through a low-rank bottleneck (q_lora_rank > 0), else attn_q (wq) directly
    Role("wq_a", "blk.{i}.attn_q_a.weight", lambda h: (h["n_embd"], h["q_lora_rank"]),
         "(n_embd, q_lora_rank): Q's compression", matmul=True),
    Role("q_a_norm", "blk.{i}.attn_q_a_norm.weight", lambda h: (h["q_lora_rank"],), "(q_lora_rank)"),
    Role("wq_b", "blk.{i}.attn_q_b.weight", lambda h: (h["q_lora_rank"], _q(h)),
         "(q_lora_rank, n_head * head_dim_k): Q of every head, no-RoPE part then RoPE part", matmul=True),
    # the latent and the shared RoPE part of K, in one projection
    Role("wkv_a_mqa", "blk.{i}.attn_kv_a_mqa.weight", lambda h: (h["n_embd"], h["kv_lora_rank"] + h["n_rot"]),
         "(n_embd, kv_lora_rank + n_rot)", matmul=True),
    Role("kv_a_norm", "blk.{i}.attn_kv_a_norm.weight", lambda h: (h["kv_lora_rank"],), "(kv_lora_rank)"),
    # per head: no-RoPE K from the latent (transposed, to absorb it into Q) and V from the latent
    Role("wk_b", "blk.{i}.attn_k_b.weight", lambda h: (_nope(h), h["kv_lora_rank"], h["n_head"]),
         "(head_dim_k - n_rot, kv_lora_rank, n_head)"),
    Role("wv_b", "blk.{i}.attn_v_b.weight", lambda h: (h["kv_lora_rank"], h["head_dim_v"], h["n_head"]),
         "(kv_lora_rank, head_dim_v, n_head)"),
)

HPARAMS = (
    HParam("kv_lora_rank", "int", 0, "MLA: the latent K/V width a token caches (0: not MLA)"),
    HParam("q_lora_rank", "int", 0, "MLA: Q's low-rank width; 0: Q is projected directly (attn_q)"),
)

# The roles of an MLA attention block, with Q compressed or not.
MLA_Q_LORA = ("wq_a", "q_a_norm", "wq_b")
MLA_KV = ("wkv_a_mqa", "kv_a_norm", "wk_b", "wv_b")


def mla_hparams(h: dict, key: Key, gguf: Any, q_lora_required: bool) -> None:
    """The MLA widths, as llama_model_deepseek2::load_arch_hparams reads them,
    checked against the cached widths the file also gives (``h`` holds those
    as head_dim_k/head_dim_v when this is called, and the MLA per-head widths
    after).  ``q_lora_required``: llama.cpp reads q_lora_rank without a
    default (every variant but its "lite" ones)."""
    prefix = gguf.get("general.architecture") + "."
    k_mla, v_mla = gguf.get(prefix + "attention.key_length_mla"), gguf.get(prefix + "attention.value_length_mla")
    if k_mla is None and v_mla is None:
        raise ModelShapeError(
            f"{prefix}attention.key_length_mla is missing: an older conversion with the unsplit attn_kv_b "
            f"(K and V decompressed per head), which elelem does not run; convert the model again with a "
            f"current llama.cpp (it writes attn_k_b and attn_v_b)")
    h["kv_lora_rank"] = rank = int(key("attention.kv_lora_rank"))
    h["q_lora_rank"] = q_rank = int(key("attention.q_lora_rank", None if q_lora_required else 0))
    cached_k, cached_v = h["head_dim_k"], h["head_dim_v"]
    h["head_dim_k"] = int(key("attention.key_length_mla"))
    h["head_dim_v"] = int(key("attention.value_length_mla"))
    for name, value in (("attention.kv_lora_rank", rank), ("attention.key_length_mla", h["head_dim_k"]),
                        ("attention.value_length_mla", h["head_dim_v"])):
        if not 0 < value <= 4096:
            raise ModelShapeError(f"{prefix}{name} = {value} is out of range")
    if not 0 <= q_rank <= MAX_WIDTH:
        raise ModelShapeError(f"{prefix}attention.q_lora_rank = {q_rank} is out of range")
    if not 0 < h["n_rot"] < h["head_dim_k"]:
        raise ModelShapeError(f"{prefix}rope.dimension_count = {h['n_rot']} must leave a no-RoPE part of each "
                              f"head (attention.key_length_mla = {h['head_dim_k']})")
    # The cache holds the latent and the RoPE part as one KV head, V its first kv_lora_rank values.
    if cached_k != rank + h["n_rot"]:
        raise ModelShapeError(f"{prefix}attention.key_length = {cached_k} must be kv_lora_rank + "
                              f"rope.dimension_count = {rank + h['n_rot']}")
    if cached_v != rank:
        raise ModelShapeError(f"{prefix}attention.value_length = {cached_v} must be kv_lora_rank = {rank}")
    if h["n_head_kv"] != 1:
        raise ModelShapeError(f"{prefix}attention.head_count_kv = {h['n_head_kv']} must be 1: MLA caches one "
                              f"latent for every head")
    if "layer_n_head_kv" in h or "layer_n_ff" in h:
        raise ModelShapeError(f"{prefix}: per-layer head counts or FFN widths are not supported with MLA")


def _f32(x: float) -> float:
    return float(np.float32(x))


def _logf(x: float) -> float:
    return _f32(math.log(_f32(x)))


def mla_yarn_attn_factor(h: dict, key: Key) -> float:
    """llama.cpp's cparams.yarn_attn_factor for deepseek2 (llama_context's
    constructor, [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]), in float32: with YaRN and
    a log multiplier, the ratio of magnitudes is 1 (mscale = mscale_all_dim),
    then divided by the 1 + 0.1 ln(factor) that ggml's rope multiplies in."""
    if h["rope_ext_factor"] == 0.0:
        return h["rope_attn_factor"]
    log_mul = mla_log_mul(key)
    factor = _f32(1.0 / np.float32(h["rope_scale"]))
    if log_mul != 0.0:
        attn = 1.0
    else:
        attn = 1.0 if factor <= 1.0 else _f32(_f32(_f32(0.1) * _logf(factor)) + 1.0)
    attn = _f32(attn * _f32(1.0 / _f32(1.0 + _f32(_f32(0.1) * _logf(factor)))))
    return _f32(attn * _f32(key("rope.scaling.attn_factor", 1.0)))


def mla_log_mul(key: Key) -> float:
    """rope.scaling.yarn_log_multiplier as deepseek2 reads it: the converter
    writes 0.1 * mscale_all_dim, and llama.cpp divides the 0.1 out again."""
    return _f32(np.float32(key("rope.scaling.yarn_log_multiplier", 0.0)) / np.float32(0.1))


def mla_kq_scale(h: Mapping[str, Any], key: Key) -> float:
    """llm_build_deepseek2's kq_scale, in float32: YaRN's magnitude scale,
    squared, over sqrt(key_length_mla) -- 1/sqrt(key_length_mla) without YaRN."""
    attn_factor = np.float32(h["rope_attn_factor"])
    ln = np.float32(_logf(_f32(np.float32(1.0) / np.float32(h["rope_scale"]))))
    attn_factor_org = np.float32(attn_factor * np.float32(np.float32(1.0) + np.float32(np.float32(0.1) * ln)))
    log_mul = np.float32(mla_log_mul(key))
    mscale = np.float32(attn_factor_org * np.float32(
        np.float32(1.0) + np.float32(np.float32(np.float32(0.1) * log_mul) * ln)))
    return _f32(np.float32(np.float32(mscale * mscale) / np.float32(math.sqrt(h["head_dim_k"]))))
