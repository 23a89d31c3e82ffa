"""Tiny random models written as GGUF files with the `gguf` package, and the
NumPy reference forward pass they are checked against.

The reference is written from the architectures' definitions (RMSNorm, RoPE,
grouped-query attention, gated FFN), in float64, independently of ggml.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import gguf
import numpy as np

import delta_net
import ggml_numerics as numerics
from kquants import quantize_q4_k, quantize_q6_k
from synthetic_lfm2 import LFM2_ARCHS, add_lfm2_keys, lfm2_hidden, lfm2_weights
from synthetic_stream import RandomTensor, write_streamed

QTYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q4_k": gguf.GGMLQuantizationType.Q4_K,
    "q6_k": gguf.GGMLQuantizationType.Q6_K,
    "mxfp4": gguf.GGMLQuantizationType.MXFP4,
}
# gguf can dequantize but not quantize these; tests/support/kquants.py does.
_OWN_QUANTIZERS = {"q4_k": quantize_q4_k, "q6_k": quantize_q6_k}


@dataclass(frozen=True)
class TinyConfig:
    arch: str = "qwen2"
    n_vocab: int = 96
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: Optional[int] = None    # written as key/value_length when set
    n_ff: int = 128
    n_ctx_train: int = 2048
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    tied: bool = False
    wtype: str = "f32"                # type of the matmul weights
    embd_type: str = "f32"            # type of token_embd (also the output's when tied)
    wtypes: tuple = ()                # ((name, type), ...) overriding wtype; "ffn_down.weight" names every layer's
    n_rot: Optional[int] = None       # rope.dimension_count when set (partial rotary)
    rope_linear: float = 0.0          # rope.scaling.type=linear with this factor when set
    n_swa: int = 0                    # gemma3 sliding window
    rope_freqs: bool = False          # llama3-style frequency factors
    seed: int = 0
    extra_keys: tuple = ()           # ((key template, value), ...) written as-is
    # Mixture of experts (qwen3moe, gpt-oss, glm4moe), as llama.cpp's converter writes them
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ff_shexp: Optional[int] = None  # qwen35moe's and qwen3next's shared expert width (default 2 * n_ff_exp)
    n_expert_shared: int = 1          # glm4moe's shared experts
    n_dense_lead: int = 1             # glm4moe's leading dense layers
    n_nextn: int = 1                  # glm4moe's multi-token-prediction layers (written, never run)
    expert_scale: float = 1.5         # glm4moe's expert_weights_scale
    yarn: float = 0.0                 # rope.scaling.type=yarn with this factor (gpt-oss, mistral3)
    yarn_orig_ctx: int = 256          # ... and this rope.scaling.original_context_length
    yarn_log_mul: float = 0.0         # mistral3's rope.scaling.yarn_log_multiplier
    attn_temp: float = 0.0            # mistral3's attention.temperature_scale
    # Gated DeltaNet hybrids (qwen35): every full_attention_interval-th layer attends, the rest recur
    ssm_d_conv: int = 4
    ssm_d_state: int = 16             # the head width of keys and values
    ssm_n_group: int = 2              # key heads
    ssm_dt_rank: int = 4              # value heads
    full_attention_interval: int = 4
    rope_sections: tuple = (3, 3, 2, 0)
    # Qwen3-Next (qwen3next): Q, K, V and z in one projection per head group (ssm_in), as older
    # converters wrote it, rather than attn_qkv and attn_gate; and its MTP layers (n_nextn, written
    # as the converter does, never run) where n_nextn is set
    ssm_in: bool = False
    # Qwen3.5's MTP block (n_nextn of them after n_layer, as the converter's _QwenMtpMixin writes
    # them), where mtp is set; mtp="agree": a block built to predict what the model does (the model's
    # layers barely move the residual stream, the block passes the token's embedding through), so
    # that its drafts are confirmed
    mtp: object = False
    # Gemma 4 (gemma4), as llama.cpp's converter writes it (conversion/gemma.py: Gemma4Model).
    # head_dim is the global layers' head width, n_swa the window, n_head_kv the sliding layers' KV heads.
    head_dim_swa: Optional[int] = None    # the sliding layers' head width (key/value_length_swa)
    swa_every: int = 3                # every swa_every-th layer is global, the others slide
    n_head_kv_global: Optional[int] = None  # the global layers' KV heads (head_count_kv then per layer)
    n_rot_swa: Optional[int] = None   # rope.dimension_count_swa
    rope_partial: float = 0.25        # the global layers' proportional RoPE: the fraction of a head that turns
    rope_base_swa: float = 10000.0    # rope.freq_base_swa
    n_kv_shared: int = 0              # attention.shared_kv_layers: the last layers reuse earlier K/V
    n_embd_per_layer: int = 0         # embedding_length_per_layer_input: per-layer token embeddings
    softcap: Optional[float] = 0.0    # final_logit_softcapping (gemma4: 0 none; None: key absent, llama.cpp caps at 30)
    k_eq_v: bool = False              # the global layers have no attn_v: V is K
    double_ffn: bool = False          # the shared-K/V layers' FFN twice as wide (feed_forward_length per layer)
    layer_scale: bool = False         # blk.N.layer_output_scale
    experts: bool = False             # gemma4 with experts beside each layer's dense FFN (26B-A4B)
    fused_gate_up: bool = True        # ... their gate and up stacked in ffn_gate_up_exps, as the converter writes
    # LFM2 (lfm2, lfm2moe; tests/support/synthetic_lfm2.py): a letter per layer, C a short-convolution
    # layer and A attention (default: the real model's kinds, cut to n_layer), and the convolution's width.
    # lfm2moe's leading dense layers are n_dense_lead.
    layer_types: str = ""
    conv_l_cache: int = 3
    kv_pattern: str = ""              # the kinds head_count_kv declares, where not the tensors' (broken files)
    # Broken files, for the tests of bad input: tensors left out, and ((name, axis, length), ...)
    # tensors cut to a length along an axis (numpy order).
    drop: tuple = ()
    cut: tuple = ()

    @property
    def hd(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def rot(self) -> int:
        return self.n_rot or self.hd

    @property
    def moe(self) -> bool:
        return self.arch in _MOE_ARCHS or (self.arch == "gemma4" and self.experts)

    def tensor_type(self, name: str, arr: np.ndarray) -> str:
        if arr.ndim < 2 or name.endswith(".bias") or name.endswith("ffn_gate_inp.weight") \
                or name.endswith("ssm_conv1d.weight") or name.endswith("shortconv.conv.weight"):
            return "f32"  # as llama.cpp's converter keeps them (the router too)
        if name == "token_embd.weight":
            return self.embd_type
        return next((t for key, t in self.wtypes if name == key or name.endswith("." + key)), self.wtype)

    def but(self, **kw) -> "TinyConfig":
        return replace(self, **kw)


_MOE_ARCHS = ("qwen3moe", "qwen3vlmoe", "gpt-oss", "glm4moe", "qwen35moe", "qwen3next", "lfm2moe", "minimax-m2")
_HYBRID_ARCHS = ("qwen35", "qwen35moe", "qwen3next")   # Gated DeltaNet layers beside gated attention
_NEXTN_ARCHS = ("glm4moe", "qwen3next")                # multi-token-prediction layers written after the rest


def _features(arch: str) -> dict:
    base = dict(bias=False, out_bias=False, qk_norm=False, post_norms=False, neox=True, gelu=False, sinks=False,
                ffn_norm="ffn_norm", qk_norm_all=False, nope_every=0)
    return dict(base, **{
        "qwen2": dict(bias=True),
        "qwen2vl": dict(bias=True),   # Qwen2 with multi-section RoPE (rope.dimension_sections)
        "llama": dict(neox=False),
        "mistral3": dict(neox=False),
        "qwen3": dict(qk_norm=True),
        "gemma3": dict(qk_norm=True, post_norms=True, gelu=True),
        "gemma4": dict(qk_norm=True, post_norms=True, gelu=True),
        "qwen3moe": dict(qk_norm=True),
        "qwen3vl": dict(qk_norm=True),      # Qwen3 with interleaved M-RoPE and deepstack (n_deepstack_layers)
        "qwen3vlmoe": dict(qk_norm=True),
        "gpt-oss": dict(bias=True, out_bias=True, sinks=True, ffn_norm="post_attention_norm"),
        "glm4moe": dict(bias=True, ffn_norm="post_attention_norm"),
        "qwen35": dict(qk_norm=True, ffn_norm="post_attention_norm"),
        "qwen35moe": dict(qk_norm=True, ffn_norm="post_attention_norm"),
        "qwen3next": dict(qk_norm=True, ffn_norm="post_attention_norm"),
        "seed_oss": dict(bias=True, ffn_norm="post_attention_norm"),
        "smollm3": dict(neox=False, nope_every=4),   # every 4th layer without RoPE
        "minimax-m2": dict(qk_norm_all=True),         # Q/K norms over all heads together
    }[arch])


def recurrent_layer(cfg: "TinyConfig", i: int) -> bool:
    return cfg.arch in _HYBRID_ARCHS and i < cfg.n_layer and (i + 1) % cfg.full_attention_interval != 0


def n_nextn(cfg: "TinyConfig") -> int:
    """The multi-token-prediction layers the file has after its n_layer."""
    if cfg.arch in ("qwen35", "qwen35moe"):
        return cfg.n_nextn if cfg.mtp else 0
    return cfg.n_nextn if cfg.arch in _NEXTN_ARCHS else 0


def _moe_layer(cfg: "TinyConfig", i: int) -> bool:
    return cfg.moe and not (cfg.arch == "glm4moe" and i < cfg.n_dense_lead)


def make_weights(cfg: TinyConfig) -> dict[str, np.ndarray]:
    """Random float32 weights, numpy shape (n_out, n_in) as gguf writes them."""
    if cfg.arch == "gemma4":
        return _gemma4_weights(cfg)
    if cfg.arch in LFM2_ARCHS:
        return lfm2_weights(cfg)
    rng = np.random.default_rng(cfg.seed)
    f = _features(cfg.arch)
    e, hd = cfg.n_embd, cfg.hd
    q, kv = cfg.n_head * hd, cfg.n_head_kv * hd

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((cfg.n_vocab, e)).astype(np.float32),
         "output_norm.weight": norm(e)}
    if not cfg.tied:
        w["output.weight"] = mat(cfg.n_vocab, e)
    if cfg.rope_freqs:
        w["rope_freqs.weight"] = (1.0 + rng.uniform(0, 3, cfg.rot // 2)).astype(np.float32)
    def vec(n, scale=0.1):
        return (scale * rng.standard_normal(n)).astype(np.float32)

    for i in range(cfg.n_layer + n_nextn(cfg)):
        p = f"blk.{i}."
        if recurrent_layer(cfg, i):   # Gated DeltaNet, as llama.cpp's converter writes it
            d_inner = cfg.ssm_d_state * cfg.ssm_dt_rank
            conv_dim = 2 * cfg.ssm_d_state * cfg.ssm_n_group + d_inner
            w[p + "attn_norm.weight"] = norm(e)
            qkv, z = mat(conv_dim, e), mat(d_inner, e)
            if cfg.ssm_in:
                w[p + "ssm_in.weight"] = qkvz_by_head_group(cfg, qkv, z)
            else:
                w[p + "attn_qkv.weight"] = qkv
                w[p + "attn_gate.weight"] = z
            w[p + "ssm_conv1d.weight"] = (rng.standard_normal((conv_dim, cfg.ssm_d_conv)) / 2).astype(np.float32)
            w[p + "ssm_dt.bias"] = vec(cfg.ssm_dt_rank, 0.5)
            w[p + "ssm_a"] = -np.exp(vec(cfg.ssm_dt_rank, 0.5))
            beta, alpha = mat(cfg.ssm_dt_rank, e), mat(cfg.ssm_dt_rank, e)
            if cfg.arch == "qwen3next":   # per key head: its value heads' beta, then their alpha
                w[p + "ssm_ba.weight"] = np.concatenate(
                    [beta.reshape(cfg.ssm_n_group, -1, e), alpha.reshape(cfg.ssm_n_group, -1, e)], axis=1
                ).reshape(2 * cfg.ssm_dt_rank, e)
            else:
                w[p + "ssm_beta.weight"] = beta
                w[p + "ssm_alpha.weight"] = alpha
            w[p + "ssm_norm.weight"] = norm(cfg.ssm_d_state)
            w[p + "ssm_out.weight"] = mat(e, d_inner)
        else:
            _attention_weights(w, cfg, f, p, mat, norm, vec)
        w[p + f["ffn_norm"] + ".weight"] = norm(e)
        if not _moe_layer(cfg, i):
            w[p + "ffn_gate.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
            if i >= cfg.n_layer:
                _nextn_weights(w, cfg, p, mat, norm)
            continue
        _expert_weights(w, cfg, i, p, mat, norm, vec)
    if cfg.mtp == "agree":
        _agreeing_mtp(w, cfg)
    return w


def _nextn_weights(w, cfg, p, mat, norm):
    """A NextN block's own tensors (the converter's names: blk.N.nextn.*)."""
    e = cfg.n_embd
    w[p + "nextn.eh_proj.weight"] = mat(e, 2 * e)
    w[p + "nextn.enorm.weight"] = norm(e)
    w[p + "nextn.hnorm.weight"] = norm(e)
    if cfg.arch in ("qwen3next", "qwen35", "qwen35moe"):
        w[p + "nextn.shared_head_norm.weight"] = norm(e)


def _agreeing_mtp(w, cfg):
    """The model's layers scaled to barely move the residual stream (the more
    layers, the less each), so its next token is nearly a function of the
    current one; and an MTP block that computes that function: the token's
    normed embedding through eh_proj = [I 0], its attention and FFN silent,
    the model's output norm."""
    e = cfg.n_embd
    outputs = ("attn_output", "ssm_out", "ffn_down", "ffn_down_exps", "ffn_down_shexp")
    for i in range(cfg.n_layer):
        for name in outputs:
            if f"blk.{i}.{name}.weight" in w:
                w[f"blk.{i}.{name}.weight"] *= 0.08 / cfg.n_layer
    p = f"blk.{cfg.n_layer}."
    w[p + "nextn.eh_proj.weight"] = np.concatenate([np.eye(e), np.zeros((e, e))], axis=1).astype(np.float32)
    w[p + "nextn.enorm.weight"] = np.ones(e, dtype=np.float32)
    for name in outputs:
        if f"{p}{name}.weight" in w:
            w[f"{p}{name}.weight"] = np.zeros_like(w[f"{p}{name}.weight"])
    w[p + "nextn.shared_head_norm.weight"] = w["output_norm.weight"].copy()


