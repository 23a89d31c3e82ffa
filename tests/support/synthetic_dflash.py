"""Tiny DFlash drafters (``dflash``) as llama.cpp's converter writes them
(conversion/qwen.py, ``DFlashModel``, a Qwen3Model): Qwen3's keys under the
``dflash`` prefix (``key_length``/``value_length`` the head width),
``dflash.block_size``, ``dflash.target_layers`` (the checkpoint's
``target_layer_ids`` plus one: the input of the layer after each) and
``tokenizer.ggml.mask_token_id``; tensors: Qwen3 layers (per-head Q/K norms),
``fc`` (the target's layer inputs side by side to the drafter's width),
``enc.output_norm`` (the checkpoint's ``hidden_norm``) and ``output_norm``.
The checkpoints borrow the target's token embeddings and output, so the
converter writes neither (``own=True`` writes both, as a file with its own
does); the target's vocabulary is the drafter's (the converter takes the
target's tokenizer).
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
class DFlashConfig:
    arch: str = "dflash"
    n_vocab: int = 49152              # the target's
    n_embd: int = 64                  # the target's too (the drafter embeds with the target's table)
    n_embd_target: int = 64
    target_layers: tuple = (1, 3, 5, 7)   # written as they are (already shifted by the converter)
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 2048
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    block_size: int = 8
    mask_token: int = 5
    own: bool = False                 # its own token_embd and output
    wtype: str = "f32"
    seed: int = 0
    drop: tuple = ()
    cut: tuple = ()
    extra_keys: tuple = ()            # ((key, value), ...) written as they are

    @property
    def hd(self) -> int:
        return self.n_embd // self.n_head

    def tensor_type(self, name: str, arr: np.ndarray) -> str:
        return "f32" if arr.ndim < 2 or name == "token_embd.weight" else self.wtype

    def but(self, **kw) -> "DFlashConfig":
        return replace(self, **kw)


def dflash_weights(cfg: DFlashConfig) -> dict[str, np.ndarray]:
    """Random weights, numpy shape (n_out, n_in) as gguf writes them."""
    rng = np.random.default_rng(cfg.seed)
    e, hd, fused = cfg.n_embd, cfg.hd, len(cfg.target_layers) * cfg.n_embd_target

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"fc.weight": mat(e, fused), "enc.output_norm.weight": norm(e), "output_norm.weight": norm(e)}
    if cfg.own:
        w["token_embd.weight"] = rng.standard_normal((cfg.n_vocab, e)).astype(np.float32)
        w["output.weight"] = mat(cfg.n_vocab, e)
    for i in range(cfg.n_layer):
        w |= {
            f"blk.{i}.attn_norm.weight": norm(e),
            f"blk.{i}.attn_q.weight": mat(cfg.n_head * hd, e),
            f"blk.{i}.attn_k.weight": mat(cfg.n_head_kv * hd, e),
            f"blk.{i}.attn_v.weight": mat(cfg.n_head_kv * hd, e),
            f"blk.{i}.attn_output.weight": mat(e, cfg.n_head * hd),
            f"blk.{i}.attn_q_norm.weight": norm(hd),
            f"blk.{i}.attn_k_norm.weight": norm(hd),
            f"blk.{i}.ffn_norm.weight": norm(e),
            f"blk.{i}.ffn_gate.weight": mat(cfg.n_ff, e),
            f"blk.{i}.ffn_up.weight": mat(cfg.n_ff, e),
            f"blk.{i}.ffn_down.weight": mat(e, cfg.n_ff),
        }
    return w


def add_dflash_keys(writer: gguf.GGUFWriter, cfg: DFlashConfig) -> None:
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_key_length(cfg.hd)
    writer.add_value_length(cfg.hd)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_uint32("dflash.block_size", cfg.block_size)
    writer.add_array("dflash.target_layers", list(cfg.target_layers))
    writer.add_uint32("tokenizer.ggml.mask_token_id", cfg.mask_token)
    for key, value in cfg.extra_keys:
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, (list, tuple)):
            writer.add_array(key, list(value))
        else:
            writer.add_string(key, value)


def write_dflash(path: Path, cfg: DFlashConfig,
                 extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None) -> StoredWeights:
    return write_family_model(path, cfg, dflash_weights(cfg), add_dflash_keys, extra_metadata)
