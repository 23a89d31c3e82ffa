"""DFlash drafter files (llama.cpp's ``dflash``, src/models/dflash.cpp), as
llama.cpp's converter writes them (conversion/qwen.py, ``DFlashModel``: a
Qwen3 block under the ``dflash`` prefix).

A drafter of a few Qwen3 layers that drafts a whole block of tokens in one
forward pass.  Two kinds of step, as llama.cpp's decoder graph:

- the *injection*: the inputs of some of the target's layers
  (``dflash.target_layers``, already shifted by one by the converter: the
  input of layer ``i + 1`` is the output of layer ``i``), side by side, go
  through ``fc`` and its norm (``enc.output_norm``, the checkpoint's
  ``hidden_norm``) to the drafter's width, and every layer stores its K
  (normed and rotated) and V of them at the target's positions;
- the *block*: the token the target just picked, then ``block_size - 1``
  mask tokens (``tokenizer.ggml.mask_token_id``), each attending over the
  injected cells and over the whole block both ways (non-causal); the
  logits at the mask positions are the drafts.

Real files borrow the target's token embeddings and output (llama.cpp reads
them through ``ctx_other``): ``token_embd``/``output`` are optional here and
taken from the target when absent (elelem.api.draft).  The variants llama.cpp
also reads under this architecture -- DFlash2's selector, DSpark's Markov
head, DeepSeek-V4 stages, a reduced draft vocabulary (``d2t``), sliding
windows, M-RoPE sections that split a head's pairs, attention sinks and
value scales -- are refused with the key or tensor that marks them.
"""
from __future__ import annotations

from typing import Any, Callable

from ...errors import ModelShapeError
from ..archspec.hparams import array, flag, int_list
from ..archspec.spec import Architecture, HParam, Role

#: llama.cpp's default block size where the file has no dflash.block_size (common/speculative.cpp)
DEFAULT_BLOCK_SIZE = 16
#: The most target layers elelem hands a drafter (MAX_FEATURE_LAYERS in _native/graph/blocks.pxi).
MAX_TARGET_LAYERS = 8

ROLES = (
    Role("dflash_fc", "fc.weight", lambda h: (h["n_embd_inp"], h["n_embd"]),
         "DFlash: (n_target_layers * n_embd_target, n_embd), the target's layer inputs fused to the drafter's width",
         matmul=True),
    Role("dflash_fc_norm", "enc.output_norm.weight", lambda h: (h["n_embd"],),
         "DFlash: (n_embd), the norm of the fused target states (the checkpoint's hidden_norm)"),
)

HPARAMS = (
    HParam("n_embd_inp", "int", 0, "the width of a step's embedding rows, where not n_embd "
           "(DFlash: its target's layer inputs side by side)"),
    HParam("block_size", "int", 0, "DFlash: the tokens of one drafted block (the picked token and the masks)",
           core=False),
    HParam("mask_token", "int", -1, "DFlash: the mask token filling a block after the picked token", core=False),
)

