"""``POST /v1/messages``, Anthropic's Messages API: the real ``anthropic`` client against
``elelem serve``, and the request and wire translations on their own.

The server runs in-process on SmolLM2-135M (as in test_server.py); the
translation tests need no model.
"""
from __future__ import annotations

import json

import pytest

anthropic = pytest.importorskip("anthropic")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pydantic = pytest.importorskip("pydantic")

from elelem.server import ServerConfig  # noqa: E402
from elelem.server.errors import APIError  # noqa: E402
from elelem.server.anthropic import (MAX_STOP_SEQUENCES, MessagesWire, error_body, messages_request,  # noqa: E402
                                     tool_use_id)
from elelem.server.tools import arguments_object as tool_input  # noqa: E402
from test_server import InProcessServer, cells_used, idle, no_end, wait_until  # noqa: E402

KEY = "messages-key-0123456789"
CONFIG = ServerConfig(models=["unused.gguf"], max_messages=16)
WEATHER = [{"name": "get_weather", "description": "The weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
HI = [{"role": "user", "content": "Say hello to Ada in one sentence."}]
GREEDY = {"temperature": 0}  # the client has no temperature argument: it goes in extra_body


def request(**body):
    return messages_request({"max_tokens": 16, "messages": HI, **body}, CONFIG)


def refused(body) -> APIError:
    with pytest.raises(APIError) as caught:
        messages_request(body, CONFIG)
    assert caught.value.status == 400
    return caught.value


# -- the request, translated to a chat call ------------------------------------------

def test_system_blocks_and_tool_turns_become_chat_messages():
    call = request(system=[{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}},
                           {"type": "text", "text": "Answer in English."}],
                   messages=[
                       {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                       {"role": "assistant", "content": [
                           {"type": "thinking", "thinking": "A tool knows.", "signature": "sig"},
                           {"type": "text", "text": "Let me check."},
                           {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                       {"role": "user", "content": [
                           {"type": "text", "text": "And be quick."},
                           {"type": "tool_result", "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "21 C"}]},
                           {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city",
                            "is_error": True}]},
                   ]).call
    assert call.chat and call.messages == [
        {"role": "system", "content": "Be terse.\n\nAnswer in English."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "A tool knows.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny\n\n21 C"},   # results first,
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
        {"role": "user", "content": "And be quick."},                             # then the user's text
    ]


def test_an_assistant_turn_of_calls_only_has_empty_content():
    call = request(messages=[HI[0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]).call
    assert call.messages[1]["content"] == "" and len(call.messages[1]["tool_calls"]) == 1
    assert call.messages[2:] == [{"role": "tool", "tool_call_id": "t", "content": ""}]  # no empty user turn


def test_tools_tool_choice_and_sampling_map_to_chat_options():
    call = request(tools=WEATHER, tool_choice={"type": "tool", "name": "get_weather"},
                   temperature=0.5, top_p=0.9, top_k=40, stream=True).call
    assert call.tools == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER[0]["input_schema"]}}]
    assert call.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert call.stream and not call.include_usage
    assert call.options == {"max_tokens": 16, "temperature": 0.5, "top_p": 0.9, "top_k": 40}
    for choice, chat in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert request(tools=WEATHER, tool_choice={"type": choice}).call.tool_choice == chat
    assert request(tools=WEATHER, tool_choice={"type": "auto", "disable_parallel_tool_use": True}).call.tool_choice \
        == "auto"


def test_stop_sequences_pass_beyond_chats_four():
    stops = [f"s{i}" for i in range(10)]
    assert request(stop_sequences=stops).call.options["stop"] == stops
    assert "stop" not in request(stop_sequences=[]).call.options


def test_thinking_output_format_and_ignored_fields_are_accepted():
    checked = request(thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u"},
                      service_tier="auto", output_config={"effort": "low", "format": {
                          "type": "json_schema", "schema": {"type": "object"}}})
    assert checked.thinking == {"type": "enabled", "budget_tokens": 1024}
    assert checked.call.options["response_format"] == {"type": "json_schema",
                                                       "json_schema": {"name": "output", "schema": {"type": "object"}}}
    assert request(thinking={"type": "disabled"}).thinking == {"type": "disabled"}


@pytest.mark.parametrize("body, param", [
    ({"messages": HI}, "max_tokens"),                                           # required, as in Anthropic's API
    ({"max_tokens": 8, "messages": HI, "bogus": 1}, "bogus"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages.0"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "x", "name": "n"}]}, "messages.0.name"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": ["hi"]}]}, "messages.0.content.0"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages.0.content.0"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "txt", "text": "x"}]}]},
     "messages.0.content.0.type"),                                              # an unknown block type
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages.0.content.0.source"),                                            # an image with no data
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages.0.content.0.text"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
     "messages.0.content.0.extra"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "messages.0.content.0"),   # a user's call
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t"}]}]}, "messages.0.content.0"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "thinking", "thinking": "x", "signature": ""}]}]}, "messages.0.content.0"),
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]}, "messages.0.content.0.input"),
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "", "name": "f", "input": {}}]}]}, "messages.0.content.0"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]},
     "messages.0.content.0.content.0.type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]}, "messages.0.content.0.is_error"),
    ({"max_tokens": 8, "messages": HI, "system": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
     "system.0"),
    ({"max_tokens": 8, "messages": HI, "system": 3}, "system"),
    ({"max_tokens": 8, "messages": HI, "tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"max_tokens": 8, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools.0.type"),
    ({"max_tokens": 8, "messages": HI, "tools": WEATHER, "tool_choice": "auto"}, "tool_choice"),
    ({"max_tokens": 8, "messages": HI, "tools": WEATHER, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"max_tokens": 8, "messages": HI, "stop_sequences": "END"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": HI, "stop_sequences": ["x"] * (MAX_STOP_SEQUENCES + 1)}, "stop_sequences"),
    ({"max_tokens": 8, "messages": HI, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"max_tokens": 8, "messages": HI, "output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),                           # schema.py's own checks hold
    ({"max_tokens": 8, "messages": HI * 17}, "messages"),                      # and so do the server's limits
    ({"max_tokens": 8, "messages": HI, "stream": "yes"}, "stream"),
])
def test_malformed_requests_are_400s_naming_the_field(body, param):
    error = refused(body)
    assert error.param == param
    status, shape = error_body(error)
    assert status == 400 and shape["type"] == "error" and shape["error"]["type"] == "invalid_request_error"
    assert shape["error"]["message"].startswith(param)


def test_errors_take_anthropics_types_and_statuses():
    cases = [(APIError(400, "bad"), 400, "invalid_request_error"), (APIError(401, "key"), 401, "authentication_error"),
             (APIError(404, "model"), 404, "not_found_error"), (APIError(413, "big"), 413, "request_too_large"),
             (APIError(503, "full", type="server_overloaded", retry_after=1), 529, "overloaded_error"),
             (APIError(500, "boom", type="server_error"), 500, "api_error")]
    for error, status, kind in cases:
        got_status, body = error_body(error)
        assert (got_status, body["error"]["type"]) == (status, kind)
        assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}
    response = MessagesWire("m").error_response(APIError(503, "full", retry_after=2))
    assert response.status_code == 529 and response.headers["retry-after"] == "2"
    event = MessagesWire("m").error_event(APIError(503, "stopping"))
    assert event.startswith(b"event: error\ndata: ") and \
        json.loads(event.split(b"data: ")[1]) == {"type": "error", "error": {"type": "overloaded_error",
                                                                             "message": "stopping"}}


# -- the answer, from hand-made chat dicts and chunks ----------------------------------

def chunk(delta, finish=None):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def parse_events(raw: list[bytes]) -> list[dict]:
    events = []
    for event in raw:
        head, data = event.decode().rstrip("\n").split("\n")
        assert head.startswith("event: ") and data.startswith("data: ")
        events.append(json.loads(data[len("data: "):]))
        assert events[-1]["type"] == head[len("event: "):]
    return events


def test_a_whole_answer_is_a_message_with_thinking_text_and_tool_use_blocks():
    response = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
        "tool_calls": [{"id": "call_abc", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}}]}
    message = MessagesWire("m").whole(response, {"prompt_tokens": 12, "completion_tokens": 5})
    assert message["id"].startswith("msg_") and message["model"] == "m"
    assert message["content"] == [
        {"type": "thinking", "thinking": "Use the tool.", "signature": ""},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)
    assert message["usage"] == {"input_tokens": 12, "output_tokens": 5, "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 0}
    anthropic.types.Message.model_validate(message)  # every field as the client reads it
    plain = {"choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "Hi"}}]}
    message = MessagesWire("m").whole(plain, {"prompt_tokens": 1, "completion_tokens": 1})
    assert message["content"] == [{"type": "text", "text": "Hi"}] and message["stop_reason"] == "max_tokens"


def test_a_stream_opens_a_block_per_kind_and_ends_with_the_stop_reason():
    wire = MessagesWire("m")
    raw = []
    for c in (chunk({"role": "assistant"}), chunk({"reasoning_content": "Hm"}), chunk({"reasoning_content": "m."}),
              chunk({"content": "Let me"}), chunk({"content": " look."}),
              chunk({"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]}),
              chunk({"tool_calls": [{"index": 1, "id": "call_y", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}),
              chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"city": "Rome"}'}}]}),
              chunk({}, "tool_calls")):
        raw += wire.events(c)
    raw += wire.end({"prompt_tokens": 9, "completion_tokens": 30})
    events = parse_events(raw)
    adapter = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert [(e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type"))
            for e in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"), ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    assert events[9]["content_block"] == {"type": "tool_use", "id": "toolu_x", "name": "get_weather", "input": {}}
    assert events[10]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Oslo"}'}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 30 and events[-2]["usage"]["input_tokens"] == 9


def test_a_stream_without_output_still_starts_and_stops_the_message():
    wire = MessagesWire("m")
    assert wire.events(chunk({"role": "assistant"})) == []  # message_start waits for output
    events = parse_events(wire.events(chunk({}, "stop")) + wire.end({"prompt_tokens": 3, "completion_tokens": 0}))
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]
    assert events[1]["delta"]["stop_reason"] == "end_turn"


def test_tool_ids_and_inputs():
    assert tool_use_id("call_123") == "toolu_123" and tool_use_id("abc") == "abc"
    assert tool_input('{"a": 1}') == {"a": 1} and tool_input("") == {} and tool_input({"b": 2}) == {"b": 2}
    assert tool_input("[1]") == {"input": [1]} and tool_input("not json") == {"input": "not json"}


# -- against the server -----------------------------------------------------------------

@pytest.fixture(scope="module")
def server(smollm_path):
    running = InProcessServer(ServerConfig(models=[str(smollm_path)], api_key=KEY, parallel=4, n_ctx=512,
                                           max_body_bytes=64 * 1024, keep_alive=None, n_threads=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model_id(server):
    return server.model.id


def post(server, body, **headers):
    headers.setdefault("x-api-key", KEY)
    return httpx.post(server.url + "/v1/messages", content=body if isinstance(body, bytes) else json.dumps(body),
                      headers=headers, timeout=60)


def anthropic_error(response, status) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"]
    return body["error"]


@pytest.mark.real_model
def test_create_answers_with_a_message(client, model_id):
    message = client.messages.create(model=model_id, max_tokens=12, messages=HI, system="You are terse.",
                                     extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant" and message.model == model_id
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"] and message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 12 and message.usage.input_tokens > 0
    long = client.messages.create(model=model_id, max_tokens=3, messages=HI, extra_body=GREEDY)
    assert long.stop_reason == "max_tokens" and long.usage.output_tokens == 3


@pytest.mark.real_model
def test_the_stream_gives_the_same_message_as_create(client, model_id):
    whole = client.messages.create(model=model_id, max_tokens=16, messages=HI, extra_body=GREEDY)
    with client.messages.stream(model=model_id, max_tokens=16, messages=HI, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "text" in kinds  # the helper's own event, from the text deltas
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # the prefix the first request left is read from the cache, and counted apart from the new input
    assert final.usage.cache_read_input_tokens > 0
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    with client.messages.stream(model=model_id, max_tokens=16, messages=HI, extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == whole.content[0].text


@pytest.mark.real_model
def test_a_tool_use_and_tool_result_round_trip(client, model_id):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Room for SmolLM2's free text before the forced call (sampling/lazy.py's FREE_TOKENS), and the call.
    call = client.messages.create(model=model_id, max_tokens=128, messages=ask, tools=WEATHER,
                                  tool_choice={"type": "tool", "name": "get_weather"})
    assert call.stop_reason == "tool_use"
    use = call.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert isinstance(use.input, dict) and isinstance(use.input.get("city"), str)
    turn = [*ask, {"role": "assistant", "content": call.content},  # the client's own blocks, sent back as they are
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "Sunny and 21 degrees."}]}]
    answer = client.messages.create(model=model_id, max_tokens=24, messages=turn, tools=WEATHER, extra_body=GREEDY)
    assert answer.content and answer.content[0].type == "text" and answer.content[0].text.strip()
    assert answer.stop_reason in ("end_turn", "max_tokens")
    # and streamed: the input arrives as input_json deltas, assembled by the client
    with client.messages.stream(model=model_id, max_tokens=128, messages=ask, tools=WEATHER,
                                tool_choice={"type": "any"}) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas and final.stop_reason == "tool_use"
    assert final.content[-1].type == "tool_use" and isinstance(final.content[-1].input.get("city"), str)


@pytest.mark.real_model
def test_stop_sequences_end_the_text(client, model_id):
    whole = client.messages.create(model=model_id, max_tokens=16, messages=HI, extra_body=GREEDY).content[0].text
    words = whole.split()
    assert len(words) >= 3
    cut = " " + words[2]
    stops = [cut] + [f"never-{i}" for i in range(7)]  # more than Chat Completions' four
    message = client.messages.create(model=model_id, max_tokens=16, messages=HI, stop_sequences=stops,
                                     extra_body=GREEDY)
    assert message.content[0].text == whole[:whole.index(cut)]
    # Which stop sequence matched is not known to the server (see elelem/server/anthropic/wire.py).
    assert message.stop_reason == "end_turn" and message.stop_sequence is None


@pytest.mark.real_model
def test_bad_input_is_anthropics_400(server, client, model_id):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=model_id, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "hologram", "text": "x"}]}])
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "hologram" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=model_id, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "text", "txt": "typo"}]}])
    for body in (b"{not json", b"[1]", {"model": model_id, "messages": HI},
                 {"model": model_id, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
                 {"model": model_id, "max_tokens": 8, "messages": HI, "tools": WEATHER,
                  "tool_choice": {"type": "tool", "name": "nope"}},
                 {"model": model_id, "max_tokens": 600, "messages": HI}):   # past the context
        assert anthropic_error(post(server, body), 400)["type"] == "invalid_request_error"
    assert anthropic_error(post(server, {"model": model_id, "max_tokens": 8,
                                         "messages": [{"role": "user", "content": "x" * 70_000}]}), 413)["type"] \
        == "request_too_large"
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=HI)
    assert caught.value.body["error"]["type"] == "not_found_error"