def qkvz_by_head_group(cfg: "TinyConfig", qkv: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Qwen3-Next's ssm_in from attn_qkv's and attn_gate's rows: per key head,
    its q, its k, its value heads' v, their z (the order the converter's
    Qwen3NextModel undoes into attn_qkv and attn_gate)."""
    d, H_k, e = cfg.ssm_d_state, cfg.ssm_n_group, qkv.shape[1]
    q, k, v = np.split(qkv, [H_k * d, 2 * H_k * d])
    parts = [x.reshape(H_k, -1, e) for x in (q, k, v, z)]
    return np.concatenate(parts, axis=1).reshape(-1, e)


def _attention_weights(w, cfg, f, p, mat, norm, vec):
    e, hd = cfg.n_embd, cfg.hd
    q, kv = cfg.n_head * hd, cfg.n_head_kv * hd
    w[p + "attn_norm.weight"] = norm(e)
    w[p + "attn_q.weight"] = mat(2 * q if cfg.arch in _HYBRID_ARCHS else q, e)   # Q and its gate
    w[p + "attn_k.weight"] = mat(kv, e)
    w[p + "attn_v.weight"] = mat(kv, e)
    w[p + "attn_output.weight"] = mat(e, q)
    if f["bias"]:
        for n, size in (("q", q), ("k", kv), ("v", kv)):
            w[p + f"attn_{n}.bias"] = vec(size)
    if f["out_bias"]:
        w[p + "attn_output.bias"] = vec(e)
    if f["sinks"]:
        w[p + "attn_sinks.weight"] = vec(cfg.n_head, 1.0)
    if f["qk_norm"] or f["qk_norm_all"]:
        w[p + "attn_q_norm.weight"] = norm(q if f["qk_norm_all"] else hd)
        w[p + "attn_k_norm.weight"] = norm(kv if f["qk_norm_all"] else hd)
    if f["post_norms"]:
        w[p + "post_attention_norm.weight"] = norm(e)
        w[p + "post_ffw_norm.weight"] = norm(e)


def _expert_weights(w, cfg, i, p, mat, norm, vec):
    e = cfg.n_embd
    # Experts stacked as llama.cpp's converter writes them: numpy (n_expert, n_out, n_in),
    # GGUF (n_in, n_out, n_expert).  A router scaled up, so that the choice of experts is
    # clear-cut rather than a near tie.
    x, fe = cfg.n_expert, cfg.n_ff_exp
    w[p + "ffn_gate_inp.weight"] = 4.0 * mat(x, e)
    w[p + "ffn_gate_exps.weight"] = np.stack([mat(fe, e) for _ in range(x)])
    w[p + "ffn_up_exps.weight"] = np.stack([mat(fe, e) for _ in range(x)])
    w[p + "ffn_down_exps.weight"] = np.stack([mat(e, fe) for _ in range(x)])
    if cfg.arch == "gpt-oss":
        w[p + "ffn_gate_inp.bias"] = vec(x)
        w[p + "ffn_gate_exps.bias"] = vec((x, fe))
        w[p + "ffn_up_exps.bias"] = vec((x, fe))
        w[p + "ffn_down_exps.bias"] = vec((x, e))
    if cfg.arch in ("glm4moe", "minimax-m2"):
        w[p + "exp_probs_b.bias"] = vec(x)
    if cfg.arch == "glm4moe":
        fs = fe * cfg.n_expert_shared
        w[p + "ffn_gate_shexp.weight"] = mat(fs, e)
        w[p + "ffn_up_shexp.weight"] = mat(fs, e)
        w[p + "ffn_down_shexp.weight"] = mat(e, fs)
    if cfg.arch in ("qwen35moe", "qwen3next"):   # one shared expert, gated by a sigmoid of its own projection
        fs = cfg.n_ff_shexp or 2 * fe
        w[p + "ffn_gate_inp_shexp.weight"] = vec(e, 1.0 / math.sqrt(e))
        w[p + "ffn_gate_shexp.weight"] = mat(fs, e)
        w[p + "ffn_up_shexp.weight"] = mat(fs, e)
        w[p + "ffn_down_shexp.weight"] = mat(e, fs)
    if i >= cfg.n_layer:   # the NextN block's own tensors
        _nextn_weights(w, cfg, p, mat, norm)


@dataclass(frozen=True)
class Gemma4Layer:
    """What llama.cpp makes of a gemma4 layer's hyperparameters."""
    swa: bool
    head_dim: int
    n_head_kv: int
    n_rot: int
    n_ff: int
    kv_source: int    # the layer whose K/V it attends over (itself, or an earlier one)


