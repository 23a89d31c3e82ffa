"""The Mamba-2 layer as llama.cpp runs it for its hybrids (Nemotron-H, Granite
4.0 H: llm_build_mamba_base::build_mamba2_layer): its tensors, its widths,
and which layers are Mamba-2, attention or FFN-only as llama.cpp reads them
(graph/mamba2.pxi builds the layer).

A Mamba-2 layer projects its input to z (the gate, ``ssm_d_inner``), xBC
(``ssm_d_inner`` of x, then B and C, ``ssm_n_group * ssm_d_state`` each) and
dt (one per head: ``ssm_dt_rank`` heads of ``ssm_d_inner / ssm_dt_rank``);
convolves xBC causally over the last ``ssm_d_conv`` positions, one kernel per
channel, plus a bias, then SiLU; scans x with the per-head decay ``A`` and
time step ``softplus(dt + dt_bias)`` through a (ssm_d_state, head width)
state per head, B and C shared by the heads of a group (ggml_ssm_scan); adds
``D * x``; gates with SiLU(z); normalizes each group's channels (RMS) and
scales them; projects back.  Its memory of a sequence is the convolution's
last ``ssm_d_conv - 1`` inputs and the scan's state: the recurrent state the
one cache keeps per sequence, in the same two parts as a Gated DeltaNet
layer's (the hyperparameters are Gated DeltaNet's, elelem.model.archspec.delta_net).

The converter (conversion/mamba.py: Mamba2Model) stores A as -exp(A_log)
and it and D as (1, heads), the norm as (group width, groups), the
convolution kernel squeezed to (d_conv, channels).
"""
from __future__ import annotations

from typing import Any, Mapping

from ...errors import ModelShapeError
from .hparams import Key, int_list, nextn, ssm_widths
from .spec import HParam, Role


def conv_channels(h: Mapping[str, Any]) -> int:
    """xBC's width: x, then B and C of every group."""
    return h["ssm_d_inner"] + 2 * h["ssm_n_group"] * h["ssm_d_state"]


