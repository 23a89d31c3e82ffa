"""Gemma 3: embeddings scaled by sqrt(n_embd), norms before and after both
the attention and the FFN, GeGLU, and sliding-window layers with their own
RoPE base (graph/arch_gemma3.pxi)."""
import math
from typing import Any

from ..archspec.hparams import Key
from ..archspec.roles import ATTN_FFN
from ..archspec.spec import Architecture


def gemma3_hparams(h: dict, key: Key, gguf: Any) -> None:
    # With a sliding window, layer il attends over the window unless
    # il % pattern == pattern - 1 (pattern 6: five local layers, then one
    # global); local layers use rope.freq_base_swa (default 10000, as
    # llama.cpp), global ones rope.freq_base.  Q is scaled by
    # 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 62-layer 27B).
    h["embd_scale"] = math.sqrt(h["n_embd"])
    h["n_swa"] = int(key("attention.sliding_window", 0))
    if h["n_swa"] > 0:
        pattern = int(key("attention.sliding_window_pattern", 6))
        h["swa_layers"] = [pattern == 0 or il % pattern < pattern - 1 for il in range(h["n_layer"])]
    h["rope_base_swa"] = float(key("rope.freq_base_swa", 10000.0))
    # Linear RoPE scaling (Gemma 3 4B-27B: factor 8) is for the global layers
    # only: llama.cpp's rope_freq_scale_train_swa is 1 for gemma3.
    h["rope_scale_swa"] = 1.0
    width = h["n_embd"] / h["n_head"] if h["n_layer"] == 62 else h["head_dim_k"]
    h["attn_scale"] = 1.0 / math.sqrt(width)


ARCH = Architecture("gemma3", "gemma3", "neox", ATTN_FFN + ("q_norm", "k_norm", "attn_post_norm", "ffn_post_norm"),
                    activation="gelu", derive=gemma3_hparams, description="Gemma 3")
