"""``/v1/embeddings``: OpenAI's embeddings endpoint over ``LLM.embed``.

OpenAI's shape has one vector per input, so a model whose pooling is
``none`` (decoder models carry no pooling key) is served with mean pooling;
a model with its own pooling (``{arch}.pooling_type``) keeps it; a
reranker's (rank) is refused: its scores are ``/v1/rerank``'s.  Vectors
are normalized (OpenAI's are unit length).  ``encoding_format`` may be
``"float"`` or ``"base64"`` (little-endian float32, as OpenAI's client
decodes it); ``dimensions`` is refused.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..api.embeddings import embed, embedding_response
from .errors import bad_request

_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}


@dataclass
class EmbeddingCall:
    model: Optional[str]
    texts: list[str]
    base64: bool


def embedding_call(body: Any) -> EmbeddingCall:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}", unknown[0])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise bad_request("input must be a non-empty string or a list of non-empty strings", "input")
    if body.get("dimensions") is not None:
        raise bad_request("dimensions is not supported: the vectors have the model's n_embd", "dimensions")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request("encoding_format must be 'float' or 'base64'", "encoding_format")
    return EmbeddingCall(model, texts, encoding == "base64")


def run_embedding(session, llm, call: EmbeddingCall, model_id: str) -> dict:
    """Embed on the request's session (its cache is replaced); blocking."""
    if llm.pooling == "rank":
        raise bad_request("this model is a reranker (rank pooling): its scores come from /v1/rerank")
    pooling = "mean" if llm.pooling == "none" else llm.pooling
    vectors, total = embed(llm.engine, session.assets, call.texts, pooling=pooling, n_ctx=session.n_ctx,
                           normalize=True, seq=session.seq)
    if call.base64:
        vectors = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vectors]
    return embedding_response(vectors, total, model_id)