def gemma4_layers(cfg: TinyConfig) -> list[Gemma4Layer]:
    first_shared = cfg.n_layer - cfg.n_kv_shared
    out = []
    for i in range(cfg.n_layer):
        swa = cfg.n_swa > 0 and (i + 1) % cfg.swa_every != 0
        hd = (cfg.head_dim_swa or cfg.hd) if swa else cfg.hd
        kv = cfg.n_head_kv if swa else (cfg.n_head_kv_global or cfg.n_head_kv)
        n_rot = (cfg.n_rot_swa or cfg.head_dim_swa or cfg.hd) if swa else cfg.hd
        src = i if i < first_shared else first_shared - (2 if swa else 1)
        n_ff = cfg.n_ff * 2 if cfg.double_ffn and i >= first_shared else cfg.n_ff
        out.append(Gemma4Layer(swa, hd, kv, n_rot, n_ff, src))
    return out


def _gemma4_weights(cfg: TinyConfig) -> dict[str, np.ndarray]:
    """A gemma4 model's tensors as the converter writes them: per-layer head
    widths, shared-K/V layers without K/V weights, per-layer token
    embeddings, proportional RoPE factors, and experts with a fused gate/up."""
    rng = np.random.default_rng(cfg.seed)
    e, n_pl = cfg.n_embd, cfg.n_embd_per_layer

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    layers = gemma4_layers(cfg)
    w = {"token_embd.weight": rng.standard_normal((cfg.n_vocab, e)).astype(np.float32),
         "output_norm.weight": norm(e)}
    if not cfg.tied:
        w["output.weight"] = mat(cfg.n_vocab, e)
    if not all(lay.swa for lay in layers):
        turning = int(cfg.hd * cfg.rope_partial / 2)
        w["rope_freqs.weight"] = np.array([1.0] * turning + [1e30] * (cfg.hd // 2 - turning), dtype=np.float32)
    if n_pl:
        w["per_layer_token_embd.weight"] = rng.standard_normal((cfg.n_vocab, n_pl * cfg.n_layer)).astype(np.float32)
        w["per_layer_model_proj.weight"] = mat(n_pl * cfg.n_layer, e)
        w["per_layer_proj_norm.weight"] = norm(n_pl)
    for i, lay in enumerate(layers):
        p = f"blk.{i}."
        q, kv = cfg.n_head * lay.head_dim, lay.n_head_kv * lay.head_dim
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = mat(q, e)
        w[p + "attn_q_norm.weight"] = norm(lay.head_dim)
        if lay.kv_source == i:
            w[p + "attn_k.weight"] = mat(kv, e)
            w[p + "attn_k_norm.weight"] = norm(lay.head_dim)
            if not (cfg.k_eq_v and not lay.swa):
                w[p + "attn_v.weight"] = mat(kv, e)
        w[p + "attn_output.weight"] = mat(e, q)
        w[p + "post_attention_norm.weight"] = norm(e)
        w[p + "ffn_norm.weight"] = norm(e)
        w[p + "ffn_gate.weight"] = mat(lay.n_ff, e)
        w[p + "ffn_up.weight"] = mat(lay.n_ff, e)
        w[p + "ffn_down.weight"] = mat(e, lay.n_ff)
        w[p + "post_ffw_norm.weight"] = norm(e)
        if cfg.experts:
            x, fe = cfg.n_expert, cfg.n_ff_exp
            w[p + "ffn_gate_inp.weight"] = 4.0 * mat(x, e)
            w[p + "ffn_gate_inp.scale"] = norm(e)
            w[p + "pre_ffw_norm_2.weight"] = norm(e)
            w[p + "post_ffw_norm_1.weight"] = norm(e)
            w[p + "post_ffw_norm_2.weight"] = norm(e)
            gate = np.stack([mat(fe, e) for _ in range(x)])
            up = np.stack([mat(fe, e) for _ in range(x)])
            if cfg.fused_gate_up:
                w[p + "ffn_gate_up_exps.weight"] = np.concatenate([gate, up], axis=1)
            else:
                w[p + "ffn_gate_exps.weight"] = gate
                w[p + "ffn_up_exps.weight"] = up
            w[p + "ffn_down_exps.weight"] = np.stack([mat(e, fe) for _ in range(x)])
            w[p + "ffn_down_exps.scale"] = (0.5 + rng.uniform(0, 1, x)).astype(np.float32)
        if n_pl:
            # Scaled down: the residual stream it reads is ~sqrt(n_embd) large, and GELU's float16
            # table rounds large inputs coarsely (the NumPy reference then drifts from ggml).
            w[p + "inp_gate.weight"] = mat(n_pl, e) / math.sqrt(e)
            w[p + "proj.weight"] = mat(e, n_pl)
            w[p + "post_norm.weight"] = norm(e)
        if cfg.layer_scale:
            w[p + "layer_output_scale.weight"] = (0.5 + rng.uniform(0, 1, 1)).astype(np.float32)
    return w


class StoredWeights(dict):
    """name -> the weights exactly as stored (dequantized, float32), and for each
    name its type (``types``) and, when quantized, its raw rows (``raw``)."""

    def __init__(self):
        super().__init__()
        self.types: dict[str, str] = {}
        self.raw: dict[str, np.ndarray] = {}


def quantize(arr: np.ndarray, wtype: str) -> np.ndarray:
    """(n_out, n_in) float32 -> (n_out, bytes per row) uint8, with gguf's quantizers
    where it has one, else tests/support/kquants.py's."""
    own = _OWN_QUANTIZERS.get(wtype)
    if own is None:
        return gguf.quants.quantize(arr, QTYPES[wtype])
    return own(arr.reshape(-1, arr.shape[-1])).reshape(arr.shape[:-1] + (-1,))  # experts: (n_expert, n_out, bytes)


def write_model(path: Path, cfg: TinyConfig,
                extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None) -> StoredWeights:
    """Write ``cfg`` to ``path``; returns the weights exactly as stored (dequantized).

    ``extra_metadata``, when given, is called with the writer after the
    hyperparameters and before the tensors, to add more keys (a vocabulary).
    """
    if cfg.arch == "deepseek2":   # multi-head latent attention: tests/support/synthetic_mla.py
        from synthetic_mla import write_mla_model
        return write_mla_model(path, cfg, extra_metadata)
    if cfg.arch in ("nemotron_h", "nemotron_h_moe", "granitehybrid"):   # Mamba-2 hybrids: synthetic_mamba2.py
        from synthetic_mamba2 import write_mamba2_model
        return write_mamba2_model(path, cfg, extra_metadata)
    if cfg.arch == "laguna":   # per-layer heads, a softplus output gate: tests/support/synthetic_laguna.py
        from synthetic_laguna import write_laguna_model
        return write_laguna_model(path, cfg, extra_metadata)
    weights = make_weights(cfg)
    for name in cfg.drop:
        del weights[name]
    for name, axis, length in cfg.cut:
        weights[name] = np.ascontiguousarray(np.take(weights[name], range(length), axis=axis))
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    a = cfg.arch
    add_shape_keys(writer, cfg)
    if cfg.arch == "gemma4":
        add_gemma4_keys(writer, cfg)
    elif cfg.arch in LFM2_ARCHS:
        add_lfm2_keys(writer, cfg)
    else:
        writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_rope_freq_base(cfg.rope_base)
    if cfg.head_dim is not None:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    if cfg.n_swa and cfg.arch != "gemma4":
        writer.add_sliding_window(cfg.n_swa)
    if cfg.n_rot is not None:
        writer.add_rope_dimension_count(cfg.n_rot)
    if cfg.rope_linear:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_linear)
    add_moe_keys(writer, cfg)
    if cfg.arch in ("qwen2vl", "qwen3vl", "qwen3vlmoe"):
        writer.add_rope_dimension_sections(list(cfg.rope_sections))
    for key, value in cfg.extra_keys:
        if isinstance(value, bool):
            writer.add_bool(key.format(arch=a), value)
        elif isinstance(value, float):
            writer.add_float32(key.format(arch=a), value)
        elif isinstance(value, str):
            writer.add_string(key.format(arch=a), value)
        else:
            writer.add_uint32(key.format(arch=a), value)
    if extra_metadata is not None:
        extra_metadata(writer)
    return write_tensors(writer, cfg, weights)


def write_family_model(path: Path, cfg, weights: dict[str, np.ndarray],
                       add_keys: Callable[[gguf.GGUFWriter, Any], None],
                       extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]]) -> "StoredWeights":
    """What a family's writer (synthetic_mla.py, synthetic_mamba2.py, ...) does around its own
    weights and keys: drops and cuts the tensors ``cfg`` says (the tests' bad files), writes the
    keys, then ``extra_metadata`` (a vocabulary), then the tensors; returns them as stored (nothing
    where ``weights`` holds RandomTensors: a benchmark's file, written as it is made)."""
    for name in cfg.drop:
        del weights[name]
    for name, axis, length in cfg.cut:
        weights[name] = np.ascontiguousarray(np.take(weights[name], range(length), axis=axis))
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    add_keys(writer, cfg)
    if extra_metadata is not None:
        extra_metadata(writer)
    if any(isinstance(t, RandomTensor) for t in weights.values()):   # a real-sized file: synthetic_stream.py
        write_streamed(writer, weights, cfg.tensor_type, quantize)
        return StoredWeights()
    return write_tensors(writer, cfg, weights)


