"""Gemma 4's drafter files (``gemma4-assistant``: google/gemma-4-*-it-assistant),
as llama.cpp's llama_model_gemma4_assistant reads them
(graph/arch_gemma4_assistant.pxi builds the step).

A few Gemma 4 layers that store no K and V of their own: each attends over
the target model's cache, a sliding layer over the target's last sliding
layer's cells and a global one over its last global layer's (llama.cpp's
``share`` callback in llama_model::create_memory).  A step takes a token,
embedded by the *target's* table, with the target's final normed hidden
state before it (``embedding_length_out`` wide), projects both to the
drafter's width (``nextn.pre_projection``), and gives logits through its own
token table (tied output) and a hidden state of the target's width again
(``nextn.post_projection``) for the next draft.  The converter writes
``nextn_predict_layers`` equal to ``block_count``: every layer drafts.
"""
from typing import Any

from ...errors import ModelShapeError
from ..archspec.hparams import Key, array
from ..archspec.roles import NAMES
from ..archspec.spec import Architecture, HParam, Role
from ..archspec.swa import checked_head_widths

GLOBAL_ROLES = (
    Role("nextn_proj_pre", "nextn.pre_projection.weight", lambda h: (2 * h["n_embd_out"], h["n_embd"]),
         "drafter: (2 * n_embd_out, n_embd), the target's token embedding and hidden state -> n_embd",
         matmul=True),
    Role("nextn_proj_post", "nextn.post_projection.weight", lambda h: (h["n_embd"], h["n_embd_out"]),
         "drafter: (n_embd, n_embd_out), its normed hidden state -> the target's width, for the next draft",
         matmul=True),
)

HPARAMS = (
    HParam("n_embd_out", "int", 0, "a drafter's: the target's hidden width it takes and gives (embedding_length_out)"),
)

LAYER = ("attn_norm", "wq", "q_norm", "wo", "attn_post_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
         "ffn_post_norm", "layer_out_scale")


def assistant_hparams(h: dict, key: Key, gguf: Any) -> None:
    """As llama_model_gemma4_assistant::load_arch_hparams, and the checks of
    its load_arch_tensors: K and V heads equally wide, the target's width
    (embedding_length_out) not the drafter's own."""
    prefix = "gemma4-assistant."
    n = h["n_layer"]
    count = int(key("nextn_predict_layers", 0))
    if count != n:
        raise ModelShapeError(f"{prefix}nextn_predict_layers = {count} must equal block_count = {n} "
                              f"(every layer of a Gemma 4 drafter drafts)")
    h["n_embd_out"] = out = int(key("embedding_length_out", 0))
    if not 0 < out < 2**20 or out == h["n_embd"]:
        raise ModelShapeError(f"{prefix}embedding_length_out = {out} must carry the target's hidden width "
                              f"(not the drafter's own n_embd = {h['n_embd']})")
    h["attn_scale"] = 1.0
    h["mtp_head"] = True   # a step takes tokens and the hidden states before them
    h["n_swa"] = int(key("attention.sliding_window"))
    raw = array(gguf.get(prefix + "attention.sliding_window_pattern"))
    if raw is None or len(raw) < n or not all(isinstance(v, (bool, int)) for v in raw):
        raise ModelShapeError(f"{prefix}attention.sliding_window_pattern must hold a flag per layer ({n} layers)")
    swa = h["swa_layers"] = [bool(v) for v in raw[:n]]
    if any(swa) and h["n_swa"] <= 0:
        raise ModelShapeError(f"{prefix}attention.sliding_window = {h['n_swa']} must be positive")
    h["rope_base_swa"] = float(key("rope.freq_base_swa", 10000.0))
    h["rope_scale_swa"] = 1.0
    dims_swa = int(key("attention.key_length_swa", h["head_dim_k"])), \
        int(key("attention.value_length_swa", h["head_dim_v"]))
    n_rot_swa = checked_head_widths(h, key, prefix, dims_swa, "a Gemma 4 drafter")
    kv_heads = h.pop("layer_n_head_kv", [h["n_head_kv"]] * n)
    h["layer_n_head_kv"] = kv_heads
    h["layer_head_dim_k"] = [dims_swa[0] if s else h["head_dim_k"] for s in swa]
    h["layer_head_dim_v"] = [dims_swa[1] if s else h["head_dim_v"] for s in swa]
    h["layer_n_rot"] = [n_rot_swa if s else h["n_rot"] for s in swa]
    h["n_head_kv"] = max(kv_heads)
    h["rope_freqs_dims"] = h["head_dim_k"]
    if not all(swa) and NAMES["rope_freqs"] not in gguf.tensors:
        raise ModelShapeError(f"required tensor {NAMES['rope_freqs']!r} is missing "
                              f"(the drafter's global layers rotate through it)")


ARCH = Architecture("gemma4-assistant", "gemma4_assistant", "neox", LAYER, activation="gelu",
                    derive=assistant_hparams, per_layer_shapes=True,
                    global_required=("tok_embd", "output_norm", "nextn_proj_pre", "nextn_proj_post"),
                    global_optional=("rope_freqs",),
                    description="Gemma 4 drafter (gemma4-assistant), drafting over its target's cache")