LAYER = ("attn_norm", "wq", "wk", "wv", "wo", "q_norm", "k_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
FUSION = ("dflash_fc", "dflash_fc_norm")

# Keys and tensors of the variants llama.cpp reads under ``dflash`` and elelem does not run.
_REFUSED_KEYS = {
    "dflash.selector_rank": "a DFlash2 selector", "dflash.conv_kernel_size": "DFlash2 convolutions",
    "dflash.hyper_connection_count": "DeepSeek-V4 (DSpark) stages",
    "dflash.attention.sliding_window": "sliding-window attention",
    "dflash.attention.value_scale": "an attention value scale",
    "dflash.embedding_scale": "an embedding scale",
}
_REFUSED_TENSORS = {
    "d2t": "a reduced draft vocabulary (d2t)", "markov_w1.weight": "a DSpark Markov head",
    "selector_hidden.weight": "a DFlash2 selector", "blk.0.attn_sinks.weight": "attention sinks",
    "blk.0.attn_post_norm.weight": "post-attention norms", "blk.0.ffn_post_norm.weight": "post-FFN norms",
    "blk.0.layer_output_scale.weight": "layer output scales",
}


def _check_rope_sections(gguf) -> None:
    """Drafters for M-RoPE targets (Qwen3.5's) carry degenerate sections, every rotated pair in
    the temporal one ([n_rot / 2, 0, 0, 0]: llama.cpp's dflash loader and graph, which then ropes
    with ggml_rope_multi).  A text position is the same in every section, so the temporal section
    alone turns each pair by what NeoX RoPE turns it by, with the same floats (ggml's mrope cache
    steps theta_t as the plain cache steps theta): the drafter runs as a plain one.  Sections
    that split the pairs would take the image's 2D positions, which a drafter never sees."""
    sections = int_list(gguf.get("dflash.rope.dimension_sections"))
    if sections is None and gguf.get("dflash.rope.dimension_sections") is None:
        return
    if sections is None or not sections or sections[0] <= 0 or any(sections[1:]):
        raise ModelShapeError(f"dflash.rope.dimension_sections = {sections!r}: elelem runs DFlash drafters whose "
                              f"M-RoPE sections are the temporal one alone ([n_rot / 2, 0, 0, 0], as converted)")


def _layer_roles(h, i: int, tensors) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every layer is a Qwen3 layer; the fusion's two tensors hang on layer 0
    (one of each per file), as the EAGLE-3 head's do."""
    return (LAYER + FUSION if i == 0 else LAYER), ()


def _dflash(h: dict, key: Callable[[str, Any], Any], gguf) -> None:
    """As llama_model_dflash::load_arch_hparams and the checks of its
    load_arch_tensors, for the plain DFlash drafter."""
    for name, what in _REFUSED_KEYS.items():
        if gguf.get(name) is not None:
            raise ModelShapeError(f"this DFlash file has {what} ({name}); elelem runs plain DFlash drafters only")
    for name, what in _REFUSED_TENSORS.items():
        if name in gguf.tensors:
            raise ModelShapeError(f"this DFlash file has {what} ({name!r}); elelem runs plain DFlash drafters only")
    _check_rope_sections(gguf)
    act = gguf.get("dflash.hidden_act")
    if act is not None and act != "silu":
        raise ModelShapeError(f"dflash.hidden_act = {act!r}: elelem runs SiLU DFlash drafters only")
    if flag(gguf, "dflash.attention.causal", False):
        raise ModelShapeError("dflash.attention.causal is set: elelem runs non-causal DFlash drafters only")
    layers = array(gguf.get("dflash.target_layers"))
    if not layers or len(layers) > MAX_TARGET_LAYERS or not all(isinstance(v, int) and v >= 0 for v in layers):
        raise ModelShapeError(f"a DFlash file needs 1 to {MAX_TARGET_LAYERS} target layers (dflash.target_layers), "
                              f"got {gguf.get('dflash.target_layers')!r}")
    h["target_layers"] = [int(v) for v in layers]
    fc = gguf.tensors.get("fc.weight")
    if fc is None or len(fc.shape) != 2 or fc.shape[0] % len(layers):
        raise ModelShapeError(f"fc.weight must be ({len(layers)} * the target's width, n_embd), got "
                              f"{None if fc is None else list(fc.shape)}")
    h["n_embd_inp"] = int(fc.shape[0])
    h["n_embd_target"] = h["n_embd_inp"] // len(layers)
    block = key("block_size", DEFAULT_BLOCK_SIZE)
    if isinstance(block, bool) or not isinstance(block, int) or not 2 <= block <= 256:
        raise ModelShapeError(f"dflash.block_size = {block!r} must be 2 .. 256")
    h["block_size"] = block
    mask = gguf.get("tokenizer.ggml.mask_token_id")
    # a bool is an int to Python, not a token id (a file may hold the key as a GGUF bool)
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < h["n_vocab"]:
        raise ModelShapeError(f"tokenizer.ggml.mask_token_id = {mask!r} must name a token of the vocabulary "
                              f"(0 .. {h['n_vocab'] - 1}): a DFlash block is filled with it")
    h["mask_token"] = mask
    if h["head_dim_k"] != h["head_dim_v"]:
        raise ModelShapeError(f"key_length {h['head_dim_k']} and value_length {h['head_dim_v']} must be equal "
                              f"in a DFlash drafter")
    scale = gguf.get("dflash.attention.scale")
    if scale is not None:
        h["attn_scale"] = float(scale)


ARCH = Architecture("dflash", "dflash", "neox", LAYER, layer_roles=_layer_roles, derive=_dflash,
                    global_required=("output_norm",), global_optional=("tok_embd", "output", "rope_freqs"),
                    description="DFlash drafter (a block of drafts per pass over a target's hidden states)")
