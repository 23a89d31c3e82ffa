"""``elelem serve``'s ``/v1/rerank`` (and ``/rerank``, ``/v1/reranking``, ``/reranking``), as llama-server answers it.

One server with two synthetic models in its pool: a bge-reranker-shaped
cross-encoder (tests/support/synthetic_rerank.py) and a BERT embedder
without a classification head.  The scores are the library's (checked
against llama.cpp in tests/test_rerank.py); here: Jina's and TEI's request
and response shapes, ``top_n``, the model the body names, and llama-server's
errors (400, 404, 501) in its shape, the server serving on after each.
"""
from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import elelem  # noqa: E402
from elelem.server import ServerConfig  # noqa: E402
from synthetic_bert import BertConfig, write_bert  # noqa: E402
from synthetic_rerank import BgeConfig, write_bge  # noqa: E402
from test_server import InProcessServer, post  # noqa: E402

QUERY = "the cat sat"
DOCUMENTS = ["the cat sat on the mat.", "import numpy as np", "a dog , a kitten !", "hello world"]


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory):
    models = tmp_path_factory.mktemp("rerank_server")
    write_bge(models / "bge.gguf", BgeConfig())
    write_bert(models / "embedder.gguf", BertConfig())
    running = InProcessServer(ServerConfig(models=[str(models / "bge.gguf"), str(models / "embedder.gguf")],
                                           parallel=2, n_ctx=128, keep_alive=None, n_threads=1))
    with elelem.LLM(models / "bge.gguf", n_ctx=128, n_threads=1) as llm:
        expected = llm.rerank(QUERY, DOCUMENTS)
    yield running, expected
    running.stop()


def _llama_error(response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "type"} and error["code"] == status and error["type"] == kind
    return error["message"]


def test_jina_shape_with_top_n(rerank_server):
    server, expected = rerank_server
    body = {"model": "bge", "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    response = post(server, "/v1/rerank", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"model", "object", "usage", "results"}
    assert answer["model"] == "bge" and answer["object"] == "list"
    assert answer["results"] == expected[:3]
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 4 * 3   # every document counted
    scores = [r["relevance_score"] for r in answer["results"]]
    assert scores == sorted(scores, reverse=True)
    for path in ("/rerank", "/v1/reranking", "/reranking"):   # llama-server's other routes
        again = post(server, path, {k: v for k, v in body.items() if k != "top_n"})
        assert again.status_code == 200 and again.json()["results"] == expected


def test_tei_shape_with_return_text(rerank_server):
    server, expected = rerank_server
    response = post(server, "/rerank", {"model": "bge", "query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert response.status_code == 200, response.text
    assert response.json() == [{"index": r["index"], "score": r["relevance_score"], "text": DOCUMENTS[r["index"]]}
                               for r in expected]
    bare = post(server, "/rerank", {"model": "bge", "query": QUERY, "texts": DOCUMENTS, "top_n": 1}).json()
    assert bare == [{"index": expected[0]["index"], "score": expected[0]["relevance_score"]}]


def test_errors_are_llama_servers(rerank_server):
    server, expected = rerank_server
    for body, needle in [({"model": "bge", "documents": DOCUMENTS}, '"query" must be provided'),
                         ({"model": "bge", "query": 3, "documents": DOCUMENTS}, '"query" must be a string'),
                         ({"model": "bge", "query": QUERY, "documents": []}, '"documents" must be'),
                         ({"model": "bge", "query": QUERY, "documents": ["a", 2]}, '"documents" must be'),
                         ({"model": "bge", "query": QUERY}, '"documents" must be'),
                         ({"model": "bge", "query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n"),
                         ([QUERY], "JSON object")]:
        assert needle in _llama_error(post(server, "/v1/rerank", body), 400, "invalid_request_error")
    assert "does not exist" in _llama_error(
        post(server, "/v1/rerank", {"model": "nope", "query": QUERY, "documents": DOCUMENTS}), 404, "not_found_error")
    assert "not a reranker" in _llama_error(
        post(server, "/v1/rerank", {"model": "embedder", "query": QUERY, "documents": DOCUMENTS}),
        501, "not_supported_error")
    assert post(server, "/v1/embeddings", {"model": "embedder", "input": "the cat"}).status_code == 200
    ok = post(server, "/v1/rerank", {"model": "bge", "query": QUERY, "documents": DOCUMENTS})
    assert ok.status_code == 200 and ok.json()["results"] == expected   # still serving
