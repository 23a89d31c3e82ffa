"""EAGLE-3 drafter files (llama.cpp's ``eagle3``, src/models/eagle3.cpp): a
one-layer head that drafts for a target model from the target's own hidden
states, as llama.cpp's converter writes them (conversion/llama.py, the
``is_eagle3`` path).

The head reads the inputs of three of the target's layers (``target_layers``:
low, middle and high; each ``n_embd_target`` wide), concatenated, and fuses
them into its own width with ``fc`` (normed first by ``enc.output_norm``
where ``norm_before_fc``): that is ``g``.  Its one decoder layer takes the
token after each position with that position's ``g``, each normed
(``attn_norm``, ``attn_norm_2``) and side by side (Q/K/V project from
``2 * n_embd``), the residual being ``g`` itself (or its norm, where
``norm_before_residual``); then the FFN, the output norm and its own output
over a draft vocabulary (``d2t`` maps each draft id to the target's).  A
chained draft step takes the head's own pre-norm state as its ``g``.

elelem runs the file as its own model beside the target (elelem.engine.eagle3);
the graph builder is ``_native/graph/arch_eagle3.pxi``.  A file may lack
``token_embd`` or ``output`` (Llama 3.1's heads have no token table): the
head then uses the target's own tensors, shared, not copied (llama.cpp reads
them through ``ctx_other``; here ``_core.borrow_target_weights``), and its
vocabulary's size is the tokenizer's.  Without an output of its own its
logits are the target's output's, over the whole vocabulary (a ``d2t``
there must map all of it, as llama.cpp's d2t scatter requires).
"""
from __future__ import annotations

from typing import Any, Callable

from ...errors import ModelShapeError
from ..archspec.hparams import array, flag
from ..archspec.spec import Architecture, HParam, Role

# llama.cpp's EAGLE-3 takes exactly three target layers (llama_model_eagle3::load_arch_hparams)
N_TARGET_LAYERS = 3


def _fused(h) -> int:
    return N_TARGET_LAYERS * h["n_embd_target"]


ROLES = (
    Role("attn_norm_2", "blk.{i}.attn_norm_2.weight", lambda h: (h["n_embd"],),
         "EAGLE-3: the norm of g (the fused target states) before the attention"),
    Role("eagle3_fc", "fc.weight", lambda h: (_fused(h), h["n_embd"]),
         "EAGLE-3: (3 * n_embd_target, n_embd), the target's three layers' inputs fused into g", matmul=True),
    Role("eagle3_fc_norm", "enc.output_norm.weight", lambda h: (_fused(h),),
         "EAGLE-3, with norm_before_fc: (3 * n_embd_target), the norm of the target's states before fc"),
    Role("eagle3_output", "output.weight", lambda h: (h["n_embd"], h["n_vocab_draft"]),
         "EAGLE-3: (n_embd, n_vocab_draft), the head's logits over its draft vocabulary", matmul=True),
)

HPARAMS = (
    HParam("n_embd_target", "int", 0, "EAGLE-3: the target model's width (target_hidden_size)"),
    HParam("norm_before_fc", "bool", False, "EAGLE-3: the target's states are normed before fc"),
    HParam("norm_before_residual", "bool", False, "EAGLE-3: the residual is the normed g, not g"),
    HParam("target_layers", "ints", None, "EAGLE-3: the target layers whose inputs it reads", core=False),
    HParam("n_vocab_draft", "int", 0, "EAGLE-3: its output's vocabulary (d2t maps it to the target's)",
           core=False),
    HParam("n_embd_attn_in", "int", 0, "the width Q/K/V project from, where not n_embd (EAGLE-3: 2 * n_embd)",
           core=False),
)


def _eagle3(h: dict, key: Callable[[str, Any], Any], gguf) -> None:
    layers = array(gguf.get("eagle3.target_layers"))
    if layers is None or len(layers) != N_TARGET_LAYERS or not all(isinstance(v, int) for v in layers):
        raise ModelShapeError(f"an EAGLE-3 file needs {N_TARGET_LAYERS} integer eagle3.target_layers, "
                              f"got {gguf.get('eagle3.target_layers')!r}")
    if any(v < 0 for v in layers):
        raise ModelShapeError(f"eagle3.target_layers {layers} holds a negative layer")
    h["target_layers"] = [int(v) for v in layers]
    h["n_embd_target"] = int(key("target_hidden_size", None))
    if not 0 < h["n_embd_target"] < 2**20:
        raise ModelShapeError(f"eagle3.target_hidden_size = {h['n_embd_target']} is out of range")
    h["norm_before_fc"] = flag(gguf, "eagle3.norm_before_fc", False)
    h["norm_before_residual"] = flag(gguf, "eagle3.norm_before_residual", False)
    if h["norm_before_fc"] and "enc.output_norm.weight" not in gguf.tensors:
        raise ModelShapeError("eagle3.norm_before_fc is set but the file has no enc.output_norm.weight")
    if h["n_layer"] != 1:
        raise ModelShapeError(f"an EAGLE-3 head has one layer, this file has {h['n_layer']}")
    h["n_embd_attn_in"] = 2 * h["n_embd"]
    out = gguf.tensors.get("output.weight")
    if out is not None and len(out.shape) != 2:
        raise ModelShapeError(f"output.weight must be 2-D, got {list(out.shape)}")
    # without an output of its own, the target's: over the whole vocabulary
    h["n_vocab_draft"] = int(out.shape[1]) if out is not None else h["n_vocab"]
    d2t = gguf.tensors.get("d2t")
    if d2t is not None and (d2t.type_name != "I64" or d2t.shape != (h["n_vocab_draft"],)):
        raise ModelShapeError(f"d2t must be I64 ({h['n_vocab_draft']}), got {d2t.type_name} {list(d2t.shape)}")
    if d2t is None and h["n_vocab_draft"] != h["n_vocab"]:
        raise ModelShapeError(f"the output's vocabulary ({h['n_vocab_draft']}) is not the target's "
                              f"({h['n_vocab']}) and the file has no d2t to map it")
    h["mtp_head"] = True   # its steps take a hidden state (g) with each token


ARCH = Architecture("eagle3", "eagle3", "normal",
                    ("attn_norm", "attn_norm_2", "wq", "wk", "wv", "wo", "ffn_norm", "ffn_gate", "ffn_up",
                     "ffn_down", "eagle3_fc"),
                    optional=("eagle3_fc_norm", "eagle3_output"), global_required=("output_norm",),
                    global_optional=("tok_embd", "rope_freqs"), derive=_eagle3,
                    description="EAGLE-3 drafter (a one-layer head over a target's hidden states)")
