"""Laguna (Poolside Laguna XS.2, S.2, M.1), as llama.cpp's laguna graph runs
it (src/models/laguna.cpp): per-head Q/K RMSNorm; a head count of each
layer's own (XS.2: 48 in the full-attention layers, 64 in the sliding ones);
one full-attention layer then three sliding-window ones, where the file has
a window, each kind with its RoPE (YaRN over part of each head on the full
layers, plain RoPE with its own base and width on the sliding ones); the
attention's output times softplus(g_proj(x)), one gate per head or per
element; leading dense layers, then sigmoid-routed experts with a selection
bias beside one always-on shared expert (graph/arch_laguna.pxi)."""
from typing import Any, Mapping

from ...errors import ModelShapeError
from ..archspec.hparams import Key, swa_pattern
from ..archspec.roles import ATTN, EXPERTS
from ..archspec.spec import Architecture, Experts, HParam, Role

ROLES = (
    Role("attn_out_gate", "blk.{i}.attn_gate.weight",
         lambda h: (h["n_embd"], h["n_head"] * h["attn_gate_width"]),
         "(n_embd, n_head) or (n_embd, n_head * head_dim_v): softplus gate on the attention's output (Laguna)",
         matmul=True),
)

HPARAMS = (
    HParam("attn_gate_width", "int", 1, "values one gate multiplies: 1 (a gate per head) or head_dim_k "
           "(per element)", core=False),
    HParam("layer_attn_gate_width", "ints", None, "each layer's attn_gate_width", core=False),
)

# llama_model_laguna::load_arch_hparams: XS.2's layers are full, SWA, SWA, SWA, ...
SWA_PERIOD = 4


def _gate_widths(h: dict, gguf: Any) -> list[int]:
    """Each layer's gate width, from its attn_gate tensor's height, which
    must be one of the two llama.cpp takes (it aborts on any other)."""
    widths = []
    for i, n_head in enumerate(h.get("layer_n_head") or [h["n_head"]] * h["n_layer"]):
        name = f"blk.{i}.attn_gate.weight"
        info = gguf.tensors.get(name)
        height = int(info.shape[1]) if info is not None and len(info.shape) >= 2 else n_head
        if height not in (n_head, n_head * h["head_dim_k"]):
            raise ModelShapeError(f"tensor {name!r} has {height} outputs; expected {n_head} (a gate per head) "
                                  f"or {n_head * h['head_dim_k']} (per element)")
        widths.append(height // n_head)
    return widths


def laguna_hparams(h: dict, key: Key, gguf: Any) -> None:
    prefix = "laguna."
    for name in ("leading_dense_block_count", "expert_feed_forward_length"):
        if gguf.get(prefix + name) is None:   # llama.cpp reads both with no default
            raise ModelShapeError(f"missing hyperparameter {prefix}{name}")
    if "layer_n_head" in h and gguf.get(prefix + "attention.head_count_kv") is None:
        # llama.cpp would give each layer as many KV heads as heads; the converter always writes them
        raise ModelShapeError(f"{prefix}attention.head_count_kv is missing (heads differ per layer)")
    if h["head_dim_v"] != h["head_dim_k"]:   # llama.cpp's graph asserts it
        raise ModelShapeError(f"{prefix}attention.value_length = {h['head_dim_v']} must equal "
                              f"{prefix}attention.key_length = {h['head_dim_k']}")
    for il, n_head in enumerate(h.get("layer_n_head") or ()):
        if n_head % h["n_head_kv"]:
            raise ModelShapeError(f"{prefix}attention.head_count_kv = {h['n_head_kv']} does not divide "
                                  f"layer {il}'s attention.head_count = {n_head}")
    # One shared expert, of expert_shared_feed_forward_length (else the routed experts' width
    # times expert_shared_count, default 1), as llama_model_laguna::load_arch_hparams.
    count = int(key("expert_shared_count", 1))
    width = int(key("expert_shared_feed_forward_length", 0)) or h["n_ff_exp"] * count
    if not 0 < width < 2**31:
        raise ModelShapeError(f"{prefix}expert_shared_feed_forward_length = {width}: the shared expert "
                              f"must have a width")
    h["n_expert_shared"], h["n_ff_shexp"] = 1, width
    # The sliding window is optional (M.1 has none: every layer full).  Its layers turn
    # by plain RoPE: their own base and rotated dims, no scaling, no YaRN.  llama.cpp's
    # full layers rotate hparams.n_rot() dims, layer 0's.
    h["n_swa"] = int(key("attention.sliding_window", 0))
    if h["n_swa"] > 0:
        swa_pattern(h, key, gguf, SWA_PERIOD, dense_first=True)
        h["rope_base_swa"] = float(key("rope.freq_base_swa", h["rope_base"]))
        h["rope_scale_swa"] = 1.0
        n_rot_swa = int(key("rope.dimension_count_swa", h["n_rot"]))
        if not (0 < n_rot_swa <= h["head_dim_k"]) or n_rot_swa % 2:
            raise ModelShapeError(f"{prefix}rope.dimension_count_swa = {n_rot_swa} must be even and at most "
                                  f"{h['head_dim_k']}")
        n_rot_full = n_rot_swa if h["swa_layers"][0] else h["n_rot"]
        h["layer_n_rot"] = [n_rot_swa if swa else n_rot_full for swa in h["swa_layers"]]
    widths = _gate_widths(h, gguf)
    h["attn_gate_width"], h["layer_attn_gate_width"] = widths[0], widths


def laguna_shape(h: Mapping[str, Any]) -> str:
    heads = h.get("layer_n_head") or [h["n_head"]] * h["n_layer"]
    head_counts = "/".join(str(n) for n in sorted(set(heads)))
    gates = set(h.get("layer_attn_gate_width") or [h["attn_gate_width"]])
    gate = " and ".join(("per head" if w == 1 else "per element") for w in sorted(gates))
    parts = [f"{head_counts} heads x {h['head_dim_k']} ({h['n_head_kv']} KV); softplus output gate {gate}"]
    swa = h.get("swa_layers") or []
    if any(swa):
        full = [il for il, s in enumerate(swa) if not s]
        listed = ", ".join(map(str, full[:6])) + (", ..." if len(full) > 6 else "")
        rot = h["layer_n_rot"]
        parts.append(f"sliding window {h['n_swa']} in all layers but {listed or 'none'} "
                     f"(full: RoPE over {rot[full[0]] if full else h['n_rot']} dims; "
                     f"window: RoPE over {rot[swa.index(True)]} dims, base {h['rope_base_swa']:g})")
    else:
        parts.append("every layer full attention")
    parts.append(f"{h['n_layer_dense_lead']} dense, then sigmoid routing with a selection bias "
                 f"and a shared expert of n_ff {h['n_ff_shexp']}")
    return "; ".join(parts)


# Q/K/V biases where the file has them (create_tensor_qkv); the output head
# falls back to the token embeddings; no RoPE factors.
ARCH = Architecture("laguna", "laguna", "neox", ATTN + ("q_norm", "k_norm", "attn_out_gate"),
                    optional=("bq", "bk", "bv"),
                    experts=Experts(gating="sigmoid", normalize=None,
                                    required=EXPERTS + ("ffn_exp_probs_b",)),
                    global_optional=("output",), per_layer_heads=True,
                    derive=laguna_hparams, shape=laguna_shape,
                    description="Laguna XS.2, S.2, M.1 (Poolside)")
