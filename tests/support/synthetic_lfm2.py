"""Tiny LFM2 models (``lfm2``, ``lfm2moe``) as llama.cpp's converter writes
them (conversion/lfm2.py), and their NumPy reference forward pass.

synthetic.write_model writes them (``TinyConfig(arch="lfm2")``): the
converter's keys (``attention.head_count_kv`` per layer, 0 for a convolution
layer; ``shortconv.l_cache``; for lfm2moe the experts, the leading dense
layers and sigmoid gating) and tensors (``shortconv.{in_proj,conv,out_proj}``,
the convolution kernel squeezed to (n_embd, l_cache) and kept F32; the final
norm named ``token_embd_norm``).

The reference follows Liquid's definition (transformers' Lfm2ShortConv) in
float64: in_proj to B, C and x; B*x convolved causally, each channel with
its own kernel of l_cache taps over the last l_cache positions; C times
that; out_proj.  :func:`shortconv_layer` also carries the state (the last
l_cache - 1 values of B*x) from a previous call, so that a sequence run in
pieces equals the sequence run whole.
"""
from __future__ import annotations

import math
from typing import Optional

import gguf
import numpy as np

# The layer kinds of real models, a letter per layer (C: short convolution, A: attention),
# from their config.json's layer_types.  LFM2-350M, -700M and -1.2B: attention at 2, 5, 8, 10, 12, 14.
LFM2_350M_LAYERS = "CCACCACCACACACAC"
# LFM2-8B-A1B: 24 layers, attention at 2, 6, 10, 14, 18, 21; the first two layers dense.
LFM2_8B_A1B_LAYERS = "CCACCCACCCACCCACCCACCACC"
LFM2_ARCHS = ("lfm2", "lfm2moe")


def layer_types(cfg) -> str:
    """cfg's layer kinds, a letter per layer: its own, or the real model's cut to n_layer."""
    if cfg.layer_types:
        assert len(cfg.layer_types) == cfg.n_layer, "layer_types needs a letter per layer"
        return cfg.layer_types
    real = LFM2_8B_A1B_LAYERS if cfg.arch == "lfm2moe" else LFM2_350M_LAYERS
    assert cfg.n_layer <= len(real)
    return real[: cfg.n_layer]


def moe_layer(cfg, i: int) -> bool:
    return cfg.arch == "lfm2moe" and i >= cfg.n_dense_lead


def lfm2_weights(cfg) -> dict[str, np.ndarray]:
    """Random float32 weights, numpy shape (n_out, n_in) as gguf writes them."""
    rng = np.random.default_rng(cfg.seed)
    e, hd = cfg.n_embd, cfg.hd
    q, kv = cfg.n_head * hd, cfg.n_head_kv * hd

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((cfg.n_vocab, e)).astype(np.float32),
         "token_embd_norm.weight": norm(e)}
    if not cfg.tied:
        w["output.weight"] = mat(cfg.n_vocab, e)
    for i, kind in enumerate(layer_types(cfg)):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(e)   # the operator norm, before either kind
        if kind == "C":
            w[p + "shortconv.in_proj.weight"] = mat(3 * e, e)
            w[p + "shortconv.conv.weight"] = (rng.standard_normal((e, cfg.conv_l_cache)) / 2).astype(np.float32)
            w[p + "shortconv.out_proj.weight"] = mat(e, e)
        else:
            w[p + "attn_q.weight"] = mat(q, e)
            w[p + "attn_k.weight"] = mat(kv, e)
            w[p + "attn_v.weight"] = mat(kv, e)
            w[p + "attn_output.weight"] = mat(e, q)
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "ffn_norm.weight"] = norm(e)
        if moe_layer(cfg, i):
            # A router scaled up, so that the choice of experts is clear-cut rather than a near tie.
            x, fe = cfg.n_expert, cfg.n_ff_exp
            w[p + "ffn_gate_inp.weight"] = 4.0 * mat(x, e)
            w[p + "ffn_gate_exps.weight"] = np.stack([mat(fe, e) for _ in range(x)])
            w[p + "ffn_up_exps.weight"] = np.stack([mat(fe, e) for _ in range(x)])
            w[p + "ffn_down_exps.weight"] = np.stack([mat(e, fe) for _ in range(x)])
            w[p + "exp_probs_b.bias"] = (0.1 * rng.standard_normal(x)).astype(np.float32)
        else:
            w[p + "ffn_gate.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
    return w


def add_lfm2_keys(writer: gguf.GGUFWriter, cfg) -> None:
    """The keys LFM2Model / LFM2MoeModel.set_gguf_parameters write beyond the common ones."""
    writer.add_head_count_kv([0 if kind == "C" else cfg.n_head_kv for kind in cfg.kv_pattern or layer_types(cfg)])
    writer.add_vocab_size(cfg.n_vocab)
    writer.add_shortconv_l_cache(cfg.conv_l_cache)
    if cfg.arch == "lfm2moe":
        writer.add_leading_dense_block_count(cfg.n_dense_lead)
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)


