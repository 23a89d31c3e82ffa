"""LoRA adapter files: read and checked against the model they are for.

A LoRA adapter is a GGUF file as llama.cpp's ``convert_lora_to_gguf.py``
writes it: ``general.type = "adapter"``, ``adapter.type = "lora"``,
``adapter.lora.alpha``, ``general.architecture`` the base model's, and for
each weight it changes a pair ``<weight>.lora_a`` (A: ``(n_in, rank)`` in
ggml's order, stacked experts ``(n_in, rank, n_expert)``) and
``<weight>.lora_b`` (B: ``(rank, n_out)``); the token embedding's pair is
laid out the other way (A ``(rank, n_vocab)``, B ``(rank, n_embd)``), as
llama.cpp's ``build_inp_embd`` reads it.  A weight ``w`` then computes
``x @ w + scale * B(A x)``, ``scale = user_scale * alpha / rank`` (alpha 0:
the user's scale).

Everything is checked here before the native core loads the factors
(``elelem._core.open_adapter``, which checks the shapes again), and every
problem is an :class:`~elelem.errors.AdapterError` that names it: a file that
is not an adapter, an adapter for another architecture, a weight the model
does not have (an adapter for another model), shapes that do not fit.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AdapterError, GGUFError

if TYPE_CHECKING:
    from ..gguf.reader import GGUFFile, TensorInfo
    from .architectures import ModelSpec

#: The types llama.cpp's converter writes LoRA factors in (--outtype).
FACTOR_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0"})


@dataclass(frozen=True)
class AdapterInfo:
    """A checked LoRA adapter file."""
    path: Path
    name: str                    # general.name, else the file's name
    alpha: float                 # adapter.lora.alpha (0: none)
    targets: tuple[str, ...]     # the weights it changes
    ranks: tuple[int, ...]       # the distinct ranks of its pairs
    task_name: str = ""          # adapter.lora.task_name and .prompt_prefix, as llama-server lists them
    prompt_prefix: str = ""


def read_adapter(path: str | os.PathLike, base: "GGUFFile", spec: "ModelSpec") -> AdapterInfo:
    """Read and check the LoRA adapter at ``path`` for the model ``base`` (``spec``)."""
    from ..gguf.reader import read_gguf

    try:
        gguf = read_gguf(path)
    except GGUFError as e:
        raise AdapterError(f"{path}: not a readable GGUF file: {e}") from e
    where = str(gguf.path)
    kind = gguf.get("general.type")
    if kind != "adapter":
        raise AdapterError(f"{where}: general.type is {kind!r}, not 'adapter': this is not a LoRA adapter"
                           + (" (it looks like a model)" if kind in (None, "model") else ""))
    adapter_type = gguf.get("adapter.type")
    if adapter_type != "lora":
        raise AdapterError(f"{where}: adapter.type is {adapter_type!r}; only 'lora' adapters are supported "
                           f"(a control vector is another kind)")
    arch, base_arch = gguf.get("general.architecture"), base.get("general.architecture")
    if arch != base_arch:
        raise AdapterError(f"{where}: the adapter is for a {arch!r} model; this model is {base_arch!r}")
    if gguf.get("adapter.alora.invocation_tokens") is not None:
        raise AdapterError(f"{where}: an activated LoRA (aLoRA) is not supported")
    alpha = gguf.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise AdapterError(f"{where}: adapter.lora.alpha is {alpha!r}, not a number")

    pairs: dict[str, dict[str, "TensorInfo"]] = {}
    for name, info in gguf.tensors.items():
        for side in ("lora_a", "lora_b"):
            if name.endswith("." + side):
                pairs.setdefault(name[:-len(side) - 1], {})[side] = info
                break
        else:
            if not name.endswith("_norm.weight"):   # llama.cpp skips these, and refuses anything else
                raise AdapterError(f"{where}: tensor {name!r} is neither a .lora_a nor a .lora_b")
    if not pairs:
        raise AdapterError(f"{where}: the adapter has no LoRA tensors")
    adaptable = set(spec.matmul_weights())
    tok_embd = spec.global_tensors["tok_embd"]
    ranks: list[int] = []
    for target, pair in pairs.items():
        missing = [side for side in ("lora_a", "lora_b") if side not in pair]
        if missing:
            raise AdapterError(f"{where}: the LoRA pair for {target!r} lacks its {missing[0]}")
        a, b = pair["lora_a"], pair["lora_b"]
        weight = base.tensors.get(target)
        if weight is None:
            raise AdapterError(f"{where}: the adapter changes {target!r}, which this model does not have "
                               f"(is it an adapter for another model?)")
        if target != tok_embd and target not in adaptable:
            raise AdapterError(f"{where}: the adapter changes {target!r}, which this model does not multiply")
        for side, info in (("lora_a", a), ("lora_b", b)):
            if info.type_name not in FACTOR_TYPES:
                raise AdapterError(f"{where}: {target}.{side} is {info.type_name}; "
                                   f"LoRA factors are {', '.join(sorted(FACTOR_TYPES))}")
        sa, sb, sw = (_padded(t.shape) for t in (a, b, weight))
        if target == tok_embd:
            fits = sw[0] == sb[1] and sw[1] == sa[1] and sa[0] == sb[0] and sa[2:] == sb[2:] == (1, 1)
        else:
            fits = (sw[0] == sa[0] and sw[1] == sb[1] and sa[1] == sb[0] and sa[2] == sb[2] == sw[2]
                    and sa[3] == sb[3] == 1)
        if not fits:
            raise AdapterError(f"{where}: {target}.lora_a {list(a.shape)} and .lora_b {list(b.shape)} "
                               f"do not fit the model's {target} {list(weight.shape)} "
                               f"(is it an adapter for another model?)")
        if sb[0] not in ranks:
            ranks.append(sb[0])
    name = gguf.get("general.name") or Path(where).stem
    return AdapterInfo(Path(where), str(name), float(alpha), tuple(pairs), tuple(ranks),
                       str(gguf.get("adapter.lora.task_name") or ""), str(gguf.get("adapter.lora.prompt_prefix") or ""))


def _padded(shape) -> tuple[int, ...]:
    return tuple(shape) + (1,) * (4 - len(shape))
