"""Tiny synthetic deepseek2 models (multi-head latent attention), written as
llama.cpp's converter writes them (conversion/deepseek.py: DeepseekV2Model,
conversion/glm.py: Glm4MoeLiteModel), and a NumPy reference of their forward
pass in both of MLA's forms.

The converter's layout: head_count_kv 1; key_length kv_lora_rank + the RoPE
dims and value_length kv_lora_rank (the cached widths), key_length_mla and
value_length_mla the per-head ones; kv_b_proj split per head into attn_k_b
(transposed, ggml (nope, kv_lora_rank, n_head)) and attn_v_b (ggml
(kv_lora_rank, v_head_dim, n_head)); Q through attn_q_a/attn_q_a_norm/
attn_q_b where the model has q_lora_rank, else attn_q; the first
leading_dense_block_count layers dense, the rest experts with shared ones
(and exp_probs_b where the model has a selection bias).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

from synthetic import StoredWeights, Yarn, _rms_norm, _rope, _silu, _softmax, write_family_model
from synthetic_stream import random_matrices


@dataclass(frozen=True)
class MLAConfig:
    arch: str = "deepseek2"
    n_vocab: int = 96
    n_embd: int = 64
    n_layer: int = 3
    n_head: int = 4
    q_lora_rank: int = 64            # 0: attn_q, and no q_lora_rank key (DeepSeek-V2-Lite, Moonlight)
    kv_lora_rank: int = 32
    qk_nope: int = 32
    qk_rope: int = 16
    v_head_dim: int = 32
    n_ff: int = 96                   # the leading dense layers' FFN
    n_ctx_train: int = 2048
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_expert_shared: int = 1
    n_dense_lead: int = 1
    n_nextn: int = 0                 # multi-token-prediction layers after the rest (GLM-4.7-Flash: 1),
                                     # written as Glm4MoeLiteModel does, never run
    gating: Optional[str] = "sigmoid"   # expert_gating_func written; None: not written (GLM-4.7-Flash)
    selection_bias: bool = True      # exp_probs_b (GLM-4.7-Flash, DeepSeek-V3, Kimi-K2)
    expert_norm: bool = True         # expert_weights_norm (written only when true, as the converter)
    expert_scale: float = 1.8        # expert_weights_scale (0: not written)
    vocab_size_key: Optional[int] = None   # deepseek2.vocab_size; None: n_vocab
    expert_groups: int = 0           # expert_group_count / expert_group_used_count (0: not written)
    expert_groups_used: int = 0
    yarn: float = 0.0                # rope.scaling.type=yarn with this factor
    yarn_orig_ctx: int = 256
    mscale_all_dim: float = 0.0      # written as rope.scaling.yarn_log_multiplier = 0.1 * this
    wtype: str = "f32"
    embd_type: str = "f32"
    tied: bool = False
    seed: int = 0
    extra_keys: tuple = ()           # ((key, value), ...) written instead ("{arch}" expanded)
    drop_keys: tuple = ()            # keys the converter writes, left out
    drop: tuple = ()                 # tensors left out
    cut: tuple = ()                  # ((name, axis, length), ...): tensors cut (numpy order)

    @property
    def head_dim_k(self) -> int:
        return self.qk_nope + self.qk_rope

    def but(self, **kw) -> "MLAConfig":
        return replace(self, **kw)

    def tensor_type(self, name: str, arr: np.ndarray) -> str:
        if arr.ndim < 2 or name.endswith(".bias") or name.endswith("ffn_gate_inp.weight"):
            return "f32"
        return self.embd_type if name == "token_embd.weight" else self.wtype


def make_weights(cfg: MLAConfig, stream: bool = False) -> dict[str, np.ndarray]:
    """Deterministic weights from cfg.seed, numpy order ((n_out, n_in) for a matrix); with
    ``stream``, the matrices are synthetic_stream.RandomTensors, made only while written."""
    rng = np.random.default_rng(cfg.seed)
    f32 = np.float32

    def mat(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(f32)
    if stream:
        mat = random_matrices(cfg.seed)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(f32)

    e, H = cfg.n_embd, cfg.n_head
    w = {"token_embd.weight": mat(cfg.n_vocab, e, scale=1.0)}
    for i in range(cfg.n_layer + cfg.n_nextn):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(e)
        if cfg.q_lora_rank:
            w[p + "attn_q_a.weight"] = mat(cfg.q_lora_rank, e)
            w[p + "attn_q_a_norm.weight"] = norm(cfg.q_lora_rank)
            w[p + "attn_q_b.weight"] = mat(H * cfg.head_dim_k, cfg.q_lora_rank)
        else:
            w[p + "attn_q.weight"] = mat(H * cfg.head_dim_k, e)
        w[p + "attn_kv_a_mqa.weight"] = mat(cfg.kv_lora_rank + cfg.qk_rope, e)
        w[p + "attn_kv_a_norm.weight"] = norm(cfg.kv_lora_rank)
        w[p + "attn_k_b.weight"] = mat(H, cfg.kv_lora_rank, cfg.qk_nope, scale=1.0 / math.sqrt(cfg.kv_lora_rank))
        w[p + "attn_v_b.weight"] = mat(H, cfg.v_head_dim, cfg.kv_lora_rank)
        w[p + "attn_output.weight"] = mat(e, H * cfg.v_head_dim)
        w[p + "ffn_norm.weight"] = norm(e)
        if i < cfg.n_dense_lead:
            w[p + "ffn_gate.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
            continue
        w[p + "ffn_gate_inp.weight"] = mat(cfg.n_expert, e, scale=1.0)
        if cfg.selection_bias:
            w[p + "exp_probs_b.bias"] = (0.1 * rng.standard_normal(cfg.n_expert)).astype(f32)
        w[p + "ffn_gate_exps.weight"] = mat(cfg.n_expert, cfg.n_ff_exp, e)
        w[p + "ffn_up_exps.weight"] = mat(cfg.n_expert, cfg.n_ff_exp, e)
        w[p + "ffn_down_exps.weight"] = mat(cfg.n_expert, e, cfg.n_ff_exp)
        if cfg.n_expert_shared:
            shared = cfg.n_ff_exp * cfg.n_expert_shared
            w[p + "ffn_gate_shexp.weight"] = mat(shared, e)
            w[p + "ffn_up_shexp.weight"] = mat(shared, e)
            w[p + "ffn_down_shexp.weight"] = mat(e, shared)
        if i >= cfg.n_layer:   # the NextN block's own tensors
            w[p + "nextn.eh_proj.weight"] = mat(e, 2 * e)
            w[p + "nextn.enorm.weight"] = norm(e)
            w[p + "nextn.hnorm.weight"] = norm(e)
            w[p + "nextn.shared_head_norm.weight"] = norm(e)
    w["output_norm.weight"] = norm(e)
    if not cfg.tied:
        w["output.weight"] = mat(cfg.n_vocab, e)
    return w


def _add_keys(writer: gguf.GGUFWriter, cfg: MLAConfig) -> None:
    """The keys DeepseekV2Model.set_gguf_parameters writes, in its order."""
    keys: list[tuple[str, Callable, object]] = [
        ("context_length", writer.add_context_length, cfg.n_ctx_train),
        ("embedding_length", writer.add_embedding_length, cfg.n_embd),
        ("block_count", writer.add_block_count, cfg.n_layer + cfg.n_nextn),
        ("feed_forward_length", writer.add_feed_forward_length, cfg.n_ff),
        ("attention.head_count", writer.add_head_count, cfg.n_head),
        ("attention.head_count_kv", writer.add_head_count_kv, 1),
        ("rope.freq_base", writer.add_rope_freq_base, cfg.rope_base),
        ("attention.layer_norm_rms_epsilon", writer.add_layer_norm_rms_eps, cfg.rms_eps),
        ("expert_count", writer.add_expert_count, cfg.n_expert),
        ("expert_used_count", writer.add_expert_used_count, cfg.n_expert_used),
        ("leading_dense_block_count", writer.add_leading_dense_block_count, cfg.n_dense_lead),
        ("vocab_size", writer.add_vocab_size, cfg.vocab_size_key or cfg.n_vocab),
        ("attention.q_lora_rank", writer.add_q_lora_rank, cfg.q_lora_rank or None),
        ("attention.kv_lora_rank", writer.add_kv_lora_rank, cfg.kv_lora_rank),
        ("attention.key_length", writer.add_key_length, cfg.kv_lora_rank + cfg.qk_rope),
        ("attention.value_length", writer.add_value_length, cfg.kv_lora_rank),
        ("attention.key_length_mla", writer.add_key_length_mla, cfg.head_dim_k),
        ("attention.value_length_mla", writer.add_value_length_mla, cfg.v_head_dim),
        ("expert_feed_forward_length", writer.add_expert_feed_forward_length, cfg.n_ff_exp),
        ("expert_shared_count", writer.add_expert_shared_count, cfg.n_expert_shared),
        ("expert_weights_scale", writer.add_expert_weights_scale, cfg.expert_scale or None),
        ("expert_weights_norm", writer.add_expert_weights_norm, True if cfg.expert_norm else None),
        ("rope.dimension_count", writer.add_rope_dimension_count, cfg.qk_rope),
        ("expert_group_count", writer.add_expert_group_count, cfg.expert_groups or None),
        ("expert_group_used_count", writer.add_expert_group_used_count, cfg.expert_groups_used or None),
        ("nextn_predict_layers", writer.add_nextn_predict_layers, cfg.n_nextn or None),   # Glm4MoeLiteModel's
    ]
    overridden = {key.format(arch=cfg.arch) for key, _ in cfg.extra_keys}
    for name, add, value in keys:
        if value is not None and name not in cfg.drop_keys and f"{cfg.arch}.{name}" not in overridden:
            add(value)
    if cfg.gating is not None:
        writer.add_expert_gating_func({"softmax": gguf.ExpertGatingFuncType.SOFTMAX,
                                       "sigmoid": gguf.ExpertGatingFuncType.SIGMOID}[cfg.gating])
    if cfg.yarn:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(cfg.yarn)
        writer.add_rope_scaling_orig_ctx_len(cfg.yarn_orig_ctx)
    if cfg.mscale_all_dim:
        writer.add_rope_scaling_yarn_log_mul(0.1 * cfg.mscale_all_dim)
    for key, value in cfg.extra_keys:
        key = key.format(arch=cfg.arch)
        if isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)


def write_mla_model(path: Path, cfg: MLAConfig,
                    extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None,
                    stream: bool = False) -> StoredWeights:
    """Write ``cfg`` to ``path``; returns the weights exactly as stored (dequantized).  With
    ``stream`` (a real-sized benchmark file), random matrices made a few million values at a
    time as they are written (synthetic_stream.py), and nothing returned."""
    return write_family_model(path, cfg, make_weights(cfg, stream), _add_keys, extra_metadata)


# --------------------------------------------------------------------------
# The NumPy reference, in float64.

class _MLAYarn(Yarn):
    """YaRN as llama.cpp runs it for deepseek2: with a log multiplier the
    rotated values keep their magnitude (mscale = mscale_all_dim cancels),
    which goes into the attention scale instead (:func:`kq_scale`)."""

    def magnitude(self) -> float:
        if self.log_mul:
            return 1.0
        return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0


def _yarn(cfg: MLAConfig) -> Optional[_MLAYarn]:
    return _MLAYarn(cfg.yarn, cfg.yarn_orig_ctx, cfg.mscale_all_dim) if cfg.yarn else None


def kq_scale(cfg: MLAConfig) -> float:
    """llm_build_deepseek2's kq_scale: YaRN's magnitude mscale(factor, 1) * mscale(factor, mscale_all_dim)
    over the rotated values' own, squared, over sqrt(key_length_mla)."""
    scale = 1.0
    if cfg.yarn and cfg.yarn > 1:
        ln = math.log(cfg.yarn)
        rope_magnitude = _yarn(cfg).magnitude()
        scale = rope_magnitude * (1 + 0.1 * cfg.mscale_all_dim * ln)
    return scale * scale / math.sqrt(cfg.head_dim_k)


