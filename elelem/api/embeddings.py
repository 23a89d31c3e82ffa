"""Embeddings: ``LLM.embed`` and ``LLM.create_embedding``, as llama-cpp-python has them.

Each input is evaluated as a sequence of its own and read out before the
output projection: the final normed hidden state of every token (llama.cpp's
``t_embd``).  Pooling then follows the model's GGUF metadata
(``{arch}.pooling_type``, as llama.cpp reads it): ``none`` (each token's
vector: llama.cpp's default for decoder models, which carry no such key),
``mean``, ``cls`` (the first token), ``last`` (Qwen3-Embedding) or
``rank`` (a reranker's classification head: its outputs, whose first is the
score; :mod:`elelem.api.rerank`); ``LLM(pooling=...)`` overrides it.  ``normalize=True`` divides each vector by its Euclidean norm
(llama-cpp-python's ``normalize_embedding``).  Inputs are tokenized as
llama-cpp-python does (the model's BOS rule, no special tokens).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from ..errors import ContextLimitError, InvalidArgumentError

#: llama.cpp's enum llama_pooling_type.
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}

Input = Union[str, Sequence[str]]


def model_pooling(gguf, arch: str, override: Optional[str], has_head: bool = False) -> str:
    """The pooling to use: ``override``, else the model's metadata, else
    none; rank only for a model with a classification head (``has_head``)."""
    if override is not None:
        if override not in POOLING_TYPES.values():
            raise InvalidArgumentError(f"pooling must be one of {sorted(POOLING_TYPES.values())}, got {override!r}")
        pooling = override
    else:
        value = gguf.get(f"{arch}.pooling_type", 0)
        if isinstance(value, bool) or value not in POOLING_TYPES:
            raise InvalidArgumentError(f"{arch}.pooling_type = {value!r} is not supported "
                                       f"(elelem pools {', '.join(f'{k} ({v})' for k, v in POOLING_TYPES.items())})")
        pooling = POOLING_TYPES[value]
    if pooling == "rank" and not has_head:
        raise InvalidArgumentError(f"rank pooling ({arch}.pooling_type = 4) needs a classification head "
                                   f"(cls / cls.output), which this model lacks")
    return pooling


def embed(engine, assets, inputs: Input, *, pooling: str, n_ctx: int, normalize: bool = False,
          truncate: bool = True, seq: Optional[int] = None) -> tuple[list, int]:
    """``(embeddings, tokens evaluated)``: one per input (a vector, or a vector
    per token with pooling none), on a free sequence or on ``seq``."""
    texts = _texts(inputs)
    out, total = [], 0
    for text in texts:
        ids = assets.tokenize(text, special=False)
        if not ids:
            raise InvalidArgumentError("cannot embed an empty text (it has no tokens)")
        if len(ids) > n_ctx:
            if not truncate:
                raise ContextLimitError(f"the text has {len(ids)} tokens; n_ctx is {n_ctx} (truncate=True cuts it)")
            ids = ids[:n_ctx]
        total += len(ids)
        if pooling == "rank":
            vectors = engine.rank(ids, seq).astype(np.float64)
        else:
            vectors = _pool(engine.embed(ids, seq).astype(np.float64), pooling)
        if normalize:
            vectors = _normalized(vectors)
        out.append(vectors.tolist())
    return out, total


def embedding_response(embeddings: list, total_tokens: int, model: str) -> dict[str, Any]:
    """llama-cpp-python's (and OpenAI's) ``create_embedding`` response."""
    return {
        "object": "list",
        "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeddings)],
        "model": model,
        "usage": {"prompt_tokens": total_tokens, "total_tokens": total_tokens},
    }


def _texts(inputs: Input) -> list[str]:
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (bytes, bytearray)) or not isinstance(inputs, Sequence) or not inputs or \
            not all(isinstance(t, str) for t in inputs):
        raise InvalidArgumentError("input must be a string or a non-empty list of strings")
    return list(inputs)


def _pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    if pooling == "mean":
        return rows.mean(axis=0)
    if pooling == "cls":
        return rows[0]
    if pooling == "last":
        return rows[-1]
    return rows


def _normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norms, out=np.array(vectors, copy=True), where=norms > 0)
