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

This module is also the one place elelem reads GGUF metadata from (the
tokenizer, the hyperparameters, ``elelem info``); see
:func:`validate_tokenizer_metadata` for the vocabulary checks.
"""
from __future__ import annotations

import enum
import logging
import mmap
import os
import re
import stat
import struct
import time
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Sequence
from typing import Any, NoReturn, Optional

import numpy as np

try:  # the compiled core's fast path; the reader works without it, only slower
    from .._core import scan_string_array as _scan_string_array
except ImportError:  # pragma: no cover - a source tree without the extension
    _scan_string_array = None

from ..errors import (
    GGUFFormatError,
    GGUFHeaderError,
    GGUFMetadataError,
    GGUFTensorError,
    GGUFTruncatedError,
    ModelNotFoundError,
)

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

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # ggml rejects v1 (32-bit counts); v2 and v3 share one layout
HEADER_SIZE = 24  # magic, u32 version, i64 tensor count, i64 KV count

ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
# ggml accepts any power of two that fits a uint32.  Real files use 32 (at
# most a page or two); a larger value only buys a hostile file a huge gap
# before the data section, so elelem caps it at 1 MiB.
MAX_ALIGNMENT = 1 << 20

MAX_STRING_LENGTH = 1 << 30  # GGUF_MAX_STRING_LENGTH
MAX_ARRAY_ELEMENTS = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # includes the NUL, so names must be at most 63 bytes

INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1  # SIZE_MAX on every platform ggml supports here


class GGUFValueType(enum.IntEnum):
    """Value type ids of GGUF metadata (``enum gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types: (struct format for scalars, numpy dtype for arrays).
_FIXED_TYPES: dict[int, tuple[struct.Struct, np.dtype]] = {
    GGUFValueType.UINT8: (struct.Struct("<B"), np.dtype("<u1")),
    GGUFValueType.INT8: (struct.Struct("<b"), np.dtype("<i1")),
    GGUFValueType.UINT16: (struct.Struct("<H"), np.dtype("<u2")),
    GGUFValueType.INT16: (struct.Struct("<h"), np.dtype("<i2")),
    GGUFValueType.UINT32: (struct.Struct("<I"), np.dtype("<u4")),
    GGUFValueType.INT32: (struct.Struct("<i"), np.dtype("<i4")),
    GGUFValueType.FLOAT32: (struct.Struct("<f"), np.dtype("<f4")),
    GGUFValueType.BOOL: (struct.Struct("<B"), np.dtype("<u1")),  # int8 on disk, any non-zero is true
    GGUFValueType.UINT64: (struct.Struct("<Q"), np.dtype("<u8")),
    GGUFValueType.INT64: (struct.Struct("<q"), np.dtype("<i8")),
    GGUFValueType.FLOAT64: (struct.Struct("<d"), np.dtype("<f8")),
}
_INTEGER_TYPES = frozenset(
    {
        GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
        GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
    }
)


def _value_type_name(type_id: int) -> str:
    try:
        return GGUFValueType(type_id).name
    except ValueError:
        return f"unknown type {type_id}"


# ggml type id -> (name, block_size, type_size), from `enum ggml_type` in
# third_party/ggml/include/ggml.h and `type_traits` in src/ggml.c (sizes are
# sizeof(block_*) in src/ggml-common.h) for the vendored ggml 0.25.3.
# tests/test_gguf_reader.py checks the ids and names against ggml.h.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}
GGML_TYPE_COUNT = 43
# Ids that once existed and that ggml now refuses (blck_size 0 in type_traits).
_REMOVED_GGML_TYPES = {
    4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
    36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8",
}

# The smallest possible encodings, used to bound the header's counts by the
# file size before anything is allocated.  A KV pair: key length (8), a
# non-empty key (1), value type (4), the smallest value (1).  A tensor info:
# name length (8), a non-empty name (1), n_dims (4), one dimension (8), type
# (4), offset (8).
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIqq")


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor-info table."""

    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (the contiguous dimension) first, as in the file
    ggml_type: int  # a key of GGML_TYPES
    offset: int  # relative to the data section of its file, as stored in the file
    nbytes: int  # computed from type and shape
    shard: int = 0  # the file of a split model it is in (GGUFFile.shard_paths), 0 for a single file

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def n_elements(self) -> int:
        n = 1
        for ne in self.shape:
            n *= ne
        return n


class GGUFFile:
    """A parsed, validated GGUF file.  Holds no open file handle."""

    def __init__(
        self,
        *,
        path: Path,
        version: int,
        alignment: int,
        data_offset: int,
        file_size: int,
        metadata: dict[str, Any],
        tensors: dict[str, TensorInfo],
        value_types: dict[str, tuple[int, int | None]],
        value_offsets: dict[str, int],
    ):
        self.path = path
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = file_size
        # scalars -> int/float/bool/str; string arrays -> list[str];
        # numeric and bool arrays -> 1-D numpy arrays of the matching dtype.
        self.metadata = metadata
        self.tensors = tensors  # in file order
        self._value_types = value_types  # key -> (gguf type, element type or None)
        self._value_offsets = value_offsets  # key -> offset of the value's first byte
        # A split model (name-00001-of-00003.gguf): the other files, read and checked; their
        # tensors are in ``tensors`` too, each with its ``shard``.  Empty for a single file.
        self.shards: tuple[GGUFFile, ...] = ()

    @property
    def shard_paths(self) -> tuple[Path, ...]:
        """Every file of the model, in order: ``(path,)``, or each shard of a split model."""
        return (self.path, *(shard.path for shard in self.shards))

    @property
    def total_size(self) -> int:
        """Bytes of every file of the model."""
        return self.file_size + sum(shard.file_size for shard in self.shards)

    def __repr__(self) -> str:
        return (
            f"GGUFFile({str(self.path)!r}, version={self.version}, "
            f"{len(self.metadata)} keys, {len(self.tensors)} tensors)"
        )

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def value_type(self, key: str) -> int:
        """The GGUF type of ``key`` (``GGUFValueType.ARRAY`` for arrays); KeyError if absent."""
        return self._value_types[key][0]

    def array_type(self, key: str) -> int:
        """The element type of array ``key``; KeyError if absent, GGUFMetadataError if not an array."""
        value_type, element_type = self._value_types[key]
        if element_type is None:
            self._fail(key, f"is a {_value_type_name(value_type)}, not an array")
        return element_type

    def value_offset(self, key: str) -> int:
        """Byte offset in the file where the value of ``key`` starts (for error messages)."""
        return self._value_offsets[key]

    def expect_array(self, key: str, element_type: int, *, required: bool = True) -> Any:
        """The array ``key``, checked to hold ``element_type`` elements.

        Returns None for an absent key when ``required`` is false.  Raises
        GGUFMetadataError (naming key and offset) when the key is missing,
        is not an array, or holds another element type.
        """
        if key not in self.metadata:
            if required:
                self._fail(key, "is missing")
            return None
        value_type, actual = self._value_types[key]
        if actual is None:
            self._fail(key, f"must be an array of {_value_type_name(element_type)} "
                            f"but is a {_value_type_name(value_type)}")
        if actual != element_type:
            self._fail(key, f"must be an array of {_value_type_name(element_type)} "
                            f"but holds {_value_type_name(actual)}")
        return self.metadata[key]

    def expect_scalar(self, key: str, *value_types: int, required: bool = True) -> Any:
        """The scalar ``key``, checked to be one of ``value_types``; None if absent and not required."""
        if key not in self.metadata:
            if required:
                self._fail(key, "is missing")
            return None
        actual = self._value_types[key][0]
        if actual not in value_types:
            wanted = " or ".join(_value_type_name(t) for t in value_types)
            self._fail(key, f"must be a {wanted} but is a {_value_type_name(actual)}")
        return self.metadata[key]

    def _fail(self, key: str, problem: str, *, index: int | None = None) -> NoReturn:
        offset = self._value_offsets.get(key)
        field = f"key '{key}'" if index is None else f"key '{key}'[{index}]"
        where = f" at offset {offset}" if offset is not None else ""
        raise GGUFMetadataError(f"{self.path}: {field}: {problem}{where}", field=field, offset=offset)


class LazyStrings(Sequence):
    """A GGUF string array whose UTF-8 is decoded (and checked) on first use.

    Holds a copy of the array's bytes; ``ends[i]`` is where string i ends in
    it.  A string that is not valid UTF-8 raises :class:`GGUFMetadataError`
    naming the element and its file offset, when the array is first read.
    """

    __slots__ = ("_blob", "_ends", "_base", "_field", "_path", "_items")

    def __init__(self, blob: bytes, ends, base: int, field: str, path: str):
        self._blob, self._ends, self._base, self._field, self._path = blob, ends, base, field, path
        self._items: Optional[list[str]] = None

    def _decoded(self) -> list[str]:
        if self._items is None:
            blob, items, start = self._blob, [], 0
            append = items.append
            for i, end in enumerate(self._ends.tolist()):
                try:
                    append(blob[start + 8:end].decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise GGUFMetadataError(
                        f"{self._path}: {self._field}[{i}]: string is not valid UTF-8 (bad byte {exc.start}) "
                        f"at offset {self._base + start + 8 + exc.start}",
                        field=f"{self._field}[{i}]", offset=self._base + start + 8 + exc.start) from None
                start = end
            self._items, self._blob = items, b""
        return self._items

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index):
        return self._decoded()[index]

    def __iter__(self):
        return iter(self._decoded())

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, Sequence)) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"<LazyStrings: {len(self)} strings of {self._field}>"


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


def read_gguf_file(path: str | os.PathLike) -> GGUFFile:
    """Parse and validate the one GGUF file at ``path`` (:func:`read_gguf`'s checks), whatever
    its ``split.*`` keys say."""
    path = Path(path)
    # Checked before opening: opening a FIFO would block until something writes to it.
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ModelNotFoundError(f"no such model file: {path}") from None
    if stat.S_ISDIR(mode):
        raise ModelNotFoundError(f"{path} is a directory, not a GGUF file")
    if not stat.S_ISREG(mode):
        raise ModelNotFoundError(f"{path} is not a regular file (a device, pipe or socket), not a GGUF file")
    with open(path, "rb") as file:
        file_size = os.fstat(file.fileno()).st_size
        if file_size < HEADER_SIZE:
            # mmap refuses empty files, and nothing this short can be GGUF.
            raise GGUFTruncatedError(
                f"{path}: header: file is {file_size} bytes, shorter than the "
                f"{HEADER_SIZE}-byte GGUF header at offset 0",
                field="header", offset=0,
            )
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Parser(buf, file_size, path).parse()


# -- split models -----------------------------------------------------------------

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


class _Parser:
    """One pass over a mapped GGUF file; every read is bounds-checked first."""

    def __init__(self, buf: mmap.mmap, size: int, path: Path):
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    # -- errors and primitive reads ------------------------------------------

    def fail(self, cls: type[GGUFFormatError], field: str, problem: str, offset: int) -> NoReturn:
        raise cls(f"{self.path}: {field}: {problem} at offset {offset}", field=field, offset=offset)

    def need(self, nbytes: int, field: str, what: str) -> None:
        left = self.size - self.pos
        if nbytes > left:
            self.fail(GGUFTruncatedError, field,
                      f"file ends inside the {what} ({nbytes} bytes needed, {left} left)", self.pos)

    def read_u32(self, field: str, what: str) -> int:
        self.need(4, field, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def read_i32(self, field: str, what: str) -> int:
        self.need(4, field, what)
        (value,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def read_u64(self, field: str, what: str) -> int:
        self.need(8, field, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def read_string(self, field: str, error: type[GGUFFormatError]) -> tuple[str, int]:
        """A length-prefixed UTF-8 string and its length in bytes."""
        start = self.pos
        length = self.read_u64(field, "string length")
        if length > MAX_STRING_LENGTH:
            self.fail(error, field, f"string length {length} exceeds the limit of {MAX_STRING_LENGTH}", start)
        left = self.size - self.pos
        if length > left:
            self.fail(GGUFTruncatedError, field,
                      f"string length {length} runs past the end of the file ({left} bytes left)", start)
        body = self.pos
        try:
            text = self.buf[body:body + length].decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail(error, field, f"string is not valid UTF-8 (bad byte {exc.start})", body + exc.start)
        self.pos = body + length
        return text, length

    # -- the file, top down ----------------------------------------------------

    def parse(self) -> GGUFFile:
        version, n_tensors, n_kv = self.parse_header()
        metadata, value_types, value_offsets = self.parse_metadata(n_kv)
        alignment = self.check_alignment(metadata, value_types, value_offsets)
        tensors, offset_fields = self.parse_tensor_infos(n_tensors)
        data_offset = self.pos
        if n_tensors > 0:
            # As ggml: the data section starts at the next multiple of the
            # alignment, but only when there are tensors.
            data_offset = _pad(self.pos, alignment)
            if data_offset > self.size:
                self.fail(GGUFTruncatedError, "data section",
                          f"padding to alignment {alignment} runs past the end of the file "
                          f"(size {self.size})", self.pos)
        self.check_tensor_layout(tensors, offset_fields, alignment, data_offset)
        return GGUFFile(
            path=self.path, version=version, alignment=alignment, data_offset=data_offset,
            file_size=self.size, metadata=metadata, tensors=tensors,
            value_types=value_types, value_offsets=value_offsets,
        )

    def parse_header(self) -> tuple[int, int, int]:
        magic, version, n_tensors, n_kv = _HEADER.unpack_from(self.buf, 0)
        if magic != GGUF_MAGIC:
            self.fail(GGUFHeaderError, "magic", f"expected b'GGUF', found {magic!r}", 0)
        if version not in SUPPORTED_VERSIONS:
            # ggml's test: a version whose low 16 bits are zero was written big-endian.
            if version != 0 and version & 0xFFFF == 0:
                problem = (f"version 0x{version:08x} looks byte-swapped: this is a big-endian GGUF file, "
                           f"and elelem reads little-endian GGUF only")
            else:
                problem = f"unsupported GGUF version {version} (supported: 2, 3)"
            self.fail(GGUFHeaderError, "version", problem, 4)
        if n_tensors < 0:
            self.fail(GGUFHeaderError, "tensor_count", f"tensor count is negative ({n_tensors})", 8)
        if n_kv < 0:
            self.fail(GGUFHeaderError, "kv_count", f"key-value count is negative ({n_kv})", 16)
        left = self.size - HEADER_SIZE
        if n_kv * MIN_KV_BYTES > left:
            self.fail(GGUFHeaderError, "kv_count",
                      f"{n_kv} key-value pairs need at least {n_kv * MIN_KV_BYTES} bytes but the file "
                      f"has {left} after the header", 16)
        if n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES > left:
            self.fail(GGUFHeaderError, "tensor_count",
                      f"{n_tensors} tensor infos and {n_kv} key-value pairs need at least "
                      f"{n_tensors * MIN_TENSOR_INFO_BYTES + n_kv * MIN_KV_BYTES} bytes but the file "
                      f"has {left} after the header", 8)
        self.pos = HEADER_SIZE
        return version, n_tensors, n_kv

    # -- key-value metadata ----------------------------------------------------

    def parse_metadata(
        self, n_kv: int
    ) -> tuple[dict[str, Any], dict[str, tuple[int, int | None]], dict[str, int]]:
        metadata: dict[str, Any] = {}
        value_types: dict[str, tuple[int, int | None]] = {}
        value_offsets: dict[str, int] = {}
        for i in range(n_kv):
            key_offset = self.pos
            key, _ = self.read_string(f"key #{i}", GGUFMetadataError)
            if not key:
                self.fail(GGUFMetadataError, f"key #{i}", "key is empty", key_offset)
            if key in metadata:
                self.fail(GGUFMetadataError, f"key '{key}'", "duplicate key", key_offset)
            field = f"key '{key}'"
            type_offset = self.pos
            value_type = self.read_i32(field, "value type")
            if value_type == GGUFValueType.ARRAY:
                element_type, value, value_offset = self.read_array(field)
                value_types[key] = (value_type, element_type)
            else:
                self.check_value_type(value_type, field, type_offset)
                value_offset = self.pos
                value = self.read_scalar(value_type, field)
                value_types[key] = (value_type, None)
            metadata[key] = value
            value_offsets[key] = value_offset
        return metadata, value_types, value_offsets

    def check_value_type(self, value_type: int, field: str, offset: int) -> None:
        if value_type not in _FIXED_TYPES and value_type != GGUFValueType.STRING:
            self.fail(GGUFMetadataError, field, f"unknown value type {value_type}", offset)

    def read_scalar(self, value_type: int, field: str) -> Any:
        if value_type == GGUFValueType.STRING:
            return self.read_string(field, GGUFMetadataError)[0]
        fmt = _FIXED_TYPES[value_type][0]
        self.need(fmt.size, field, f"{_value_type_name(value_type)} value")
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value != 0 if value_type == GGUFValueType.BOOL else value

    def read_array(self, field: str) -> tuple[int, Any, int]:
        """An array's element type, its value and the offset of its first element."""
        type_offset = self.pos
        element_type = self.read_i32(field, "array element type")
        if element_type == GGUFValueType.ARRAY:
            self.fail(GGUFMetadataError, field, "nested arrays are not supported", type_offset)
        self.check_value_type(element_type, field, type_offset)
        count_offset = self.pos
        count = self.read_u64(field, "array length")
        if count > MAX_ARRAY_ELEMENTS:
            self.fail(GGUFMetadataError, field,
                      f"array length {count} exceeds the limit of {MAX_ARRAY_ELEMENTS}", count_offset)
        # Strings need at least their 8-byte length prefix each.
        element_size = 8 if element_type == GGUFValueType.STRING else _FIXED_TYPES[element_type][1].itemsize
        left = self.size - self.pos
        if count * element_size > left:
            self.fail(GGUFTruncatedError, field,
                      f"array of {count} {_value_type_name(element_type)} needs at least "
                      f"{count * element_size} bytes but only {left} are left", count_offset)
        data_offset = self.pos
        if element_type == GGUFValueType.STRING:
            return element_type, self.read_string_array(field, count), data_offset
        dtype = _FIXED_TYPES[element_type][1]
        # frombuffer refuses offset == len(buffer) even for zero elements.
        raw = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos) if count else np.empty(0, dtype)
        if element_type == GGUFValueType.BOOL:
            value = raw != 0
        else:
            # astype copies, so the array outlives the mmap, and yields native byte order.
            value = raw.astype(dtype.newbyteorder("="))
        del raw  # release the export on the mmap, or closing it fails
        self.pos += count * element_size
        return element_type, value, data_offset

    def read_string_array(self, field: str, count: int) -> "Sequence[str]":
        # The hot loop of the whole reader: about 300k strings in a Qwen2
        # vocabulary plus merges.  The native scanner walks the lengths in C
        # and the text is decoded on first use (the tokenizer's), not at load.
        if _scan_string_array is not None:
            start = self.pos
            view = memoryview(self.buf)
            try:
                ends, bad = _scan_string_array(view, start, count, MAX_STRING_LENGTH)
            finally:
                view.release()
            if bad < 0:
                self.pos = int(ends[-1]) if count else start
                blob = self.buf[start:self.pos]  # a copy: the array outlives the mmap
                return LazyStrings(blob, ends - start, start, field, str(self.path))
            self.pos = int(ends[-1]) if bad else start
            self.read_string(f"{field}[{bad}]", GGUFMetadataError)  # raises, precisely
            raise AssertionError("unreachable: the checked reader accepted a string the scanner refused")
        return self._read_string_array_python(field, count)

    def _read_string_array_python(self, field: str, count: int) -> list[str]:
        # Without the compiled core: locals only, one bound check per string,
        # and errors located afterwards, off the fast path.
        buf = self.buf
        size = self.size
        unpack_length = _U64.unpack_from
        out: list[str] = []
        append = out.append
        pos = self.pos
        index = 0
        try:
            for index in range(count):
                (length,) = unpack_length(buf, pos)
                body = pos + 8
                end = body + length
                if end > size or length > MAX_STRING_LENGTH:
                    break
                append(buf[body:end].decode("utf-8"))
                pos = end
            else:
                self.pos = pos
                return out
        except (struct.error, UnicodeDecodeError):
            pass
        # Re-read the bad element with the checked reader for a precise error.
        self.pos = pos
        self.read_string(f"{field}[{index}]", GGUFMetadataError)
        raise AssertionError("unreachable: the checked reader accepted a string the fast path refused")

    def check_alignment(
        self,
        metadata: dict[str, Any],
        value_types: dict[str, tuple[int, int | None]],
        value_offsets: dict[str, int],
    ) -> int:
        if ALIGNMENT_KEY not in metadata:
            return DEFAULT_ALIGNMENT
        field = f"key '{ALIGNMENT_KEY}'"
        offset = value_offsets[ALIGNMENT_KEY]
        value_type, element_type = value_types[ALIGNMENT_KEY]
        if value_type != GGUFValueType.UINT32:
            actual = _value_type_name(value_type)
            if element_type is not None:
                actual = f"array of {_value_type_name(element_type)}"
            self.fail(GGUFMetadataError, field, f"must be a UINT32 but is a {actual}", offset)
        alignment = metadata[ALIGNMENT_KEY]
        if alignment == 0 or alignment & (alignment - 1):
            self.fail(GGUFMetadataError, field, f"alignment {alignment} is not a power of two", offset)
        if alignment > MAX_ALIGNMENT:
            self.fail(GGUFMetadataError, field,
                      f"alignment {alignment} exceeds elelem's limit of {MAX_ALIGNMENT}", offset)
        return alignment

    # -- tensor infos and the data section ---------------------------------------

    def parse_tensor_infos(self, n_tensors: int) -> tuple[dict[str, TensorInfo], list[int]]:
        tensors: dict[str, TensorInfo] = {}
        offset_fields: list[int] = []  # file offset of each tensor's stored data offset
        for i in range(n_tensors):
            name_offset = self.pos
            name, name_bytes = self.read_string(f"tensor #{i} name", GGUFTensorError)
            if not name:
                self.fail(GGUFTensorError, f"tensor #{i}", "tensor name is empty", name_offset)
            if name_bytes >= GGML_MAX_NAME:
                self.fail(GGUFTensorError, f"tensor #{i}",
                          f"tensor name is {name_bytes} bytes, ggml allows at most {GGML_MAX_NAME - 1}",
                          name_offset)
            field = f"tensor '{name}'"
            if name in tensors:
                self.fail(GGUFTensorError, field, "duplicate tensor name", name_offset)
            shape = self.read_shape(field)
            type_offset = self.pos
            ggml_type = self.read_i32(field, "ggml type")
            nbytes = self.check_type_and_size(field, shape, ggml_type, type_offset)
            offset_fields.append(self.pos)
            offset = self.read_u64(field, "data offset")
            tensors[name] = TensorInfo(name, shape, ggml_type, offset, nbytes)
        return tensors, offset_fields

    def read_shape(self, field: str) -> tuple[int, ...]:
        dims_offset = self.pos
        n_dims = self.read_u32(field, "number of dimensions")
        if n_dims == 0 or n_dims > GGML_MAX_DIMS:
            self.fail(GGUFTensorError, field,
                      f"number of dimensions is {n_dims}, must be 1 to {GGML_MAX_DIMS}", dims_offset)
        self.need(8 * n_dims, field, "dimensions")
        shape = struct.unpack_from(f"<{n_dims}q", self.buf, self.pos)
        for j, ne in enumerate(shape):
            if ne < 0:
                self.fail(GGUFTensorError, field, f"dimension {j} is negative (ne={ne})", self.pos + 8 * j)
        self.pos += 8 * n_dims
        return shape

    def check_type_and_size(self, field: str, shape: tuple[int, ...], ggml_type: int, type_offset: int) -> int:
        """Validate the type against the shape and return the tensor's size in bytes."""
        if ggml_type in _REMOVED_GGML_TYPES:
            self.fail(GGUFTensorError, field,
                      f"ggml type {ggml_type} ({_REMOVED_GGML_TYPES[ggml_type]}) has been removed from ggml",
                      type_offset)
        if ggml_type not in GGML_TYPES:
            self.fail(GGUFTensorError, field,
                      f"invalid ggml type {ggml_type}, must be in [0, {GGML_TYPE_COUNT})", type_offset)
        type_name, block_size, type_size = GGML_TYPES[ggml_type]
        if shape[0] % block_size:
            self.fail(GGUFTensorError, field,
                      f"dimension 0 (ne={shape[0]}) is not a multiple of the {type_name} block size "
                      f"{block_size}", type_offset)
        # ggml multiplies in int64_t/size_t, so the element count (checked
        # prefix by prefix, as gguf.cpp does), every stride and the byte size
        # must all fit in int64.  Python ints cannot wrap, so compare exactly.
        n_elements = 1
        for ne in shape:
            n_elements *= ne
            if n_elements > INT64_MAX:
                self.fail(GGUFTensorError, field,
                          f"element count of shape {list(shape)} overflows int64", type_offset)
        stride = type_size * (shape[0] // block_size)  # nb[1], the row size
        largest = max(stride, shape[0] * type_size)  # ggml_nbytes computes ne0 * type_size first
        for ne in shape[1:]:
            stride *= ne
            largest = max(largest, stride)
        nbytes = n_elements // block_size * type_size
        if largest > INT64_MAX or nbytes > INT64_MAX:
            self.fail(GGUFTensorError, field,
                      f"byte size of {type_name} shape {list(shape)} overflows int64", type_offset)
        return nbytes

    def check_tensor_layout(self, tensors: dict[str, TensorInfo], offset_fields: list[int],
                            alignment: int, data_offset: int) -> None:
        # First the layout as gguf.cpp checks it: each tensor starts at the
        # padded end of the one before, and the running total must not overflow.
        expected = 0
        for info, offset_field in zip(tensors.values(), offset_fields):
            field = f"tensor '{info.name}'"
            if info.offset != expected:
                self.fail(GGUFTensorError, field,
                          f"data offset is {info.offset} but must be {expected}, the padded end of "
                          f"the previous tensor", offset_field)
            expected += _pad(info.nbytes, alignment)
            if expected > INT64_MAX:
                self.fail(GGUFTensorError, field,
                          f"data section size overflows int64 (running total {expected})", offset_field)
        # Then against the file: ggml itself only finds this out when it reads
        # the data.  The last tensor's padding may be missing at end of file.
        for info, offset_field in zip(tensors.values(), offset_fields):
            end = data_offset + info.offset + info.nbytes
            if end > self.size:
                self.fail(GGUFTruncatedError, f"tensor '{info.name}'",
                          f"data [{data_offset + info.offset}, {end}) runs past the end of the file "
                          f"(size {self.size})", offset_field)


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# -- tokenizer metadata -----------------------------------------------------------

_SPECIAL_TOKEN_KEY = re.compile(r"tokenizer\.ggml\.\w+_token_id")
# The tokenizer's flags; llama.cpp refuses a file where one is not a BOOL.
_TOKENIZER_FLAGS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                    "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix",
                    "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
TOKEN_TYPE_BYTE = 6  # llama_token_type LLAMA_TOKEN_TYPE_BYTE


def validate_tokenizer_metadata(gguf: GGUFFile) -> None:
    """Check the ``tokenizer.ggml.*`` keys that the tokenizer trusts blindly.

    Raises GGUFMetadataError naming the key, the offset of its value and,
    for array entries, the index.  Checks: tokens are STRING, scores FLOAT32,
    token_type INT32 and merges STRING arrays; scores and token_type have one
    entry per token; every ``tokenizer.ggml.*_token_id`` is a UINT32 (as
    llama.cpp requires) in ``[0, n_vocab)``; ``tokenizer.ggml.pre`` is a
    STRING and the ``add_bos_token``/``add_eos_token``/``add_sep_token``/``add_space_prefix``
    flags and the WordPiece ``normalizer.lowercase``/``normalizer.strip_accents``
    options are BOOLs, as llama.cpp requires; every BYTE-type token reads
    ``<0xNN>`` with two hex digits; and for a ``gpt2`` (byte-level BPE)
    vocabulary every merge is ``"A B"`` with A, B and AB in the vocabulary.
    A file without ``tokenizer.ggml.tokens`` passes only if its tokenizer
    model is absent or ``"none"``.
    """
    model = gguf.expect_scalar("tokenizer.ggml.model", GGUFValueType.STRING, required=False)
    tokens = gguf.expect_array(
        "tokenizer.ggml.tokens", GGUFValueType.STRING, required=model not in (None, "none")
    )
    if tokens is None:
        return
    n_vocab = len(tokens)
    if n_vocab == 0:
        gguf._fail("tokenizer.ggml.tokens", "vocabulary is empty")
    gguf.expect_scalar("tokenizer.ggml.pre", GGUFValueType.STRING, required=False)
    for key in _TOKENIZER_FLAGS:
        gguf.expect_scalar(key, GGUFValueType.BOOL, required=False)

    scores = gguf.expect_array("tokenizer.ggml.scores", GGUFValueType.FLOAT32, required=False)
    if scores is not None and len(scores) != n_vocab:
        gguf._fail("tokenizer.ggml.scores", f"has {len(scores)} entries for {n_vocab} tokens")

    token_types = gguf.expect_array("tokenizer.ggml.token_type", GGUFValueType.INT32, required=False)
    if token_types is not None:
        if len(token_types) != n_vocab:
            gguf._fail("tokenizer.ggml.token_type", f"has {len(token_types)} entries for {n_vocab} tokens")
        for index in np.flatnonzero(token_types == TOKEN_TYPE_BYTE).tolist():
            if not _BYTE_TOKEN.fullmatch(tokens[index]):
                gguf._fail("tokenizer.ggml.tokens",
                           f"byte token {tokens[index]!r} is not of the form <0xNN>", index=index)

    for key in gguf.metadata:
        if _SPECIAL_TOKEN_KEY.fullmatch(key):
            token_id = gguf.expect_scalar(key, GGUFValueType.UINT32)
            if token_id >= n_vocab:
                gguf._fail(key, f"token id {token_id} is outside the vocabulary [0, {n_vocab})")

    merges = gguf.expect_array("tokenizer.ggml.merges", GGUFValueType.STRING, required=False)
    if merges is not None and model == "gpt2":
        _check_merges(gguf, tokens, merges)


def _check_merges(gguf: GGUFFile, tokens: list[str], merges: list[str]) -> None:
    # llama.cpp splits a merge at its first space after the first character,
    # so a merge may start with a literal space; partition() is the fast path
    # (about 0.1 s for Qwen2's 151k merges would otherwise become 0.15 s).
    vocab = set(tokens)
    for index, merge in enumerate(merges):
        left, space, right = merge.partition(" ")
        if not left and space:
            split = merge.find(" ", 1)
            left, space, right = (merge[:split], " ", merge[split + 1:]) if split > 0 else ("", "", "")
        if not space or left not in vocab or right not in vocab or left + right not in vocab:
            _fail_merge(gguf, vocab, index, left, space, right)


def _fail_merge(gguf: GGUFFile, vocab: set[str], index: int, left: str, space: str, right: str) -> NoReturn:
    merge = gguf.metadata["tokenizer.ggml.merges"][index]
    if not space:
        gguf._fail("tokenizer.ggml.merges", f"merge {merge!r} is not of the form 'A B'", index=index)
    missing = next(t for t in (left, right, left + right) if t not in vocab)
    gguf._fail("tokenizer.ggml.merges",
               f"merge {merge!r} uses {missing!r}, which is not in the vocabulary", index=index)
