"""A model's hyperparameters and tensors, read and checked against its architecture.

Each architecture is one module of :mod:`elelem.model.archs` (its table
entry, its hyperparameters and its tensor roles), found by the file's
``general.architecture``; the graph is built natively by the builder the
entry names (``elelem/_native/graph/arch_*.pxi``).

Everything is checked here, in Python, before the native core sees the file:
missing tensors, mis-shaped tensors and hyperparameters that do not fit all
raise :class:`~elelem.errors.ModelShapeError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..errors import ModelShapeError, UnsupportedArchitectureError
from . import archs
from .archspec.experts import expert_hparams
from .archspec.rank import classifier_hparams
from .archspec.hparams import MAX_LAYERS, MAX_WIDTH, check_hparams, key_reader, per_layer_key, rope_scaling
from .archspec.shortconv import layer_kinds_from_kv_heads
from .archspec.spec import Architecture, Role

if TYPE_CHECKING:
    from ..gguf.reader import GGUFFile

# ggml types the CPU backend can multiply (as the weight of a mul_mat) and
# look rows up in (get_rows); integer and 64-bit float tensors cannot be.
_MATRIX_TYPES = frozenset({
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0",
    "MXFP4",
})
# Norm weights, biases and RoPE factors take part in element-wise F32 ops.
_VECTOR_TYPES = frozenset({"F32"})
_DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")
_SHARED_EXPERTS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


def supported_architectures() -> list[str]:
    return sorted(archs.architectures())


@dataclass
class ModelSpec:
    """What the native core needs to open a model: all of it validated."""
    arch: Architecture
    hparams: dict[str, Any]
    global_tensors: dict[str, Optional[str]]
    layer_tensors: list[dict[str, Optional[str]]] = field(default_factory=list)

    def matmul_weights(self) -> list[str]:
        """Tensors used as the weight operand of a matrix multiplication."""
        roles = archs.layer_roles()
        names = [n for table in self.layer_tensors for role, n in table.items() if n and roles[role].matmul]
        global_roles = archs.global_roles()
        names += [n for role, n in self.global_tensors.items() if n and role != "output" and global_roles[role].matmul]
        head = self.global_tensors["output"] or self.global_tensors["tok_embd"]   # tok_embd: always there
        if not self.arch.encoder and head:  # an encoder has no output projection
            names.append(head)
        return names

    def kv_heads(self) -> tuple[int, int, int, bool]:
        """(KV heads, K head width, V head width, whether V is stored) of the
        attention as the cache holds it: the hyperparameters', or with
        multi-head latent attention one head of the latent and the RoPE part,
        V the latent, a view of K's rows (elelem.model.archspec.mla)."""
        h = self.hparams
        if h.get("kv_lora_rank"):
            return 1, h["kv_lora_rank"] + h["n_rot"], h["kv_lora_rank"], False
        return h["n_head_kv"], h["head_dim_k"], h["head_dim_v"], True

    def widened_bytes(self, tensors: dict, excluded=frozenset()) -> int:
        """The memory Q8_0 copies of the Q5_0 matmul weights (but ``excluded``)
        would take, from the file's tensor table: 34 bytes for each 22-byte
        block (elelem/_native/widen.pxi)."""
        return sum(tensors[n].nbytes // 22 * 34 for n in set(self.matmul_weights()) - set(excluded)
                   if n in tensors and tensors[n].type_name == "Q5_0")

    @property
    def description(self) -> str:
        h = self.hparams
        ffn = (f"{h['n_expert']} experts ({h['n_expert_used']} used) of n_ff {h['n_ff_exp']}"
               if "n_expert" in h else f"n_ff {h['n_ff']}")
        return (f"{self.arch.name}: {h['n_layer']} layers, n_embd {h['n_embd']}, "
                f"{h['n_head']} heads ({h['n_head_kv']} KV), {ffn}, "
                f"vocab {h['n_vocab']}, trained context {h['n_ctx_train']}")

    def layer_pattern(self) -> Optional[str]:
        """A hybrid's layers in order, a letter each: R recurrent, A attention, F an FFN
        alone (Nemotron-H); None for others."""
        flags = self.hparams.get("recurrent_layers")
        if not flags or not any(flags):
            return None
        ffn = self.hparams.get("ffn_layers") or [False] * len(flags)
        return "".join("R" if f else ("F" if alone else "A") for f, alone in zip(flags, ffn))

    def recurrent_state_bytes(self) -> Optional[dict[str, int]]:
        """One sequence's recurrent state over every recurrent layer, in bytes
        by part (F32, as the cache keeps it); None where the architecture does not say."""
        flags = self.hparams.get("recurrent_layers") or []
        if self.arch.recurrent_state is None or not any(flags):
            return None
        per_layer = self.arch.recurrent_state(self.hparams)
        return {part: 4 * floats * sum(flags) for part, floats in per_layer.items()}

    def parameter_counts(self, tensors: Mapping[str, Any]) -> tuple[int, int]:
        """(total, active): the weights' element count, and how many of them
        one token reads -- the experts it is routed to, not all of them (the
        embedding table counts once, as llama.cpp's n_params does)."""
        total = active = 0
        used: set[str] = set()
        for table in [self.global_tensors] + self.layer_tensors:
            used.update(n for n in table.values() if n)
        for name in used:
            n = math.prod(tensors[name].shape)
            total += n
            is_expert = any(name.endswith(s) for s in ("_exps.weight", "_exps.bias"))
            active += n * self.hparams["n_expert_used"] // self.hparams["n_expert"] if is_expert else n
        return total, active


