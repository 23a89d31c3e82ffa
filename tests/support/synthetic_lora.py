"""Tiny random LoRA adapters written as llama.cpp's convert_lora_to_gguf.py writes them.

The converter (``LoraModel`` in convert_lora_to_gguf.py) writes the base
model's ``general.architecture``, ``general.type = "adapter"``,
``adapter.type = "lora"`` and ``adapter.lora.alpha`` (float32), then for each
adapted weight ``<name>.lora_a`` and ``<name>.lora_b``: PEFT's A
``(rank, n_in)`` and B ``(n_out, rank)`` as they are (in NumPy's order;
ggml's reverses it), stacked per expert for expert weights, and for the token
embedding A transposed (``(n_vocab, rank)``: ggml's ``(rank, n_vocab)``, rows
by token) and B ``(n_embd, rank)``.  Its default --outtype is f32.

Imported by tests and by the DEV-ONLY fixture script, so it needs only
``gguf`` and NumPy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import gguf
import numpy as np


def lora_factors(shape: tuple, rank: int, rng: np.random.Generator, embedding: bool = False,
                 magnitude: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) in NumPy's order for a weight of NumPy shape ``shape``
    ((n_out, n_in), experts (n_expert, n_out, n_in), or the embedding (n_vocab, n_embd))."""
    if embedding:
        n_vocab, n_embd = shape
        a = rng.standard_normal((n_vocab, rank)) * magnitude
        b = rng.standard_normal((n_embd, rank)) * magnitude / np.sqrt(rank)
        return a.astype(np.float32), b.astype(np.float32)
    *experts, n_out, n_in = shape
    a = rng.standard_normal((*experts, rank, n_in)) * magnitude / np.sqrt(n_in)
    b = rng.standard_normal((*experts, n_out, rank)) * magnitude / np.sqrt(rank)
    return a.astype(np.float32), b.astype(np.float32)


def write_lora(path: Path, arch: str, targets: dict[str, tuple], *, rank: int = 8, alpha: Optional[float] = 16.0,
               seed: int = 0, dtype: str = "f32", embedding: Optional[str] = None, name: str = "tiny-lora",
               general_type: str = "adapter", adapter_type: str = "lora",
               ranks: Optional[dict[str, int]] = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write an adapter for the weights ``targets`` (name -> NumPy shape of the
    base weight); ``embedding`` names the token embedding among them.  Returns
    name -> (A, B) as stored (NumPy order, float32)."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(general_type)
    writer.add_name(name)
    writer.add_string(gguf.Keys.Adapter.TYPE, adapter_type)
    if alpha is not None:
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    out = {}
    for target, shape in targets.items():
        a, b = lora_factors(tuple(shape), (ranks or {}).get(target, rank), rng, embedding=target == embedding)
        if dtype == "f16":
            a, b = a.astype(np.float16), b.astype(np.float16)
        writer.add_tensor(target + ".lora_a", a)
        writer.add_tensor(target + ".lora_b", b)
        out[target] = (a.astype(np.float32), b.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def weight_shapes(path: Path) -> dict[str, tuple]:
    """name -> NumPy shape of each tensor of a GGUF file (ggml's order reversed)."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
