"""Tiny EAGLE-3 drafter heads (``eagle3``) as llama.cpp's converter writes
them (conversion/llama.py, LlamaModel with ``is_eagle3``): llama's keys with
block_count 1, ``eagle3.target_layers`` (three target layers; the
converter's default ``[2, n // 2, n - 3]``), ``eagle3.target_hidden_size``,
``eagle3.norm_before_residual`` and ``eagle3.norm_before_fc``; tensors
``fc`` (the fusion of the target's states), ``enc.output_norm`` (with
norm_before_fc), ``blk.0.attn_norm_2`` (the hidden_norm), Q/K/V over
``2 * n_embd``, its own token embeddings and output (over ``n_vocab_draft``
ids), and ``d2t`` as absolute target ids in I64 where the draft vocabulary
is not the target's.  The target's vocabulary is the head's (the converter
takes the target's tokenizer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

from synthetic import StoredWeights, write_family_model


@dataclass(frozen=True)
class Eagle3Config:
    arch: str = "eagle3"
    n_vocab: int = 49152             # the target's (token_embd's rows; the vocabulary's)
    n_vocab_draft: int = 1024        # the output's; d2t maps them where it is not n_vocab
    n_embd: int = 64
    n_embd_target: int = 64
    target_layers: tuple = (2, 4, 5)  # the converter's default for an 8-layer target
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 2048
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    wtype: str = "f32"
    seed: int = 0
    drop: tuple = ()
    cut: tuple = ()

    @property
    def hd(self) -> int:
        return self.n_embd // self.n_head

    def tensor_type(self, name: str, arr: np.ndarray) -> str:
        return "f32" if arr.ndim < 2 or name == "token_embd.weight" else self.wtype

    def but(self, **kw) -> "Eagle3Config":
        return replace(self, **kw)


def eagle3_weights(cfg: Eagle3Config) -> dict[str, np.ndarray]:
    """Random weights, numpy shape (n_out, n_in) as gguf writes them; d2t int64."""
    rng = np.random.default_rng(cfg.seed)
    e, hd, fused = cfg.n_embd, cfg.hd, 3 * cfg.n_embd_target

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {
        "token_embd.weight": rng.standard_normal((cfg.n_vocab, e)).astype(np.float32),
        "fc.weight": mat(e, fused),
        "output_norm.weight": norm(e),
        "output.weight": mat(cfg.n_vocab_draft, e),
        "blk.0.attn_norm.weight": norm(e),
        "blk.0.attn_norm_2.weight": norm(e),
        "blk.0.attn_q.weight": mat(cfg.n_head * hd, 2 * e),
        "blk.0.attn_k.weight": mat(cfg.n_head_kv * hd, 2 * e),
        "blk.0.attn_v.weight": mat(cfg.n_head_kv * hd, 2 * e),
        "blk.0.attn_output.weight": mat(e, cfg.n_head * hd),
        "blk.0.ffn_norm.weight": norm(e),
        "blk.0.ffn_gate.weight": mat(cfg.n_ff, e),
        "blk.0.ffn_up.weight": mat(cfg.n_ff, e),
        "blk.0.ffn_down.weight": mat(e, cfg.n_ff),
    }
    if cfg.norm_before_fc:
        w["enc.output_norm.weight"] = norm(fused)
    if cfg.n_vocab_draft != cfg.n_vocab:
        # absolute target ids (the converter adds each index to HF's offsets), distinct, ascending as there
        w["d2t"] = np.sort(rng.choice(cfg.n_vocab, cfg.n_vocab_draft, replace=False)).astype(np.int64)
    return w


def add_eagle3_keys(writer: gguf.GGUFWriter, cfg: Eagle3Config) -> None:
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_vocab_size(cfg.n_vocab)
    writer.add_rope_dimension_count(cfg.hd)
    writer.add_array("eagle3.target_layers", list(cfg.target_layers))
    writer.add_uint32("eagle3.target_hidden_size", cfg.n_embd_target)
    writer.add_bool("eagle3.norm_before_residual", cfg.norm_before_residual)
    writer.add_bool("eagle3.norm_before_fc", cfg.norm_before_fc)


def write_eagle3_head(path: Path, cfg: Eagle3Config,
                      extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None) -> StoredWeights:
    return write_family_model(path, cfg, eagle3_weights(cfg), add_eagle3_keys, extra_metadata)
