"""Tiny Gemma 4 drafter files (gemma4-assistant), as llama.cpp's converter
writes them (conversion/gemma.py: Gemma4AssistantModel, over Gemma4Model):
Gemma 4's keys plus embedding_length_out (the target's width) and
nextn_predict_layers = block_count; the token table (the tied output),
nextn.pre_projection / nextn.post_projection, and Gemma 4 layers without
K and V weights.

``agreeing_assistant_weights`` builds a drafter that predicts what a target
whose layers leave the residual stream alone (``quiet_target``) predicts,
so that its drafts are confirmed: the pre-projection passes the token's
target embedding through, the drafter's layers add nothing, and its token
table is the target's output padded to its width.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

from synthetic import add_gemma4_keys, add_moe_keys, add_shape_keys, write_family_model, write_tensors


@dataclass(frozen=True)
class AssistantConfig:
    arch: str = "gemma4-assistant"
    n_embd: int = 48              # the drafter's own width
    n_embd_out: int = 64          # its target's (embedding_length_out)
    n_head: int = 2
    n_head_kv: tuple = (1, 2)     # a count per layer: those of the target's layers it reads
    head_dim: int = 32            # global layers' head width: the target's last global layer's
    head_dim_swa: int = 16        # sliding layers': the target's last sliding layer's
    n_ff: int = 96
    swa: tuple = (True, False)    # a flag per layer: sliding or global
    n_swa: int = 8
    n_ctx_train: int = 4096
    n_vocab: int = 96
    rms_eps: float = 1e-6
    rope_base: float = 1000000.0
    rope_base_swa: float = 10000.0
    rope_partial: float = 0.25
    seed: int = 0
    wtype: str = "f32"
    weights: Optional[dict] = None  # the tensors to write instead of random ones (agreeing_assistant_weights)
    extra_keys: tuple = ()
    drop: tuple = ()
    cut: tuple = ()

    @property
    def n_layer(self) -> int:
        return len(self.swa)

    def but(self, **changes) -> "AssistantConfig":
        return replace(self, **changes)

    def tensor_type(self, name: str, arr: np.ndarray) -> str:
        return "f32" if arr.ndim < 2 else self.wtype


def assistant_weights(cfg: AssistantConfig) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cfg.seed)
    e, eo = cfg.n_embd, cfg.n_embd_out

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((cfg.n_vocab, e)).astype(np.float32),
         "output_norm.weight": norm(e),
         "nextn.pre_projection.weight": mat(e, 2 * eo),
         "nextn.post_projection.weight": mat(eo, e)}
    if not all(cfg.swa):
        turning = int(cfg.head_dim * cfg.rope_partial / 2)
        w["rope_freqs.weight"] = np.array([1.0] * turning + [1e30] * (cfg.head_dim // 2 - turning), np.float32)
    for i, swa in enumerate(cfg.swa):
        p, hd = f"blk.{i}.", cfg.head_dim_swa if swa else cfg.head_dim
        q = cfg.n_head * hd
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = mat(q, e)
        w[p + "attn_q_norm.weight"] = norm(hd)
        w[p + "attn_output.weight"] = mat(e, q)
        w[p + "post_attention_norm.weight"] = norm(e)
        w[p + "ffn_norm.weight"] = norm(e)
        w[p + "ffn_gate.weight"] = mat(cfg.n_ff, e)
        w[p + "ffn_up.weight"] = mat(cfg.n_ff, e)
        w[p + "ffn_down.weight"] = mat(e, cfg.n_ff)
        w[p + "post_ffw_norm.weight"] = norm(e)
        w[p + "layer_output_scale.weight"] = np.array([0.5 + 0.1 * i], np.float32)
    return w


def agreeing_assistant_weights(cfg: AssistantConfig, target: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A drafter that predicts what ``target`` (written by :func:`quiet_target`'s config:
    layers adding nothing to the residual stream, an untied output) predicts next."""
    w = assistant_weights(cfg)
    e, eo = cfg.n_embd, cfg.n_embd_out
    assert e > eo, "the drafter carries the target's embedding in its first n_embd_out dims"
    pre = np.zeros((e, 2 * eo), np.float32)
    pre[:eo, :eo] = np.eye(eo)                     # the token's target embedding, through
    w["nextn.pre_projection.weight"] = pre
    for i in range(cfg.n_layer):                   # layers that add nothing
        w[f"blk.{i}.post_attention_norm.weight"] = np.zeros(e, np.float32)
        w[f"blk.{i}.post_ffw_norm.weight"] = np.zeros(e, np.float32)
        w[f"blk.{i}.layer_output_scale.weight"] = np.ones(1, np.float32)
    w["output_norm.weight"] = np.concatenate([target["output_norm.weight"], np.zeros(e - eo, np.float32)])
    w["token_embd.weight"] = np.concatenate(
        [target["output.weight"], np.zeros((cfg.n_vocab, e - eo), np.float32)], axis=1)
    return w


def quiet_target(weights: dict[str, np.ndarray], n_layer: int) -> dict[str, np.ndarray]:
    """``weights`` of a gemma4 target whose layers leave the residual stream alone
    (their post-attention and post-FFN norms zero): it predicts from the token alone."""
    w = dict(weights)
    for i in range(n_layer):
        w[f"blk.{i}.post_attention_norm.weight"] = np.zeros_like(w[f"blk.{i}.post_attention_norm.weight"])
        w[f"blk.{i}.post_ffw_norm.weight"] = np.zeros_like(w[f"blk.{i}.post_ffw_norm.weight"])
    return w


def add_assistant_keys(writer: gguf.GGUFWriter, cfg: AssistantConfig) -> None:
    """The keys Gemma4AssistantModel.set_gguf_parameters writes."""
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(list(cfg.n_head_kv) if len(set(cfg.n_head_kv)) > 1 else cfg.n_head_kv[0])
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_key_length_swa(cfg.head_dim_swa)
    writer.add_value_length_swa(cfg.head_dim_swa)
    writer.add_sliding_window(cfg.n_swa)
    writer.add_sliding_window_pattern(list(cfg.swa))
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_dimension_count_swa(cfg.head_dim_swa)
    writer.add_rope_freq_base_swa(cfg.rope_base_swa)
    writer.add_shared_kv_layers(0)
    writer.add_embedding_length_per_layer_input(0)
    writer.add_embedding_length_out(cfg.n_embd_out)
    writer.add_nextn_predict_layers(cfg.n_layer)
    for key, value in cfg.extra_keys:
        writer.add_uint32(key.format(arch=cfg.arch), value)


def write_assistant(path: Path, cfg: AssistantConfig,
                    extra_metadata: Optional[Callable[[gguf.GGUFWriter], None]] = None):
    weights = dict(cfg.weights) if cfg.weights is not None else assistant_weights(cfg)
    return write_family_model(path, cfg, weights, add_assistant_keys, extra_metadata)


def write_gemma4_target(path: Path, cfg, weights: dict[str, np.ndarray]):
    """A gemma4 file of ``cfg``'s keys (as synthetic.write_model writes them) with ``weights``."""
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    add_shape_keys(writer, cfg)
    add_gemma4_keys(writer, cfg)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_rope_freq_base(cfg.rope_base)
    if cfg.head_dim is not None:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    add_moe_keys(writer, cfg)
    return write_tensors(writer, cfg, weights)
