"""A pure-Python, strictly validating GGUF reader.

Every model file passes through :func:`read_gguf` before ggml's C parser sees
it, so a hostile file fails here with a :class:`~elelem.errors.GGUFError`
instead of reaching a ``GGML_ASSERT`` (an abort of the whole process).  The
checks mirror ``gguf_init_from_reader`` in ``third_party/ggml/src/gguf.cpp``
and are sometimes stricter (listed in :func:`read_gguf`).

Only the header, the key-value metadata and the tensor-info table are read;
tensor data is never touched.  The file is mapped with ``mmap``, parsed with
``struct``/``numpy`` and closed before :func:`read_gguf` returns, so a
:class:`GGUFFile` holds no file handle and every array it holds owns its
memory.  No allocation is ever sized by a count the file claims: every count
is first bounded by the bytes that are actually left in the file.

This package is also the one place elelem reads GGUF metadata from (the
tokenizer, the hyperparameters, ``elelem info``); see
:func:`validate_tokenizer_metadata` for the vocabulary checks.

The format's constants are in :mod:`.format`, the parsed file in :mod:`.file`,
the parser in :mod:`.parser`, split models in :mod:`.split` and the tokenizer
checks in :mod:`.tokenizer_metadata`; this module is the entry point and names
them all.
"""
from __future__ import annotations

import logging
import os
import time

from .file import GGUFFile, TensorInfo
from .format import GGML_TYPES, GGUFValueType
from .parser import read_gguf_file
from .split import read_split, split_count
from .tokenizer_metadata import validate_tokenizer_metadata

log = logging.getLogger("elelem")

__all__ = [
    "GGML_TYPES",
    "GGUFFile",
    "GGUFValueType",
    "TensorInfo",
    "read_gguf",
    "read_gguf_file",
    "validate_tokenizer_metadata",
]


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse and validate the GGUF file at ``path``; never reads tensor data.

    A split model (``name-00001-of-00003.gguf``, as llama.cpp's gguf-split
    writes it) is opened by its first file: every other file is read and
    validated too (see :func:`read_split`), and ``tensors`` holds them all.

    Raises ModelNotFoundError for a missing path and a GGUFError subclass
    (GGUFHeaderError, GGUFMetadataError, GGUFTensorError,
    GGUFTruncatedError; each with ``.field`` and ``.offset``) for anything
    ggml would refuse or trip over.  Beyond ggml's own checks it rejects:
    versions other than 2 and 3; tensors with 0 dimensions or an empty name;
    keys, names and string values that are not valid UTF-8; an alignment over
    1 MiB; tensor sizes, strides and the data-section size past INT64_MAX
    (ggml stops at SIZE_MAX); and tensor data that runs past the end of the
    file (ggml only notices when it reads the data).
    """
    started = time.perf_counter()
    gguf = read_gguf_file(path)
    if split_count(gguf) > 1:
        read_split(gguf)
    log.debug(
        "read %s: GGUF v%d, %d keys, %d tensors in %d file(s) in %.3f s", gguf.path, gguf.version,
        len(gguf.metadata), len(gguf.tensors), len(gguf.shard_paths), time.perf_counter() - started,
    )
    return gguf
