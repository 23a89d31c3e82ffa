"""IBM Granite 4.0 H (llama.cpp's granitehybrid, graph/arch_granitehybrid.pxi):
Mamba-2 layers (elelem.model.archspec.mamba2) and attention layers without
positional encoding, which ones from the per-layer ``attention.head_count_kv``
(0 for Mamba-2); every layer then an FFN: SwiGLU (Micro), or experts routed
by a softmax and renormalised, beside one shared SwiGLU expert (Tiny,
Small); and Granite's scalars -- the embeddings, each residual branch, the
attention's Q.K and the logits each multiplied (or divided) by one."""
import math
from typing import Any, Mapping

from ...errors import ModelShapeError
from ..archspec.experts import expert_hparams
from ..archspec.hparams import Key
from ..archspec.mamba2 import ATTENTION_BIASES, MAMBA2, NEMOTRON_ATTENTION, mamba2_hparams, state_floats
from ..archspec.roles import DENSE_FFN, EXPERTS, SHARED_EXPERTS
from ..archspec.spec import Architecture, Experts, HParam

HPARAMS = (
    HParam("residual_multiplier", "float", 0.0,
           "multiplies each residual branch before its add (Granite: residual_scale); 0: none"),
    HParam("logits_scaling", "float", 0.0, "divides the logits (Granite: logit_scale); 0: none"),
)

# How llama.cpp's granitehybrid routes: softmax, the chosen weights renormalised, never scaled.
_EXPERTS = Experts(gating="softmax", normalize=True)


def _scale(key: Key, name: str) -> float:
    value = float(key(name, 0.0))
    if value < 0 or not math.isfinite(value):
        raise ModelShapeError(f"granitehybrid.{name} = {value} must not be negative")
    return value


def granitehybrid_hparams(h: dict, key: Key, gguf: Any) -> None:
    """The Mamba-2 widths, Granite's scalars, and the experts where the file
    has them (expert_count > 0: each as wide as feed_forward_length, as
    llama.cpp's granitehybrid shapes them).  Refused as llama.cpp refuses
    them, or runs them otherwise: a Mamba-2 inner width other than twice
    n_embd, and RoPE attention (Bamba's conversions)."""
    key("attention.layer_norm_rms_epsilon")   # llama.cpp's granitehybrid requires it
    mamba2_hparams(h, key, gguf)
    if h["ssm_d_inner"] != 2 * h["n_embd"]:
        raise ModelShapeError(f"granitehybrid.ssm.inner_size = {h['ssm_d_inner']} must be twice embedding_length "
                              f"({h['n_embd']}), as llama.cpp's granitehybrid asserts")
    if gguf.get("granitehybrid.rope.scaling.finetuned", True) is not False:
        raise ModelShapeError("granitehybrid.rope.scaling.finetuned is not false: elelem runs the Granite 4.0 H "
                              "hybrids, whose attention has no RoPE, not the RoPE variant (Bamba)")
    if h["head_dim_k"] != h["head_dim_v"]:
        raise ModelShapeError("granitehybrid: attention.key_length and value_length must be equal")
    h["embd_scale"] = _scale(key, "embedding_scale") or 1.0
    h["residual_multiplier"] = _scale(key, "residual_scale")
    h["logits_scaling"] = _scale(key, "logit_scale")
    if _scale(key, "attention.scale"):
        h["attn_scale"] = _scale(key, "attention.scale")
    if int(key("expert_count", 0)) > 0:
        expert_hparams(h, key, gguf, _EXPERTS)
        h["n_ff_exp"] = h["n_ff"]
        h["expert_scale"] = 0.0   # granitehybrid reads no expert_weights_scale
    for i in range(h["n_layer"]):
        for part in ("gate", "up", "down"):
            if f"blk.{i}.ffn_{part}.bias" in gguf.tensors:
                raise ModelShapeError(f"tensor 'blk.{i}.ffn_{part}.bias': elelem does not run Granite FFNs with "
                                      f"biases (no Granite 4.0 H conversion has them)")


def granitehybrid_layer_roles(h: Mapping[str, Any], i: int, tensors: Mapping[str, Any]):
    """(required, optional) roles of layer i: Mamba-2 or attention, its FFN norm, then the FFN."""
    mixer, optional = (MAMBA2, ()) if h["recurrent_layers"][i] else (NEMOTRON_ATTENTION, ATTENTION_BIASES)
    if not h.get("n_expert"):
        return mixer + ("ffn_norm",) + DENSE_FFN, optional
    shared = SHARED_EXPERTS if h["n_ff_shexp"] > 0 else ()
    return mixer + ("ffn_norm",) + EXPERTS + shared, optional


def granite_shape(h: Mapping[str, Any]) -> str:
    heads = h["ssm_dt_rank"]
    return (f"Mamba-2 d_inner {h['ssm_d_inner']}: {heads} heads of {h['ssm_d_inner'] // heads}, "
            f"{h['ssm_n_group']} groups, state {h['ssm_d_state']}, convolution {h['ssm_d_conv']}; scales: "
            f"embeddings {h['embd_scale']:g}, residual {h['residual_multiplier']:g}, attention {h['attn_scale']:g}, "
            f"logits 1/{h['logits_scaling']:g}")


ARCH = Architecture("granitehybrid", "granitehybrid", "normal", NEMOTRON_ATTENTION, optional=ATTENTION_BIASES,
                    recurrent_from_kv_heads=True, layer_roles=granitehybrid_layer_roles,
                    derive=granitehybrid_hparams, recurrent=MAMBA2, recurrent_state=state_floats,
                    recurrent_kind="Mamba-2", shape=granite_shape,
                    description="IBM Granite 4.0 H (Mamba-2 hybrid)")
