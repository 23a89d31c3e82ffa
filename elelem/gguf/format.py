"""What the GGUF format and ggml define: value types, tensor types, limits and sizes.

The numbers the reader checks a file against, in one place; nothing here reads
a file.
"""
from __future__ import annotations

import enum
import struct

import numpy as np

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