def mla_projections(x, w, p, cfg: MLAConfig, positions):
    """One layer's attention inputs for x (n, n_embd), already normed: Q's no-RoPE
    and rotated parts (n, H, nope) and (n, H, rope), the normed latent (n, rank),
    K's rotated RoPE part (n, rope)."""
    x = x.astype(np.float64)
    if p + "attn_q.weight" in w:
        q = x @ w[p + "attn_q.weight"].T
    else:
        q = _rms_norm(x @ w[p + "attn_q_a.weight"].T, w[p + "attn_q_a_norm.weight"], cfg.rms_eps)
        q = q @ w[p + "attn_q_b.weight"].T
    q = q.reshape(len(x), cfg.n_head, cfg.head_dim_k)
    scale = 1.0 / cfg.yarn if cfg.yarn else 1.0
    q_pe = _rope(q[..., cfg.qk_nope:], positions, cfg.rope_base, False, scale=scale, yarn=_yarn(cfg))
    kv = x @ w[p + "attn_kv_a_mqa.weight"].T
    latent = _rms_norm(kv[:, : cfg.kv_lora_rank], w[p + "attn_kv_a_norm.weight"], cfg.rms_eps)
    k_pe = _rope(kv[:, None, cfg.kv_lora_rank:], positions, cfg.rope_base, False, scale=scale, yarn=_yarn(cfg))
    return q[..., : cfg.qk_nope], q_pe, latent, k_pe[:, 0]