def write_tensors(writer: gguf.GGUFWriter, cfg, weights: dict[str, np.ndarray]) -> "StoredWeights":
    """Write ``weights`` in the types ``cfg.tensor_type`` gives them, then the
    file (header, keys, tensors); returns them as stored (quantized ones
    dequantized back)."""
    stored = StoredWeights()
    for name, arr in weights.items():
        wtype = cfg.tensor_type(name, arr)
        stored.types[name] = wtype
        if wtype == "f32":
            writer.add_tensor(name, arr)
            stored[name] = arr
        else:
            qtype = QTYPES[wtype]
            data = quantize(arr, wtype)
            writer.add_tensor(name, data, raw_dtype=qtype)  # data: (..., n_out, bytes per row)
            stored.raw[name] = data
            stored[name] = gguf.quants.dequantize(data, qtype).reshape(arr.shape).astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def add_gemma4_keys(writer: gguf.GGUFWriter, cfg: TinyConfig) -> None:
    """The keys Gemma4Model.set_gguf_parameters writes (head_count_kv per
    layer where the global layers have their own count)."""
    layers = gemma4_layers(cfg)
    if cfg.head_dim is None:   # the converter always writes the global layers' head width
        writer.add_key_length(cfg.hd)
        writer.add_value_length(cfg.hd)
    kv = [lay.n_head_kv for lay in layers]
    writer.add_head_count_kv(kv if len(set(kv)) > 1 else kv[0])
    writer.add_sliding_window(cfg.n_swa)
    writer.add_sliding_window_pattern([lay.swa for lay in layers])
    writer.add_key_length_swa(cfg.head_dim_swa or cfg.hd)
    writer.add_value_length_swa(cfg.head_dim_swa or cfg.hd)
    writer.add_rope_dimension_count(cfg.hd)
    writer.add_rope_dimension_count_swa(cfg.n_rot_swa or cfg.head_dim_swa or cfg.hd)
    writer.add_rope_freq_base_swa(cfg.rope_base_swa)
    writer.add_shared_kv_layers(cfg.n_kv_shared)
    writer.add_embedding_length_per_layer_input(cfg.n_embd_per_layer)
    # Gemma 4's converter always writes the cap (0: none); a file without it is capped at 30.
    if cfg.softcap is not None:
        writer.add_final_logit_softcapping(cfg.softcap)


def add_moe_keys(writer: gguf.GGUFWriter, cfg: TinyConfig) -> None:
    """The keys llama.cpp's converter writes for the experts, sliding windows
    and RoPE scaling of cfg's architecture."""
    if cfg.moe:
        writer.add_expert_count(cfg.n_expert)
        writer.add_expert_used_count(cfg.n_expert_used)
        writer.add_expert_feed_forward_length(cfg.n_ff_exp)
    if cfg.arch == "glm4moe":
        writer.add_expert_shared_count(cfg.n_expert_shared)
        writer.add_leading_dense_block_count(cfg.n_dense_lead)
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        writer.add_expert_weights_scale(cfg.expert_scale)
        writer.add_expert_weights_norm(True)
        writer.add_nextn_predict_layers(cfg.n_nextn)
    if cfg.arch == "minimax-m2":   # MiniMaxM2Model: scoring_func "sigmoid"
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if cfg.arch in ("qwen35moe", "qwen3next"):
        writer.add_expert_shared_feed_forward_length(cfg.n_ff_shexp or 2 * cfg.n_ff_exp)
    if cfg.arch in ("qwen3next", "qwen35", "qwen35moe") and n_nextn(cfg):
        writer.add_nextn_predict_layers(n_nextn(cfg))
    if cfg.arch in _HYBRID_ARCHS:
        writer.add_ssm_conv_kernel(cfg.ssm_d_conv)
        writer.add_ssm_state_size(cfg.ssm_d_state)
        writer.add_ssm_group_count(cfg.ssm_n_group)
        writer.add_ssm_time_step_rank(cfg.ssm_dt_rank)
        writer.add_ssm_inner_size(cfg.ssm_d_state * cfg.ssm_dt_rank)
        writer.add_full_attention_interval(cfg.full_attention_interval)
    if cfg.arch.startswith("qwen35"):
        writer.add_rope_dimension_sections(list(cfg.rope_sections))
    if cfg.yarn:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(cfg.yarn)
        writer.add_rope_scaling_orig_ctx_len(cfg.yarn_orig_ctx)
    if cfg.yarn_log_mul:
        writer.add_rope_scaling_yarn_log_mul(cfg.yarn_log_mul)
    if cfg.attn_temp:
        writer.add_attn_temperature_scale(cfg.attn_temp)


