"""The NumPy reference over a real GGUF model: weights dequantized with `gguf`."""
from __future__ import annotations

import gguf
import numpy as np

from elelem.model.architectures import model_spec
from elelem.gguf.reader import read_gguf
from synthetic import TinyConfig


def dequantized_weights(path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # numpy order: (ne1, ne0)
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return out


def config_of(path) -> TinyConfig:
    h = model_spec(read_gguf(path)).hparams
    return TinyConfig(arch=model_spec(read_gguf(path)).arch.name, n_vocab=h["n_vocab"], n_embd=h["n_embd"],
                      n_layer=h["n_layer"], n_head=h["n_head"], n_head_kv=h["n_head_kv"],
                      head_dim=h["head_dim_k"], n_ff=h["n_ff"], rope_base=h["rope_base"],
                      rms_eps=h["rms_eps"], n_swa=h.get("n_swa", 0))
