"""Seeded, structure-aware mutations of GGUF files.

A mutant is described as a list of *pieces* (literal bytes, or a byte range
of a seed file, or zeros) so that a mutated 500 MB model costs a few MB of
Python bytes: only the header region (header, key-value pairs, tensor infos)
is ever copied into memory, and the tensor data is written by reference
(copied by the kernel, or left as a sparse hole of zeros).

Every case is a pure function of ``(seed, index)``: :func:`make_case` draws
from ``random.Random(f"{seed}:{index}")``, so a campaign can be replayed, cut
short and resumed, and a failing case regenerated from its number alone.

Mutations come in two kinds.  *In place* ones keep every offset: a field set
to an interesting value of its own width, a type swapped for another of the
same byte size, bytes of a string changed, bit flips.  They are the ones that
get past the reader into ggml, the shape checks and the tokenizer.  *Reshaping*
ones change the length: truncation, deleting or duplicating a record, adding a
key-value pair, inserting bytes, splicing two files.  After a reshaping change
to the header region the data section is re-padded to the file's alignment,
so the file stays self-consistent where the mutation did not break it.
"""
from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

from .gguf_layout import (
    ARRAY, BOOL, FLOAT32, FLOAT64, INT8, INT16, INT32, INT64, STRING, UINT8, UINT16, UINT32, UINT64,
    VALUE_FORMATS, Field, Layout, map_layout,
)

# --------------------------------------------------------------------------- pieces


@dataclass(frozen=True)
class FileRange:
    """``length`` bytes of ``path`` from ``offset`` (a seed's tensor data)."""

    path: Path
    offset: int
    length: int


@dataclass(frozen=True)
class Zeros:
    length: int


Piece = Union[bytes, FileRange, Zeros]
SMALL_RANGE = 16 << 20  # file ranges up to this size are copied, and inlined in fixtures


def total_size(pieces: list[Piece]) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.length for p in pieces)


def materialize(pieces: list[Piece], out: Path, *, copy_data: bool = False) -> Path:
    """Write the mutant to ``out``.

    File ranges are copied by the kernel with ``copy_data``; otherwise they
    become a hole (zeros: every ggml type decodes zeros without trouble) so a
    case over a 500 MB model writes only its few MB of header.
    """
    with open(out, "wb") as f:
        for piece in pieces:
            if isinstance(piece, bytes):
                f.write(piece)
            elif isinstance(piece, Zeros) or (piece.length > SMALL_RANGE and not copy_data):
                f.seek(piece.length, 1)
            else:
                f.flush()
                with open(piece.path, "rb") as src:
                    _copy_range(src.fileno(), f.fileno(), piece.offset, piece.length)
                f.seek(0, 2)
        f.truncate(f.tell())  # a trailing hole needs the size set explicitly
    return out


def _copy_range(src: int, dst: int, offset: int, length: int) -> None:
    import os
    while length > 0:
        try:
            done = os.copy_file_range(src, dst, length, offset)
        except (AttributeError, OSError):
            os.lseek(src, offset, 0)
            done = os.write(dst, os.read(src, min(length, 1 << 24)))
        if done <= 0:
            break
        offset += done
        length -= done


# --------------------------------------------------------------------------- seeds


@dataclass
class Base:
    """A seed file the mutator starts from."""

    name: str                  # "synthetic:qwen2-f32-gpt2", "real:smollm2-135m-instruct-q4_1"
    path: Path
    layout: Layout
    header: bytes              # bytes [0, layout.tensors_end)
    file_size: int
    alignment: int
    synthetic: bool            # small enough to hold and mutate whole

    @property
    def data(self) -> FileRange:
        """The data section, padding included."""
        start = self.layout.data_offset
        return FileRange(self.path, start, self.file_size - start)

    def whole(self) -> bytes:
        return self.path.read_bytes()


def load_base(path: Path, *, synthetic: bool) -> Base:
    from elelem.gguf.reader import read_gguf
    gguf = read_gguf(path)
    with open(path, "rb") as f:
        head = f.read(gguf.data_offset)
    layout = map_layout(path, head)
    kind = "synthetic" if synthetic else "real"
    return Base(f"{kind}:{path.stem}", path, layout, head[:layout.tensors_end], gguf.file_size,
                gguf.alignment, synthetic)