def add_shape_keys(writer: gguf.GGUFWriter, cfg) -> None:
    """The hyperparameters every architecture has, from ``cfg``'s fields of those names."""
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer + n_nextn(cfg))
    if cfg.arch == "gemma4" and getattr(cfg, "double_ffn", False):
        writer.add_feed_forward_length([lay.n_ff for lay in gemma4_layers(cfg)])
    else:
        writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)


# --------------------------------------------------------------------------
# The NumPy reference forward pass.
#
# The 2025-26 decoders add, each written here from its definition:
# - mixture-of-experts FFNs (qwen3moe, gpt-oss, glm4moe): the router and its
#   top-k choice (:func:`moe_route`), SwiGLU experts (gpt-oss: the clamped
#   swiglu_oai, with biases), a shared expert and leading dense layers (glm4moe);
# - attention sinks and alternating sliding windows (gpt-oss), an attention
#   temperature (mistral3), and YaRN RoPE scaling (gpt-oss, mistral3);
# - Qwen3.5's hybrid (qwen35, qwen35moe): Gated DeltaNet layers (a causal
#   convolution, then the gated delta rule of tests/support/delta_net.py, then a gated
#   RMS norm: :func:`_delta_net_layer`) and, every full_attention_interval-th
#   layer, attention with a sigmoid output gate from the Q projection and
#   interleaved multi-section RoPE (:func:`_rope_imrope`); qwen35moe's shared
#   expert is gated by a sigmoid of its own projection.

