"""GGUF metadata as a plain dict, for the tokenizer tests and scripts.

Prefers elelem's own reader (``elelem.gguf.reader.read_gguf(path).metadata``)
and falls back to the ``gguf`` PyPI package, converted to the same shape:
string arrays -> list[str], numeric arrays -> numpy arrays, scalars -> Python
values.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=4)
def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    try:
        from elelem.gguf.reader import read_gguf
    except ImportError:
        return _read_with_gguf_package(str(path))
    return dict(read_gguf(path).metadata)


def _read_with_gguf_package(path: str) -> dict[str, Any]:
    import gguf

    reader = gguf.GGUFReader(path)
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not field.types:
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if len(field.types) > 1 and field.types[1] == gguf.GGUFValueType.STRING:
                meta[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            elif field.data:
                meta[key] = np.concatenate([field.parts[i] for i in field.data])
            else:
                meta[key] = np.array([])
        elif kind == gguf.GGUFValueType.STRING:
            meta[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            value = field.parts[field.data[0]].tolist()[0]
            meta[key] = bool(value) if kind == gguf.GGUFValueType.BOOL else value
    return meta
