"""Gemma 4 (E2B, E4B, 31B; 26B-A4B with experts), as llama.cpp's
llama_model_gemma4 reads it (graph/arch_gemma4.pxi).

Sliding-window and global layers with their own head widths, KV heads and
rotated dims; the last layers reuse earlier layers' K and V; per-layer token
embeddings; and, in layers with a router, experts beside the dense FFN.
"""
import math
from typing import Any, Mapping

from ...errors import ModelShapeError
from ..archspec.experts import GATING, expert_hparams
from ..archspec.hparams import MAX_WIDTH, Key, array, nextn
from ..archspec.swa import checked_head_widths
from ..archspec.roles import NAMES
from ..archspec.spec import Architecture, Experts, HParam, Role


def _embd(h) -> tuple:
    return (h["n_embd"],)


ROLES = (
    Role("ffn_gate_inp_s", "blk.{i}.ffn_gate_inp.scale", _embd, "the router's input scale (n_embd)"),
    Role("ffn_pre_norm_2", "blk.{i}.pre_ffw_norm_2.weight", _embd, "norm before the experts (n_embd) ..."),
    Role("ffn_post_norm_1", "blk.{i}.post_ffw_norm_1.weight", _embd, "... after the dense FFN of an expert layer"),
    Role("ffn_post_norm_2", "blk.{i}.post_ffw_norm_2.weight", _embd, "... after the experts"),
    Role("per_layer_inp_gate", "blk.{i}.inp_gate.weight", lambda h: (h["n_embd"], h["n_embd_per_layer"]),
         "per-layer embeddings: (n_embd, n_embd_per_layer) ...", matmul=True),
    Role("per_layer_proj", "blk.{i}.proj.weight", lambda h: (h["n_embd_per_layer"], h["n_embd"]),
         "... (n_embd_per_layer, n_embd)", matmul=True),
    Role("per_layer_post_norm", "blk.{i}.post_norm.weight", _embd, "... (n_embd)"),
    Role("layer_out_scale", "blk.{i}.layer_output_scale.weight", lambda h: (1,),
         "optional (1): the layer's output times this"),
)

HPARAMS = (
    HParam("n_embd_per_layer", "int", 0, "per-layer token embeddings' width, 0 for none"),
    HParam("final_logit_softcap", "float", 0.0, "logits = softcap * tanh(logits / softcap); 0: none"),
    HParam("non_causal_swa_only", "int", 0, "1: a non-causal step (an image) attends both ways in the sliding "
           "layers only, the global ones stay causal (llama.cpp's LLAMA_NON_CAUSAL_TYPE_SWA_ONLY)"),
)

# Softmax over the router's logits, the chosen renormalised, GeGLU (llama.cpp's
# gemma4 graph passes these to build_moe_ffn, whatever the file says).
EXPERTS = Experts(gating="softmax", normalize=True, activation="gelu",
                  required=("ffn_gate_inp", "ffn_gate_inp_s", "ffn_down_exps", "ffn_pre_norm_2",
                            "ffn_post_norm_1", "ffn_post_norm_2"),
                  optional=("ffn_down_exps_s",))
LAYER = ("attn_norm", "wq", "wo", "q_norm", "attn_post_norm", "ffn_norm", "ffn_gate", "ffn_up",
         "ffn_down", "ffn_post_norm")
PER_LAYER_EMBD = ("per_layer_inp_gate", "per_layer_proj", "per_layer_post_norm")