@pytest.mark.real_model
def test_the_key_is_read_from_x_api_key_or_bearer(server, model_id):
    body = {"model": model_id, "max_tokens": 2, "messages": HI}
    assert post(server, body).status_code == 200
    assert post(server, body, **{"x-api-key": "", "authorization": f"Bearer {KEY}"}).status_code == 200
    for headers in ({"x-api-key": "wrong"}, {"x-api-key": ""}, {"x-api-key": "", "authorization": KEY}):
        assert anthropic_error(post(server, body, **headers), 401)["type"] == "authentication_error"
    by_header = anthropic.Anthropic(base_url=server.url, api_key=None, auth_token=None, max_retries=0,
                                    default_headers={"x-api-key": KEY})
    assert by_header.messages.create(model=model_id, max_tokens=2, messages=HI).content is not None
    wrong = anthropic.Anthropic(base_url=server.url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model=model_id, max_tokens=2, messages=HI)
    assert caught.value.body["error"]["type"] == "authentication_error"


@pytest.mark.real_model
def test_a_client_dropped_mid_stream_frees_its_sequence(server, model_id):
    before = server.state.metrics.requests[("/v1/messages", 499)]
    server.model.close_idle_sessions()  # so any cell still used after the drop would be the dropped request's
    body = {"model": model_id, "max_tokens": 400, "messages": HI, "stream": True,
            "logit_bias": no_end(server)}  # it would run on for long
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": KEY}) as response:
            assert response.status_code == 200
            events = []
            for line in response.iter_lines():
                events += [line[len("event: "):]] if line.startswith("event: ") else []
                if events.count("content_block_delta") == 3:
                    break
            assert events[:2] == ["message_start", "content_block_start"]
            assert cells_used(server) > 0 and server.model.in_flight == 1
    wait_until(lambda: idle(server), seconds=5)
    assert server.model.idle_sessions == 0  # closed, not kept: its cells are freed at once
    assert server.state.metrics.requests[("/v1/messages", 499)] == before + 1


@pytest.mark.real_model
def test_a_stream_the_server_stops_ends_with_an_error_event(server, client, model_id):
    with client.messages.stream(model=model_id, max_tokens=400, messages=HI,
                                extra_body={"logit_bias": no_end(server)}) as stream:
        with pytest.raises(anthropic.APIStatusError) as caught:
            for event in stream:
                if event.type == "content_block_delta":
                    server.state.cancel_all()  # what a shutdown does past its grace period
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "overloaded_error"
    wait_until(lambda: server.model.in_flight == 0, seconds=5)
    # and it serves on
    assert client.messages.create(model=model_id, max_tokens=2, messages=HI).content is not None
