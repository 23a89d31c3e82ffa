"""llama.cpp's ``POST /v1/rerank`` (also ``/rerank``, ``/v1/reranking``, ``/reranking``): documents scored for a query.

The body is Jina's (``query``, ``documents``, ``top_n``, ``model``) or, with
``texts`` in place of ``documents``, Hugging Face TEI's (``return_text``),
as llama-server reads them.  Jina's answer is ``{"model", "object": "list",
"usage", "results": [{"index", "relevance_score"}]}``; TEI's a bare list of
``{"index", "score"}``, each with its ``text`` when ``return_text`` is true.
Results are best first and at most ``top_n`` (every document by default);
``usage`` counts every document's tokens.  The scoring is the library's
(:mod:`elelem.api.rerank`), on the request's session of the model the body
names (the pool loads it on first use).

Errors are llama-server's ``{"error": {"code", "message", "type"}}``: a
missing or non-string query, no documents, or a bad ``top_n`` is a 400; a
model without a classification head is a 501 (``not_supported_error``),
as llama-server answers when it was not started with ``--reranking``.
"""
from __future__ import annotations

from typing import Any, Optional

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api.rerank import rerank, rerank_response
from .body import read_json
from .errors import APIError, bad_request


def _call(body: Any) -> tuple[Optional[str], str, list[str], Optional[int], bool, bool]:
    """(model, query, documents, top_n, TEI's shape, return_text) of a body, checked as llama-server checks it."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    if "query" not in body:
        raise bad_request('"query" must be provided', "query")
    query = body["query"]
    if not isinstance(query, str):
        raise bad_request('"query" must be a string', "query")
    tei = "texts" in body
    documents = body.get("documents", body.get("texts"))
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise bad_request('"documents" must be a non-empty string array', "texts" if tei else "documents")
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise bad_request('"top_n" must be a non-negative integer', "top_n")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request('"model" must be a string', "model")
    return model, query, documents, top_n, tei, tei and body.get("return_text") is True


async def rerank_endpoint(state, request: Request) -> Response:
    model_name, query, documents, top_n, tei, return_text = _call(
        await read_json(request, state.config.max_body_bytes))
    model = state.registry.get(model_name)
    await model.reserve()   # a rerank takes a slot like any request

    def work() -> Any:
        with model.session() as session:
            llm = model.load()
            if not llm.engine.context.model.rank_outputs:
                raise APIError(501, f"model {model.id!r} is not a reranker: it has no classification head "
                                    f"(cls / cls.output)", type="not_supported_error")
            results, total = rerank(llm.engine, session.assets, query, documents, top_n=top_n,
                                    n_ctx=session.n_ctx, seq=session.seq)
        if not tei:
            return rerank_response(results, total, model_name if model_name is not None else model.id)
        return [{"index": r["index"], "score": r["relevance_score"],
                 **({"text": documents[r["index"]]} if return_text else {})} for r in results]
    try:
        return JSONResponse(await anyio.to_thread.run_sync(work, limiter=state.limiter))
    finally:
        model.release()
