"""Synthetic GGUF files for the reader's tests: valid ones, broken ones, and a comparison.

A plain module (not a conftest) so both test files can import it by name.
:class:`RawGGUF` assembles a file field by field with ``struct``, so a test
can write exactly the bytes ggml would choke on, and records where each part
landed so the test can check the offset an error reports.
:func:`write_valid_gguf` uses the ``gguf`` package's own writer instead.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from elelem.gguf.reader import GGML_TYPES, GGUFFile

# GGUF value type ids (enum gguf_type).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR_FORMATS = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}

# ggml type ids used by the tests.
F32, F16, Q4_0, Q8_0, Q4_K, I8, I32 = 0, 1, 2, 8, 12, 24, 26


def pack_string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def pack_scalar(value_type: int, value: Any) -> bytes:
    if value_type == STRING:
        return pack_string(value)
    return struct.pack(_SCALAR_FORMATS[value_type], value)


def pack_array(element_type: int, values: Any, *, count: int | None = None) -> bytes:
    """Element type, count (``count`` overrides the real one) and the packed elements."""
    if element_type == STRING:
        body = b"".join(pack_string(v) for v in values)
    elif isinstance(values, (bytes, bytearray)):
        body = bytes(values)
    else:
        body = np.asarray(values, dtype=np.dtype(_SCALAR_FORMATS[element_type])).tobytes()
    n = len(values) if count is None else count
    return struct.pack("<iQ", element_type, n) + body


def pack_kv(key: str | bytes, value_type: int, value: Any) -> bytes:
    """A whole KV record; for ARRAY, ``value`` is ``(element_type, values)``."""
    if value_type == ARRAY:
        payload = pack_array(*value)
    else:
        payload = pack_scalar(value_type, value)
    return pack_string(key) + struct.pack("<i", value_type) + payload


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    _, block_size, type_size = GGML_TYPES[ggml_type]
    n = 1
    for ne in shape:
        n *= ne
    return n // block_size * type_size


def pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class RawGGUF:
    """Assemble a GGUF file byte by byte.

    Add KV pairs and tensor infos (well-formed through :meth:`kv` and
    :meth:`tensor`, anything at all through :meth:`raw_kv` and
    :meth:`raw_tensor`), then :meth:`build`.  After building,
    ``kv_offsets``, ``tensor_offsets`` and ``data_offset`` say where each
    part starts in the file.
    """

    def __init__(self, *, magic: bytes = b"GGUF", version: int = 3, alignment: int = 32):
        self.magic = magic
        self.version = version
        self.alignment = alignment  # used to pad the data section; add the KV yourself if not 32
        self._kvs: list[bytes] = []
        self._tensors: list[bytes] = []
        self._data_size = 0  # running padded size of the tensor data
        self.kv_offsets: list[int] = []
        self.tensor_offsets: list[int] = []
        self.data_offset = -1

    def kv(self, key: str | bytes, value_type: int, value: Any) -> RawGGUF:
        return self.raw_kv(pack_kv(key, value_type, value))

    def raw_kv(self, record: bytes) -> RawGGUF:
        self._kvs.append(record)
        return self

    def tensor(self, name: str | bytes, shape: tuple[int, ...], ggml_type: int = F32, *,
               offset: int | None = None, nbytes: int | None = None, n_dims: int | None = None) -> RawGGUF:
        """A tensor info; ``offset`` defaults to the padded running total (what ggml requires)."""
        if nbytes is None:
            nbytes = tensor_nbytes(shape, ggml_type) if ggml_type in GGML_TYPES else 0
        if offset is None:
            offset = self._data_size
        self._data_size = offset + pad(nbytes, self.alignment)
        record = (
            pack_string(name)
            + struct.pack("<I", len(shape) if n_dims is None else n_dims)
            + struct.pack(f"<{len(shape)}q", *shape)
            + struct.pack("<iQ", ggml_type, offset)
        )
        return self.raw_tensor(record)

    def raw_tensor(self, record: bytes) -> RawGGUF:
        self._tensors.append(record)
        return self

    def build(self, *, n_tensors: int | None = None, n_kv: int | None = None,
              data: bytes | None = None) -> bytes:
        """The file; ``data`` defaults to zeros for every tensor (padding included)."""
        out = bytearray(struct.pack(
            "<4sIqq", self.magic, self.version,
            len(self._tensors) if n_tensors is None else n_tensors,
            len(self._kvs) if n_kv is None else n_kv,
        ))
        self.kv_offsets = []
        for record in self._kvs:
            self.kv_offsets.append(len(out))
            out += record
        self.tensor_offsets = []
        for record in self._tensors:
            self.tensor_offsets.append(len(out))
            out += record
        if self._tensors:
            out += bytes(pad(len(out), self.alignment) - len(out))
        self.data_offset = len(out)
        out += bytes(self._data_size) if data is None else data
        return bytes(out)

    def write(self, path: Path, **build_args: Any) -> Path:
        path.write_bytes(self.build(**build_args))
        return path


def write_valid_gguf(path: Path, *, alignment: int | None = None) -> Path:
    """A small file with every value type and a few tensor types, written by the gguf package."""
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("test.u8", 200)
    writer.add_int8("test.i8", -100)
    writer.add_uint16("test.u16", 60000)
    writer.add_int16("test.i16", -30000)
    writer.add_uint32("test.u32", 4_000_000_000)
    writer.add_int32("test.i32", -2_000_000_000)
    writer.add_float32("test.f32", 0.5)
    writer.add_bool("test.bool", True)
    writer.add_string("test.str", "héllo \u2603")
    writer.add_uint64("test.u64", 2**64 - 1)
    writer.add_int64("test.i64", -(2**63))
    writer.add_float64("test.f64", 1e300)
    for name, value_type in [
        ("u8", gguf.GGUFValueType.UINT8), ("i8", gguf.GGUFValueType.INT8),
        ("u16", gguf.GGUFValueType.UINT16), ("i16", gguf.GGUFValueType.INT16),
        ("u32", gguf.GGUFValueType.UINT32), ("i32", gguf.GGUFValueType.INT32),
        ("u64", gguf.GGUFValueType.UINT64), ("i64", gguf.GGUFValueType.INT64),
    ]:
        writer.add_key_value(f"test.arr_{name}", [1, 2, 3, 100], gguf.GGUFValueType.ARRAY, value_type)
    writer.add_key_value("test.arr_f32", [0.25, -1.5], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
    writer.add_key_value("test.arr_f64", [0.25, -1.5], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT64)
    writer.add_key_value("test.arr_bool", [True, False, True], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL)
    writer.add_array("test.arr_str", ["a", "", "ĠHello", "<0x0A>", "\u2603"])

    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((3, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(5).astype(np.float16))
    writer.add_tensor("blk.0.i8", np.arange(7, dtype=np.int8))
    writer.add_tensor("blk.0.i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    # Quantized tensors are passed as raw bytes: shape (rows, bytes per row).
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 144 * 2), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((4, 34), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_matches_gguf_reader(ours: GGUFFile, path: Path) -> None:
    """Every key and tensor of ``ours`` equals what gguf.GGUFReader reads from ``path``."""
    theirs = gguf.GGUFReader(str(path))
    # GGUFReader adds the header as pseudo-keys "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count".
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    assert ours.version == int(theirs.fields["GGUF.version"].parts[0][0])
    assert ours.alignment == theirs.alignment
    assert ours.data_offset == theirs.data_offset
    for key, field in fields.items():
        value = ours.metadata[key]
        main_type = int(field.types[0])
        assert ours.value_type(key) == main_type, key
        if main_type == ARRAY:
            element_type = int(field.types[-1])
            assert ours.array_type(key) == element_type, key
            if element_type == STRING:
                assert value == field.contents(), key
            else:
                expected = np.concatenate([field.parts[i] for i in field.data]) if field.data else []
                assert isinstance(value, np.ndarray) and value.ndim == 1, key
                np.testing.assert_array_equal(value, np.asarray(expected, dtype=value.dtype), err_msg=key)
                if element_type != BOOL:
                    assert value.dtype == np.dtype(_SCALAR_FORMATS[element_type]), key
        elif main_type == STRING:
            assert value == field.contents(), key
        elif main_type == BOOL:
            assert value is bool(field.contents()), key
        else:
            expected = field.parts[-1][0]
            assert value == expected.item(), key
            assert type(value) is (float if main_type in (FLOAT32, FLOAT64) else int), key
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(d) for d in t.shape), t.name
        assert info.ggml_type == int(t.tensor_type), t.name
        assert info.type_name == t.tensor_type.name, t.name
        assert ours.data_offset + info.offset == t.data_offset, t.name
        assert info.nbytes == t.n_bytes, t.name
        assert info.n_elements == t.n_elements, t.name
