"""The multi-token-prediction head of a model file, as a model of its own.

A file whose architecture declares an MTP graph builder (``mtp_builder``) and
whose ``nextn_predict_layers`` is positive carries, after the model's own
``n_layer`` layers, a block that drafts the token after next
(:mod:`elelem.model.archspec.nextn`).  :func:`mtp_spec` describes it as a
one-layer model over the same file -- the block's attention and FFN tensors
as layer 0, with its ``nextn.*`` tensors, and the model's token embeddings,
output norm and output -- which the native core opens beside the model and
runs in a context of its own (elelem.engine.mtp).  As in llama.cpp, only the
first NextN block is used (its qwen35 and glm4moe MTP graphs assert a single one).

The head may also come in a file of its own, as ggml-org publishes it beside
a model converted without it (llama.cpp's converter, ``--mtp``: an ``mtp-``
file with the model's metadata, the NextN block, and the embeddings, output
norm and output, but none of the model's own layers):
:func:`companion_spec` reads such a file.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..errors import ModelShapeError, UnsupportedArchitectureError
from . import archs
from .architectures import ModelSpec, _check_shape, _hparams, _layer_roles
from .archspec.nextn import NEXTN_OPTIONAL, NEXTN_REQUIRED

if TYPE_CHECKING:
    from ..gguf.reader import GGUFFile

# Per-layer lists of the main model's hyperparameters, which the head's one layer takes its own entry of.
_PER_LAYER = ("recurrent_layers", "swa_layers", "layer_n_head_kv", "layer_head_dim_k", "layer_head_dim_v",
              "layer_n_ff", "layer_n_rot", "layer_kv_source")


def has_mtp(spec: ModelSpec) -> bool:
    """Whether ``spec``'s file carries an MTP head elelem can run."""
    return bool(spec.arch.mtp_builder) and spec.hparams.get("n_layer_nextn", 0) > 0


def mtp_spec(spec: ModelSpec, gguf: GGUFFile) -> Optional[ModelSpec]:
    """The one-layer model of ``spec``'s first MTP block, or None where the
    file has none; raises ModelShapeError where its tensors do not fit."""
    if not has_mtp(spec):
        return None
    h = spec.hparams
    il = h["n_layer"]                     # the first NextN block comes right after the model's layers
    # Which roles the block has: those of an attention layer of the model at index il.
    whole: dict[str, Any] = dict(h, n_layer=il + 1)
    for name in _PER_LAYER:
        if name in h and h[name] is not None:
            whole[name] = list(h[name]) + [False if name in ("recurrent_layers", "swa_layers") else h[name][-1]]
    if "n_layer_dense_lead" in h:
        whole["n_layer_dense_lead"] = min(h["n_layer_dense_lead"], il)
    required, optional = _layer_roles(spec.arch, whole, il, gguf.tensors)
    layer_roles = archs.layer_roles()
    table: dict[str, Optional[str]] = {}
    for role in required + NEXTN_REQUIRED + optional + NEXTN_OPTIONAL:
        name = spec.arch.tensor_names.get(role, layer_roles[role].gguf).format(i=il)
        if name not in gguf.tensors:
            if role in required or role in NEXTN_REQUIRED:
                raise ModelShapeError(f"the multi-token-prediction block {il} lacks its tensor {name!r}")
            continue
        _check_shape(gguf, layer_roles[role], name, h)
        table[role] = name
    head: dict[str, Any] = dict(h, n_layer=1, n_layer_nextn=0, mtp_head=True)
    for name in _PER_LAYER:
        if name in whole and whole[name] is not None:
            head[name] = [whole[name][il]]
    if "n_layer_dense_lead" in h:
        head["n_layer_dense_lead"] = 1 if whole["n_layer_dense_lead"] > il else 0
    return ModelSpec(spec.arch, head, dict(spec.global_tensors), [table])


def mtp_matmul_weights(head: ModelSpec) -> list[str]:
    """The head's matmul weights: its layer's, and the output it uses."""
    layer = head.layer_tensors[0]
    roles = archs.layer_roles()
    names = [n for role, n in layer.items() if n and roles[role].matmul and role != "nextn_shared_head_head"]
    output = layer.get("nextn_shared_head_head") or head.global_tensors["output"] or head.global_tensors["tok_embd"]
    if output:
        names.append(output)
    return names


def is_companion(gguf: GGUFFile) -> bool:
    """Whether ``gguf`` is an MTP head alone: NextN layers, none of the model's own."""
    arch = archs.find(str(gguf.get("general.architecture", "")))
    prefix = f"{arch.name}." if arch is not None else ""
    return (arch is not None and bool(arch.mtp_builder) and int(gguf.get(prefix + "nextn_predict_layers", 0) or 0) > 0
            and not any(name.startswith("blk.0.") for name in gguf.tensors))


def companion_spec(gguf: GGUFFile) -> ModelSpec:
    """The one-layer model of a companion MTP file (:func:`is_companion`)."""
    arch = archs.find(str(gguf.get("general.architecture", "")))
    if arch is None or not arch.mtp_builder or not is_companion(gguf):
        raise UnsupportedArchitectureError(f"{gguf.path} is not a multi-token-prediction head elelem can run")
    hparams = _hparams(gguf, arch)
    roles = archs.global_roles()
    globals_: dict[str, Optional[str]] = {role: None for role in roles}
    for role in arch.global_required + arch.global_optional:
        name = arch.tensor_names.get(role, roles[role].gguf)
        if name in gguf.tensors:
            _check_shape(gguf, roles[role], name, hparams)
            globals_[role] = name
        elif role in arch.global_required:
            raise ModelShapeError(f"the MTP file {gguf.path} lacks the model's {name!r}")
    head = mtp_spec(ModelSpec(arch, hparams, globals_, []), gguf)
    assert head is not None, "is_companion checked the NextN layers"
    return head
