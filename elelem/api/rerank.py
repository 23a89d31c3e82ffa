"""Reranking: ``LLM.rerank``, the score of each document for a query, as llama.cpp's server gives it.

A reranker is a model with a classification head (llama.cpp's rank
pooling): a cross-encoder such as bge-reranker (``bert`` with ``cls`` and
``cls.output``) or Qwen3-Reranker (``qwen3`` whose ``cls.output`` holds its
LM head's "yes" and "no" rows).  Each document is evaluated with the query
as a sequence of its own, and its score is the head's first output: a logit
for a cross-encoder, the probability of "yes" for Qwen3-Reranker.

The query and document are put together as llama.cpp's
``format_prompt_rerank`` does: through the model's rerank template
(``tokenizer.chat_template.rerank``, ``{query}`` and ``{document}``
replaced in that order, special tokens parsed) where it has one; otherwise
``[BOS] query [EOS] [SEP] document [EOS]``, each special token where the
vocabulary adds it (EOS: the separator where there is no EOS).

Results are sorted by score, highest first (documents of equal score in
their order), and cut to ``top_n``.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..errors import ContextLimitError, InvalidArgumentError

#: The GGUF key of the rerank prompt (llama_model_chat_template(model, "rerank")).
RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


def rerank_ids(assets, query: str, document: str) -> list[int]:
    """The token ids llama.cpp's server evaluates for ``query`` and ``document``."""
    template = assets.gguf.get(RERANK_TEMPLATE_KEY)
    if isinstance(template, str):
        prompt = template.replace("{query}", query).replace("{document}", document)
        return assets.tokenize(prompt, add_bos=False, add_eos=False, special=True)
    tokenizer = assets.tokenizer
    add_bos, add_eos, add_sep = tokenizer.special_flags
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.special_id("sep")
    sep = tokenizer.special_id("sep")
    ids: list[int] = []
    if add_bos and tokenizer.bos_id is not None:
        ids.append(tokenizer.bos_id)
    ids += assets.tokenize(query, add_bos=False, add_eos=False)
    if add_eos and eos is not None:
        ids.append(eos)
    if add_sep and sep is not None:
        ids.append(sep)
    ids += assets.tokenize(document, add_bos=False, add_eos=False)
    if add_eos and eos is not None:
        ids.append(eos)
    return ids


def rerank(engine, assets, query: str, documents: Sequence[str], *, top_n: Optional[int] = None,
           n_ctx: int, seq: Optional[int] = None) -> tuple[list[dict[str, Any]], int]:
    """``(results, tokens evaluated)``: ``{"index", "relevance_score"}`` per
    document, best first, at most ``top_n`` of them; on a free sequence, or on ``seq``."""
    query, documents, top_n = check_rerank_args(query, documents, top_n)
    scored, total = [], 0
    for index, document in enumerate(documents):
        ids = rerank_ids(assets, query, document)
        if len(ids) > n_ctx:
            raise ContextLimitError(f"document {index} with the query is {len(ids)} tokens; n_ctx is {n_ctx}")
        total += len(ids)
        scored.append({"index": index, "relevance_score": float(engine.rank(ids, seq)[0])})
    scored.sort(key=lambda r: -r["relevance_score"])   # stable: equal scores keep the documents' order
    return scored[:top_n], total


def check_rerank_args(query: Any, documents: Any, top_n: Any) -> tuple[str, list[str], int]:
    """The arguments as rerank takes them: a query string, a non-empty list
    of document strings, and ``top_n`` (None: every document)."""
    if not isinstance(query, str):
        raise InvalidArgumentError("query must be a string")
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence) or not documents or \
            not all(isinstance(d, str) for d in documents):
        raise InvalidArgumentError("documents must be a non-empty list of strings")
    if top_n is None:
        top_n = len(documents)
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise InvalidArgumentError(f"top_n must be a non-negative integer, got {top_n!r}")
    return query, list(documents), top_n


def rerank_response(results: list[dict[str, Any]], total_tokens: int, model: str) -> dict[str, Any]:
    """llama.cpp's (Jina's) ``/v1/rerank`` response."""
    return {"model": model, "object": "list", "usage": {"prompt_tokens": total_tokens, "total_tokens": total_tokens},
            "results": results}
