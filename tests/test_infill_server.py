"""``POST /infill`` as llama-server answers it: its fields, its prompt, its response, stream and error shapes.

The malformed bodies are refused before any model is looked up (a registry
that must not be used); the rest runs Qwen2.5-Coder in the app, whose prompt
ids must be llama.cpp's for the same request (the reference of
tests/test_infill.py, at llama-server's defaults: a 4096-token slot, -b 2048,
-n -1).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")  # starlette's TestClient

from starlette.testclient import TestClient  # noqa: E402

from elelem.server import ServerConfig, create_app  # noqa: E402

import infill_cases  # noqa: E402
from infill_reference import llamacpp_infill  # noqa: E402

KEY = "infill-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
LLAMA_ERROR_KEYS = {"code", "message", "type"}
BODY = {"input_prefix": infill_cases.PREFIX, "input_suffix": infill_cases.SUFFIX,
        "input_extra": [infill_cases.UTILS, infill_cases.README], "prompt": "math.pi * "}


class UnusedRegistry:
    def __getattr__(self, name):
        raise AssertionError(f"a malformed request reached the models ({name})")


def llama_error(response, status: int, words: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == LLAMA_ERROR_KEYS, body
    assert body["error"]["code"] == status and words in body["error"]["message"], body
    return body["error"]


@pytest.fixture(scope="module")
def unused():
    app = create_app(ServerConfig(models=["unused.gguf"], api_key=KEY), registry=UnusedRegistry())
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("body, words", [
    ({"input_suffix": ""}, '"input_prefix" is required'),
    ({"input_prefix": ""}, '"input_suffix" is required'),
    ({"input_prefix": 3, "input_suffix": ""}, '"input_prefix" is required, as input_prefix must be a string'),
    ({**BODY, "input_extra": {"text": "x"}}, '"input_extra" must be an array of {"filename": string, "text": string}'),
    ({**BODY, "input_extra": [{"filename": "a.py"}]}, 'input_extra[0] must contain a "text" field'),
    ({**BODY, "input_extra": [{"text": "x", "filename": 1}]}, '"filename" field must be a string'),
    ({**BODY, "prompt": ["x"]}, '"prompt" must be a string'),
    ({**BODY, "n_predict": -2}, "n_predict must be -1 (no limit) or more"),
    ({**BODY, "mirostat": 2}, "mirostat is not supported"),
    ({**BODY, "top_n_sigma": "1"}, "top_n_sigma must be a number"),
    ({**BODY, "n_cmpl": 2}, "n_cmpl must be 1"),
    ({**BODY, "n_probs": 3}, "n_probs is not supported"),
    ({**BODY, "stream": "yes"}, "stream must be a boolean"),
])
def test_malformed_bodies_are_a_400_in_llama_servers_shape(unused, body, words):
    error = llama_error(unused.post("/infill", json=body, headers=AUTH), 400, words)
    assert error["type"] == "invalid_request_error"


def test_not_json_and_a_missing_key_in_llama_servers_shape(unused):
    llama_error(unused.post("/infill", content=b"{", headers={**AUTH, "content-type": "application/json"}), 400,
                "not valid JSON")
    error = llama_error(unused.post("/infill", json=BODY), 401, "API key")
    assert error["type"] == "authentication_error"


# ------------------------------------------------------------------ on Qwen2.5-Coder

@pytest.fixture(scope="module")
def qwen_app(qwen_path):
    config = ServerConfig(models=[str(qwen_path)], api_key=KEY, parallel=1, n_ctx=infill_cases.SETTINGS["n_ctx"],
                          keep_alive=None, n_threads=2)
    with TestClient(create_app(config), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def llamacpp_ids(qwen_path) -> dict:
    return llamacpp_infill(qwen_path)["cases"]


def _llm(client):
    return client.app.state.server.registry.default.llm


@pytest.mark.real_model
def test_the_served_prompt_is_llamacpps_and_the_answer_llama_servers(qwen_app, llamacpp_ids):
    ids = llamacpp_ids["extra"]
    response = qwen_app.post("/infill", json={**BODY, "n_predict": 4, "temperature": 0}, headers=AUTH)
    assert response.status_code == 200, response.text
    answer = response.json()
    llm = _llm(qwen_app)
    assert answer["tokens_evaluated"] == len(ids)
    assert answer["prompt"] == llm.detokenize(ids, special=True).decode()
    assert answer["content"] == llm.generate(ids, max_tokens=4, temperature=0)
    assert answer["stop"] is True and answer["stop_type"] == "limit" and answer["tokens_predicted"] == 4
    assert answer["generation_settings"]["n_predict"] == 4 and answer["generation_settings"]["temperature"] == 0
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"} <= set(answer["timings"])
    assert answer["model"] == client_model_id(qwen_app)


def client_model_id(client) -> str:
    return client.app.state.server.registry.default.id


@pytest.mark.real_model
def test_a_stream_is_llama_servers_events_then_the_final_object(qwen_app):
    body = {**BODY, "n_predict": 6, "temperature": 0}
    whole = qwen_app.post("/infill", json=body, headers=AUTH).json()
    with qwen_app.stream("POST", "/infill", json={**body, "stream": True}, headers=AUTH) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        raw = "".join(response.iter_text())
    assert "[DONE]" not in raw
    events = [json.loads(line[len("data: "):]) for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events and all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events[:-1]) == whole["content"] and events[-1]["content"] == ""
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"]


@pytest.mark.real_model
def test_completion_options_and_response_fields(qwen_app):
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "n_predict": 8, "temperature": 0, "stop": ["\n"], "cache_prompt": True, "id_slot": 0, "n_indent": 4,
            "samplers": ["top_k", "top_p", "infill"], "t_max_predict_ms": 500,
            "response_fields": ["content", "timings/prompt_n", "stop_type", "absent/field"]}
    answer = qwen_app.post("/infill", json=body, headers=AUTH).json()
    assert set(answer) == {"content", "timings/prompt_n", "stop_type"} and answer["content"] == "a + b"
    assert answer["stop_type"] == "eos"
    # A text logit_bias bans each of its tokens, as llama.cpp's: "a" is never the first token now.
    banned = qwen_app.post("/infill", json={**body, "logit_bias": [["a", False]]}, headers=AUTH).json()
    assert not banned["content"].startswith("a")


@pytest.mark.real_model
def test_a_model_without_fim_tokens_is_a_400_naming_it(smollm_path):
    config = ServerConfig(models=[str(smollm_path)], api_key=KEY, parallel=1, n_ctx=256, keep_alive=None,
                          n_threads=1)
    with TestClient(create_app(config), raise_server_exceptions=False) as client:
        llama_error(client.post("/infill", json={"input_prefix": "x", "input_suffix": ""}, headers=AUTH), 400,
                    "Infill is not supported by this model: prefix token is missing.")


def test_n_indent_ends_the_text_at_the_first_line_indented_less():
    from elelem.server.infill.wire import LineLimits
    # The first line (the cursor's) is never checked; a blank line has no indentation either.
    assert LineLimits(4).whole("a + b\n    c\nd = 1\n") == len("a + b\n    c\n")
    assert LineLimits(4).whole("a + b\n\n    c") == len("a + b\n")
    # A tab counts as one character of indentation, as in llama.cpp.
    assert LineLimits(4).whole("x\n    y\n\t\t\t\tz") is None and LineLimits(4).whole("x\n\tz") == 3
    assert LineLimits(0).whole("x\ny") is None
    # Fed token by token, a line is checked one piece late, as llama.cpp checks it.
    limits = LineLimits(4)
    assert [limits.feed(p) for p in ["x\n", "    y\n", "z", "w"]] == [False, False, False, True]
    assert limits.cut == len("x\n    y\n")


@pytest.mark.real_model
def test_n_indent_cuts_the_answer_and_stops_the_stream(qwen_app):
    from elelem.server.infill.wire import LineLimits
    body = {"input_prefix": "class Point:\n    def __init__(self, x, y):\n        ", "input_suffix": "",
            "n_predict": 48, "temperature": 0}
    free = qwen_app.post("/infill", json=body, headers=AUTH).json()["content"]
    cut = LineLimits(8).whole(free)
    assert cut is not None, free  # the model leaves the method within 48 tokens
    limited = qwen_app.post("/infill", json={**body, "n_indent": 8}, headers=AUTH).json()
    assert limited["content"] == free[:cut] and limited["stop_type"] == "limit"
    with qwen_app.stream("POST", "/infill", json={**body, "n_indent": 8, "stream": True}, headers=AUTH) as response:
        raw = "".join(response.iter_text())
    events = [json.loads(line[len("data: "):]) for line in raw.split("\n\n") if line.startswith("data: ")]
    streamed = "".join(e["content"] for e in events)
    assert streamed.startswith(free[:cut]) and len(streamed) < len(free)
    assert events[-1]["stop"] is True and events[-1]["stop_type"] == "limit"