def mla_attention(x, w, p, cfg: MLAConfig, positions, form: str):
    """One layer's attention output (n, n_head * v_head_dim), before attn_output,
    causal over x's tokens: ``naive`` decompresses K and V per head from the
    latent (kv_b_proj, as the model is defined); ``absorbed`` attends over the
    latent with wk_b folded into Q and wv_b applied after (llama.cpp's form)."""
    q_nope, q_pe, latent, k_pe = mla_projections(x, w, p, cfg, positions)
    k_b = w[p + "attn_k_b.weight"].astype(np.float64)   # (H, rank, nope)
    v_b = w[p + "attn_v_b.weight"].astype(np.float64)   # (H, v, rank)
    n = len(x)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    out = []
    for head in range(cfg.n_head):
        rope_part = q_pe[:, head] @ k_pe.T
        if form == "naive":
            k_nope, v = latent @ k_b[head], latent @ v_b[head].T
            scores = q_nope[:, head] @ k_nope.T + rope_part
        else:
            scores = (q_nope[:, head] @ k_b[head].T) @ latent.T + rope_part
        probs = _softmax(np.where(allowed, scores * kq_scale(cfg), -np.inf))
        out.append(probs @ v if form == "naive" else (probs @ latent) @ v_b[head].T)
    return np.concatenate(out, axis=-1)


