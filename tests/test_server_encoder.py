"""``elelem serve`` with a BERT-family encoder: ``/v1/embeddings`` gives
llama.cpp's pooled, normalized vectors; the text routes answer 400 in
OpenAI's error shape, and the server keeps serving."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from elelem.server import ServerConfig  # noqa: E402
from synthetic_bert import write_bert  # noqa: E402
from test_server import InProcessServer, error_of, post  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "support" / "fixtures"))
from make_bert_fixtures import CONFIGS, TEXTS  # noqa: E402

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def encoder_server(tmp_path_factory):
    models = tmp_path_factory.mktemp("bert_server")
    for name, cfg in CONFIGS.items():  # all of them: llama.cpp's reference run reads every one
        write_bert(models / f"{name}.gguf", cfg)
    running = InProcessServer(ServerConfig(models=[str(models / "bert.gguf")], parallel=2, n_ctx=128,
                                           keep_alive=None, n_threads=1))
    yield running, models
    running.stop()


def test_embeddings_are_llamacpps_and_text_routes_are_400(encoder_server, llamacpp):
    server, models = encoder_server
    ref = llamacpp.bert_embeddings(models, list(CONFIGS))["configs"]["bert"]
    response = post(server, "/v1/embeddings", {"input": TEXTS})
    assert response.status_code == 200, response.text
    vectors = np.array([d["embedding"] for d in response.json()["data"]])
    np.testing.assert_allclose(vectors, np.array(ref["pooled_normalized"]), atol=5e-5, rtol=0)
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "the cat"})):
        error = error_of(post(server, path, body), 400)
        assert error["type"] == "invalid_request_error" and "encoder" in error["message"]
    assert post(server, "/v1/embeddings", {"input": "the cat"}).status_code == 200   # still serving