# --------------------------------------------------------------------------
# The NumPy reference.

def shortconv_layer(h: np.ndarray, w, p: str, mm, state: Optional[np.ndarray] = None):
    """One short-convolution layer on h (n_tokens, n_embd), after ``state``
    (the last l_cache - 1 values of B*x before these tokens; zeros for a new
    sequence): (its output (n_tokens, n_embd), the state after them)."""
    n, e = h.shape
    b, c, x = np.split(mm(h, p + "shortconv.in_proj.weight"), 3, axis=1)
    kernel = w[p + "shortconv.conv.weight"]              # (n_embd, l_cache): channel c's taps, oldest first
    taps = kernel.shape[1]
    if state is None:
        state = np.zeros((taps - 1, e))
    seen = np.concatenate([state, b * x])                # (l_cache - 1 + n, n_embd)
    conv = sum(seen[i:i + n] * kernel[:, i] for i in range(taps))
    return mm(c * conv, p + "shortconv.out_proj.weight"), seen[n:]


def lfm2_hidden(weights, cfg, tokens, dtype=np.float64, ggml_numerics: bool = False,
                trace: Optional[list] = None) -> np.ndarray:
    """The output projection's input (the final normed hidden state), (n_tokens, n_embd)."""
    from synthetic import _attend, _matmul, _moe_ffn, _rms_norm, _rope, _silu

    w = {k: v.astype(dtype, copy=False) for k, v in weights.items()}
    mm = _matmul(weights, w, ggml_numerics)
    tokens = np.asarray(tokens)
    n, hd = len(tokens), cfg.hd
    pos = np.arange(n, dtype=np.float64)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    x = w["token_embd.weight"][tokens]
    for i, kind in enumerate(layer_types(cfg)):
        p = f"blk.{i}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        if kind == "C":
            out, _ = shortconv_layer(h, w, p, mm)
        else:
            q = _rms_norm(mm(h, p + "attn_q.weight").reshape(n, cfg.n_head, hd), w[p + "attn_q_norm.weight"],
                          cfg.rms_eps)
            k = _rms_norm(mm(h, p + "attn_k.weight").reshape(n, cfg.n_head_kv, hd), w[p + "attn_k_norm.weight"],
                          cfg.rms_eps)
            v = mm(h, p + "attn_v.weight").reshape(n, cfg.n_head_kv, hd)
            q, k = _rope(q, pos, cfg.rope_base, True), _rope(k, pos, cfg.rope_base, True)
            out = mm(_attend(q, k, v, allowed, 1.0 / math.sqrt(hd)).reshape(n, -1), p + "attn_output.weight")
        x = x + out
        h = _rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        if moe_layer(cfg, i):
            x = x + _moe_ffn(h, w, p, cfg, mm, trace)
        else:
            g, u = mm(h, p + "ffn_gate.weight"), mm(h, p + "ffn_up.weight")
            x = x + mm(_silu(g) * u, p + "ffn_down.weight")
    return _rms_norm(x, w["token_embd_norm.weight"], cfg.rms_eps)