def _route(logits, cfg: MLAConfig, bias):
    gating = cfg.gating or "softmax"
    probs = _softmax(logits) if gating == "softmax" else 1.0 / (1.0 + np.exp(-logits))
    choice = probs if bias is None else probs + bias
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, : cfg.n_expert_used]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if cfg.expert_norm:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    if cfg.expert_scale not in (0.0, 1.0):
        weights = weights * cfg.expert_scale
    return ids, weights


def _ffn(h, w, p, cfg: MLAConfig):
    def gated(x, gate, up, down):
        return (_silu(x @ w[gate].T) * (x @ w[up].T)) @ w[down].T
    if p + "ffn_gate_inp.weight" not in w:
        return gated(h, p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight")
    ids, weights = _route(h @ w[p + "ffn_gate_inp.weight"].T, cfg, w.get(p + "exp_probs_b.bias"))
    out = np.zeros_like(h)
    for e in range(cfg.n_expert):
        rows, slot = np.nonzero(ids == e)
        if rows.size:
            act = _silu(h[rows] @ w[p + "ffn_gate_exps.weight"][e].T) * (h[rows] @ w[p + "ffn_up_exps.weight"][e].T)
            out[rows] += weights[rows, slot][:, None] * (act @ w[p + "ffn_down_exps.weight"][e].T)
    if p + "ffn_up_shexp.weight" in w:
        out = out + gated(h, p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight", p + "ffn_down_shexp.weight")
    return out


def reference_logits(w, cfg: MLAConfig, tokens, form: str = "absorbed") -> np.ndarray:
    """(n_tokens, n_vocab) logits of one sequence, in float64."""
    x = w["token_embd.weight"][np.asarray(tokens)].astype(np.float64)
    positions = np.arange(len(tokens), dtype=np.float64)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        x = x + mla_attention(h, w, p, cfg, positions, form) @ w[p + "attn_output.weight"].T
        x = x + _ffn(_rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps), w, p, cfg)
    x = _rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
