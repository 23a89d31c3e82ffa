"""What Qwen3.5 and Qwen3-Next share: the Gated DeltaNet layer's tensors
and widths, and which layers recur, as llama.cpp reads them
(graph/arch_qwen35.pxi builds both)."""
from __future__ import annotations

from typing import Any, Mapping

from ...errors import ModelShapeError
from .hparams import Key, int_list, nextn, ssm_widths
from .spec import HParam, Role

# Q, K and V come through attn_qkv ("wqkv"), then a short causal convolution.
ROLES = (
    Role("attn_gate", "blk.{i}.attn_gate.weight", lambda h: (h["n_embd"], h["ssm_d_inner"]),
         "(n_embd, ssm_d_inner): the output gate z", matmul=True),
    Role("ssm_conv1d", "blk.{i}.ssm_conv1d.weight",
         lambda h: (h["ssm_d_conv"], 2 * h["ssm_d_state"] * h["ssm_n_group"] + h["ssm_d_inner"]),
         "(ssm_d_conv, conv channels), F32: ggml_ssm_conv takes F32", f32=True),
    Role("ssm_dt", "blk.{i}.ssm_dt.bias", lambda h: (h["ssm_dt_rank"],), "(ssm_dt_rank): the time-step bias"),
    Role("ssm_a", "blk.{i}.ssm_a", lambda h: (h["ssm_dt_rank"],), "(ssm_dt_rank): -exp(A_log)"),
    Role("ssm_beta", "blk.{i}.ssm_beta.weight", lambda h: (h["n_embd"], h["ssm_dt_rank"]),
         "(n_embd, ssm_dt_rank)", matmul=True),
    Role("ssm_alpha", "blk.{i}.ssm_alpha.weight", lambda h: (h["n_embd"], h["ssm_dt_rank"]),
         "(n_embd, ssm_dt_rank)", matmul=True),
    Role("ssm_norm", "blk.{i}.ssm_norm.weight", lambda h: (h["ssm_d_state"],), "(ssm_d_state)"),
    Role("ssm_out", "blk.{i}.ssm_out.weight", lambda h: (h["ssm_d_inner"], h["n_embd"]),
         "(ssm_d_inner, n_embd)", matmul=True),
)

HPARAMS = (
    HParam("ssm_d_conv", "int", 0, "the convolution's width (its state keeps d_conv - 1 columns)"),
    HParam("ssm_d_inner", "int", 0, "value channels: ssm_dt_rank value heads of ssm_d_state"),
    HParam("ssm_d_state", "int", 0, "the head width (of keys and of values)"),
    HParam("ssm_n_group", "int", 0, "key heads"),
    HParam("ssm_dt_rank", "int", 0, "value heads"),
    HParam("ssm_v_grouped", "bool", False,
           "value heads grouped by key head (qwen3next): Q and K repeated per group, not tiled"),
)

DELTA_NET = ("attn_norm", "ffn_norm", "wqkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_beta",
             "ssm_alpha", "ssm_norm", "ssm_out")


def delta_net_hparams(h: dict, key: Key, gguf: Any) -> None:
    """The Gated DeltaNet layers' widths, and which layers recur
    (attention.recurrent_layers, else every layer but each
    ``full_attention_interval``-th), as llama.cpp reads them; multi-token
    prediction layers skipped.  The attention layers' Q projection also
    carries an output gate."""
    prefix = gguf.get("general.architecture") + "."
    nextn(h, key, gguf)
    ssm_widths(h, key, prefix)
    if h["ssm_d_inner"] % h["ssm_dt_rank"] or h["ssm_dt_rank"] % h["ssm_n_group"] \
            or h["ssm_d_inner"] // h["ssm_dt_rank"] != h["ssm_d_state"]:
        raise ModelShapeError(f"{prefix}ssm.inner_size = {h['ssm_d_inner']} must be ssm.time_step_rank "
                              f"({h['ssm_dt_rank']}) value heads of ssm.state_size ({h['ssm_d_state']}), "
                              f"a multiple of ssm.group_count ({h['ssm_n_group']}) key heads")
    raw = gguf.get(prefix + "attention.recurrent_layers")
    if raw is not None:
        flags = int_list(raw)
        if flags is None or len(flags) < h["n_layer"]:
            raise ModelShapeError(f"{prefix}attention.recurrent_layers must hold a flag per layer")
        h["recurrent_layers"] = [bool(f) for f in flags[:h["n_layer"]]]
    else:
        interval = int(key("full_attention_interval", 4))
        if not 0 < interval <= h["n_layer"] or h["n_layer"] % interval:
            raise ModelShapeError(f"{prefix}full_attention_interval = {interval} must divide "
                                  f"block_count ({h['n_layer']})")
        h["recurrent_layers"] = [(il + 1) % interval != 0 for il in range(h["n_layer"])]
    h["q_gate"] = True
    h["late_output_rows"] = True   # llama.cpp's qwen35 and qwen3next drop unwanted rows after their last layer


def qwen35_hparams(h: dict, key: Key, gguf: Any) -> None:
    """Qwen3.5's hybrid (dense and with experts): Gated DeltaNet layers, and
    every ``full_attention_interval``-th layer full attention whose Q
    projection also carries an output gate; interleaved multi-section RoPE
    (imrope)."""
    prefix = gguf.get("general.architecture") + "."
    delta_net_hparams(h, key, gguf)
    sections = int_list(gguf.get(prefix + "rope.dimension_sections"))
    if sections is None or len(sections) != 4 or not all(0 <= x <= h["n_rot"] for x in sections):
        raise ModelShapeError(f"{prefix}rope.dimension_sections must be 4 section widths")
    h["rope_sections"] = sections
    h["rope_type"] = "imrope"


def state_floats(h: Mapping[str, Any]) -> dict[str, int]:
    """A Gated DeltaNet layer's state per sequence, in floats: its convolution's
    last d_conv - 1 inputs of the Q, K, V channels, and a state matrix per value head."""
    channels = 2 * h["ssm_d_state"] * h["ssm_n_group"] + h["ssm_d_inner"]
    return {"convolution": (h["ssm_d_conv"] - 1) * channels, "delta rule": h["ssm_d_state"] * h["ssm_d_inner"]}
