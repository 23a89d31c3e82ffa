"""The declarations an architecture module is made of.

A :class:`Role` is a tensor an architecture's layers may have; a
:class:`HParam` a hyperparameter its reading may set; an
:class:`Architecture` the table entry that names which roles a layer must
and may have and how the hyperparameters are read.  The native core's
``LayerWeights`` and ``HParams`` structs are generated from the roles and
hyperparameters every module declares (:mod:`elelem.model.archs._codegen`), so a declaration here
is all a builder needs to read ``lw.<role>`` or ``hp.<hparam>``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

Shape = Callable[[Mapping[str, Any]], tuple]


@dataclass(frozen=True)
class Role:
    """A per-layer (or model-wide) tensor: the native field ``name``, the
    GGUF tensor ``gguf`` (``{i}``: the layer), and its ggml shape as a
    function of the hyperparameters (checked before the core sees it)."""
    name: str
    gguf: str
    shape: Shape
    doc: str = ""            # the struct field's comment: its shape, what it is for
    matmul: bool = False     # the weight of a mul_mat (repacked where the CPU can)
    f32: bool = False        # a matrix ggml adds (or convolves), not multiplies: F32 only


class SameAs(str):
    """A hyperparameter's default that is another's value (``rope_base_swa``: ``rope_base``)."""


REQUIRED = object()   # a hyperparameter every model has: no default

# Python type of each kind of hyperparameter, and the native declaration of those in HParams.
KINDS = {
    "int": (int, "int {}"),
    "float": (float, "float {}"),
    "bool": (bool, "bint {}"),
    "int[4]": (list, "int {}[4]"),
    "str": (str, None),
    "ints": (list, None),     # one value per layer: the core reads these by name
    "bools": (list, None),
}


@dataclass(frozen=True)
class HParam:
    """A hyperparameter: its kind (``KINDS``), its default where a model may
    lack it (``REQUIRED`` otherwise), and what it means.  Native kinds become
    ``HParams`` fields, filled with this default when a model does not set it."""
    name: str
    kind: str
    default: Any
    doc: str
    # a "str" hyperparameter the core takes as one of these C constants (rope_type)
    native_values: Optional[Mapping[str, str]] = None
    core: bool = True      # False: read by the checks in Python only, no HParams field

    @property
    def native(self) -> bool:
        return self.core and (KINDS[self.kind][1] is not None or self.native_values is not None)


@dataclass(frozen=True)
class Experts:
    """How an architecture's expert FFN routes tokens: the arguments
    llama.cpp's build_moe_ffn takes for it.  Layers from
    ``leading_dense_block_count`` on have experts, those before it the dense
    FFN (GLM-4.5's first layer)."""
    gating: str = "softmax"          # router probabilities: "softmax", "sigmoid", or "softmax_weight"
                                     # (the raw logits, softmax over the chosen experts only: gpt-oss)
    normalize: Optional[bool] = True # renormalise the chosen weights to sum 1; None: the file says
                                     # (expert_weights_norm)
    activation: str = "silu"         # SwiGLU, "swiglu_oai": gpt-oss's clamped variant, "gelu": GeGLU (Gemma 4),
                                     # or "relu_sqr": no gate, relu(up)^2 (Nemotron-3-Nano)
    required: tuple[str, ...] = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    optional: tuple[str, ...] = ()


# (hparams being read, key(name, default) reading "<arch>.<name>", the file) -> None
Derive = Callable[[dict, Callable[[str, Any], Any], Any], None]


@dataclass(frozen=True)
class Architecture:
    name: str                         # general.architecture
    builder: str                      # the native graph builder (graph/arch_<builder>.pxi)
    rope_type: str                    # "neox" (rotate halves) or "normal" (rotate pairs)
    required: tuple[str, ...]         # per-layer roles that must exist
    optional: tuple[str, ...] = ()    # per-layer roles used when present
    activation: str = "silu"          # gated FFN activation: "silu" or "gelu"
    derive: Optional[Derive] = None   # reads and checks the hyperparameters special to it
    description: str = ""
    global_required: tuple[str, ...] = ("tok_embd", "output_norm")   # model-wide roles that must exist
    global_optional: tuple[str, ...] = ("output", "rope_freqs")
    encoder: bool = False             # no output head: embeddings only (BERT family)
    experts: Optional[Experts] = None # a mixture-of-experts FFN (its layers lack the dense FFN roles)
    tensor_names: Mapping[str, str] = field(default_factory=dict)  # roles under another GGUF name
    recurrent: tuple[str, ...] = ()   # roles of a recurrent layer (hparams' recurrent_layers say which)
    # a fused recurrent role -> the roles it stands in for where the file has it and not
    # all of them (llama.cpp takes the separate ones where both are there)
    recurrent_fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # (hparams, layer, the file's tensor names) -> (required, optional) roles of that layer, where
    # they differ from layer to layer beyond what ``experts`` says (Gemma 4)
    layer_roles: Optional[Callable[[Mapping[str, Any], int, Mapping[str, Any]],
                                   tuple[tuple[str, ...], tuple[str, ...]]]] = None
    per_layer_shapes: bool = False   # head_count_kv and feed_forward_length may differ per layer
    per_layer_heads: bool = False    # head_count may differ per layer (Laguna; the builder reads LayerShape.n_head)
    # a layer whose head_count_kv is 0 recurs, the others attend (llama.cpp's LFM2: is_recr(il))
    recurrent_from_kv_heads: bool = False
    # reads the per-layer arrays that say each layer's kind, setting n_ff, n_head_kv,
    # recurrent_layers and the per-layer lists, in place of feed_forward_length and
    # head_count_kv read as numbers (Nemotron-H: elelem.model.archspec.mamba2)
    layer_kinds: Optional[Derive] = None
    # (hparams) -> a recurrent layer's state per sequence in floats, by part (``elelem info``)
    recurrent_state: Optional[Callable[[Mapping[str, Any]], Mapping[str, int]]] = None
    recurrent_kind: str = ""          # what a recurrent layer is, in words (``elelem info``)
    # (hparams) -> a line for ``elelem info``: what sets this family's shape apart
    shape: Optional[Callable[[Mapping[str, Any]], str]] = None
    # the graph builder of the multi-token-prediction head its files may carry after
    # its layers (nextn_predict_layers; elelem.model.mtp); "" where it has none
    mtp_builder: str = ""