# --------------------------------------------------------------------------- values

_U64_SPECIALS = (0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 63, 64, 255, 256, 4096, 65535, 65536, 2**30, 2**30 + 1,
                 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**48, 2**62, 2**63 - 1, 2**63, 2**63 + 1,
                 2**64 - 2, 2**64 - 1, 0x7FFFFFFFFFFFFFC0, 0x8000000000000040)
_FLOAT_SPECIALS = (0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 1e-30, 1e30, 3.4e38, -3.4e38, 1e300,
                   math.inf, -math.inf, math.nan)

_SAME_SIZE_VALUE_TYPES = {1: (UINT8, INT8, BOOL), 2: (UINT16, INT16), 4: (UINT32, INT32, FLOAT32),
                          8: (UINT64, INT64, FLOAT64)}
# ggml tensor types by bytes per block, then by (block size, bytes): a swap that
# keeps the tensor's byte size keeps every offset valid.
_SAME_SIZE_TENSOR_TYPES = (
    (0, 26),             # F32, I32            (block 1, 4 bytes)
    (1, 25, 30),         # F16, I16, BF16      (block 1, 2 bytes)
    (27, 28),            # I64, F64            (block 1, 8 bytes)
    (2, 20),             # Q4_0, IQ4_NL        (block 32, 18 bytes)
    (11, 21),            # Q3_K, IQ3_S         (block 256, 110 bytes)
    (16, 35),            # IQ2_XXS, TQ2_0      (block 256, 66 bytes)
)
_ALL_TENSOR_TYPE_IDS = tuple(range(-1, 45)) + (2**31 - 1, -(2**31))


def interesting_int(rng: random.Random, current: int, bits: int, signed: bool) -> int:
    """A value likely to break something: a boundary, a neighbour of the current value, or random."""
    choice = rng.random()
    if choice < 0.45:
        value = rng.choice(_U64_SPECIALS)
    elif choice < 0.75:
        value = rng.choice((current + 1, current - 1, current * 2, current // 2, current + rng.randint(-8, 8),
                            -current, current * 1000, current ^ (1 << rng.randrange(bits))))
    elif choice < 0.9:
        value = rng.choice((-1, -2, -(2**31), -(2**63), 2**(bits - 1) - 1, 2**(bits - 1)))
    else:
        value = rng.getrandbits(bits)
    value %= 1 << bits  # wrap to the field's width; pack() reinterprets as signed when needed
    if signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def interesting_float(rng: random.Random, current: float) -> float:
    if rng.random() < 0.7:
        return rng.choice(_FLOAT_SPECIALS)
    return rng.choice((current * 2, -current, current / 3, current + 1, current * 1e10))


def pack(fmt: str, value) -> bytes:
    try:
        return struct.pack(fmt, value)
    except (struct.error, OverflowError):  # floats out of range for f32
        return struct.pack(fmt, math.inf if value > 0 else -math.inf)


def new_value_for(rng: random.Random, fld: Field, old: bytes) -> bytes:
    fmt = fld.fmt
    if fmt in ("<f", "<d"):
        (current,) = struct.unpack(fmt, old)
        return pack(fmt, interesting_float(rng, current))
    (current,) = struct.unpack(fmt, old)
    bits = fld.width * 8
    return pack(fmt, interesting_int(rng, current, bits, signed=fmt[1].islower()))


# --------------------------------------------------------------------------- the mutator

# Keys a hostile file might add: hyperparameters the architectures read with a
# default (so the seed lacks them), tokenizer switches, and the template.
_EXTRA_KEYS = (
    "{arch}.attention.sliding_window_pattern", "{arch}.attention.sliding_window", "{arch}.attention.key_length",
    "{arch}.attention.value_length", "{arch}.rope.dimension_count", "{arch}.rope.freq_base_swa",
    "{arch}.rope.scaling.type", "{arch}.rope.scaling.factor", "{arch}.attention.head_count_kv",
    "{arch}.attention.layer_norm_rms_epsilon", "{arch}.rope.freq_base", "general.alignment",
    "general.architecture", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.pre",
    "tokenizer.ggml.model", "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
    "tokenizer.chat_template", "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id",
)
_EXTRA_STRINGS = (
    b"", b"linear", b"yarn", b"none", b"gpt2", b"llama", b"qwen2", b"gemma3", b"qwen3", b"default", b"smollm",
    b"llama3", b"{{ messages[0]['content'] * 100000000 }}", b"{% for i in range(10**9) %}x{% endfor %}",
    b"{{ ''.__class__.__mro__[1].__subclasses__() }}", b"{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    b"{{ raise_exception('no') }}", b"\xed\xb3\xbf", b"\xff\xfe", b"x" * 300,
)