def _rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@dataclass(frozen=True)
class Yarn:
    """YaRN's parameters, as llama.cpp runs a file with rope.scaling.type=yarn
    and no other YaRN keys: ext_factor 1, beta_fast 32, beta_slow 1."""
    factor: float
    n_ctx_orig: int
    log_mul: float = 0.0
    ext_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def corr_dims(self, n_rot: int, base: float) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims: the rotation pairs where extrapolation
        (the unscaled angle, below ``low``) gives way to interpolation (the
        scaled angle, above ``high``).  A pair that turns ``beta`` times over
        n_ctx_orig positions is pair n_rot * ln(n_ctx_orig / (2 pi beta)) / (2 ln base)."""
        def dim(beta):
            return n_rot * math.log(self.n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
        return max(0.0, math.floor(dim(self.beta_fast))), min(n_rot - 1.0, math.ceil(dim(self.beta_slow)))

    def magnitude(self) -> float:
        """What the rotated values are multiplied by: YaRN's mscale(factor, 1),
        or mscale(factor, 1) / mscale(factor, log_mul) with a log multiplier, where
        mscale(s, m) = 0.1 m ln s + 1 (1 for s <= 1).  (llama.cpp hands ggml this
        divided by 1 + 0.1 ln(factor), which ggml's rope_yarn multiplies in again.)"""
        if not self.ext_factor:
            return 1.0

        def mscale(s, m):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
        f = self.factor
        return mscale(f, 1.0) / mscale(f, self.log_mul) if self.log_mul else mscale(f, 1.0)


def yarn_of(cfg: TinyConfig) -> Optional[Yarn]:
    return Yarn(cfg.yarn, cfg.yarn_orig_ctx, cfg.yarn_log_mul) if cfg.yarn else None


def _rope(x, positions, base, neox, freq_factors=None, n_rot=None, scale=1.0, yarn: Optional[Yarn] = None):
    """x: (n_tokens, n_heads, head_dim); rotates the first ``n_rot`` dims (all by
    default) by positions * scale * base^(-2i/n_rot) (linear scaling: scale = 1/factor)
    and passes the rest through.

    With ``yarn`` (scale = 1/factor), pair i turns by a mix of the unscaled angle
    (extrapolated) and the scaled one (interpolated), weighted by a ramp that is 1
    below the correction dims' low end and 0 above their high end, and the rotated
    values are multiplied by YaRN's magnitude (:class:`Yarn`)."""
    n_rot = n_rot or x.shape[-1]
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors
    magnitude = 1.0
    if yarn is None:
        ang = positions[:, None, None] * scale * inv[None, None, :]
    else:
        extrapolated = positions[:, None, None] * inv[None, None, :]
        low, high = yarn.corr_dims(n_rot, base)
        ramp = 1.0 - np.clip((np.arange(n_rot // 2) - low) / max(0.001, high - low), 0.0, 1.0)
        mix = ramp * yarn.ext_factor
        ang = scale * extrapolated * (1.0 - mix) + extrapolated * mix
        magnitude = yarn.magnitude()
    cos, sin = magnitude * np.cos(ang), magnitude * np.sin(ang)
    r, rest = x[..., :n_rot], x[..., n_rot:]
    if neox:
        a, b = r[..., : n_rot // 2], r[..., n_rot // 2:]
        r = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    else:
        a, b = r[..., 0::2], r[..., 1::2]
        r = np.empty_like(r)
        r[..., 0::2] = a * cos - b * sin
        r[..., 1::2] = a * sin + b * cos
    return np.concatenate([r, rest], axis=-1)


def imrope_streams(sections, n_rot: int) -> np.ndarray:
    """Which of the four position streams (t, h, w, e) each of the n_rot / 2
    rotation pairs reads in ggml's interleaved multi-section RoPE (GGML_ROPE_TYPE_IMROPE,
    ggml_mrope_cache_init with is_imrope): pair i's sector s = i % sum(sections)
    goes to h where s % 3 == 1 and s < 3 * sections[1], to w where s % 3 == 2 and
    s < 3 * sections[2], to t where s % 3 == 0 and s < 3 * sections[0], else to e."""
    s = np.arange(n_rot // 2) % sum(sections)
    return np.select([(s % 3 == 1) & (s < 3 * sections[1]), (s % 3 == 2) & (s < 3 * sections[2]),
                      (s % 3 == 0) & (s < 3 * sections[0])], [1, 2, 0], 3)


def text_positions4(n: int) -> np.ndarray:
    """The four position streams a text token gets (llama.cpp, elelem's
    _set_positions4): its position in t, h and w, and 0 in e.  (4, n)."""
    pos = np.arange(n, dtype=np.float64)
    return np.stack([pos, pos, pos, np.zeros(n)])


def _rope_imrope(x, positions4, base, n_rot, sections, scale=1.0):
    """ggml_rope_multi in IMROPE mode: x (n_tokens, n_heads, head_dim); the first
    ``n_rot`` dims rotate NEOX-style (pair i = dims i and i + n_rot/2), pair i by
    positions4[stream_i] * scale * base^(-2i/n_rot) (:func:`imrope_streams`), the
    rest pass through.  For text positions (t = h = w) this is NEOX RoPE, except
    on the pairs that read e (position 0: left unrotated), which happens only where
    the sections leave some sector uncovered (sections[3] > 0, or a width too small
    for its residue class; Qwen3.5's [11, 11, 10, 0] over 64 dims covers all)."""
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = (np.asarray(positions4, dtype=np.float64)[imrope_streams(sections, n_rot)].T * scale * inv)[:, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b, rest = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot], x[..., n_rot:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, rest], axis=-1)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# gpt-oss's expert activation (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants).
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


def _swiglu_oai(gate, up, alpha=SWIGLU_OAI_ALPHA, limit=SWIGLU_OAI_LIMIT):
    """gpt-oss's clamped SwiGLU: the gate clamped from above, the linear part
    from both sides and shifted by one: g * sigmoid(alpha g) * (u + 1)."""
    g = np.minimum(gate, limit)
    u = np.clip(up, -limit, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)


# How each architecture's router turns logits into probabilities ("softmax_weight":
# none, the chosen experts' raw logits are softmaxed), whether it renormalises the
# chosen weights to sum 1 (glm4moe: what the writer's expert_weights_norm says).
_ROUTING = {"qwen3moe": ("softmax", True), "glm4moe": ("sigmoid", True), "gpt-oss": ("softmax_weight", False),
            "qwen35moe": ("softmax", True), "gemma4": ("softmax", True), "qwen3next": ("softmax", True),
            "lfm2moe": ("sigmoid", True),
            "minimax-m2": ("sigmoid", True)}


def moe_route(logits: np.ndarray, cfg: TinyConfig, selection_bias: Optional[np.ndarray] = None):
    """Router logits (n_tokens, n_expert) -> (ids, weights), each (n_tokens, k)
    with k = n_expert_used: the k experts of the largest probabilities (plus
    ``selection_bias``, which moves the choice and not the weights), best first,
    and their weights: the probabilities (gpt-oss: the softmax of the k chosen
    logits), renormalised to sum 1 where the architecture does, times the
    expert_weights_scale where it is neither 0 nor 1 (glm4moe)."""
    gating, normalise = _ROUTING[cfg.arch]
    logits = np.asarray(logits, dtype=np.float64)
    if gating == "softmax":
        probs = _softmax(logits)
    elif gating == "sigmoid":
        probs = 1.0 / (1.0 + np.exp(-logits))
    else:
        probs = logits
    choice = probs if selection_bias is None else probs + selection_bias
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, : cfg.n_expert_used]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if gating == "softmax_weight":
        weights = _softmax(weights)
    if normalise:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    scale = cfg.expert_scale if cfg.arch == "glm4moe" else 0.0   # the writer writes it for glm4moe only
    if scale not in (0.0, 1.0):
        weights = weights * scale
    return ids, weights


def routing_margin(logits: np.ndarray, cfg: TinyConfig, selection_bias: Optional[np.ndarray] = None) -> float:
    """The smallest gap, over tokens, between the k-th and (k+1)-th expert's
    selection score: how far a choice is from a tie (inf when all are chosen).
    Measured on the logits where the choice is a monotone function of them
    (softmax gatings), else on the biased sigmoid: either way in units whose
    float32 rounding is ~1e-6, not in softmax probabilities, whose gaps shrink
    with the probabilities."""
    gating, _ = _ROUTING[cfg.arch]
    logits = np.asarray(logits, dtype=np.float64)
    choice = 1 / (1 + np.exp(-logits)) if gating == "sigmoid" else logits
    if selection_bias is not None:
        choice = choice + selection_bias
    k = cfg.n_expert_used
    if k >= choice.shape[-1]:
        return math.inf
    s = -np.sort(-choice, axis=-1)
    return float((s[:, k - 1] - s[:, k]).min())


def output_weight_name(weights) -> str:
    return "output.weight" if "output.weight" in weights else "token_embd.weight"  # tied


def _matmul(weights, w: dict[str, np.ndarray], ggml_numerics: bool):
    """(x, name[, expert]) -> x @ w[name].T (of that expert, for stacked experts
    (n_expert, n_out, n_in)), as ggml computes it when ``ggml_numerics``."""
    types = getattr(weights, "types", {}) if ggml_numerics else {}
    raw = getattr(weights, "raw", {})

    def mm(x, name, expert=None):
        m = w[name] if expert is None else w[name][expert]
        if types.get(name, "f32") == "f32":
            return x @ m.T
        r = raw.get(name)
        return numerics.matmul(x, m, types[name], r if r is None or expert is None else r[expert])

    return mm


def _moe_ffn(h, w, p, cfg, mm, trace=None):
    """The routed experts of layer prefix ``p`` (plus glm4moe's shared expert) for h (n_tokens, n_embd)."""
    logits = mm(h, p + "ffn_gate_inp.weight") + w.get(p + "ffn_gate_inp.bias", 0)
    selection_bias = w.get(p + "exp_probs_b.bias")
    ids, weights = moe_route(logits, cfg, selection_bias)
    if trace is not None:
        trace.append(dict(layer=p, ids=ids, weights=weights, margin=routing_margin(logits, cfg, selection_bias)))

    def expert(x, name, e):   # expert e's matmul, plus its bias where there is one (gpt-oss)
        bias = w.get(p + name + ".bias")
        return mm(x, p + name + ".weight", e) + (0 if bias is None else bias[e])

    out = np.zeros_like(h)
    for e in range(cfg.n_expert):
        rows, slot = np.nonzero(ids == e)
        if rows.size == 0:
            continue
        gate, up = expert(h[rows], "ffn_gate_exps", e), expert(h[rows], "ffn_up_exps", e)
        act = _swiglu_oai(gate, up) if cfg.arch == "gpt-oss" else _silu(gate) * up
        out[rows] += weights[rows, slot][:, None] * expert(act, "ffn_down_exps", e)
    if p + "ffn_up_shexp.weight" in w:
        shared = _silu(mm(h, p + "ffn_gate_shexp.weight")) * mm(h, p + "ffn_up_shexp.weight")
        shared = mm(shared, p + "ffn_down_shexp.weight")
        if p + "ffn_gate_inp_shexp.weight" in w:   # qwen35moe, qwen3next: times sigmoid(h . gate), one per token
            shared = shared * _sigmoid(h @ w[p + "ffn_gate_inp_shexp.weight"])[:, None]
        out = out + shared
    return out


def _delta_net_layer(h, w, p, cfg, mm, form: str = "recurrent"):
    """One Gated DeltaNet layer (llama.cpp's qwen35 build_layer_attn_linear) on
    h (n_tokens, n_embd), from an empty state: (n_tokens, n_embd).

    - qkv = h @ attn_qkv: the channels are Q (H_k heads of d), K (the same), V
      (H_v heads of d), d = ssm_d_state, H_k = ssm_n_group, H_v = ssm_dt_rank;
    - a causal depthwise convolution over [d_conv - 1 zeros, the tokens]
      (ggml_ssm_conv: out[t, c] = sum_i in[t + i, c] * ssm_conv1d[c, i]), then SiLU;
    - q and k L2-normalised per head (:func:`delta_net.l2_normalize`);
    - beta = sigmoid(h @ ssm_beta), g = softplus(h @ ssm_alpha + ssm_dt) * ssm_a (ssm_a < 0);
    - the gated delta rule (``form``: "recurrent" or "chunked", tests/support/delta_net.py);
    - RMS norm per value head with ssm_norm, times silu(z), z = h @ attn_gate;
    - the ssm_out projection."""
    n = len(h)
    d, H_k, H_v = cfg.ssm_d_state, cfg.ssm_n_group, cfg.ssm_dt_rank
    if p + "ssm_in.weight" in w:   # qwen3next's older files: per key head [q, k, v of its value heads, their z]
        qkvz = mm(h, p + "ssm_in.weight").reshape(n, H_k, -1)
        q_, k_, v_, z_ = np.split(qkvz, [d, 2 * d, 2 * d + (H_v // H_k) * d], axis=2)
        qkv = np.concatenate([x.reshape(n, -1) for x in (q_, k_, v_)], axis=1)
        z = z_.reshape(n, H_v, d)
    else:
        qkv = mm(h, p + "attn_qkv.weight")
        z = mm(h, p + "attn_gate.weight").reshape(n, H_v, d)
    if p + "ssm_ba.weight" in w:   # qwen3next: per key head [beta of its value heads, their alpha]
        ba = mm(h, p + "ssm_ba.weight").reshape(n, H_k, 2, H_v // H_k)
        b_logit, a_logit = ba[:, :, 0].reshape(n, H_v), ba[:, :, 1].reshape(n, H_v)
    else:
        b_logit, a_logit = mm(h, p + "ssm_beta.weight"), mm(h, p + "ssm_alpha.weight")
    kernel = w[p + "ssm_conv1d.weight"]   # (channels, d_conv)
    K = kernel.shape[1]
    padded = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
    mixed = _silu(sum(padded[i:i + n] * kernel[:, i] for i in range(K)))
    q = delta_net.l2_normalize(mixed[:, : H_k * d].reshape(n, H_k, d), cfg.rms_eps)
    k = delta_net.l2_normalize(mixed[:, H_k * d: 2 * H_k * d].reshape(n, H_k, d), cfg.rms_eps)
    v = mixed[:, 2 * H_k * d:].reshape(n, H_v, d)
    if cfg.arch == "qwen3next":   # value heads grouped by key head: value head j reads key head j // (H_v / H_k)
        q, k = np.repeat(q, H_v // H_k, axis=1), np.repeat(k, H_v // H_k, axis=1)
    beta = _sigmoid(b_logit)
    g = np.logaddexp(0.0, a_logit + w[p + "ssm_dt.bias"]) * w[p + "ssm_a"]
    out, _ = {"recurrent": delta_net.recurrent, "chunked": delta_net.chunked}[form](q, k, v, g, beta)
    out = _rms_norm(out, w[p + "ssm_norm.weight"], cfg.rms_eps) * _silu(z)
    return mm(out.reshape(n, H_v * d), p + "ssm_out.weight")


def reference_logits(weights: dict[str, np.ndarray], cfg: TinyConfig, tokens, dtype=np.float64,
                     ggml_numerics: bool = False, trace: Optional[list] = None,
                     delta_form: str = "recurrent", images: Sequence[tuple[int, np.ndarray]] = ()) -> np.ndarray:
    """Logits at every position, (n_tokens, n_vocab); float64 unless told (real models are big).

    With ``ggml_numerics`` (``weights`` from :func:`write_model`), two things ggml
    does are reproduced (tests/support/ggml_numerics.py): each matmul with a quantized or
    F16 weight first quantizes its activations to the weight's vec_dot type, and
    GeGLU reads its GELU from a float16 table.  Everything else stays float64.
    ``trace``, a list, receives each MoE layer's routing (:func:`_moe_ffn`).
    ``delta_form``: how Gated DeltaNet layers run the delta rule, "recurrent" or
    "chunked" (tests/support/delta_net.py).
    ``images``: ``(start, embeddings)`` pairs, an image's rows in place of the
    tokens from ``start`` on, taken as they are (no embedding scale) and seeing
    each other both ways (libmtmd's non-causal images).
    """
    w = {k: v.astype(dtype, copy=False) for k, v in weights.items()}
    x = reference_hidden(weights, cfg, tokens, dtype, ggml_numerics, trace, delta_form, images)
    logits = _matmul(weights, w, ggml_numerics)(x, output_weight_name(w))
    cap = 30.0 if cfg.softcap is None else cfg.softcap   # absent: llama.cpp's default
    if cfg.arch == "gemma4" and cap:   # Gemma 4's final soft cap
        logits = cap * np.tanh(logits / cap)
    return logits


def _sliding(cfg: TinyConfig, i: int) -> bool:
    """Whether layer i attends over the sliding window: gemma3 every layer but
    each 6th, gpt-oss the even ones (pattern 2)."""
    if cfg.n_swa <= 0:
        return False
    if cfg.arch == "gemma3":
        return (i + 1) % 6 != 0
    return cfg.arch == "gpt-oss" and i % 2 == 0


def reference_hidden(weights: dict[str, np.ndarray], cfg: TinyConfig, tokens, dtype=np.float64,
                     ggml_numerics: bool = False, trace: Optional[list] = None,
                     delta_form: str = "recurrent", images: Sequence[tuple[int, np.ndarray]] = ()) -> np.ndarray:
    """The output projection's input (the final normed hidden state), (n_tokens, n_embd)."""
    if cfg.arch == "gemma4":
        return _gemma4_hidden(weights, cfg, tokens, dtype, ggml_numerics, trace)
    if cfg.arch in LFM2_ARCHS:
        return lfm2_hidden(weights, cfg, tokens, dtype, ggml_numerics, trace)
    f = _features(cfg.arch)
    w = {k: v.astype(dtype, copy=False) for k, v in weights.items()}
    mm = _matmul(weights, w, ggml_numerics)
    gelu = numerics.gelu_f16_table if ggml_numerics else _gelu_tanh
    tokens = np.asarray(tokens)
    n, hd = len(tokens), cfg.hd
    pos = np.arange(n, dtype=np.float64)
    x = w["token_embd.weight"][np.maximum(tokens, 0)]
    if cfg.arch == "gemma3":
        x = x * math.sqrt(cfg.n_embd)
    for start, rows in images:
        x[start:start + len(rows)] = rows
    group = cfg.n_head // cfg.n_head_kv
    ff = w.get("rope_freqs.weight")
    yarn = yarn_of(cfg)
    # gpt-oss scales Q.K by 1/sqrt(n_rot), the others by 1/sqrt(head_dim).
    scale = 1.0 / math.sqrt(cfg.rot if cfg.arch == "gpt-oss" else hd)
    temperature = None
    if cfg.attn_temp and cfg.arch == "mistral3":
        # mistral3: Q, after RoPE, times 1 + attn_temp * ln(floor(pos / n_ctx_orig) + 1)
        n_ctx_orig = cfg.yarn_orig_ctx if cfg.yarn else cfg.n_ctx_train
        temperature = 1.0 + cfg.attn_temp * np.log(np.floor(pos / n_ctx_orig) + 1.0)
    gated = cfg.arch in _HYBRID_ARCHS                 # Q's projection also writes an output gate
    imrope = cfg.arch in ("qwen35", "qwen35moe")      # qwen3next's RoPE is NEOX
    for i in range(cfg.n_layer):   # glm4moe's and qwen3next's NextN layers (blk.n_layer...) are never run
        p = f"blk.{i}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        if recurrent_layer(cfg, i):
            x = x + _delta_net_layer(h, w, p, cfg, mm, delta_form)
            x = x + _ffn(x, w, p, cfg, f, mm, gelu, i, trace)
            continue
        q = mm(h, p + "attn_q.weight") + w.get(p + "attn_q.bias", 0)
        k = mm(h, p + "attn_k.weight") + w.get(p + "attn_k.bias", 0)
        v = mm(h, p + "attn_v.weight") + w.get(p + "attn_v.bias", 0)
        if f["qk_norm_all"]:   # minimax-m2: one norm over all heads of Q, one over K's
            q = _rms_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)
            k = _rms_norm(k, w[p + "attn_k_norm.weight"], cfg.rms_eps)
        gate = None
        if gated:   # per head, hd of Q then hd of its output gate
            q, gate = q.reshape(n, cfg.n_head, 2, hd)[:, :, 0], q.reshape(n, cfg.n_head, 2, hd)[:, :, 1]
        q = q.reshape(n, cfg.n_head, hd)
        k = k.reshape(n, cfg.n_head_kv, hd)
        v = v.reshape(n, cfg.n_head_kv, hd)
        if f["qk_norm"]:
            q = _rms_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)
            k = _rms_norm(k, w[p + "attn_k_norm.weight"], cfg.rms_eps)
        is_swa = _sliding(cfg, i)
        gemma_local = cfg.arch == "gemma3" and is_swa
        # llama.cpp's gemma3 runs its sliding layers at base 10000, never scaled
        # (rope_freq_scale_train_swa = 1); gpt-oss's share the global RoPE.
        base = 10000.0 if gemma_local else cfg.rope_base
        rope_scale, layer_yarn = 1.0, None
        if cfg.rope_linear and not gemma_local:
            rope_scale = 1.0 / cfg.rope_linear
        if yarn is not None:
            rope_scale, layer_yarn = 1.0 / yarn.factor, yarn
        if f["nope_every"] and (i + 1) % f["nope_every"] == 0:
            pass   # smollm3's NoPE layers: Q and K as projected
        elif imrope:
            q = _rope_imrope(q, text_positions4(n), base, cfg.rot, cfg.rope_sections, rope_scale)
            k = _rope_imrope(k, text_positions4(n), base, cfg.rot, cfg.rope_sections, rope_scale)
        else:
            q = _rope(q, pos, base, f["neox"], ff, cfg.n_rot, rope_scale, layer_yarn)
            k = _rope(k, pos, base, f["neox"], ff, cfg.n_rot, rope_scale, layer_yarn)
        if temperature is not None:
            q = q * temperature[:, None, None]
        allowed = np.tril(np.ones((n, n), dtype=bool))
        for start, rows in images:
            allowed[start:start + len(rows), start:start + len(rows)] = True
        if is_swa:  # a query at i sees keys j with i - j < n_swa (llama.cpp's is_masked_swa, STANDARD)
            allowed &= (np.arange(n)[:, None] - np.arange(n)[None, :]) < cfg.n_swa
        sinks = w.get(p + "attn_sinks.weight")
        out = np.empty((n, cfg.n_head, hd))
        for head in range(cfg.n_head):
            s = q[:, head] @ k[:, head // group].T * scale
            s = np.where(allowed, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            if sinks is not None:  # the sink's logit joins the denominator, with no value
                m = np.maximum(m, sinks[head])
            e = np.exp(s - m)
            total = e.sum(axis=1, keepdims=True)
            if sinks is not None:
                total = total + np.exp(sinks[head] - m)
            out[:, head] = (e / total) @ v[:, head // group]
        if gate is not None:   # qwen35, qwen3next: each head's output times the sigmoid of its gate
            out = out * _sigmoid(gate)
        attn = mm(out.reshape(n, -1), p + "attn_output.weight") + w.get(p + "attn_output.bias", 0)
        if f["post_norms"]:
            attn = _rms_norm(attn, w[p + "post_attention_norm.weight"], cfg.rms_eps)
        x = x + attn
        x = x + _ffn(x, w, p, cfg, f, mm, gelu, i, trace)
    return _rms_norm(x, w["output_norm.weight"], cfg.rms_eps)


def _ffn(x, w, p, cfg, f, mm, gelu, i, trace):
    """Layer i's FFN block on the residual stream x, before its residual add:
    pre-norm, experts or the dense gated FFN, gemma3's post-norm."""
    h = _rms_norm(x, w[p + f["ffn_norm"] + ".weight"], cfg.rms_eps)
    if _moe_layer(cfg, i):
        h = _moe_ffn(h, w, p, cfg, mm, trace)
    else:
        g, u = mm(h, p + "ffn_gate.weight"), mm(h, p + "ffn_up.weight")
        h = mm((gelu(g) if f["gelu"] else _silu(g)) * u, p + "ffn_down.weight")
    if f["post_norms"]:
        h = _rms_norm(h, w[p + "post_ffw_norm.weight"], cfg.rms_eps)
    return h


def _attend(q, k, v, allowed, scale, sinks=None):
    """Grouped-query attention: q (n, n_head, hd), k and v (n, n_head_kv, hd), allowed (n, n)."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    out = np.empty((n, n_head, v.shape[2]))
    for head in range(n_head):
        s = q[:, head] @ k[:, head // group].T * scale
        s = np.where(allowed, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[head])
        e = np.exp(s - m)
        total = e.sum(axis=1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sinks[head] - m)
        out[:, head] = (e / total) @ v[:, head // group]
    return out


def _gemma4_hidden(weights, cfg: TinyConfig, tokens, dtype, ggml_numerics: bool, trace) -> np.ndarray:
    """Gemma 4, from its definition (Hugging Face's Gemma4 text model, as llama.cpp runs it):
    - embeddings times sqrt(n_embd); per-layer token embeddings: each token's
      table row per layer (times sqrt(n_embd_per_layer)) plus the RMS-normed
      projection of the embeddings (times 1/sqrt(n_embd)), halved in
      variance (times 1/sqrt 2);
    - each layer: RMS-normed Q, K and V (V without weight), RoPE (the global
      layers' turning only a fraction of each head: their factors are 1e30
      past it), attention scaled by 1 over the sliding window or globally,
      a shared-K/V layer attending over the K and V of the layer it reuses;
      post-norms around the attention and the GeGLU FFN; an expert layer adds
      its experts (routed on its own normed input, GeGLU, each output scaled)
      to its dense FFN, each with its own norms; the per-layer embedding
      mixed in through a GELU gate; a scale of the layer's output."""
    w = {k: v.astype(dtype, copy=False) for k, v in weights.items()}
    mm = _matmul(weights, w, ggml_numerics)
    gelu = numerics.gelu_f16_table if ggml_numerics else _gelu_tanh
    eps = cfg.rms_eps
    tokens = np.asarray(tokens)
    n, e, n_pl = len(tokens), cfg.n_embd, cfg.n_embd_per_layer
    pos = np.arange(n, dtype=np.float64)
    x = w["token_embd.weight"][tokens] * math.sqrt(e)
    if n_pl:
        table = w["per_layer_token_embd.weight"][tokens].reshape(n, cfg.n_layer, n_pl) * math.sqrt(n_pl)
        proj = (mm(x, "per_layer_model_proj.weight") / math.sqrt(e)).reshape(n, cfg.n_layer, n_pl)
        per_layer = (_rms_norm(proj, w["per_layer_proj_norm.weight"], eps) + table) / math.sqrt(2.0)
    causal = np.tril(np.ones((n, n), dtype=bool))
    window = causal & ((np.arange(n)[:, None] - np.arange(n)[None, :]) < cfg.n_swa)
    cached = {}
    for i, lay in enumerate(gemma4_layers(cfg)):
        p = f"blk.{i}."
        base = cfg.rope_base_swa if lay.swa else cfg.rope_base
        ff = None if lay.swa else w["rope_freqs.weight"]
        h = _rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = _rms_norm(mm(h, p + "attn_q.weight").reshape(n, cfg.n_head, lay.head_dim), w[p + "attn_q_norm.weight"], eps)
        q = _rope(q, pos, base, True, ff, lay.n_rot)
        if lay.kv_source == i:
            k = mm(h, p + "attn_k.weight")
            v = mm(h, p + "attn_v.weight") if p + "attn_v.weight" in w else k
            k = _rms_norm(k.reshape(n, lay.n_head_kv, lay.head_dim), w[p + "attn_k_norm.weight"], eps)
            v = _rms_norm(v.reshape(n, lay.n_head_kv, lay.head_dim), 1.0, eps)
            cached[i] = (_rope(k, pos, base, True, ff, lay.n_rot), v)
        k, v = cached[lay.kv_source]
        out = _attend(q, k, v, window if lay.swa else causal, 1.0)
        attn = _rms_norm(mm(out.reshape(n, -1), p + "attn_output.weight"), w[p + "post_attention_norm.weight"], eps)
        x = x + attn

        def dense(y):
            return mm(gelu(mm(y, p + "ffn_gate.weight")) * mm(y, p + "ffn_up.weight"), p + "ffn_down.weight")

        if p + "ffn_gate_inp.weight" in w:
            h = _rms_norm(dense(_rms_norm(x, w[p + "ffn_norm.weight"], eps)), w[p + "post_ffw_norm_1.weight"], eps)
            router_in = _rms_norm(x, 1.0, eps) / math.sqrt(e) * w[p + "ffn_gate_inp.scale"]
            h = h + _rms_norm(_gemma4_experts(_rms_norm(x, w[p + "pre_ffw_norm_2.weight"], eps),
                                              mm(router_in, p + "ffn_gate_inp.weight"), w, p, cfg, mm, gelu, trace),
                              w[p + "post_ffw_norm_2.weight"], eps)
        else:
            h = dense(_rms_norm(x, w[p + "ffn_norm.weight"], eps))
        x = x + _rms_norm(h, w[p + "post_ffw_norm.weight"], eps)
        if n_pl:
            g = gelu(mm(x, p + "inp_gate.weight")) * per_layer[:, i]
            x = x + _rms_norm(mm(g, p + "proj.weight"), w[p + "post_norm.weight"], eps)
        if p + "layer_output_scale.weight" in w:
            x = x * w[p + "layer_output_scale.weight"]
    return _rms_norm(x, w["output_norm.weight"], eps)


def _gemma4_experts(h, logits, w, p, cfg, mm, gelu, trace):
    """Gemma 4's experts for h (n_tokens, n_embd): softmax routing, the chosen
    renormalised, GeGLU experts (gate and up stacked or not), each expert's
    output times its scale."""
    ids, weights = moe_route(logits, cfg)
    if trace is not None:
        trace.append(dict(layer=p, ids=ids, weights=weights, margin=routing_margin(logits, cfg)))
    fused = p + "ffn_gate_up_exps.weight" in w
    out = np.zeros_like(h)
    for ex in range(cfg.n_expert):
        rows, slot = np.nonzero(ids == ex)
        if rows.size == 0:
            continue
        if fused:
            gate_up = mm(h[rows], p + "ffn_gate_up_exps.weight", ex)
            gate, up = gate_up[:, :cfg.n_ff_exp], gate_up[:, cfg.n_ff_exp:]
        else:
            gate, up = mm(h[rows], p + "ffn_gate_exps.weight", ex), mm(h[rows], p + "ffn_up_exps.weight", ex)
        down = mm(gelu(gate) * up, p + "ffn_down_exps.weight", ex) * w[p + "ffn_down_exps.scale"][ex]
        out[rows] += weights[rows, slot][:, None] * down
    return out


def prompt_then_decode(llm, tokens, n_prompt: int) -> np.ndarray:
    """Logits for every position of ``tokens``: the first ``n_prompt`` as one
    prompt (batched kernels), the rest one token at a time (decode kernels)."""
    rows = [llm.eval(tokens[:n_prompt], all_logits=True)]
    rows += [llm.eval([t])[None] for t in tokens[n_prompt:]]
    return np.concatenate(rows)
