"""Where every field of a valid GGUF file lies, so the mutator can aim.

Blind bit flips almost always die in the first check of the reader.  The
mutations that reach deeper (into ggml, the shape checks, the tokenizer)
change one field to a value of the same width: a tensor type to another type
of the same byte size, a count to a huge value, a metadata value type from
UINT32 to FLOAT32.  For that the mutator needs the offset, width and meaning
of each field, which :func:`map_layout` records in one pass over a file that
elelem's reader has already accepted.

Only the header region (header, key-value pairs, tensor infos) is mapped;
tensor data is opaque.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

# GGUF value type ids and the struct format of each fixed-size one.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
VALUE_FORMATS = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}


@dataclass(frozen=True)
class Field:
    """One fixed-width field: ``fmt`` is its struct format, ``role`` what it means."""

    offset: int
    fmt: str        # "<I", "<q", ... (the width is struct.calcsize(fmt))
    role: str       # version, n_tensors, n_kv, key_len, value_type, value, element_type,
    #                 array_count, string_len, n_dims, dim, tensor_type, tensor_offset
    label: str      # for humans: "kv 'qwen2.block_count' value", "tensor 'output.weight' dim 1"

    @property
    def width(self) -> int:
        return struct.calcsize(self.fmt)


@dataclass(frozen=True)
class Span:
    """A byte range with a meaning: a string body, a whole KV record, a tensor info."""

    start: int
    end: int
    role: str       # key, string, kv, tensor_info, tensor_name, array_body
    label: str


@dataclass
class StringArray:
    """A STRING array's element offsets (each the u64 length before the bytes)."""

    key: str
    element_offsets: list[int]


@dataclass
class Layout:
    path: Path
    size: int
    data_offset: int                     # end of the header region
    fields: list[Field] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    string_arrays: list[StringArray] = field(default_factory=list)
    kv_starts: list[int] = field(default_factory=list)
    tensor_starts: list[int] = field(default_factory=list)
    tensors_end: int = 0                 # end of the tensor-info table (before the padding)
    keys: dict[str, int] = field(default_factory=dict)  # key -> index of its 'value' or 'value_type' field

    def fields_with(self, *roles: str) -> list[Field]:
        return [f for f in self.fields if f.role in roles]

    def boundaries(self) -> list[int]:
        """Offsets where a record starts: good places to cut, splice or insert."""
        return sorted(set([24] + self.kv_starts + self.tensor_starts + [self.tensors_end, self.data_offset]))


def map_layout(path: str | Path, data: bytes | None = None) -> Layout:
    """The layout of a GGUF file that ``elelem.gguf.reader.read_gguf`` accepts."""
    path = Path(path)
    if data is None:
        from elelem.gguf.reader import read_gguf
        data_offset = read_gguf(path).data_offset
        with open(path, "rb") as f:
            data = f.read(data_offset)
    return _Walker(path, data).walk()


class _Walker:
    def __init__(self, path: Path, data: bytes):
        self.data = data
        self.pos = 0
        self.layout = Layout(path=path, size=len(data), data_offset=0)

    def field(self, fmt: str, role: str, label: str) -> int | float:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.layout.fields.append(Field(self.pos, fmt, role, label))
        self.pos += struct.calcsize(fmt)
        return value

    def string(self, role: str, label: str) -> str:
        length = self.field("<Q", "string_len" if role != "key" else "key_len", f"{label} length")
        start = self.pos
        self.pos += length
        self.layout.spans.append(Span(start, self.pos, role, label))
        return self.data[start:self.pos].decode("utf-8")

    def walk(self) -> Layout:
        lay = self.layout
        lay.spans.append(Span(0, 4, "magic", "magic"))
        self.pos = 4
        self.field("<I", "version", "version")
        n_tensors = self.field("<q", "n_tensors", "tensor count")
        n_kv = self.field("<q", "n_kv", "key-value count")
        alignment = 32
        for _ in range(n_kv):
            start = self.pos
            lay.kv_starts.append(start)
            key = self.string("key", "key")
            label = f"kv '{key}'"
            value_type = self.field("<i", "value_type", f"{label} type")
            if value_type == ARRAY:
                element_type = self.field("<i", "element_type", f"{label} element type")
                count = self.field("<Q", "array_count", f"{label} count")
                body = self.pos
                if element_type == STRING:
                    offsets = []
                    for _ in range(count):
                        offsets.append(self.pos)
                        (length,) = struct.unpack_from("<Q", self.data, self.pos)
                        self.pos += 8 + length
                    lay.string_arrays.append(StringArray(key, offsets))
                else:
                    self.pos += count * struct.calcsize(VALUE_FORMATS[element_type])
                lay.spans.append(Span(body, self.pos, "array_body", f"{label} elements"))
            elif value_type == STRING:
                self.string("string", f"{label} value")
            else:
                lay.keys[key] = len(lay.fields)
                value = self.field(VALUE_FORMATS[value_type], "value", f"{label} value")
                if key == "general.alignment":
                    alignment = int(value)
            lay.spans.append(Span(start, self.pos, "kv", label))
        for i in range(n_tensors):
            start = self.pos
            lay.tensor_starts.append(start)
            name = self.string("tensor_name", f"tensor #{i} name")
            label = f"tensor '{name}'"
            n_dims = self.field("<I", "n_dims", f"{label} n_dims")
            for j in range(n_dims):
                self.field("<q", "dim", f"{label} dim {j}")
            self.field("<i", "tensor_type", f"{label} type")
            self.field("<Q", "tensor_offset", f"{label} offset")
            lay.spans.append(Span(start, self.pos, "tensor_info", label))
        lay.tensors_end = self.pos
        lay.data_offset = (self.pos + alignment - 1) // alignment * alignment if n_tensors else self.pos
        return lay
