"""Each protocol package refuses a malformed body in its own error shape, through the app's routes.

No model is loaded: a body is checked, and the key, before the request's
model is looked up, so the app runs here over a registry that is never
used (and without its lifespan, which would load the default model).
"""
from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")  # starlette's TestClient

from starlette.testclient import TestClient  # noqa: E402

from elelem.server import ServerConfig, create_app  # noqa: E402
from elelem.server.anthropic.errors import ANTHROPIC  # noqa: E402
from elelem.server.errors import APIError  # noqa: E402
from elelem.server.fields import BOOLEAN, OPENAI, STRING, Field, Spec  # noqa: E402

KEY = "protocols-key-0123456789"
HI = [{"role": "user", "content": "Hi"}]
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


class UnusedRegistry:
    def __getattr__(self, name):
        raise AssertionError(f"a malformed request reached the models ({name})")


@pytest.fixture(scope="module")
def client():
    app = create_app(ServerConfig(models=["unused.gguf"], api_key=KEY), registry=UnusedRegistry())
    return TestClient(app, raise_server_exceptions=False)


def post(client, path, body, headers=None):
    headers = {"Authorization": f"Bearer {KEY}"} if headers is None else headers
    if isinstance(body, bytes):
        return client.post(path, content=body, headers={**headers, "content-type": "application/json"})
    return client.post(path, json=body, headers=headers)


def openai_error(response, status: int, param):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == OPENAI_ERROR_KEYS
    assert body["error"]["param"] == param and body["error"]["message"]
    return body["error"]


def anthropic_error(response, status: int, kind: str):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    return body["error"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "temprature": 0}, "temprature"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
    ("/v1/completions", {"prompt": "x", "echo": "yes"}, "echo"),
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", b"[1]", None),
])
def test_chat_completions_refuse_in_openais_shape(client, path, body, param):
    error = openai_error(post(client, path, body), 400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),   # chat's check, in the Responses API's names
    ({"input": "hi", "bogus": 1}, "bogus"),
    ({"input": []}, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    (b"{not json", None),
])
def test_responses_refuse_in_openais_shape_with_its_own_names(client, body, param):
    error = openai_error(post(client, "/v1/responses", body), 400, param)
    assert "max_tokens" not in error["message"].replace("max_output_tokens", "")


@pytest.mark.parametrize("body, starts", [
    ({"messages": HI}, "max_tokens: Field required"),
    ({"max_tokens": 8, "messages": HI, "bogus": 1}, "bogus: Extra inputs are not permitted"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text: Field required"),
    ({"max_tokens": 8, "messages": HI, "tools": [{"name": "f"}]}, "tools.0.input_schema: Field required"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),                     # chat's check, in Anthropic's shape
    (b"{not json", "the body is not valid JSON"),
])
def test_messages_refuse_in_anthropics_shape(client, body, starts):
    error = anthropic_error(post(client, "/v1/messages", body, headers={"x-api-key": KEY}), 400,
                            "invalid_request_error")
    assert error["message"].startswith(starts)


def test_a_missing_key_is_a_401_in_each_protocols_shape(client):
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"):
        assert openai_error(post(client, path, {}, headers={}), 401, None)["code"] == "invalid_api_key"
    # x-api-key is Anthropic's header: the Messages API takes it, the OpenAI routes do not.
    assert openai_error(post(client, "/v1/chat/completions", {}, headers={"x-api-key": KEY}), 401, None)
    anthropic_error(post(client, "/v1/messages", {}, headers={}), 401, "authentication_error")
    anthropic_error(post(client, "/v1/messages", {}, headers={"x-api-key": "wrong"}), 401, "authentication_error")
    # Past the key, on either header, the body is what is refused.
    anthropic_error(post(client, "/v1/messages", {}), 400, "invalid_request_error")


def test_a_spec_refuses_in_each_style():
    spec = Spec({"name": Field(STRING, required=True), "stream": Field(BOOLEAN)}, ignored=frozenset({"metadata"}))
    assert spec.check({"name": "x", "metadata": 1}) == {"name": "x", "metadata": 1}
    assert spec.check({"name": "x", "stream": None}, ANTHROPIC)   # null is absent
    for body, openai, anthropic in [
            ({}, "name is required, as a string", "name: Field required, as a string"),
            ({"name": 1}, "name must be a string", "name: Field required, as a string"),
            ({"name": "x", "stream": "yes"}, "stream must be a boolean", "stream: must be a boolean"),
            ({"name": "x", "nmae": "y"}, "unknown field 'nmae'",
             "nmae: Extra inputs are not permitted (this server does not support it)")]:
        for style, message in ((OPENAI, openai), (ANTHROPIC, anthropic)):
            with pytest.raises(APIError) as caught:
                spec.check(body, style)
            assert caught.value.status == 400 and caught.value.message == message
    with pytest.raises(APIError) as caught:
        spec.check({"name": "x", "nmae": "y"}, ANTHROPIC, "tools.0")
    assert caught.value.param == "tools.0.nmae" and caught.value.message == \
        "tools.0.nmae: Extra inputs are not permitted"
    with pytest.raises(APIError) as caught:
        spec.check([], OPENAI, "tools[0]")
    assert caught.value.param == "tools[0]"


def test_the_shared_tool_translation_keeps_each_protocols_reading():
    from elelem.server.anthropic import messages_request
    from elelem.server.responses import responses_request
    config = ServerConfig(models=["unused.gguf"])
    anthropic = messages_request({"max_tokens": 8, "messages": HI, "tool_choice": {"type": "auto",
                                  "disable_parallel_tool_use": 1},
                                  "tools": [{"name": "f", "input_schema": {}, "description": ""}]}, config).call
    assert anthropic.tools == [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert anthropic.options["parallel_tool_calls"] is False   # 0 and 1 are switches' values too
    responses = responses_request({"input": "hi", "parallel_tool_calls": 1, "tools": [
        {"type": "function", "name": "f", "description": "", "strict": True}]}, config, None).call
    assert responses.tools == [{"type": "function", "function": {"name": "f", "description": "", "strict": True}}]
    assert responses.options["parallel_tool_calls"] == 1
