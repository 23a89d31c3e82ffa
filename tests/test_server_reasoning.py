"""Reasoning through ``elelem serve``: ``reasoning_content`` in /v1/chat/completions
(whole and streamed), ``reasoning_format`` and ``chat_template_kwargs`` as llama.cpp's server takes them,
and the Messages and Responses APIs' reasoning options.

The server runs in-process on a tiny random model with Qwen3.5's real chat
template, whose prompt opens ``<think>`` unless ``enable_thinking`` is false;
a grammar makes the model write a given text.
"""
from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from elelem.server import ServerConfig  # noqa: E402
from format_models import write_format_model  # noqa: E402
from test_server import InProcessServer  # noqa: E402

KEY = "reasoning-key-0123456789"
HI = [{"role": "user", "content": "What is the capital of France?"}]
THOUGHT = "root ::= " + json.dumps("The capital.\n</think>\n\nParis.")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = write_format_model(tmp_path_factory.mktemp("qwen35") / "qwen35.gguf", "qwen3_coder")
    server = InProcessServer(ServerConfig(models=[str(model.path)], api_key=KEY, parallel=2, n_ctx=1024,
                                          keep_alive=None, n_threads=1))
    yield server, model
    server.stop()


def post(server, path, body, **headers):
    return httpx.post(server.url + path, json=body, headers={"authorization": f"Bearer {KEY}", **headers},
                      timeout=120)


def sse(response) -> list:
    events = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events


def test_reasoning_content_whole(served):
    server, _ = served
    answer = post(server, "/v1/chat/completions", {"messages": HI, "grammar": THOUGHT, "max_tokens": 60,
                                                   "temperature": 0})
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital."}


def test_reasoning_content_streamed(served):
    server, _ = served
    answer = post(server, "/v1/chat/completions", {"messages": HI, "grammar": THOUGHT, "max_tokens": 60,
                                                   "temperature": 0, "stream": True})
    deltas = [e["choices"][0]["delta"] for e in sse(answer) if e.get("choices")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The capital."
    assert "".join(d.get("content", "") for d in deltas) == "Paris."
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert not any(d.get("reasoning_content") for d in deltas[first_content:])


def test_reasoning_format_none_and_chat_template_kwargs(served):
    server, _ = served
    raw = post(server, "/v1/chat/completions", {"messages": HI, "grammar": THOUGHT, "max_tokens": 60,
                                                "temperature": 0, "reasoning_format": "none"})
    assert raw.json()["choices"][0]["message"] == {"role": "assistant", "content": "The capital.\n</think>\n\nParis."}
    plain = post(server, "/v1/chat/completions", {"messages": HI, "grammar": "root ::= \"Paris.\"", "max_tokens": 20,
                                                  "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}})
    assert plain.json()["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}
    for body, param in (({"reasoning_format": "hidden"}, "reasoning_format"),
                        ({"reasoning_format": 3}, "reasoning_format"),
                        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
                        ({"chat_template_kwargs": {"messages": []}}, None),
                        ({"tool_call_format": "nope"}, "tool_call_format")):
        refused = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 4, **body})
        assert refused.status_code == 400, (body, refused.text)
        if param is not None:
            assert refused.json()["error"]["param"] == param


def test_anthropic_thinking_switches_the_templates_thinking(served):
    server, model = served
    # The random model writes "a"s: inside the block the prompt opened (thinking on), they are reasoning.
    steer = {"logit_bias": {str(model.ids["a"]): 30.0}, "max_tokens": 6, "temperature": 0}
    on = post(server, "/v1/messages", {"messages": HI, "thinking": {"type": "enabled", "budget_tokens": 1024},
                                       **steer}, **{"anthropic-version": "2023-06-01"})
    assert on.status_code == 200, on.text
    assert [b["type"] for b in on.json()["content"]] == ["thinking"]
    assert on.json()["content"][0]["thinking"] == "aaaaaa"
    off = post(server, "/v1/messages", {"messages": HI, "thinking": {"type": "disabled"}, **steer})
    assert [b["type"] for b in off.json()["content"]] == ["text"] and off.json()["content"][0]["text"] == "aaaaaa"
    streamed = post(server, "/v1/messages", {"messages": HI, "thinking": {"type": "enabled", "budget_tokens": 1024},
                                             "stream": True, **steer})
    kinds = [e["delta"]["type"] for e in sse(streamed) if e.get("type") == "content_block_delta"]
    assert kinds and set(kinds) == {"thinking_delta"}


def test_responses_reasoning_items(served):
    server, model = served
    answer = post(server, "/v1/responses", {"input": "What is the capital of France?", "max_output_tokens": 6,
                                            "reasoning": {"effort": "low"}, "temperature": 0,
                                            "logit_bias": {str(model.ids["a"]): 30.0}})
    assert answer.status_code == 200, answer.text
    output = answer.json()["output"]
    assert output[0]["type"] == "reasoning" and output[0]["content"][0]["text"] == "aaaaaa"