def model_spec(gguf: GGUFFile) -> ModelSpec:
    """Read and check the hyperparameters and tensor table of ``gguf``."""
    arch_name = gguf.get("general.architecture")
    if not isinstance(arch_name, str):
        raise UnsupportedArchitectureError("the file has no general.architecture key")
    arch = archs.find(arch_name)
    if arch is None:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {arch_name!r}; supported: {', '.join(supported_architectures())}")
    hparams = _hparams(gguf, arch)
    tensors = _tensor_tables(gguf, arch, hparams)
    return ModelSpec(arch, hparams, *tensors)


def _n_vocab(gguf: GGUFFile, arch: Architecture) -> int:
    """The vocabulary's size: the token table's rows; for a drafter that
    embeds by its target's table (token_embd optional: EAGLE-3 and DFlash heads), the
    tokenizer's tokens, as llama.cpp's vocab.n_tokens(), or where the file has
    no tokenizer its ``vocab_size`` key."""
    embd = gguf.tensors.get(archs.global_roles()["tok_embd"].gguf)
    if embd is None and "tok_embd" in arch.global_optional:
        tokens = gguf.get("tokenizer.ggml.tokens")
        if isinstance(tokens, (str, bytes, int, float)) or not hasattr(tokens, "__len__"):
            tokens = None   # not an array: no vocabulary to count
        n = len(tokens) if tokens is not None else gguf.get(arch.name + ".vocab_size")
        if not isinstance(n, int) or not 0 < n < 2**31:
            raise ModelShapeError(f"this file has no token_embd.weight to size its vocabulary, and neither "
                                  f"tokenizer.ggml.tokens nor {arch.name}.vocab_size ({n!r})")
        return n
    if embd is None or len(embd.shape) != 2:
        raise ModelShapeError("tensor 'token_embd.weight' is missing or not 2-D")
    return int(embd.shape[1])


