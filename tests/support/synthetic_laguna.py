"""Tiny synthetic Laguna models, written as llama.cpp's converter writes them
(conversion/laguna.py: LagunaModel, over TextModel.set_gguf_parameters), and
a NumPy reference of their forward pass.

The converter's layout: attention.head_count an array, a count per layer
(num_attention_heads_per_layer, or num_attention_heads repeated); key_length
and value_length the head width; rope.dimension_count the full layers'
rotated dims (head_dim * partial_rotary_factor) and rope.dimension_count_swa
the sliding ones'; rope.freq_base and rope.freq_base_swa; YaRN keys from the
full layers' rope parameters; sliding_window only where the model has one
(M.1 has none); g_proj as attn_gate (n_head outputs per head, or n_head *
head_dim per element); the router's e_score_correction_bias as
exp_probs_b.bias; expert_feed_forward_length, expert_shared_feed_forward_length,
expert_weights_norm (always true), expert_weights_scale
(moe_routed_scaling_factor), expert_gating_func sigmoid and
leading_dense_block_count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

from synthetic import StoredWeights, Yarn, _attend, _rms_norm, _rope, _silu, write_family_model


@dataclass(frozen=True)
class LagunaConfig:
    """Shaped like Laguna-XS.2 by default: a full-attention layer then three
    sliding ones, with more heads in the sliding ones; YaRN on the full
    layers over half of each head, plain RoPE over all of it in the window;
    a gate per head; one dense layer, then 8 experts (2 used) and a shared
    expert of another width."""
    arch: str = "laguna"
    n_vocab: int = 96
    n_embd: int = 64
    n_layer: int = 6
    heads_full: int = 4
    heads_swa: int = 6
    n_head_kv: int = 2
    head_dim: int = 16
    n_rot: int = 8                   # the full layers' (partial_rotary_factor 0.5)
    n_rot_swa: int = 16
    n_swa: int = 5                   # 0: no sliding_window key, every layer full (M.1)
    per_element_gate: bool = False   # M.1's gate; XS.2's is per head
    n_ff: int = 96                   # the leading dense layers' FFN
    n_ctx_train: int = 2048
    rope_base: float = 500000.0
    rope_base_swa: float = 10000.0
    yarn: float = 4.0                # the full layers' YaRN factor (0: none)
    yarn_orig_ctx: int = 16
    rms_eps: float = 1e-6
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ff_shexp: int = 64
    n_dense_lead: int = 1
    expert_scale: float = 2.5        # moe_routed_scaling_factor
    wtype: str = "f32"
    embd_type: str = "f32"
    tied: bool = False
    seed: int = 0
    extra_keys: tuple = ()           # ((key, value), ...) written instead ("{arch}" expanded)
    drop_keys: tuple = ()            # keys the converter writes, left out
    drop: tuple = ()                 # tensors left out
    cut: tuple = ()                  # ((name, axis, length), ...): tensors cut (numpy order)

    def sliding(self, i: int) -> bool:
        """XS.2's pattern (llama.cpp's set_swa_pattern(4, dense_first)): layer i slides unless i % 4 == 0."""
        return self.n_swa > 0 and i % 4 != 0

    def heads(self, i: int) -> int:
        return self.heads_swa if self.sliding(i) else self.heads_full

    def but(self, **kw) -> "LagunaConfig":
        return replace(self, **kw)

    def tensor_type(self, name: str, arr: np.ndarray) -> str:
        if arr.ndim < 2 or name.endswith(".bias") or name.endswith("ffn_gate_inp.weight"):
            return "f32"
        return self.embd_type if name == "token_embd.weight" else self.wtype


def make_weights(cfg: LagunaConfig) -> dict[str, np.ndarray]:
    """Deterministic weights from cfg.seed, numpy order ((n_out, n_in) for a matrix)."""
    rng = np.random.default_rng(cfg.seed)
    f32 = np.float32

    def mat(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(f32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(f32)

    e, hd = cfg.n_embd, cfg.head_dim
    w = {"token_embd.weight": mat(cfg.n_vocab, e, scale=1.0)}
    for i in range(cfg.n_layer):
        p, heads = f"blk.{i}.", cfg.heads(i)
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = mat(heads * hd, e)
        w[p + "attn_k.weight"] = mat(cfg.n_head_kv * hd, e)
        w[p + "attn_v.weight"] = mat(cfg.n_head_kv * hd, e)
        w[p + "attn_output.weight"] = mat(e, heads * hd)
        w[p + "attn_q_norm.weight"] = norm(hd)
        w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "attn_gate.weight"] = mat(heads * hd if cfg.per_element_gate else heads, e)
        w[p + "ffn_norm.weight"] = norm(e)
        if i < cfg.n_dense_lead:
            w[p + "ffn_gate.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
            continue
        # A router scaled up, so that the choice of experts is clear-cut rather than a near tie.
        w[p + "ffn_gate_inp.weight"] = mat(cfg.n_expert, e, scale=4.0 / math.sqrt(e))
        w[p + "exp_probs_b.bias"] = (0.1 * rng.standard_normal(cfg.n_expert)).astype(f32)
        w[p + "ffn_gate_exps.weight"] = mat(cfg.n_expert, cfg.n_ff_exp, e)
        w[p + "ffn_up_exps.weight"] = mat(cfg.n_expert, cfg.n_ff_exp, e)
        w[p + "ffn_down_exps.weight"] = mat(cfg.n_expert, e, cfg.n_ff_exp)
        w[p + "ffn_gate_shexp.weight"] = mat(cfg.n_ff_shexp, e)
        w[p + "ffn_up_shexp.weight"] = mat(cfg.n_ff_shexp, e)
        w[p + "ffn_down_shexp.weight"] = mat(e, cfg.n_ff_shexp)
    w["output_norm.weight"] = norm(e)
    if not cfg.tied:
        w["output.weight"] = mat(cfg.n_vocab, e)
    return w


def _add_keys(writer: gguf.GGUFWriter, cfg: LagunaConfig) -> None:
    """The keys TextModel.set_gguf_parameters and then LagunaModel.set_gguf_parameters
    write, in their order (the per-layer head_count overwrites the base's
    number in its place)."""
    heads = [cfg.heads(i) for i in range(cfg.n_layer)]
    keys: list[tuple[str, Callable, object]] = [
        ("block_count", writer.add_block_count, cfg.n_layer),
        ("context_length", writer.add_context_length, cfg.n_ctx_train),
        ("embedding_length", writer.add_embedding_length, cfg.n_embd),
        ("feed_forward_length", writer.add_feed_forward_length, cfg.n_ff),
        ("attention.head_count", writer.add_head_count, heads),
        ("attention.head_count_kv", writer.add_head_count_kv, cfg.n_head_kv),
    ]
    if cfg.yarn:
        keys += [("rope.scaling.type", writer.add_rope_scaling_type, gguf.RopeScalingType.YARN),
                 ("rope.scaling.factor", writer.add_rope_scaling_factor, cfg.yarn),
                 ("rope.scaling.original_context_length", writer.add_rope_scaling_orig_ctx_len, cfg.yarn_orig_ctx)]
    keys += [
        ("rope.freq_base", writer.add_rope_freq_base, cfg.rope_base),
        ("rope.freq_base_swa", writer.add_rope_freq_base_swa, cfg.rope_base_swa if cfg.n_swa else None),
        ("attention.layer_norm_rms_epsilon", writer.add_layer_norm_rms_eps, cfg.rms_eps),
        ("expert_count", writer.add_expert_count, cfg.n_expert),
        ("expert_used_count", writer.add_expert_used_count, cfg.n_expert_used),
        ("attention.key_length", writer.add_key_length, cfg.head_dim),
        ("attention.value_length", writer.add_value_length, cfg.head_dim),
        ("vocab_size", writer.add_vocab_size, cfg.n_vocab),
        ("attention.sliding_window", writer.add_sliding_window, cfg.n_swa or None),
        ("expert_feed_forward_length", writer.add_expert_feed_forward_length, cfg.n_ff_exp),
        ("expert_shared_feed_forward_length", writer.add_expert_shared_feed_forward_length, cfg.n_ff_shexp),
        ("expert_weights_norm", writer.add_expert_weights_norm, True),
        ("expert_weights_scale", writer.add_expert_weights_scale, cfg.expert_scale),
        ("expert_gating_func", writer.add_expert_gating_func, gguf.ExpertGatingFuncType.SIGMOID),
        ("leading_dense_block_count", writer.add_leading_dense_block_count, cfg.n_dense_lead),
        ("rope.dimension_count", writer.add_rope_dimension_count, cfg.n_rot),
        ("rope.dimension_count_swa", writer.add_rope_dimension_count_swa, cfg.n_rot_swa if cfg.n_swa else None),
    ]
    overridden = {key.format(arch=cfg.arch) for key, _ in cfg.extra_keys}
    for name, add, value in keys:
        if value is not None and name not in cfg.drop_keys and f"{cfg.arch}.{name}" not in overridden:
            add(value)
    for key, value in cfg.extra_keys:
        key = key.format(arch=cfg.arch)
        if isinstance(value, tuple):   # an array (a per-layer head count, say)
            writer.add_array(key, list(value))
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)


def write_laguna_model(path: Path, cfg: LagunaConfig,
                       extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None) -> StoredWeights:
    """Write ``cfg`` to ``path``; returns the weights exactly as stored (dequantized)."""
    return write_family_model(path, cfg, make_weights(cfg), _add_keys, extra_metadata)


# --------------------------------------------------------------------------
# The NumPy reference, in float64.

def softplus(x):
    """log(1 + e^x), without overflow for large x."""
    return np.logaddexp(0.0, x)


def gated_attention(out, gate, per_element: bool):
    """The attention's output (n, n_head, head_dim) times softplus(gate): gate
    (n, n_head) one value a head, or (n, n_head * head_dim) one an element."""
    n, n_head, hd = out.shape
    g = softplus(gate).reshape(n, n_head, hd if per_element else 1)
    return (out * g).reshape(n, n_head * hd)


def _route(logits, bias, cfg: LagunaConfig):
    probs = 1.0 / (1.0 + np.exp(-logits))
    ids = np.argsort(-(probs + bias), axis=-1, kind="stable")[:, : cfg.n_expert_used]
    weights = np.take_along_axis(probs, ids, axis=-1)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return ids, weights * cfg.expert_scale if cfg.expert_scale not in (0.0, 1.0) else weights


def _ffn(h, w, p, cfg: LagunaConfig):
    def gated(x, gate, up, down):
        return (_silu(x @ w[gate].T) * (x @ w[up].T)) @ w[down].T
    if p + "ffn_gate_inp.weight" not in w:
        return gated(h, p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight")
    ids, weights = _route(h @ w[p + "ffn_gate_inp.weight"].T, w[p + "exp_probs_b.bias"], cfg)
    out = np.zeros_like(h)
    for e in range(cfg.n_expert):
        rows, slot = np.nonzero(ids == e)
        if rows.size:
            act = _silu(h[rows] @ w[p + "ffn_gate_exps.weight"][e].T) * (h[rows] @ w[p + "ffn_up_exps.weight"][e].T)
            out[rows] += weights[rows, slot][:, None] * (act @ w[p + "ffn_down_exps.weight"][e].T)
    return out + gated(h, p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight", p + "ffn_down_shexp.weight")


def reference_logits(w, cfg: LagunaConfig, tokens) -> np.ndarray:
    """(n_tokens, n_vocab) logits of one sequence, in float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = w["token_embd.weight"][np.asarray(tokens)]
    n, hd = len(tokens), cfg.head_dim
    pos = np.arange(n, dtype=np.float64)
    causal = np.tril(np.ones((n, n), dtype=bool))
    window = causal & ((np.arange(n)[:, None] - np.arange(n)[None, :]) < cfg.n_swa)
    yarn = Yarn(cfg.yarn, cfg.yarn_orig_ctx) if cfg.yarn else None
    for i in range(cfg.n_layer):
        p, heads, swa = f"blk.{i}.", cfg.heads(i), cfg.sliding(i)
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = _rms_norm((h @ w[p + "attn_q.weight"].T).reshape(n, heads, hd), w[p + "attn_q_norm.weight"], cfg.rms_eps)
        k = _rms_norm((h @ w[p + "attn_k.weight"].T).reshape(n, cfg.n_head_kv, hd), w[p + "attn_k_norm.weight"],
                      cfg.rms_eps)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, cfg.n_head_kv, hd)
        if swa:   # plain RoPE, the window's base and width
            q, k = (_rope(t, pos, cfg.rope_base_swa, True, n_rot=cfg.n_rot_swa) for t in (q, k))
        else:
            scale = 1.0 / cfg.yarn if cfg.yarn else 1.0
            q, k = (_rope(t, pos, cfg.rope_base, True, n_rot=cfg.n_rot, scale=scale, yarn=yarn) for t in (q, k))
        out = _attend(q, k, v, window if swa else causal, 1.0 / math.sqrt(hd))
        out = gated_attention(out, h @ w[p + "attn_gate.weight"].T, cfg.per_element_gate)
        x = x + out @ w[p + "attn_output.weight"].T
        x = x + _ffn(_rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps), w, p, cfg)
    x = _rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
