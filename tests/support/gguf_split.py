"""Split a GGUF file into shards the way llama.cpp's gguf-split writes them.

tools/gguf-split/gguf-split.cpp (``--split --split-max-tensors N``): the first
file holds every key of the original, then ``split.no`` (UINT16, the file's
index from 0), ``split.count`` (UINT16) and ``split.tensors.count`` (INT32, the
tensors of all the files); every other file holds only those three keys (so
the default alignment, 32).  Tensors keep their order and are dealt out in
runs; each file's data section is laid out as ggml lays out any GGUF.
Files are named ``PREFIX-%05d-of-%05d.gguf`` (llama_split_path).

Only the ``gguf`` package and tests/support/gguf_builders.py: independent of elelem's reader.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Optional

import gguf
import numpy as np

from gguf_builders import pack_kv, pack_string, pad

UINT16, INT32, UINT32 = 2, 5, 4


def split_name(prefix: str, index: int, count: int) -> str:
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def split_gguf(src: Path, folder: Path, n_files: int, *, prefix: Optional[str] = None,
               empty_first: bool = False, tensors_per_file: Optional[list[int]] = None) -> list[Path]:
    """Write ``src`` as ``n_files`` files in ``folder``; returns their paths, first first.

    ``empty_first`` puts no tensor in the first file (gguf-split's
    ``--no-tensor-first-split``); ``tensors_per_file`` sets how many go in each.
    """
    reader = gguf.GGUFReader(str(src))
    fields = [f for key, f in reader.fields.items() if not key.startswith("GGUF.")]
    alignment = 32
    if "general.alignment" in reader.fields:
        alignment = int(reader.fields["general.alignment"].contents())
    tensors = list(reader.tensors)
    carrying = n_files - 1 if empty_first else n_files
    if tensors_per_file is None:
        base, extra = divmod(len(tensors), carrying)
        tensors_per_file = [base + (i < extra) for i in range(carrying)]
        if empty_first:
            tensors_per_file = [0, *tensors_per_file]
    assert sum(tensors_per_file) == len(tensors) and len(tensors_per_file) == n_files
    prefix = prefix or src.name.removesuffix(".gguf")
    paths, start = [], 0
    for index, count in enumerate(tensors_per_file):
        kvs = [b"".join(bytes(part) for part in f.parts) for f in fields] if index == 0 else []
        kvs += [pack_kv("split.no", UINT16, index), pack_kv("split.count", UINT16, n_files),
                pack_kv("split.tensors.count", INT32, len(tensors))]
        file_alignment = alignment if index == 0 else 32
        infos, data, offset = [], bytearray(), 0
        for t in tensors[start:start + count]:
            raw = np.ascontiguousarray(t.data).tobytes()
            assert len(raw) == t.n_bytes
            shape = [int(n) for n in t.shape]  # ggml order, ne0 first
            infos.append(pack_string(t.name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}q", *shape)
                         + struct.pack("<iQ", int(t.tensor_type), offset))
            data += raw + bytes(pad(len(raw), file_alignment) - len(raw))
            offset += pad(len(raw), file_alignment)
        out = bytearray(struct.pack("<4sIqq", b"GGUF", 3, count, len(kvs)))
        for record in kvs + infos:
            out += record
        if count:
            out += bytes(pad(len(out), file_alignment) - len(out))
            out += data
        path = folder / split_name(prefix, index, n_files)
        path.write_bytes(bytes(out))
        paths.append(path)
        start += count
    return paths
