"""The GGUF parser: one bounds-checked pass over a mapped file.

The header, the key-value metadata (scalars, numeric arrays as numpy arrays,
string arrays decoded lazily) and the tensor-info table, each count bounded by
the bytes left in the file before anything is allocated; then the tensors'
layout in the data section.  The checks mirror ``gguf_init_from_reader`` in
``third_party/ggml/src/gguf.cpp``.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

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
from .file import GGUFFile, LazyStrings, TensorInfo
from .format import (
    _FIXED_TYPES,
    _HEADER,
    _I32,
    _REMOVED_GGML_TYPES,
    _U32,
    _U64,
    ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_TYPE_COUNT,
    GGML_TYPES,
    GGUF_MAGIC,
    HEADER_SIZE,
    INT64_MAX,
    MAX_ALIGNMENT,
    MAX_ARRAY_ELEMENTS,
    MAX_STRING_LENGTH,
    MIN_KV_BYTES,
    MIN_TENSOR_INFO_BYTES,
    SUPPORTED_VERSIONS,
    GGUFValueType,
    _value_type_name,
)


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
