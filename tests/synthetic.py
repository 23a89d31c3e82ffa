"""Tiny random models written as GGUF files with the `gguf` package, and the
NumPy reference forward pass they are checked against.

The reference is written from the architectures' definitions (RMSNorm, RoPE,
grouped-query attention, gated FFN), in float64, independently of ggml.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

QTYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}


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
    n_swa: int = 0                    # gemma3 sliding window
    rope_freqs: bool = False          # llama3-style frequency factors
    seed: int = 0
    extra_keys: tuple = ()           # ((key template, value), ...) written as-is

    @property
    def hd(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    def but(self, **kw) -> "TinyConfig":
        return replace(self, **kw)


def _features(arch: str) -> dict:
    return {
        "qwen2": dict(bias=True, qk_norm=False, post_norms=False, neox=True, gelu=False),
        "llama": dict(bias=False, qk_norm=False, post_norms=False, neox=False, gelu=False),
        "qwen3": dict(bias=False, qk_norm=True, post_norms=False, neox=True, gelu=False),
        "gemma3": dict(bias=False, qk_norm=True, post_norms=True, neox=True, gelu=True),
    }[arch]


def make_weights(cfg: TinyConfig) -> dict[str, np.ndarray]:
    """Random float32 weights, numpy shape (n_out, n_in) as gguf writes them."""
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
        w["rope_freqs.weight"] = (1.0 + rng.uniform(0, 3, hd // 2)).astype(np.float32)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = mat(q, e)
        w[p + "attn_k.weight"] = mat(kv, e)
        w[p + "attn_v.weight"] = mat(kv, e)
        w[p + "attn_output.weight"] = mat(e, q)
        if f["bias"]:
            for n, size in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"attn_{n}.bias"] = (0.1 * rng.standard_normal(size)).astype(np.float32)
        if f["qk_norm"]:
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        if f["post_norms"]:
            w[p + "post_attention_norm.weight"] = norm(e)
            w[p + "post_ffw_norm.weight"] = norm(e)
        w[p + "ffn_norm.weight"] = norm(e)
        w[p + "ffn_gate.weight"] = mat(cfg.n_ff, e)
        w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
        w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
    return w


def _is_matmul_weight(name: str, arr: np.ndarray) -> bool:
    return arr.ndim == 2 and name != "token_embd.weight"


def write_model(path: Path, cfg: TinyConfig,
                extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None) -> dict[str, np.ndarray]:
    """Write ``cfg`` to ``path``; returns the weights exactly as stored (dequantized).

    ``extra_metadata``, when given, is called with the writer after the
    hyperparameters and before the tensors, to add more keys (a vocabulary).
    """
    weights = make_weights(cfg)
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    a = cfg.arch
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_rope_freq_base(cfg.rope_base)
    if cfg.head_dim is not None:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    if cfg.n_swa:
        writer.add_sliding_window(cfg.n_swa)
    for key, value in cfg.extra_keys:
        if isinstance(value, float):
            writer.add_float32(key.format(arch=a), value)
        else:
            writer.add_uint32(key.format(arch=a), value)
    if extra_metadata is not None:
        extra_metadata(writer)
    stored = {}
    for name, arr in weights.items():
        qtype = QTYPES[cfg.wtype] if _is_matmul_weight(name, arr) else gguf.GGMLQuantizationType.F32
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, arr)
            stored[name] = arr
        else:
            data = gguf.quants.quantize(arr, qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)  # data: (n_out, bytes per row)
            stored[name] = gguf.quants.dequantize(data, qtype).reshape(arr.shape).astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


# --------------------------------------------------------------------------
# The NumPy reference forward pass.

def _rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, base, neox, freq_factors=None):
    """x: (n_tokens, n_heads, head_dim), rotating all head_dim dims."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    if freq_factors is not None:
        inv = inv / freq_factors
    ang = positions[:, None, None] * inv[None, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def reference_logits(weights: dict[str, np.ndarray], cfg: TinyConfig, tokens, dtype=np.float64) -> np.ndarray:
    """Logits at every position, (n_tokens, n_vocab); float64 unless told (real models are big)."""
    f = _features(cfg.arch)
    w = {k: v.astype(dtype, copy=False) for k, v in weights.items()}
    tokens = np.asarray(tokens)
    n, hd = len(tokens), cfg.hd
    pos = np.arange(n, dtype=np.float64)
    x = w["token_embd.weight"][tokens]
    if cfg.arch == "gemma3":
        x = x * math.sqrt(cfg.n_embd)
    group = cfg.n_head // cfg.n_head_kv
    ff = w.get("rope_freqs.weight")
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = h @ w[p + "attn_q.weight"].T + w.get(p + "attn_q.bias", 0)
        k = h @ w[p + "attn_k.weight"].T + w.get(p + "attn_k.bias", 0)
        v = h @ w[p + "attn_v.weight"].T + w.get(p + "attn_v.bias", 0)
        q = q.reshape(n, cfg.n_head, hd)
        k = k.reshape(n, cfg.n_head_kv, hd)
        v = v.reshape(n, cfg.n_head_kv, hd)
        if f["qk_norm"]:
            q = _rms_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)
            k = _rms_norm(k, w[p + "attn_k_norm.weight"], cfg.rms_eps)
        is_swa = cfg.arch == "gemma3" and cfg.n_swa > 0 and (i + 1) % 6 != 0
        base = 10000.0 if is_swa else cfg.rope_base
        q = _rope(q, pos, base, f["neox"], ff)
        k = _rope(k, pos, base, f["neox"], ff)
        scale = 1.0 / math.sqrt(hd)
        allowed = np.tril(np.ones((n, n), dtype=bool))
        if is_swa:
            allowed &= (np.arange(n)[:, None] - np.arange(n)[None, :]) < cfg.n_swa
        out = np.empty((n, cfg.n_head, hd))
        for head in range(cfg.n_head):
            s = q[:, head] @ k[:, head // group].T * scale
            s = np.where(allowed, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, head] = s @ v[:, head // group]
        attn = out.reshape(n, -1) @ w[p + "attn_output.weight"].T
        if f["post_norms"]:
            attn = _rms_norm(attn, w[p + "post_attention_norm.weight"], cfg.rms_eps)
        x = x + attn
        h = _rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        h = ((_gelu_tanh(g) if f["gelu"] else _silu(g)) * u) @ w[p + "ffn_down.weight"].T
        if f["post_norms"]:
            h = _rms_norm(h, w[p + "post_ffw_norm.weight"], cfg.rms_eps)
        x = x + h
    x = _rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    out_w = w.get("output.weight", w["token_embd.weight"])
    return x @ out_w.T
