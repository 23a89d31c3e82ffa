"""Tiny Mamba-2 hybrids (``nemotron_h``, ``nemotron_h_moe``, ``granitehybrid``)
as llama.cpp's converter writes them (conversion/nemotron.py: NemotronHModel
over conversion/granite.py: GraniteHybridModel and conversion/mamba.py:
Mamba2Model), and a NumPy reference of their forward pass.

Granite 4.0 H (``granitehybrid``): ``attention.head_count_kv`` per layer (0
for Mamba-2), ``feed_forward_length`` one number (the experts' width too),
every layer an FFN after ``ffn_norm`` (SwiGLU, or softmax-routed experts and
a shared expert), ``rope.scaling.finetuned`` false (no RoPE), and Granite's
``embedding_scale``, ``residual_scale``, ``attention.scale``, ``logit_scale``.

The converter's layout: ``attention.head_count_kv`` and
``feed_forward_length`` one per layer (KV heads on the attention layers,
the FFN width on the MLP or experts layers, 0 elsewhere: a layer with
neither is Mamba-2); ``ssm.*`` (time_step_rank = the Mamba heads,
inner_size = heads * head width); only ``attention.layer_norm_epsilon``;
``ssm_a`` = -exp(A_log) and ``ssm_d`` as (heads, 1), ``ssm_norm`` as
(groups, group width), ``ssm_conv1d`` squeezed to (channels, d_conv), all
F32 (numpy order here: ggml's reversed).

The reference follows the definition (transformers' NemotronHMamba2Mixer,
its torch_forward) in float64: in_proj to z, xBC and dt; xBC convolved
causally with a kernel per channel plus a bias, SiLU; the selective scan per
head, h_t = exp(dt A) h_{t-1} + dt B_t x_t, y_t = C_t h_t + D x_t, dt =
softplus(dt + dt_bias), B and C shared by the heads of a group; y * SiLU(z);
an RMS norm over each group's channels; out_proj.  :func:`mamba2_layer`
also carries the state (the convolution's last d_conv - 1 inputs and the
scan's state) from a previous call, so that a sequence run in pieces equals
it run whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

from synthetic import StoredWeights, _attend, _matmul, _rms_norm, _silu, write_family_model
from synthetic_stream import random_matrices

MAMBA2_ARCHS = ("nemotron_h", "nemotron_h_moe", "granitehybrid")
# The real interleaves, a letter per layer as the configs' hybrid_override_pattern writes them
# (M Mamba-2, * attention, - MLP, E experts).  Nemotron-H-8B's first 26 of 52 layers:
NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*"
# Nemotron-3-Nano-30B-A3B's first 26 of 52:
NEMOTRON_3_NANO = "MEMEM*EMEMEM*EMEMEM*EMEMEM*"
# Granite 4.0 H Tiny's first 20 of 40 (attention at 5 and 15; an FFN after every layer):
GRANITE_4_H_TINY = "MMMMM*MMMMMMMMM*MMMM"


@dataclass(frozen=True)
class Mamba2Config:
    arch: str = "nemotron_h"
    n_vocab: int = 96
    n_embd: int = 64
    pattern: str = "M-M*M-M"         # the layers, a letter each (above)
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128                  # the MLP layers' width
    n_ctx_train: int = 2048
    norm_eps: float = 1e-5           # attention.layer_norm_epsilon (the only epsilon written)
    ssm_d_conv: int = 4
    ssm_d_state: int = 16
    ssm_n_group: int = 2
    ssm_n_head: int = 8              # time_step_rank
    ssm_head_dim: int = 8            # inner_size = ssm_n_head * ssm_head_dim
    # experts (nemotron_h_moe)
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ff_shexp: int = 64
    expert_norm: bool = True
    expert_scale: float = 2.5
    # Granite 4.0 H (granitehybrid): experts (n_expert, n_expert_used, n_ff wide, n_ff_shexp shared) or
    # the dense SwiGLU FFN, and its scalars (Granite 4.0 H Tiny's)
    granite_experts: bool = True
    embedding_scale: float = 12.0
    residual_scale: float = 0.22
    attention_scale: float = 0.0078125
    logit_scale: float = 6.0
    wtype: str = "f32"
    embd_type: str = "f32"
    tied: bool = False
    seed: int = 0
    extra_keys: tuple = ()           # ((key, value), ...) written as-is ("{arch}" expanded)
    drop_keys: tuple = ()            # keys the converter writes, left out
    kv_override: Optional[tuple] = None   # head_count_kv written instead (broken files)
    ff_override: Optional[tuple] = None   # feed_forward_length written instead
    drop: tuple = ()                 # tensors left out
    cut: tuple = ()                  # ((name, axis, length), ...): tensors cut (numpy order)

    @property
    def n_layer(self) -> int:
        return len(self.pattern)

    @property
    def granite(self) -> bool:
        return self.arch == "granitehybrid"

    @property
    def d_inner(self) -> int:
        return self.ssm_n_head * self.ssm_head_dim

    @property
    def channels(self) -> int:
        return self.d_inner + 2 * self.ssm_n_group * self.ssm_d_state

    def but(self, **kw) -> "Mamba2Config":
        return replace(self, **kw)

    def tensor_type(self, name: str, arr: np.ndarray) -> str:
        if arr.ndim < 2 or name.endswith(".bias") or name.endswith("ffn_gate_inp.weight") \
                or any(name.endswith(s) for s in (".ssm_a", ".ssm_d", "ssm_norm.weight", "ssm_conv1d.weight")):
            return "f32"
        return self.embd_type if name == "token_embd.weight" else self.wtype


def make_weights(cfg: Mamba2Config, stream: bool = False) -> dict[str, np.ndarray]:
    """Deterministic weights from cfg.seed, numpy order ((n_out, n_in) for a matrix); with
    ``stream``, the matrices are synthetic_stream.RandomTensors, made only while written."""
    rng = np.random.default_rng(cfg.seed)
    f32 = np.float32
    e = cfg.n_embd

    def mat(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(f32)
    if stream:
        mat = random_matrices(cfg.seed)

    def norm(*shape):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(f32)

    w = {"token_embd.weight": mat(cfg.n_vocab, e, scale=1.0)}
    nh, ng = cfg.ssm_n_head, cfg.ssm_n_group
    for i, kind in enumerate(cfg.pattern):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(e)
        if kind == "M":
            w[p + "ssm_in.weight"] = mat(2 * cfg.d_inner + 2 * ng * cfg.ssm_d_state + nh, e)
            w[p + "ssm_conv1d.weight"] = mat(cfg.channels, cfg.ssm_d_conv, scale=0.5)
            w[p + "ssm_conv1d.bias"] = mat(cfg.channels, scale=0.1)
            # time steps softplus(dt + bias) of about 0.05 to 0.5, decays A of -1 to -8: a state that
            # remembers some tokens back
            w[p + "ssm_dt.bias"] = (rng.uniform(-3.0, -0.5, nh)).astype(f32)
            w[p + "ssm_a"] = (-np.exp(rng.uniform(0.0, math.log(8.0), nh))).astype(f32).reshape(nh, 1)
            w[p + "ssm_d"] = norm(nh).reshape(nh, 1)
            w[p + "ssm_norm.weight"] = norm(ng, cfg.d_inner // ng)
            w[p + "ssm_out.weight"] = mat(e, cfg.d_inner)
        elif kind == "*":
            w[p + "attn_q.weight"] = mat(cfg.n_head * cfg.head_dim, e)
            w[p + "attn_k.weight"] = mat(cfg.n_head_kv * cfg.head_dim, e)
            w[p + "attn_v.weight"] = mat(cfg.n_head_kv * cfg.head_dim, e)
            w[p + "attn_output.weight"] = mat(e, cfg.n_head * cfg.head_dim)
        elif kind == "-":
            w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
        elif kind == "E":
            # A router scaled up, so that the choice of experts is clear-cut rather than a near tie.
            w[p + "ffn_gate_inp.weight"] = mat(cfg.n_expert, e, scale=4.0 / math.sqrt(e))
            w[p + "exp_probs_b.bias"] = (0.1 * rng.standard_normal(cfg.n_expert)).astype(f32)
            w[p + "ffn_up_exps.weight"] = mat(cfg.n_expert, cfg.n_ff_exp, e)
            w[p + "ffn_down_exps.weight"] = mat(cfg.n_expert, e, cfg.n_ff_exp)
            w[p + "ffn_up_shexp.weight"] = mat(cfg.n_ff_shexp, e)
            w[p + "ffn_down_shexp.weight"] = mat(e, cfg.n_ff_shexp)
        else:
            raise ValueError(f"layer letter {kind!r}")
        if cfg.granite:
            w[p + "ffn_norm.weight"] = norm(e)
            if cfg.granite_experts:
                w[p + "ffn_gate_inp.weight"] = mat(cfg.n_expert, e, scale=4.0 / math.sqrt(e))
                w[p + "ffn_gate_exps.weight"] = mat(cfg.n_expert, cfg.n_ff, e)
                w[p + "ffn_up_exps.weight"] = mat(cfg.n_expert, cfg.n_ff, e)
                w[p + "ffn_down_exps.weight"] = mat(cfg.n_expert, e, cfg.n_ff)
                w[p + "ffn_gate_shexp.weight"] = mat(cfg.n_ff_shexp, e)
                w[p + "ffn_up_shexp.weight"] = mat(cfg.n_ff_shexp, e)
                w[p + "ffn_down_shexp.weight"] = mat(e, cfg.n_ff_shexp)
            else:
                w[p + "ffn_gate.weight"] = mat(cfg.n_ff, e)
                w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
                w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
    w["output_norm.weight"] = norm(e)
    if not cfg.tied:
        w["output.weight"] = mat(cfg.n_vocab, e)
    return w


def _add_keys(writer: gguf.GGUFWriter, cfg: Mamba2Config) -> None:
    """The keys NemotronHModel (or GraniteHybridModel).set_gguf_parameters writes (through its parents)."""
    a = cfg.arch
    if cfg.granite:
        return _add_granite_keys(writer, cfg)
    moe = a == "nemotron_h_moe"
    values = {
        "context_length": cfg.n_ctx_train,
        "embedding_length": cfg.n_embd,
        "block_count": cfg.n_layer,
        "attention.head_count": cfg.n_head,
        "attention.layer_norm_epsilon": cfg.norm_eps,
        "ssm.conv_kernel": cfg.ssm_d_conv,
        "ssm.state_size": cfg.ssm_d_state,
        "ssm.group_count": cfg.ssm_n_group,
        "ssm.inner_size": cfg.d_inner,
        "ssm.time_step_rank": cfg.ssm_n_head,
        "attention.key_length": cfg.head_dim,
        "attention.value_length": cfg.head_dim,
    }
    ffn_letter = "E" if moe else "-"
    kv = cfg.kv_override or tuple(cfg.n_head_kv if k == "*" else 0 for k in cfg.pattern)
    ff = cfg.ff_override or tuple((cfg.n_ff_exp if moe else cfg.n_ff) if k == ffn_letter else 0 for k in cfg.pattern)
    arrays = {"attention.head_count_kv": list(kv), "feed_forward_length": list(ff)}
    if moe:
        values.update({"expert_used_count": cfg.n_expert_used, "expert_feed_forward_length": cfg.n_ff_exp,
                       "expert_shared_feed_forward_length": cfg.n_ff_shexp, "expert_count": cfg.n_expert,
                       "expert_shared_count": 1, "expert_weights_norm": cfg.expert_norm,
                       "expert_weights_scale": cfg.expert_scale, "expert_group_count": 1})
    for name, value in values.items():
        if name in cfg.drop_keys:
            continue
        key = f"{a}.{name}"
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    for name, value in arrays.items():
        if name not in cfg.drop_keys:
            writer.add_array(f"{a}.{name}", value)
    writer.add_rope_scaling_finetuned(False)   # GraniteHybridModel: no RoPE in the hybrids
    _add_extra_keys(writer, cfg)


def _add_extra_keys(writer: gguf.GGUFWriter, cfg: Mamba2Config) -> None:
    for key, value in cfg.extra_keys:
        key = key.format(arch=cfg.arch)
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, (list, tuple)):
            writer.add_array(key, list(value))
        else:
            writer.add_uint32(key, value)


def _add_granite_keys(writer: gguf.GGUFWriter, cfg: Mamba2Config) -> None:
    """The keys GraniteHybridModel.set_gguf_parameters writes (GraniteMoeModel's, then its own)."""
    values: dict = {
        "context_length": cfg.n_ctx_train,
        "embedding_length": cfg.n_embd,
        "block_count": cfg.n_layer,
        "feed_forward_length": cfg.n_ff,
        "attention.head_count": cfg.n_head,
        "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": cfg.norm_eps,
        "vocab_size": cfg.n_vocab,
        "rope.dimension_count": cfg.head_dim,
        "attention.scale": cfg.attention_scale,
        "embedding_scale": cfg.embedding_scale,
        "residual_scale": cfg.residual_scale,
        "logit_scale": cfg.logit_scale,
        "ssm.conv_kernel": cfg.ssm_d_conv,
        "ssm.state_size": cfg.ssm_d_state,
        "ssm.group_count": cfg.ssm_n_group,
        "ssm.inner_size": cfg.d_inner,
        "ssm.time_step_rank": cfg.ssm_n_head,
    }
    if cfg.granite_experts:
        values.update({"expert_count": cfg.n_expert, "expert_used_count": cfg.n_expert_used,
                       "expert_shared_feed_forward_length": cfg.n_ff_shexp})
    for name, value in values.items():
        if name in cfg.drop_keys:
            continue
        key = f"{cfg.arch}.{name}"
        if isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    if "attention.head_count_kv" not in cfg.drop_keys:
        kv = cfg.kv_override or tuple(cfg.n_head_kv if k == "*" else 0 for k in cfg.pattern)
        writer.add_array(f"{cfg.arch}.attention.head_count_kv", list(kv))
    writer.add_rope_scaling_finetuned(False)
    _add_extra_keys(writer, cfg)


def write_mamba2_model(path: Path, cfg: Mamba2Config,
                       extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None,
                       stream: bool = False) -> StoredWeights:
    """Write ``cfg`` to ``path``; returns the weights exactly as stored (dequantized).  With
    ``stream`` (a real-sized benchmark file), random matrices made a few million values at a
    time as they are written (synthetic_stream.py), and nothing returned."""
    return write_family_model(path, cfg, make_weights(cfg, stream), _add_keys, extra_metadata)


# --------------------------------------------------------------------------
# The NumPy reference, in float64.

def _softplus(x):
    return np.where(x <= 20.0, np.log1p(np.exp(np.minimum(x, 20.0))), x)


def ssm_conv(state: np.ndarray, xbc: np.ndarray, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The causal convolution ggml_ssm_conv computes: each channel of xbc (n, channels),
    after ``state`` (the last d_conv - 1 inputs), with its own kernel (channels, d_conv),
    oldest tap first: (n, channels), and the new state."""
    n, taps = len(xbc), kernel.shape[1]
    seen = np.concatenate([state, xbc])
    return sum(seen[i:i + n] * kernel[:, i] for i in range(taps)), seen[n:]


def ssm_scan(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
             c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mamba-2's selective scan, token by token, as its definition says: state
    (heads, head_dim, d_state), x (n, heads, head_dim), dt (n, heads) after
    softplus, a (heads), b and c (n, groups, d_state), the heads of a group
    next to each other.  Returns y (n, heads, head_dim) and the final state."""
    n, heads, _ = x.shape
    group_of = np.arange(heads) // (heads // b.shape[1])
    y = np.empty_like(x)
    for t in range(n):
        decay = np.exp(dt[t] * a)                                         # (heads)
        bt, ct = b[t][group_of], c[t][group_of]                          # (heads, d_state)
        state = state * decay[:, None, None] + (dt[t][:, None] * x[t])[:, :, None] * bt[:, None, :]
        y[t] = np.einsum("hds,hs->hd", state, ct)
    return y, state


def gated_group_rms_norm(y: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """y * SiLU(z), then an RMS norm over each group's channels (n, groups, width), scaled."""
    g = y * _silu(z)
    n = len(g)
    groups = g.reshape(n, weight.shape[0], -1)
    out = groups / np.sqrt(np.mean(groups * groups, axis=-1, keepdims=True) + eps) * weight
    return out.reshape(n, -1)


def mamba2_layer(h: np.ndarray, w, p: str, cfg: Mamba2Config, mm, state=None):
    """One Mamba-2 layer on h (n_tokens, n_embd), after ``state`` ((conv state,
    scan state); zeros for a new sequence): (its output, the state after it)."""
    n = len(h)
    di, ch, nh, ng, ds = cfg.d_inner, cfg.channels, cfg.ssm_n_head, cfg.ssm_n_group, cfg.ssm_d_state
    if state is None:
        state = (np.zeros((cfg.ssm_d_conv - 1, ch)), np.zeros((nh, cfg.ssm_head_dim, ds)))
    zxbcdt = mm(h, p + "ssm_in.weight")
    z, xbc, dt = zxbcdt[:, :di], zxbcdt[:, di:di + ch], zxbcdt[:, di + ch:]
    conv, conv_state = ssm_conv(state[0], xbc, w[p + "ssm_conv1d.weight"])
    xbc = _silu(conv + w[p + "ssm_conv1d.bias"])
    x = xbc[:, :di].reshape(n, nh, cfg.ssm_head_dim)
    b = xbc[:, di:di + ng * ds].reshape(n, ng, ds)
    c = xbc[:, di + ng * ds:].reshape(n, ng, ds)
    y, scan_state = ssm_scan(state[1], x, _softplus(dt + w[p + "ssm_dt.bias"]), w[p + "ssm_a"].reshape(nh), b, c)
    y = y + x * w[p + "ssm_d"].reshape(nh, 1)
    y = gated_group_rms_norm(y.reshape(n, di), z, w[p + "ssm_norm.weight"], cfg.norm_eps)
    return mm(y, p + "ssm_out.weight"), (conv_state, scan_state)


def _relu_sqr(x):
    return np.maximum(x, 0.0) ** 2


def _experts(h, w, p, cfg: Mamba2Config, mm):
    """Nemotron-3-Nano's routed experts: sigmoid router, top-k chosen with the
    selection bias, the chosen weights renormalised and scaled; squared-ReLU experts."""
    probs = 1.0 / (1.0 + np.exp(-mm(h, p + "ffn_gate_inp.weight")))
    out = np.zeros_like(h)
    for t in range(len(h)):
        chosen = np.argsort(-(probs[t] + w[p + "exp_probs_b.bias"]), kind="stable")[:cfg.n_expert_used]
        weights = probs[t][chosen]
        if cfg.expert_norm:
            weights = weights / weights.sum()
        weights = weights * cfg.expert_scale
        for e, wt in zip(chosen, weights):
            up = mm(h[t:t + 1], p + "ffn_up_exps.weight", e)
            out[t] += wt * mm(_relu_sqr(up), p + "ffn_down_exps.weight", e)[0]
    return out


def _granite_experts(h, w, p, cfg: Mamba2Config, mm):
    """Granite's routed experts: softmax router, top-k, the chosen weights
    renormalised (never scaled); SwiGLU experts."""
    logits = mm(h, p + "ffn_gate_inp.weight")
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(len(h)):
        chosen = np.argsort(-probs[t], kind="stable")[:cfg.n_expert_used]
        weights = probs[t][chosen] / probs[t][chosen].sum()
        for e, wt in zip(chosen, weights):
            g = mm(h[t:t + 1], p + "ffn_gate_exps.weight", e)
            u = mm(h[t:t + 1], p + "ffn_up_exps.weight", e)
            out[t] += wt * mm(_silu(g) * u, p + "ffn_down_exps.weight", e)[0]
    return out


def _swiglu(h, w, p, mm, suffix=""):
    g, u = mm(h, p + f"ffn_gate{suffix}.weight"), mm(h, p + f"ffn_up{suffix}.weight")
    return mm(_silu(g) * u, p + f"ffn_down{suffix}.weight")


def reference_hidden(weights, cfg: Mamba2Config, tokens) -> np.ndarray:
    """The output projection's input (the final normed hidden state), (n_tokens, n_embd)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    mm = _matmul(weights, w, False)
    tokens = np.asarray(tokens)
    n = len(tokens)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    x = w["token_embd.weight"][tokens]
    residual, kq_scale = 1.0, 1.0 / math.sqrt(cfg.head_dim)
    if cfg.granite:
        x = x * cfg.embedding_scale
        residual, kq_scale = cfg.residual_scale, cfg.attention_scale
    for i, kind in enumerate(cfg.pattern):
        p = f"blk.{i}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.norm_eps)
        if kind == "M":
            out, _ = mamba2_layer(h, w, p, cfg, mm)
        elif kind == "*":
            q = mm(h, p + "attn_q.weight").reshape(n, cfg.n_head, cfg.head_dim)
            k = mm(h, p + "attn_k.weight").reshape(n, cfg.n_head_kv, cfg.head_dim)
            v = mm(h, p + "attn_v.weight").reshape(n, cfg.n_head_kv, cfg.head_dim)
            out = mm(_attend(q, k, v, allowed, kq_scale).reshape(n, -1), p + "attn_output.weight")
        elif kind == "-":
            out = mm(_relu_sqr(mm(h, p + "ffn_up.weight")), p + "ffn_down.weight")
        else:
            out = _experts(h, w, p, cfg, mm) + mm(_relu_sqr(mm(h, p + "ffn_up_shexp.weight")),
                                                  p + "ffn_down_shexp.weight")
        x = x + residual * out
        if cfg.granite:
            h = _rms_norm(x, w[p + "ffn_norm.weight"], cfg.norm_eps)
            ffn = (_granite_experts(h, w, p, cfg, mm) + _swiglu(h, w, p, mm, "_shexp") if cfg.granite_experts
                   else _swiglu(h, w, p, mm))
            x = x + residual * ffn
    return _rms_norm(x, w["output_norm.weight"], cfg.norm_eps)


def reference_logits(weights, cfg: Mamba2Config, tokens) -> np.ndarray:
    x = reference_hidden(weights, cfg, tokens)
    name = "output.weight" if "output.weight" in weights else "token_embd.weight"
    logits = x @ weights[name].astype(np.float64).T
    return logits / cfg.logit_scale if cfg.granite else logits
