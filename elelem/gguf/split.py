"""Split models (``name-00001-of-00003.gguf``, as llama.cpp's gguf-split writes them).

The model is opened by its first file; every other file is read and checked
here and its tensors joined to the first file's index.
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from ..errors import GGUFMetadataError, GGUFTensorError, ModelNotFoundError
from .file import GGUFFile
from .format import GGUFValueType
from .parser import read_gguf_file

SPLIT_NO_KEY = "split.no"  # LLM_KV_SPLIT_NO: UINT16, the file's index from 0
SPLIT_COUNT_KEY = "split.count"  # LLM_KV_SPLIT_COUNT: UINT16, the number of files
SPLIT_TENSORS_KEY = "split.tensors.count"  # LLM_KV_SPLIT_TENSORS_COUNT: INT32, tensors in all the files
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf$")


def split_count(gguf: GGUFFile) -> int:
    """The number of files of the model whose (first) file ``gguf`` is: 1 unless split.

    Raises GGUFMetadataError for split keys of the wrong type and for a file
    that is not the first of its split model (llama.cpp loads a split model
    from its first file only).
    """
    count = gguf.expect_scalar(SPLIT_COUNT_KEY, GGUFValueType.UINT16, required=False)
    if count is None or count <= 1:
        return 1
    number = gguf.expect_scalar(SPLIT_NO_KEY, GGUFValueType.UINT16)
    if number != 0:
        first = split_path(gguf.path, 0, count) if _SPLIT_NAME.match(gguf.path.name) else "the first file"
        gguf._fail(SPLIT_NO_KEY, f"this is file {number + 1} of a model split in {count}; "
                                 f"open its first file, {first}")
    return count


def split_path(path: str | os.PathLike, index: int, count: int) -> Path:
    """The file ``index`` (from 0) of the split model one of whose files is ``path``
    (llama.cpp's llama_split_path: ``PREFIX-%05d-of-%05d.gguf``)."""
    path = Path(path)
    match = _SPLIT_NAME.match(path.name)
    if match is None:
        raise GGUFMetadataError(f"{path}: the name of a split model's file must end in "
                                f"-NNNNN-of-{count:05d}.gguf", field="file name", offset=None)
    return path.with_name(f"{match['prefix']}-{index + 1:05d}-of-{count:05d}.gguf")


def read_split(first: GGUFFile) -> None:
    """Read and check every other file of the split model whose first file is ``first``, and
    add their tensors to it, as llama.cpp's llama_model_loader does: each file is a valid GGUF
    whose ``split.no`` is its index (and whose ``split.count``, where present, is the same),
    no tensor name appears twice, and the tensors of all the files number
    ``split.tensors.count``.  The metadata is the first file's; the others carry only their
    ``split.*`` keys (gguf-split's layout)."""
    count = split_count(first)
    expected_tensors = first.expect_scalar(SPLIT_TENSORS_KEY, GGUFValueType.INT32)
    if split_path(first.path, 0, count).name != first.path.name:
        first._fail(SPLIT_COUNT_KEY, f"says {count} files, but the file's name is {first.path.name!r} "
                                     f"(expected {split_path(first.path, 0, count).name!r})")
    shards = []
    tensors = dict(first.tensors)
    for index in range(1, count):
        path = split_path(first.path, index, count)
        if not path.exists():
            raise ModelNotFoundError(f"{first.path}: file {index + 1} of the {count} of this split model "
                                     f"is missing: {path}")
        shard = read_gguf_file(path)
        number = shard.expect_scalar(SPLIT_NO_KEY, GGUFValueType.UINT16)
        if number != index:
            shard._fail(SPLIT_NO_KEY, f"is {number}, but this is file {index + 1} of {count} (split.no {index})")
        shard_count = shard.expect_scalar(SPLIT_COUNT_KEY, GGUFValueType.UINT16, required=False)
        if shard_count is not None and shard_count != count:
            shard._fail(SPLIT_COUNT_KEY, f"is {shard_count}, but the first file says {count}")
        for name, info in shard.tensors.items():
            if name in tensors:
                where = tensors[name].shard
                raise GGUFTensorError(f"{path}: tensor '{name}': duplicate tensor name (also in file "
                                      f"{where + 1} of {count})", field=f"tensor '{name}'", offset=None)
            tensors[name] = replace(info, shard=index)
        shards.append(shard)
    if expected_tensors != len(tensors):
        first._fail(SPLIT_TENSORS_KEY, f"says {expected_tensors} tensors, but the {count} files hold "
                                       f"{len(tensors)}")
    first.tensors = tensors
    first.shards = tuple(shards)