def gemma4_hparams(h: dict, key: Key, gguf: Any) -> None:
    """As llama.cpp's llama_model_gemma4::load_arch_hparams.

    Layers slide or not as the per-layer attention.sliding_window_pattern
    says; sliding layers have their own head widths (key_length_swa,
    value_length_swa), rotated dims (rope.dimension_count_swa, default
    rope.dimension_count) and RoPE base (rope.freq_base_swa, default 10000,
    never scaled), and head_count_kv may differ per layer.  The last
    attention.shared_kv_layers layers store no K and V: each attends over
    those of the last earlier layer of its kind (llama.cpp's
    n_layer_kv_from_start and its reuse callback).  Embeddings are scaled by
    sqrt(n_embd), Q.K by 1, and the logits are soft-capped by
    final_logit_softcapping (30 when absent, as in llama.cpp; 0: no cap).  Layers with a router (ffn_gate_inp)
    add the experts (expert_count ...) to the dense FFN."""
    prefix = "gemma4."
    n_all = h["n_layer"]
    nextn(h, key, gguf)
    n = h["n_layer"]
    h["embd_scale"] = math.sqrt(h["n_embd"])
    h["attn_scale"] = 1.0
    h["n_swa"] = int(key("attention.sliding_window"))
    raw = array(gguf.get(prefix + "attention.sliding_window_pattern"))
    if raw is None or len(raw) < n or not all(isinstance(v, (bool, int)) for v in raw):
        raise ModelShapeError(f"{prefix}attention.sliding_window_pattern must hold a flag per layer ({n} layers)")
    swa = h["swa_layers"] = [bool(v) for v in raw[:n]]
    if any(swa) and h["n_swa"] <= 0:
        raise ModelShapeError(f"{prefix}attention.sliding_window = {h['n_swa']} must be positive: "
                              f"{prefix}attention.sliding_window_pattern has sliding layers")
    h["rope_base_swa"] = float(key("rope.freq_base_swa", 10000.0))
    h["rope_scale_swa"] = 1.0
    h["n_embd_per_layer"] = n_pl = int(key("embedding_length_per_layer_input"))
    if not 0 <= n_pl <= MAX_WIDTH:
        raise ModelShapeError(f"{prefix}embedding_length_per_layer_input = {n_pl} is out of range")
    # A file without the key is capped at 30, llama.cpp's default (llama_hparams); 0 turns the cap off.
    h["final_logit_softcap"] = cap = float(key("final_logit_softcapping", 30.0))
    h["non_causal_swa_only"] = 1   # llama.cpp's gemma4 loader sets it, whatever the file says
    if cap < 0:
        raise ModelShapeError(f"{prefix}final_logit_softcapping = {cap} must not be negative")
    dims_swa = int(key("attention.key_length_swa")), int(key("attention.value_length_swa"))
    dims_full = h["head_dim_k"], h["head_dim_v"]
    n_rot_swa = checked_head_widths(h, key, prefix, dims_swa, "Gemma 4")
    kv_heads = h.pop("layer_n_head_kv", [h["n_head_kv"]] * n)
    for il, heads in enumerate(kv_heads):
        if h["n_head"] % heads:
            raise ModelShapeError(f"{prefix}attention.head_count_kv = {heads} (layer {il}) does not divide "
                                  f"head_count = {h['n_head']}")
    shared = int(key("attention.shared_kv_layers", 0))
    first_shared = n_all - shared
    if not 0 <= shared < n_all or (shared and first_shared < 2):
        raise ModelShapeError(f"{prefix}attention.shared_kv_layers = {shared} must leave at least 2 of the "
                              f"{n_all} layers with K/V of their own")
    sources = []
    for il in range(n):
        src = il if il < first_shared else first_shared - (2 if swa[il] else 1)
        if src != il and (swa[src] != swa[il] or kv_heads[src] != kv_heads[il]):
            raise ModelShapeError(f"layer {il} would share the K/V of layer {src}, which is "
                                  f"{'not ' if swa[il] else ''}a sliding-window layer "
                                  f"({prefix}attention.shared_kv_layers = {shared}, sliding_window_pattern)")
        sources.append(src)
    h["layer_n_head_kv"] = kv_heads
    h["layer_head_dim_k"] = [dims_swa[0] if s else dims_full[0] for s in swa]
    h["layer_head_dim_v"] = [dims_swa[1] if s else dims_full[1] for s in swa]
    h["layer_n_rot"] = [n_rot_swa if s else h["n_rot"] for s in swa]
    h["layer_kv_source"] = sources
    h["n_head_kv"] = max(kv_heads)
    # The full-attention layers rotate through rope_freqs (head_dim / 2 factors).
    h["rope_freqs_dims"] = dims_full[0]
    if not all(swa) and NAMES["rope_freqs"] not in gguf.tensors:
        raise ModelShapeError(f"required tensor {NAMES['rope_freqs']!r} is missing "
                              f"(Gemma 4's global layers rotate through it)")
    if n_pl:
        for role in ("per_layer_tok_embd", "per_layer_model_proj", "per_layer_proj_norm"):
            if NAMES[role] not in gguf.tensors:
                raise ModelShapeError(f"required tensor {NAMES[role]!r} is missing "
                                      f"({prefix}embedding_length_per_layer_input = {n_pl})")
    routers = any(NAMES["ffn_gate_inp"].format(i=il) in gguf.tensors for il in range(n))
    if routers or gguf.get(prefix + "expert_count") is not None:
        expert_hparams(h, key, gguf, EXPERTS)
        h["expert_gating"] = GATING["softmax"]
        h["expert_norm"] = True
        h["expert_scale"] = 0.0


def gemma4_layer_roles(h: Mapping[str, Any], i: int, tensors: Mapping[str, Any]):
    """A Gemma 4 layer's roles: K (and its norm) where it stores its own K/V
    (V is optional: without it V is K), the per-layer embeddings' where the
    model has them, and the experts where the layer has a router (their gate
    and up stacked in one tensor, or two)."""
    required: tuple[str, ...] = LAYER
    optional: tuple[str, ...] = ("layer_out_scale",)
    kv = ("wk", "k_norm")
    if h["layer_kv_source"][i] == i:
        required, optional = required + kv, optional + ("wv",)
    else:   # a shared layer's own K/V weights, if the file has them, go unused
        optional = optional + kv + ("wv",)
    if h.get("n_embd_per_layer", 0) > 0:
        required = required + PER_LAYER_EMBD
    if NAMES["ffn_gate_inp"].format(i=i) in tensors:
        fused = NAMES["ffn_gate_up_exps"].format(i=i) in tensors
        required = required + EXPERTS.required + (
            ("ffn_gate_up_exps",) if fused else ("ffn_gate_exps", "ffn_up_exps"))
        optional = optional + EXPERTS.optional
    return required, optional


ARCH = Architecture("gemma4", "gemma4", "neox", LAYER, activation="gelu", derive=gemma4_hparams,
                    layer_roles=gemma4_layer_roles, per_layer_shapes=True,
                    global_optional=("output", "rope_freqs", "per_layer_tok_embd", "per_layer_model_proj",
                                     "per_layer_proj_norm"),
                    description="Gemma 4 (E2B, E4B, 31B; 26B-A4B: experts)")