def _hparams(gguf: GGUFFile, arch: Architecture) -> dict[str, Any]:
    """The hyperparameters every decoder has, then the architecture's own
    (its ``derive``), checked against their declarations."""
    prefix = arch.name + "."
    key = key_reader(gguf, prefix)
    h: dict[str, Any] = {
        "n_vocab": _n_vocab(gguf, arch),
        "n_embd": int(key("embedding_length")),
        "n_layer": int(key("block_count")),
        "n_ctx_train": int(key("context_length")),
        "rms_eps": float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_base": float(key("rope.freq_base", 10000.0)),
        "rope_type": arch.rope_type,
    }
    if not 0 < h["n_layer"] <= MAX_LAYERS:
        raise ModelShapeError(f"hyperparameter n_layer = {h['n_layer']} is out of range")
    # One head count, or one per layer (Laguna: its full and sliding layers differ)
    h["n_head"] = per_layer_key(h, gguf, arch.name, arch.per_layer_shapes or arch.per_layer_heads, key,
                                "attention.head_count", "layer_n_head", None)
    if arch.layer_kinds is not None:
        arch.layer_kinds(h, key, gguf)
    else:
        _ffn_and_kv_heads(h, gguf, arch, key)
    for name in ("n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_ctx_train", "n_vocab"):
        if not 0 < h[name] < 2**31:
            raise ModelShapeError(f"hyperparameter {name} = {h[name]} is out of range")
    last_layer = f"blk.{h['n_layer'] - 1}."
    if h["n_layer"] > MAX_LAYERS or not any(name.startswith(last_layer) for name in gguf.tensors):
        raise ModelShapeError(f"block_count = {h['n_layer']} does not match the file's layers")
    for name in ("n_embd", "n_head", "n_head_kv", "n_ff"):
        if h[name] > MAX_WIDTH:
            raise ModelShapeError(f"hyperparameter {name} = {h[name]} is out of range")
    # llama.cpp's default head width is n_embd over the first layer's head count
    n_head_first = h["layer_n_head"][0] if "layer_n_head" in h else h["n_head"]
    if gguf.get(prefix + "attention.key_length") is None and h["n_embd"] % n_head_first != 0:
        raise ModelShapeError(f"n_head = {n_head_first} does not divide n_embd = {h['n_embd']}")
    h["head_dim_k"] = int(key("attention.key_length", h["n_embd"] // n_head_first))
    h["head_dim_v"] = int(key("attention.value_length", h["head_dim_k"]))
    for name in ("head_dim_k", "head_dim_v"):
        if not 0 < h[name] <= 4096:
            raise ModelShapeError(f"{name} = {h[name]} is out of range")
    h["n_rot"] = int(key("rope.dimension_count", h["head_dim_k"]))
    h.update(rope_scaling(gguf, prefix, key, h["n_ctx_train"]))
    h["attn_scale"] = 1.0 / math.sqrt(h["head_dim_k"])
    if arch.experts is not None:
        expert_hparams(h, key, gguf, arch.experts)
    if arch.derive is not None:
        arch.derive(h, key, gguf)
    classifier_hparams(h, gguf, arch.name)

    if h["n_head"] % h["n_head_kv"] != 0:
        raise ModelShapeError(f"n_head_kv = {h['n_head_kv']} does not divide n_head = {h['n_head']}")
    for name in ("head_dim_k", "head_dim_v"):
        if not 0 < h[name] <= 4096:
            raise ModelShapeError(f"{name} = {h[name]} is out of range")
    if not (0 < h["n_rot"] <= h["head_dim_k"]) or h["n_rot"] % 2:
        raise ModelShapeError(f"rope.dimension_count = {h['n_rot']} must be even and at most {h['head_dim_k']}")
    if not (h["rms_eps"] > 0 and math.isfinite(h["rms_eps"])):
        raise ModelShapeError(f"layer_norm_rms_epsilon = {h['rms_eps']} must be positive")
    if not (h["rope_base"] > 0 and math.isfinite(h["rope_base"])):
        raise ModelShapeError(f"rope.freq_base = {h['rope_base']} must be positive")
    if not 0 <= h.get("n_swa", 0) < 2**31:
        raise ModelShapeError(f"attention.sliding_window = {h['n_swa']} is out of range")
    for name in ("rope_base_swa", "rope_scale", "rope_scale_swa", "attn_scale", "embd_scale"):
        if name in h and not (math.isfinite(h[name]) and h[name] > 0):
            raise ModelShapeError(f"{name} = {h[name]} must be a positive number")
    check_hparams(h, archs.hparams())
    return h


def _ffn_and_kv_heads(h: dict[str, Any], gguf: GGUFFile, arch: Architecture, key) -> None:
    """feed_forward_length and head_count_kv, each a number or one per layer."""
    prefix = arch.name + "."
    # A model whose every layer has experts may have no dense FFN width.
    h["n_ff"] = per_layer_key(h, gguf, arch.name, arch.per_layer_shapes, key, "feed_forward_length", "layer_n_ff",
                              gguf.get(prefix + "expert_feed_forward_length") if arch.experts else None)
    if arch.recurrent_from_kv_heads:
        layer_kinds_from_kv_heads(h, gguf, arch.name)
    else:
        h["n_head_kv"] = per_layer_key(h, gguf, arch.name, arch.per_layer_shapes, key, "attention.head_count_kv",
                                       "layer_n_head_kv", h["n_head"])


# Per-layer hparams lists (Gemma 4, Laguna) -> the hparam each gives a layer its value of.
_LAYER_HPARAMS = {"layer_n_head": "n_head", "layer_n_head_kv": "n_head_kv", "layer_head_dim_k": "head_dim_k",
                  "layer_head_dim_v": "head_dim_v", "layer_n_ff": "n_ff", "layer_attn_gate_width": "attn_gate_width"}


def _layer_hparams(h: Mapping[str, Any], i: int) -> Mapping[str, Any]:
    """The hyperparameters layer ``i``'s shapes follow: ``h``, or where some
    differ from layer to layer, with the layer's own values."""
    own = {name: h[lists][i] for lists, name in _LAYER_HPARAMS.items() if lists in h and h[lists][i] != h[name]}
    return dict(h, **own) if own else h


def _check_shape(gguf: GGUFFile, role: Role, name: str, h: Mapping[str, Any]) -> None:
    info = gguf.tensors[name]
    want = tuple(role.shape(h))
    # The token-type table is added as a vector (its row 0), so it is F32 too.
    allowed = _VECTOR_TYPES if len(want) == 1 or role.f32 else _MATRIX_TYPES
    if info.type_name not in allowed:
        raise ModelShapeError(f"tensor {name!r} ({role.name}) has type {info.type_name}, which elelem cannot "
                              f"compute with here; expected one of {', '.join(sorted(allowed))}")
    got = tuple(info.shape)
    # A trailing dimension of 1 is the same shape to ggml.
    while len(got) > len(want) and got[-1] == 1:
        got = got[:-1]
    if got != want:
        raise ModelShapeError(f"tensor {name!r} ({role.name}) has shape {list(got)}, expected {list(want)}")


def _tensor_tables(gguf: GGUFFile, arch: Architecture, h: dict[str, Any]):
    global_roles, layer_roles = archs.global_roles(), archs.layer_roles()
    globals_: dict[str, Optional[str]] = {role: None for role in global_roles}
    for role in arch.global_required + arch.global_optional:
        name = arch.tensor_names.get(role, global_roles[role].gguf)
        present = name in gguf.tensors
        if not present and role in arch.global_required:
            raise ModelShapeError(f"required tensor {name!r} is missing")
        if present:
            _check_shape(gguf, global_roles[role], name, h)
        globals_[role] = name if present else None  # output absent: tied to tok_embd

    layers = []
    for i in range(h["n_layer"]):
        table: dict[str, Optional[str]] = {}
        layer_h = _layer_hparams(h, i)
        required, optional = _layer_roles(arch, h, i, gguf.tensors)
        for role in required + optional:
            name = arch.tensor_names.get(role, layer_roles[role].gguf).format(i=i)
            if name not in gguf.tensors:
                if role in required:
                    raise ModelShapeError(f"required tensor {name!r} is missing")
                continue
            _check_shape(gguf, layer_roles[role], name, layer_h)
            table[role] = name
        if "wk" in table and (("bq" in table) != ("bk" in table) or ("q_norm" in table) != ("k_norm" in table)):
            raise ModelShapeError(f"layer {i}: Q and K must both have, or both lack, biases and norms")
        if arch.encoder:
            _check_encoder_projections(i, table)
        layers.append(table)
    return globals_, layers


def _layer_roles(arch: Architecture, h: Mapping[str, Any], i: int,
                 tensors: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The roles layer ``i`` must have and may have: an expert layer's FFN is
    the router and the experts (and shared experts where the model has them),
    a leading dense layer's the plain gated FFN; or what the architecture's
    own ``layer_roles`` says."""
    if arch.layer_roles is not None:
        return arch.layer_roles(h, i, tensors)
    required, optional = (arch.recurrent, ()) if arch.recurrent and h["recurrent_layers"][i] else \
        (arch.required, arch.optional)
    if required is arch.recurrent:
        names = archs.layer_roles()
        for fused, parts in arch.recurrent_fused.items():
            separate = all(names[r].gguf.format(i=i) in tensors for r in parts)
            if not separate and names[fused].gguf.format(i=i) in tensors:
                required = tuple(r for r in required if r not in parts) + (fused,)
    experts = arch.experts
    if experts is None:
        return required, optional
    if i < h["n_layer_dense_lead"]:
        return required + _DENSE_FFN, optional
    shared = _SHARED_EXPERTS if h["n_expert_shared"] > 0 else ()
    return required + experts.required + shared, optional + experts.optional


def _check_encoder_projections(i: int, table: dict[str, Optional[str]]) -> None:
    """An encoder layer projects Q, K and V separately or through one fused
    matrix (nomic-bert), never both, and its biases go with its matrices."""
    separate = [r for r in ("wq", "wk", "wv") if r in table]
    if "wqkv" in table:
        stray = separate + [r for r in ("bq", "bk", "bv") if r in table]
        if stray:
            raise ModelShapeError(f"layer {i} has a fused attn_qkv and also {', '.join(stray)}")
    elif len(separate) != 3:
        raise ModelShapeError(f"layer {i} needs attn_q, attn_k and attn_v (or a fused attn_qkv)")
    elif "bqkv" in table or ("bq" in table) != ("bv" in table):
        raise ModelShapeError(f"layer {i}: Q, K and V must all have, or all lack, biases")
