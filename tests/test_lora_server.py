"""LoRA adapters in the server, as llama-server has them: ``GET``/``POST
/lora-adapters`` (the scales requests run at, hot-swapped) and a request's
own ``lora`` field, each answer the library's at those scales; bad scales are
400s.  SmolLM2 with two adapters written as convert_lora_to_gguf.py writes
them (tests/support/synthetic_lora.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")  # starlette's TestClient

from starlette.testclient import TestClient  # noqa: E402

import elelem  # noqa: E402
from elelem.server import ServerConfig, create_app  # noqa: E402
from synthetic_lora import weight_shapes, write_lora  # noqa: E402

KEY = "lora-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "Name three colors."}]
pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def adapters(smollm_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_server")
    shapes = weight_shapes(smollm_path)
    paths = []
    for i, targets in enumerate([["blk.0.attn_q.weight", "blk.5.ffn_down.weight", "blk.10.ffn_up.weight"],
                                 ["blk.2.attn_v.weight", "blk.20.attn_output.weight"]]):
        paths.append(tmp / f"adapter{i}.gguf")
        write_lora(paths[-1], "llama", {n: shapes[n] for n in targets}, rank=8, alpha=16.0, seed=10 + i,
                   name=f"adapter{i}")
    return paths


@pytest.fixture(scope="module")
def library(smollm_path, adapters):
    """The library's answers at some scales: scales -> text."""
    with elelem.LLM(smollm_path, lora=[(a, 0.0) for a in adapters], n_ctx=512, n_threads=2) as llm:
        return {scales: llm.chat(MESSAGES, max_tokens=12, temperature=0, lora=list(scales))
                for scales in [(0.0, 0.0), (2.0, 0.0), (1.0, 1.5)]}


@pytest.fixture(scope="module")
def client(smollm_path, adapters):
    config = ServerConfig(models=[str(smollm_path)], api_key=KEY, n_ctx=512, n_threads=2,
                          llm_options={"lora": [(str(a), 0.0) for a in adapters]})
    with TestClient(create_app(config), raise_server_exceptions=False) as c:
        yield c


def chat(client, **extra) -> str:
    r = client.post("/v1/chat/completions", headers=AUTH,
                    json={"messages": MESSAGES, "max_tokens": 12, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_adapters_are_listed_and_their_scales_hot_swapped(client, adapters, library):
    r = client.get("/lora-adapters", headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == [{"id": i, "path": str(a), "scale": 0.0, "task_name": "", "prompt_prefix": ""}
                        for i, a in enumerate(adapters)]
    assert chat(client) == library[(0.0, 0.0)]
    assert library[(2.0, 0.0)] != library[(0.0, 0.0)]      # the adapter changes the answer
    r = client.post("/lora-adapters", headers=AUTH, json=[{"id": 0, "scale": 2.0}])
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    assert [a["scale"] for a in client.get("/lora-adapters", headers=AUTH).json()] == [2.0, 0.0]
    assert chat(client) == library[(2.0, 0.0)]
    # A request's own scales win, for it alone (adapters it does not name: 0).
    assert chat(client, lora=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.5}]) == library[(1.0, 1.5)]
    assert chat(client, lora=[]) == library[(2.0, 0.0)]       # an empty list: the server's, as llama-server
    assert chat(client) == library[(2.0, 0.0)]
    client.post("/lora-adapters", headers=AUTH, json=[])    # every adapter off again
    assert chat(client) == library[(0.0, 0.0)]


@pytest.mark.parametrize("body, words", [
    ({"a": 1}, 'the body must be a list of {"id": integer, "scale": number}'),
    ([{"id": "0", "scale": 1}], "the body must be a list"),
    ([{"id": 2, "scale": 1}], "no LoRA adapter has id 2 (ids 0..1)"),
])
def test_bad_scales_are_400s(client, body, words):
    r = client.post("/lora-adapters", headers=AUTH, json=body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("lora, words", [
    ({"id": 0}, 'lora must be a list of {"id": integer, "scale": number}'),
    ([{"id": 0, "scale": "high"}], "lora must be a list"),
    ([{"id": 5, "scale": 1.0}], "no LoRA adapter has id 5"),
])
def test_a_bad_lora_field_is_a_400(client, lora, words):
    r = client.post("/v1/chat/completions", headers=AUTH, json={"messages": MESSAGES, "max_tokens": 2, "lora": lora})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_the_endpoints_need_the_key(client):
    assert client.get("/lora-adapters").status_code == 401
    assert client.post("/lora-adapters", json=[]).status_code == 401