# The convolution kernel (ssm_conv1d), the time-step bias (ssm_dt) and the output
# projection (ssm_out) are shaped as Gated DeltaNet's and share its roles.
ROLES = (
    Role("mamba_in", "blk.{i}.ssm_in.weight",
         lambda h: (h["n_embd"], h["ssm_d_inner"] + conv_channels(h) + h["ssm_dt_rank"]),
         "(n_embd, z + xBC + dt widths): 2 * ssm_d_inner + 2 * ssm_n_group * ssm_d_state + ssm_dt_rank",
         matmul=True),
    Role("mamba_conv_b", "blk.{i}.ssm_conv1d.bias", lambda h: (conv_channels(h),),
         "(conv channels): the convolution's bias"),
    Role("mamba_a", "blk.{i}.ssm_a", lambda h: (1, h["ssm_dt_rank"]), "(1, heads): -exp(A_log), a decay per head",
         f32=True),
    Role("mamba_d", "blk.{i}.ssm_d", lambda h: (1, h["ssm_dt_rank"]), "(1, heads): the skip D * x per head",
         f32=True),
    Role("mamba_norm", "blk.{i}.ssm_norm.weight",
         lambda h: (h["ssm_d_inner"] // h["ssm_n_group"], h["ssm_n_group"]),
         "(ssm_d_inner / ssm_n_group, ssm_n_group): the grouped RMS norm's scale", f32=True),
)

HPARAMS = (
    HParam("ffn_layers", "bools", None, "1 for a layer that is an FFN alone (Nemotron-H's MLP or experts layers)",
           core=False),
)

# A Mamba-2 layer's roles, its norm first.
MAMBA2 = ("attn_norm", "mamba_in", "ssm_conv1d", "mamba_conv_b", "ssm_dt", "mamba_a", "mamba_d", "mamba_norm",
          "ssm_out")
# Nemotron-H's other layers: attention (no RoPE, optional biases), the squared-ReLU MLP, and
# (Nemotron-3-Nano) experts routed by a sigmoid with a selection bias beside a shared expert.
NEMOTRON_ATTENTION = ("attn_norm", "wq", "wk", "wv", "wo")
ATTENTION_BIASES = ("bq", "bk", "bv", "bo")
NEMOTRON_MLP = ("attn_norm", "ffn_up", "ffn_down")
NEMOTRON_EXPERTS = ("attn_norm", "ffn_gate_inp", "ffn_exp_probs_b", "ffn_up_exps", "ffn_down_exps", "ffn_up_shexp",
                    "ffn_down_shexp")


def mamba2_hparams(h: dict, key: Key, gguf: Any) -> None:
    """The Mamba-2 layers' widths (ssm.*), as llama.cpp reads them, checked as
    its graph asserts them (d_inner a multiple of the heads and of the groups)."""
    prefix = gguf.get("general.architecture") + "."
    ssm_widths(h, key, prefix)
    if h["ssm_d_inner"] % h["ssm_dt_rank"] or h["ssm_d_inner"] % h["ssm_n_group"] \
            or h["ssm_dt_rank"] % h["ssm_n_group"]:
        raise ModelShapeError(f"{prefix}ssm.inner_size = {h['ssm_d_inner']} must be a multiple of "
                              f"ssm.time_step_rank ({h['ssm_dt_rank']} heads) and of ssm.group_count "
                              f"({h['ssm_n_group']} groups), the heads a multiple of the groups")


def _per_layer(gguf: Any, name: str, n: int) -> list[int]:
    """``name`` as one count per layer (a number stands for every layer's)."""
    raw = gguf.get(name)
    values = int_list(raw)
    if values is None:
        if raw is None or isinstance(raw, bool) or not isinstance(raw, int):
            raise ModelShapeError(f"{name} must be a number or an integer per layer ({n} layers)")
        values = [int(raw)] * n
    if len(values) < n or any(not 0 <= v < 2**31 for v in values):
        raise ModelShapeError(f"{name} must hold a count per layer ({n} layers), 0 or more")
    return values[:n]


def layer_kinds_from_kv_heads_and_ffn(h: dict, key: Key, gguf: Any) -> None:
    """Nemotron-H's layer kinds, as llama.cpp's nemotron_h reads them: a layer
    with neither KV heads (``attention.head_count_kv``) nor an FFN
    (``feed_forward_length``) is a Mamba-2 layer, one with KV heads and no FFN
    an attention layer, one with an FFN an FFN-only layer (the dense MLP, or
    the experts).  The attention layers share one KV head count and the FFN
    layers one width, as every conversion writes them; the layers that do
    not attend store no K/V (``layer_n_head_kv`` 0)."""
    prefix = gguf.get("general.architecture") + "."
    n = h["n_layer"]
    kv = _per_layer(gguf, prefix + "attention.head_count_kv", n)
    ff = _per_layer(gguf, prefix + "feed_forward_length", n)
    kinds = ["F" if f else ("A" if k else "M") for k, f in zip(kv, ff)]
    attending = sorted({k for k, kind in zip(kv, kinds) if kind == "A"})
    widths = sorted({f for f in ff if f})
    if len(attending) != 1 or len(widths) > 1:
        raise ModelShapeError(f"{prefix}attention.head_count_kv = {kv} and feed_forward_length = {ff} must give "
                              f"attention layers of one KV head count (at least one) and FFN layers of one width")
    if any(k and f for k, f in zip(kv, ff)):
        raise ModelShapeError(f"{prefix}attention.head_count_kv = {kv}, feed_forward_length = {ff}: a layer has "
                              f"either KV heads (attention) or an FFN, not both")
    h["n_head_kv"] = attending[0]
    h["n_ff"] = widths[0] if widths else h["n_embd"]
    h["recurrent_layers"] = [kind == "M" for kind in kinds]
    h["layer_n_head_kv"] = [k if kind == "A" else 0 for k, kind in zip(kv, kinds)]
    h["ffn_layers"] = [kind == "F" for kind in kinds]


def layer_letters(h: Mapping[str, Any]) -> str:
    """The layers in order, a letter each as Nemotron-H's configs write them:
    M Mamba-2, * attention, - an FFN (E: experts)."""
    ffn = "E" if h.get("n_expert") else "-"
    return "".join("M" if r else (ffn if f else "*") for r, f in zip(h["recurrent_layers"], h["ffn_layers"]))


def nemotron_h_hparams(h: dict, key: Key, gguf: Any) -> None:
    """The Mamba-2 widths, and the norms' epsilon: llama.cpp requires
    ``attention.layer_norm_epsilon`` and takes it for the RMS norms where the
    file has no ``layer_norm_rms_epsilon`` (Nemotron-H's conversions have
    only the former)."""
    prefix = gguf.get("general.architecture") + "."
    eps = float(key("attention.layer_norm_epsilon"))
    if gguf.get(prefix + "attention.layer_norm_rms_epsilon") is None:
        h["rms_eps"] = eps
    mamba2_hparams(h, key, gguf)
    if h["head_dim_k"] != h["head_dim_v"]:
        raise ModelShapeError(f"{prefix}attention.key_length ({h['head_dim_k']}) and value_length "
                              f"({h['head_dim_v']}) must be equal (llama.cpp's nemotron_h asserts it)")
    for i, ffn in enumerate(h["ffn_layers"]):
        for part in ("up", "down"):
            if ffn and f"blk.{i}.ffn_{part}.bias" in gguf.tensors:
                raise ModelShapeError(f"tensor 'blk.{i}.ffn_{part}.bias': elelem does not run Nemotron-H MLPs "
                                      f"with biases (no conversion of a released model has them)")


def nemotron_h_layer_roles(h: Mapping[str, Any], i: int, tensors: Mapping[str, Any]):
    """(required, optional) roles of layer i: Mamba-2, attention, the MLP or the experts."""
    if h["recurrent_layers"][i]:
        return MAMBA2, ()
    if h["ffn_layers"][i]:
        return (NEMOTRON_EXPERTS if h.get("n_expert") else NEMOTRON_MLP), ()
    return NEMOTRON_ATTENTION, ATTENTION_BIASES


def mamba2_shape(h: Mapping[str, Any]) -> str:
    heads = h["ssm_dt_rank"]
    return (f"Mamba-2 d_inner {h['ssm_d_inner']}: {heads} heads of {h['ssm_d_inner'] // heads}, "
            f"{h['ssm_n_group']} groups, state {h['ssm_d_state']}, convolution {h['ssm_d_conv']}; "
            f"layers {layer_letters(h)}")


def nemotron_h_moe_layer_kinds(h: dict, key: Key, gguf: Any) -> None:
    """Nemotron-3-Nano's layer kinds, after its multi-token-prediction block
    (counted in block_count, after the layers; skipped as llama.cpp's main
    graph skips it); the per-layer expert counts of Nemotron's Puzzle models
    refused."""
    prefix = gguf.get("general.architecture") + "."
    nextn(h, key, gguf)
    for name in ("expert_used_count", "expert_feed_forward_length"):
        if int_list(gguf.get(prefix + name)) is not None:
            raise ModelShapeError(f"{prefix}{name} is an array: elelem does not run models whose layers have "
                                  f"experts of their own counts or widths (Nemotron's Puzzle models)")
    layer_kinds_from_kv_heads_and_ffn(h, key, gguf)


def nemotron_h_moe_hparams(h: dict, key: Key, gguf: Any) -> None:
    """nemotron_h's, and the expert variants llama.cpp has that no released
    Nemotron-3-Nano file uses, refused: latent expert projections
    (moe_latent_size, Nemotron 3 Super) and grouped routing."""
    prefix = gguf.get("general.architecture") + "."
    nemotron_h_hparams(h, key, gguf)
    if int(key("moe_latent_size", 0)):
        raise ModelShapeError(f"{prefix}moe_latent_size: elelem does not run experts over a latent projection "
                              f"(Nemotron 3 Super)")
    if int(key("expert_group_count", 0)) > 1:
        raise ModelShapeError(f"{prefix}expert_group_count = {int(key('expert_group_count'))}: grouped expert "
                              f"routing is not supported by elelem")


def state_floats(h: Mapping[str, Any]) -> dict[str, int]:
    """A Mamba-2 layer's state per sequence, in floats: its convolution's last
    d_conv - 1 inputs of the xBC channels, and a (d_state, head width) state per head."""
    return {"convolution": (h["ssm_d_conv"] - 1) * conv_channels(h), "scan": h["ssm_d_state"] * h["ssm_d_inner"]}
