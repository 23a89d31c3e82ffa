"""LoRA adapters on an ``LLM``: which are loaded, and at which scales.

    >>> llm = LLM("model.gguf", lora=["style.gguf", ("domain.gguf", 0.5)])
    >>> llm.lora_adapters
    [{'id': 0, 'path': 'style.gguf', 'name': 'style', 'scale': 1.0}, {'id': 1, ..., 'scale': 0.5}]
    >>> llm.set_lora({1: 1.0})              # adapter 1 at 1.0, the others off
    >>> llm.generate("Hi", lora=[{"id": 0, "scale": 0.25}])   # one call's own scales

The adapters are loaded with the model (``lora=``, llama.cpp's ``--lora``
and ``--lora-scaled``); their scales change at any time, for the calls that
start afterwards (``set_lora``, llama-server's ``POST /lora-adapters``), or
for one call (the ``lora`` keyword of every text call, llama-server's
per-request ``lora`` field).  A scale of 0 leaves the adapter out: the
model's own numbers, bit for bit.  Calls at different scales run in the same
steps, each row with its own scales, and never reuse each other's cached
prefixes.  The files are checked against the model first
(:mod:`elelem.model.adapters`).
"""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence, Union

from ..errors import InvalidArgumentError
from ..model.adapters import AdapterInfo

#: What ``LLM(lora=...)`` takes: each adapter a path, or (path, scale).
AdapterSpec = Union[str, os.PathLike, tuple]
#: What ``set_lora`` and a call's ``lora`` take (see :func:`resolve_scales`).
ScalesSpec = Union[Sequence[float], Mapping[int, float], Sequence[Mapping[str, Any]], None]


def normalize_adapters(value: Any) -> tuple[tuple[str, float], ...]:
    """``lora=``'s entries as ``((path, scale), ...)``: a path alone is at scale 1."""
    if value is None:
        return ()
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    out = []
    for entry in value:
        if isinstance(entry, (str, os.PathLike)):
            path, scale = entry, 1.0
        elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], (str, os.PathLike)):
            path, scale = entry
        else:
            raise InvalidArgumentError(f"lora takes paths or (path, scale) pairs, got {entry!r}")
        out.append((os.fspath(path), _scale(scale, f"the scale of {os.fspath(path)}")))
    return tuple(out)


def resolve_scales(spec: ScalesSpec, n: int, default: tuple[float, ...]) -> tuple[float, ...]:
    """Every adapter's scale from ``spec``: None, ``default``; a list of ``n``
    numbers, those; ``{id: scale}`` or llama-server's ``[{"id": .., "scale":
    ..}]``, those adapters at those scales and the others at 0 (llama-server's
    rule for a request's ``lora``)."""
    if spec is None:
        return default
    if isinstance(spec, Mapping):
        pairs = list(spec.items())
    elif isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        raise InvalidArgumentError(f"lora scales are a list of numbers, {{id: scale}} or [{{'id', 'scale'}}], "
                                   f"got {spec!r}")
    elif all(isinstance(v, Mapping) for v in spec):   # [] too: every adapter at 0
        pairs = []
        for entry in spec:
            assert isinstance(entry, Mapping)
            if "id" not in entry:
                raise InvalidArgumentError(f"a lora entry needs an 'id' (and a 'scale'), got {dict(entry)!r}")
            pairs.append((entry["id"], entry.get("scale", 0.0)))
    else:
        values = list(spec)
        if len(values) != n:
            raise InvalidArgumentError(f"{len(values)} lora scales for {n} adapters")
        return tuple(_scale(v, f"lora scale {i}") for i, v in enumerate(values))
    scales = [0.0] * n
    for key, value in pairs:
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < n:
            raise InvalidArgumentError(f"no LoRA adapter has id {key!r}"
                                       + (f" (ids 0..{n - 1})" if n else ": none is loaded"))
        scales[key] = _scale(value, f"the scale of lora adapter {key}")
    return tuple(scales)


def describe(infos: Sequence[AdapterInfo], scales: Sequence[float]) -> list[dict]:
    """The adapters as llama-server's ``GET /lora-adapters`` lists them."""
    return [{"id": i, "path": str(info.path), "name": info.name, "scale": float(scale), "alpha": info.alpha,
             "targets": len(info.targets), "task_name": info.task_name, "prompt_prefix": info.prompt_prefix}
            for i, (info, scale) in enumerate(zip(infos, scales))]


def _scale(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgumentError(f"{what} must be a finite number, got {value!r}")
    return float(value)