@dataclass
class Mutant:
    pieces: list[Piece]
    ops: list[str] = field(default_factory=list)


class Mutator:
    """Turns ``(seed, index)`` into a mutant of one of ``bases``."""

    def __init__(self, bases: list[Base]):
        if not bases:
            raise ValueError("the GGUF fuzzer needs at least one seed file")
        self.bases = bases
        self._whole: dict[str, bytes] = {}

    def make(self, seed: int, index: int) -> tuple[Base, Mutant]:
        rng = random.Random(f"{seed}:{index}")
        base = rng.choice(self.bases)
        ops: list[str] = []
        mode = rng.random()
        if base.synthetic and mode < 0.12:
            return base, self._raw_whole_file(rng, base, ops)
        buf = bytearray(base.header)
        layout = base.layout
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
            op = rng.choices(_IN_PLACE_OPS, weights=[w for _, w in _IN_PLACE_OPS])[0][0]
            op(self, rng, buf, layout, ops)
        tail: list[Piece] = [base.data]
        if rng.random() < 0.35:
            op = rng.choices(_RESHAPE_OPS, weights=[w for _, w in _RESHAPE_OPS])[0][0]
            buf, tail = op(self, rng, base, buf, tail, ops)
        return base, Mutant(self._assemble(base, bytes(buf), tail), ops)

    # -- assembly ------------------------------------------------------------

    def _assemble(self, base: Base, header: bytes, tail: list[Piece]) -> list[Piece]:
        """Header region, re-padded to the alignment, then the data (when kept)."""
        if not tail:
            return [header]
        padding = -len(header) % base.alignment
        return [header + bytes(padding)] + tail

    def _bytes_of(self, base: Base) -> bytes:
        if base.name not in self._whole:
            self._whole[base.name] = base.whole()
        return self._whole[base.name]

    def _raw_whole_file(self, rng: random.Random, base: Base, ops: list[str]) -> Mutant:
        """Blind byte-level mutation of a whole (small) file, tensor data included."""
        data = bytearray(self._bytes_of(base))
        for _ in range(rng.randint(1, 8)):
            kind = rng.random()
            pos = rng.randrange(len(data))
            if kind < 0.5:
                data[pos] ^= 1 << rng.randrange(8)
                ops.append(f"raw bitflip @{pos}")
            elif kind < 0.8:
                data[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
                ops.append(f"raw byte @{pos}")
            else:
                width = rng.choice((4, 8))
                pos = min(pos, len(data) - width)
                data[pos:pos + width] = pack("<Q" if width == 8 else "<I", rng.choice(_U64_SPECIALS) % (1 << 8 * width))
                ops.append(f"raw word{width * 8} @{pos}")
        if rng.random() < 0.3:
            cut = rng.randrange(len(data))
            del data[cut:]
            ops.append(f"raw truncate to {cut}")
        return Mutant([bytes(data)], ops)

    # -- in-place operators ------------------------------------------------------

    def op_set_field(self, rng, buf, layout, ops):
        roles = rng.choice((("n_tensors", "n_kv", "version"), ("key_len", "string_len"), ("value_type",),
                            ("element_type", "array_count"), ("n_dims", "dim"), ("tensor_type",),
                            ("tensor_offset",), ("value",), ("value",), ("dim",)))
        candidates = layout.fields_with(*roles)
        if not candidates:
            return
        fld = rng.choice(candidates)
        old = bytes(buf[fld.offset:fld.offset + fld.width])
        new = new_value_for(rng, fld, old)
        buf[fld.offset:fld.offset + fld.width] = new
        ops.append(f"set {fld.label} = {struct.unpack(fld.fmt, new)[0]!r}")

    def op_swap_type(self, rng, buf, layout, ops):
        candidates = layout.fields_with("value_type", "element_type", "tensor_type")
        if not candidates:
            return
        fld = rng.choice(candidates)
        (old,) = struct.unpack_from(fld.fmt, buf, fld.offset)
        if fld.role == "tensor_type":
            group = next((g for g in _SAME_SIZE_TENSOR_TYPES if old in g), None)
            new = rng.choice(group) if group and rng.random() < 0.8 else rng.choice(_ALL_TENSOR_TYPE_IDS)
        else:
            width = struct.calcsize(VALUE_FORMATS[old]) if old in VALUE_FORMATS else None
            group = _SAME_SIZE_VALUE_TYPES.get(width)
            new = rng.choice(group) if group and rng.random() < 0.8 else rng.choice(tuple(range(-1, 14)))
        struct.pack_into(fld.fmt, buf, fld.offset, new)
        ops.append(f"retype {fld.label}: {old} -> {new}")

    def op_hparam_value(self, rng, buf, layout, ops):
        """A hyperparameter or tokenizer scalar set to a boundary value (the ones shape checks see)."""
        keys = [k for k in layout.keys if "." in k and not k.startswith("general.")] or list(layout.keys)
        if not keys:
            return
        fld = layout.fields[layout.keys[rng.choice(keys)]]
        old = bytes(buf[fld.offset:fld.offset + fld.width])
        if fld.fmt in ("<f", "<d"):
            new = pack(fld.fmt, interesting_float(rng, struct.unpack(fld.fmt, old)[0]))
        else:
            (current,) = struct.unpack(fld.fmt, old)
            small = rng.choice((0, 1, 2, 3, 4, 5, 6, 7, current - 1, current + 1, current * 2, current // 2,
                                current * 3))
            value = small if rng.random() < 0.6 else interesting_int(rng, current, fld.width * 8, False)
            new = pack(fld.fmt.upper(), value % (1 << fld.width * 8))  # written unsigned, read as stored
        buf[fld.offset:fld.offset + fld.width] = new
        ops.append(f"hparam {fld.label} = {struct.unpack(fld.fmt, new)[0]!r}")

    def op_string_bytes(self, rng, buf, layout, ops):
        spans = [s for s in layout.spans if s.role in ("key", "string", "tensor_name") and s.end > s.start]
        if not spans:
            return
        span = rng.choice(spans)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(span.start, span.end)
            buf[pos] = rng.choice((0x00, 0xFF, 0x80, 0xC0, 0xED, 0x2E, 0x20, 0x25, 0x7B, 0x7D, rng.randrange(256),
                                   buf[pos] ^ 0x20, buf[pos] + 1 & 0xFF))
        ops.append(f"bytes of {span.label} -> {bytes(buf[span.start:span.end])[:40]!r}")

    def op_swap_strings(self, rng, buf, layout, ops):
        """Exchange two equal-length strings: tensor names, keys, architecture names, vocabulary entries."""
        spans = [s for s in layout.spans if s.role in ("key", "string", "tensor_name")]
        by_length: dict[int, list] = {}
        for s in spans:
            by_length.setdefault(s.end - s.start, []).append(s)
        groups = [g for g in by_length.values() if len(g) > 1]
        if rng.random() < 0.3:
            arch = next((s for s in spans if s.label == "kv 'general.architecture' value"), None)
            if arch is not None:
                name = {5: ("qwen2", "llama", "qwen3", "gemma", "mamba"), 6: ("gemma3", "gemma2", "qwen2m")}
                choices = name.get(arch.end - arch.start)
                if choices:
                    new = rng.choice(choices).encode()
                    buf[arch.start:arch.end] = new
                    ops.append(f"architecture -> {new.decode()}")
                    return
        if not groups:
            return
        a, b = rng.sample(rng.choice(groups), 2)
        first, second = bytes(buf[a.start:a.end]), bytes(buf[b.start:b.end])
        buf[a.start:a.end], buf[b.start:b.end] = second, first
        ops.append(f"swap {a.label} <-> {b.label}")

    def op_vocab_entry(self, rng, buf, layout, ops):
        """One entry of a STRING array (vocabulary, merges): its length or its bytes."""
        arrays = [a for a in layout.string_arrays if a.element_offsets]
        if not arrays:
            return
        array = rng.choice(arrays)
        index = rng.randrange(len(array.element_offsets))
        offset = array.element_offsets[index]
        (length,) = struct.unpack_from("<Q", buf, offset)
        # An earlier operator may already have broken this length: then only change it again.
        if rng.random() < 0.3 or length == 0 or length > len(buf) - offset - 8:
            new = interesting_int(rng, length, 64, False)
            struct.pack_into("<Q", buf, offset, new)
            ops.append(f"kv '{array.key}'[{index}] length = {new}")
            return
        # Same length, new bytes: a byte token like <0x-1>, a merge without a space, invalid UTF-8.
        body = offset + 8
        old = bytes(buf[body:body + length])
        replacements = [b"<0x-1>", b"<0xZZ>", b"<0x0A>", b"a", b" ", b"\xff", b"\xc3", b"<|im_end|>", b"<s>",
                        b"\xe2\x96\x81", old[::-1], old.replace(b" ", b"_"), old.upper()]
        new = rng.choice(replacements)[:length].ljust(length, b" ")
        buf[body:body + length] = new
        ops.append(f"kv '{array.key}'[{index}] {old[:20]!r} -> {new[:20]!r}")

    def op_numeric_array(self, rng, buf, layout, ops):
        """Elements of a numeric array (token types, scores) set to boundary values."""
        spans = [s for s in layout.spans if s.role == "array_body" and s.end > s.start]
        numeric = []
        for s in spans:
            key = s.label[len("kv '"):-len("' elements")]
            if not any(a.key == key for a in layout.string_arrays):
                numeric.append(s)
        if not numeric:
            return
        span = rng.choice(numeric)
        type_field = next(f for f in layout.fields if f.role == "element_type" and f.offset == span.start - 12)
        (element_type,) = struct.unpack_from("<i", buf, type_field.offset)
        fmt = VALUE_FORMATS.get(element_type)
        if fmt is None:
            return
        width = struct.calcsize(fmt)
        n = (span.end - span.start) // width
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(n)
            pos = span.start + i * width
            fld = Field(pos, fmt, "value", "")
            buf[pos:pos + width] = new_value_for(rng, fld, bytes(buf[pos:pos + width]))
        ops.append(f"elements of {span.label}")

    def op_bitflip(self, rng, buf, layout, ops):
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(buf))
            buf[pos] ^= 1 << rng.randrange(8)
            ops.append(f"bitflip @{pos}")

    # -- reshaping operators (return the new header and tail) ----------------------

    def op_truncate(self, rng, base, buf, tail, ops):
        if tail and rng.random() < 0.4:  # inside the data section
            data = tail[0]
            cut = rng.choice((data.length - 1, data.length // 2, rng.randrange(max(1, data.length))))
            ops.append(f"truncate data to {cut} of {data.length} bytes")
            return buf, [FileRange(data.path, data.offset, cut)]
        points = base.layout.boundaries()
        cut = rng.choice((rng.randrange(len(buf)), rng.choice(points) + rng.randint(-9, 9)))
        cut = max(0, min(cut, len(buf)))
        ops.append(f"truncate header region at {cut}")
        return buf[:cut], []

    def op_delete(self, rng, base, buf, tail, ops):
        lay = base.layout
        records = [s for s in lay.spans if s.role in ("kv", "tensor_info")]
        if records and rng.random() < 0.6:
            rec = rng.choice(records)
            del buf[rec.start:rec.end]
            if rng.random() < 0.7:  # keep the header's count honest, most of the time
                self._add_count(buf, "n_kv" if rec.role == "kv" else "n_tensors", -1)
            ops.append(f"delete {rec.label}")
        else:
            start = rng.randrange(len(buf))
            end = min(len(buf), start + rng.choice((1, 2, 4, 8, 16, 64, 1000)))
            del buf[start:end]
            ops.append(f"delete bytes [{start}, {end})")
        return buf, tail

    def op_duplicate(self, rng, base, buf, tail, ops):
        records = [s for s in base.layout.spans if s.role in ("kv", "tensor_info")]
        if not records:
            return buf, tail
        rec = rng.choice(records)
        where = rng.choice((rec.end, rec.start, base.layout.tensors_end if rec.role == "tensor_info" else rec.end))
        buf[where:where] = buf[rec.start:rec.end]
        if rng.random() < 0.8:
            self._add_count(buf, "n_kv" if rec.role == "kv" else "n_tensors", +1)
        ops.append(f"duplicate {rec.label}")
        return buf, tail

    def op_insert_kv(self, rng, base, buf, tail, ops):
        arch = self._architecture(base)
        key = rng.choice(_EXTRA_KEYS).format(arch=arch)
        value_type = rng.choice((UINT32, UINT32, UINT32, INT32, FLOAT32, UINT64, INT64, FLOAT64, UINT8, BOOL,
                                 STRING, STRING, ARRAY, 13, -1))
        record = _pack_string(key.encode()) + struct.pack("<i", value_type)
        if value_type == STRING:
            record += _pack_string(rng.choice(_EXTRA_STRINGS))
        elif value_type == ARRAY:
            element = rng.choice((UINT8, INT32, FLOAT32, STRING, ARRAY))
            count = rng.choice((0, 1, 3, 2**30, 2**62))
            record += struct.pack("<iQ", element, count)
            if element == STRING:
                record += b"".join(_pack_string(s.encode()) for s in ("a", "b c", "")[:min(count, 3)])
            elif element in VALUE_FORMATS:
                record += bytes(struct.calcsize(VALUE_FORMATS[element]) * min(count, 3))
        elif value_type in VALUE_FORMATS:
            fmt = VALUE_FORMATS[value_type]
            fld = Field(0, fmt, "value", key)
            if value_type == UINT32 and rng.random() < 0.5:
                record += struct.pack("<I", rng.choice((0, 1, 2, 3, 5, 6, 7, 100, 2**31, 2**32 - 1)))
            else:
                record += new_value_for(rng, fld, bytes(struct.calcsize(fmt)))
        at = rng.choice(base.layout.kv_starts + [base.layout.tensor_starts[0] if base.layout.tensor_starts else 24])
        buf[at:at] = record
        if rng.random() < 0.9:
            self._add_count(buf, "n_kv", +1)
        ops.append(f"insert kv '{key}' of type {value_type}")
        return buf, tail

    def op_insert_bytes(self, rng, base, buf, tail, ops):
        at = rng.choice(base.layout.boundaries() + [rng.randrange(len(buf) + 1)])
        at = min(at, len(buf))
        blob = rng.choice((bytes(rng.randint(1, 64)), b"\xff" * rng.randint(1, 16),
                           bytes(rng.randrange(256) for _ in range(rng.randint(1, 32))), b"GGUF" + bytes(20)))
        buf[at:at] = blob
        ops.append(f"insert {len(blob)} bytes at {at}")
        return buf, tail

    def op_splice(self, rng, base, buf, tail, ops):
        """The first part of this file, then the rest of another one from a record boundary."""
        other = rng.choice(self.bases)
        cut_here = rng.choice(base.layout.boundaries())
        cut_there = rng.choice(other.layout.boundaries())
        if cut_there > len(other.header):
            cut_there = len(other.header)
        spliced = bytearray(buf[:min(cut_here, len(buf))] + other.header[cut_there:])
        ops.append(f"splice {base.name}[:{cut_here}] + {other.name}[{cut_there}:]")
        return spliced, [other.data] if tail else []

    @staticmethod
    def _add_count(buf: bytearray, which: str, delta: int) -> None:
        offset = 8 if which == "n_tensors" else 16
        (count,) = struct.unpack_from("<q", buf, offset)
        struct.pack_into("<q", buf, offset, (count + delta + 2**63) % 2**64 - 2**63)  # wraps, as in C

    @staticmethod
    def _architecture(base: Base) -> str:
        span = next((s for s in base.layout.spans if s.label == "kv 'general.architecture' value"), None)
        return base.header[span.start:span.end].decode() if span else "llama"


def _pack_string(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


_IN_PLACE_OPS: list[tuple[Callable, int]] = [
    (Mutator.op_set_field, 30), (Mutator.op_swap_type, 14), (Mutator.op_hparam_value, 16),
    (Mutator.op_string_bytes, 8), (Mutator.op_swap_strings, 8), (Mutator.op_vocab_entry, 10),
    (Mutator.op_numeric_array, 6), (Mutator.op_bitflip, 8),
]
_RESHAPE_OPS: list[tuple[Callable, int]] = [
    (Mutator.op_truncate, 20), (Mutator.op_delete, 15), (Mutator.op_duplicate, 12), (Mutator.op_insert_kv, 25),
    (Mutator.op_insert_bytes, 10), (Mutator.op_splice, 18),
]
