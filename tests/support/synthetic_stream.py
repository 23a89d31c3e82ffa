"""Real-sized synthetic files written with little memory: tensors of random
weights made only while they are written, a few million values at a time.

The family writers (synthetic_mla.py, synthetic_mamba2.py) make their tests'
tiny models whole, in float32, and return them for the NumPy reference.  A
benchmark file with a real model's per-layer shapes (a stack of 128 experts is
2.5 GB in float32) cannot be made that way on a small machine: with
``stream=True`` their matrices are :class:`RandomTensor` placeholders, and
:func:`write_streamed` writes the file as llama.cpp's converter lays it out
(header, keys, tensor infos, then each tensor's data), quantizing each
placeholder a block of rows at a time.  Nothing is returned: no reference
runs on such a file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import gguf
import numpy as np

#: Values made (and quantized) at a time: 16 MB of float32.
CHUNK_VALUES = 1 << 22


@dataclass(frozen=True)
class RandomTensor:
    """Standard normal values times ``scale``, numpy shape ``shape`` (rows, then
    the row length), from a generator of its own (``seed``): made only while
    written, so that the order tensors are made in does not change them."""
    shape: tuple
    scale: float
    seed: tuple

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def row_blocks(self) -> Iterator[np.ndarray]:
        """The tensor as (rows, row length) float32 blocks, in order."""
        rng = np.random.default_rng(list(self.seed))
        n_in = self.shape[-1]
        rows = math.prod(self.shape[:-1])
        step = max(1, CHUNK_VALUES // n_in)
        for start in range(0, rows, step):
            block = rng.standard_normal((min(step, rows - start), n_in), dtype=np.float32)
            block *= np.float32(self.scale)
            yield block


def random_matrices(seed: int) -> Callable[..., RandomTensor]:
    """A family writer's ``mat`` in stream mode: each call a new RandomTensor, numbered from ``seed``."""
    count = iter(range(1 << 30))

    def mat(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return RandomTensor(tuple(shape), float(scale), (seed, next(count)))
    return mat


def write_streamed(writer: gguf.GGUFWriter, weights: dict, tensor_type: Callable[[str, object], str],
                   quantize: Callable[[np.ndarray, str], np.ndarray]) -> None:
    """Write ``weights`` (arrays and RandomTensors) after the keys already in
    ``writer``, in the types ``tensor_type(name, tensor)`` gives, and close it.
    At most one tensor's quantized bytes sit in memory (gguf's writer takes a
    tensor's data whole)."""
    plan = []
    for name, t in weights.items():
        wtype = tensor_type(name, t)
        qtype = gguf.GGMLQuantizationType[wtype.upper()]
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = math.prod(t.shape) // block * type_size
        if wtype in ("f32", "f16"):
            writer.add_tensor_info(name, t.shape, np.dtype(np.float32 if wtype == "f32" else np.float16), nbytes)
        else:   # the values' shape, and the type they are stored in
            writer.add_tensor_info(name, t.shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        plan.append((name, t, wtype, nbytes))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, t, wtype, nbytes in plan:
        blocks = t.row_blocks() if isinstance(t, RandomTensor) else [np.asarray(t, np.float32).reshape(-1, t.shape[-1])]
        out = np.empty(nbytes, dtype=np.uint8)
        at = 0
        for x in blocks:
            if wtype == "f32":
                data = x
            elif wtype == "f16":
                data = x.astype(np.float16)
            else:
                data = quantize(x, wtype)
            raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
            out[at:at + raw.size] = raw
            at += raw.size
        assert at == nbytes, f"{name}: {at} bytes made, {nbytes} declared"
        writer.write_tensor_data(out)
    writer.close()
