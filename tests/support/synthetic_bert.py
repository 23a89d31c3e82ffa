"""Tiny random BERT-family encoders (``bert``, ``nomic-bert``, ``nomic-bert-moe``) written as GGUF
files with the `gguf` package, and their NumPy reference forward pass.

The reference follows the architectures' definitions in float64: BERT sums
token, token-type-0 and learned position embeddings, LayerNorms them, then
runs post-norm blocks (attention over the whole sequence, add, LayerNorm;
GELU FFN with biases, add, LayerNorm).  nomic-bert has no position table:
it rotates Q and K (NeoX RoPE), fuses Q/K/V into one matrix and uses a
SwiGLU FFN without biases.  nomic-bert-moe rotates too, with biases on
its fused Q/K/V and BERT's GELU FFN, and every ``moe_every``-th layer (from
layer 1) routes each token to its top ``n_expert_used`` of ``n_expert``
GELU experts (softmax weights, not renormalised).  The one ggml detail it reproduces is that
ggml's GELU reads a float16 table (tests/support/ggml_numerics.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

import ggml_numerics as numerics
from synthetic import _rope, _silu, add_shape_keys

# A WordPiece vocabulary as GGUF stores BERT's: word-initial pieces carry
# U+2581, continuations are bare (the converter's rewrite of "##x").
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = ("the", "cat", "sat", "on", "mat", "dog", "a", "kit", "ten", "import", "numpy", "as", "np",
         "hello", "world", ",", "!", ".", "s", "ing", "ed")


def wordpiece_vocab() -> list[str]:
    return list(SPECIALS) + ["\u2581" + w for w in WORDS] + ["s", "ing", "ed", "ten"]


@dataclass(frozen=True)
class BertConfig:
    arch: str = "bert"               # or "nomic-bert", "nomic-bert-moe"
    n_embd: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 64
    n_ctx_train: int = 128
    n_token_types: int = 2
    norm_eps: float = 1e-12
    rope_base: float = 1000.0        # nomic-bert
    pooling: Optional[int] = 1       # {arch}.pooling_type (1 mean, 2 cls, 3 last); None: not written
    causal: Optional[bool] = False   # {arch}.attention.causal; None: not written (llama.cpp then assumes true)
    fused_qkv: Optional[bool] = None  # default: nomic-bert fused, bert separate
    wtype: str = "f32"               # the blocks' matrices: f32, f16 or q8_0
    seed: int = 0
    n_expert: int = 4                # nomic-bert-moe
    n_expert_used: int = 2
    moe_every: int = 2

    @property
    def n_vocab(self) -> int:
        return len(wordpiece_vocab())

    @property
    def fused(self) -> bool:
        return self.arch.startswith("nomic-bert") if self.fused_qkv is None else self.fused_qkv

    def moe_layer(self, i: int) -> bool:
        return self.arch == "nomic-bert-moe" and self.moe_every > 0 and i % self.moe_every == 1

    def but(self, **kw) -> "BertConfig":
        return replace(self, **kw)


def make_weights(cfg: BertConfig) -> dict[str, np.ndarray]:
    """Random float32 weights, numpy shape (n_out, n_in) as gguf writes them."""
    rng = np.random.default_rng(cfg.seed)
    e, f = cfg.n_embd, cfg.n_ff
    bert = cfg.arch == "bert"
    biased = cfg.arch in ("bert", "nomic-bert-moe")   # biases, and a GELU FFN rather than SwiGLU

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def vec(n, mean=0.0, scale=0.1):
        return (mean + scale * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((cfg.n_vocab, e)).astype(np.float32),
         "token_types.weight": (0.5 * rng.standard_normal((cfg.n_token_types, e))).astype(np.float32),
         "token_embd_norm.weight": vec(e, 1.0), "token_embd_norm.bias": vec(e)}
    if bert:
        w["position_embd.weight"] = (0.5 * rng.standard_normal((cfg.n_ctx_train, e))).astype(np.float32)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if cfg.fused:
            w[p + "attn_qkv.weight"] = mat(3 * e, e)
            if cfg.arch == "nomic-bert-moe":
                w[p + "attn_qkv.bias"] = vec(3 * e)
        else:
            for n in "qkv":
                w[p + f"attn_{n}.weight"] = mat(e, e)
                if bert:
                    w[p + f"attn_{n}.bias"] = vec(e)
        w[p + "attn_output.weight"] = mat(e, e)
        w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"] = vec(e, 1.0), vec(e)
        if cfg.moe_layer(i):
            w[p + "attn_output.bias"] = vec(e)
            w[p + "ffn_gate_inp.weight"] = mat(cfg.n_expert, e)
            w[p + "ffn_up_exps.weight"] = np.stack([mat(f, e) for _ in range(cfg.n_expert)])
            w[p + "ffn_down_exps.weight"] = np.stack([mat(e, f) for _ in range(cfg.n_expert)])
        else:
            w[p + "ffn_up.weight"] = mat(f, e)
            w[p + "ffn_down.weight"] = mat(e, f)
            if biased:
                w[p + "attn_output.bias"] = vec(e)
                w[p + "ffn_up.bias"], w[p + "ffn_down.bias"] = vec(f), vec(e)
            else:
                w[p + "ffn_gate.weight"] = mat(f, e)
        w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"] = vec(e, 1.0), vec(e)
    return w


def write_bert(path: Path, cfg: BertConfig, edit: Optional[Callable[[dict[str, np.ndarray]], None]] = None,
               *, encoder_keys: bool = True) -> dict[str, np.ndarray]:
    """Write ``cfg`` (with its WordPiece vocabulary) to ``path``; returns the
    weights as stored.  ``edit`` may change the weight table first, and
    ``encoder_keys=False`` writes only the shape keys (tests of malformed files)."""
    weights = make_weights(cfg)
    if edit is not None:
        edit(weights)
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    add_shape_keys(writer, cfg)
    if encoder_keys:
        _add_encoder_keys(writer, cfg)
    for name, arr in weights.items():
        if cfg.wtype != "f32" and arr.ndim == 2 and name.startswith("blk."):
            qtype = numerics_qtype(cfg.wtype)
            data = gguf.quants.quantize(arr, qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)
            weights[name] = gguf.quants.dequantize(data, qtype).reshape(arr.shape).astype(np.float32)
        else:
            writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def _add_encoder_keys(writer: gguf.GGUFWriter, cfg: BertConfig) -> None:
    writer.add_layer_norm_eps(cfg.norm_eps)
    if cfg.causal is not None:
        writer.add_causal_attention(cfg.causal)
    if cfg.pooling is not None:
        writer.add_pooling_type(gguf.PoolingType(cfg.pooling))
    if cfg.arch.startswith("nomic-bert"):
        writer.add_rope_freq_base(cfg.rope_base)
    if cfg.arch == "nomic-bert-moe":
        writer.add_expert_count(cfg.n_expert)
        writer.add_expert_used_count(cfg.n_expert_used)
        writer.add_uint32(f"{cfg.arch}.moe_every_n_layers", cfg.moe_every)
    vocab = wordpiece_vocab()
    writer.add_tokenizer_model("bert")
    writer.add_token_list(vocab)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in vocab])
    writer.add_token_type_count(cfg.n_token_types)
    # As llama.cpp's converter writes BERT's: [CLS] is the BOS token, [SEP] the separator.
    for key, token in (("unk", "[UNK]"), ("bos", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("mask", "[MASK]")):
        getattr(writer, f"add_{key}_token_id")(vocab.index(token))
    writer.add_add_bos_token(True)   # [CLS] first; llama.cpp's WordPiece adds [SEP] last by default


def _experts(h, w, p, cfg: BertConfig):
    """nomic-bert-moe's expert FFN: each row's top experts by softmax, GELU(up) then down, weighted."""
    logits = h @ w[p + "ffn_gate_inp.weight"].T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for e in np.argsort(-probs[t], kind="stable")[:cfg.n_expert_used]:
            up = numerics.gelu_f16_table(h[t] @ w[p + "ffn_up_exps.weight"][e].T)
            out[t] += probs[t, e] * (up @ w[p + "ffn_down_exps.weight"][e].T)
    return out


def numerics_qtype(wtype: str):
    return {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[wtype]


def _layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def reference_hidden(weights: dict[str, np.ndarray], cfg: BertConfig, tokens) -> np.ndarray:
    """The last hidden state of every token of one sequence, (n_tokens, n_embd)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens)
    n, e, hd = len(tokens), cfg.n_embd, cfg.n_embd // cfg.n_head
    pos = np.arange(n, dtype=np.float64)
    x = w["token_embd.weight"][tokens] + w["token_types.weight"][0]
    if "position_embd.weight" in w:
        x = x + w["position_embd.weight"][:n]
    x = _layer_norm(x, w["token_embd_norm.weight"], w["token_embd_norm.bias"], cfg.norm_eps)
    allowed = np.tril(np.ones((n, n), dtype=bool)) if cfg.causal in (True, None) else np.ones((n, n), dtype=bool)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in w:
            q, k, v = np.split(x @ w[p + "attn_qkv.weight"].T + w.get(p + "attn_qkv.bias", 0), 3, axis=-1)
        else:
            q, k, v = (x @ w[p + f"attn_{n_}.weight"].T + w.get(p + f"attn_{n_}.bias", 0) for n_ in "qkv")
        q, k, v = (t.reshape(n, cfg.n_head, hd) for t in (q, k, v))
        if cfg.arch.startswith("nomic-bert"):
            q = _rope(q, pos, cfg.rope_base, True)
            k = _rope(k, pos, cfg.rope_base, True)
        out = np.empty((n, cfg.n_head, hd))
        for head in range(cfg.n_head):
            s = np.where(allowed, q[:, head] @ k[:, head].T / math.sqrt(hd), -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head] = (s / s.sum(axis=1, keepdims=True)) @ v[:, head]
        attn = out.reshape(n, e) @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0)
        h = _layer_norm(attn + x, w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"], cfg.norm_eps)
        if p + "ffn_gate_inp.weight" in w:
            ff = _experts(h, w, p, cfg)
        elif p + "ffn_gate.weight" in w:
            ff = (_silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        else:
            up = h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"]
            ff = numerics.gelu_f16_table(up) @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
        x = _layer_norm(ff + h, w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"], cfg.norm_eps)
    return x
