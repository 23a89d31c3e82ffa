"""``POST /v1/responses``, OpenAI's Responses API: the real ``openai`` client against the server,
and the request's translation and the answer's shapes checked without a model.

The shapes are checked against the ``openai`` package's own pydantic models (``Response`` and each stream
event), validated strictly, and streams are fed through the client's own accumulator
(``client.responses.stream``), which refuses an event sequence it cannot follow.
"""
from __future__ import annotations

import json
from typing import get_args

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pydantic = pytest.importorskip("pydantic")

from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402

from elelem.server import ServerConfig  # noqa: E402
from elelem.server.errors import APIError  # noqa: E402
from elelem.server.responses import responses_request  # noqa: E402
from elelem.server.responses.store import ResponseStore  # noqa: E402
from elelem.server.responses.wire import ResponsesWire  # noqa: E402
from test_server import InProcessServer, cells_used, error_of, idle, no_end, wait_until  # noqa: E402

KEY = "test-key-responses"
WEATHER = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_WEATHER = [{"type": "function", "function": {k: v for k, v in WEATHER[0].items() if k != "type"}}]
CONFIG = ServerConfig(models=["unused.gguf"], max_messages=16)
_EVENT_CLASSES = {get_args(cls.model_fields["type"].annotation)[0]: cls
                  for cls in get_args(get_args(ResponseStreamEvent)[0])}


def parse_sse(raw: bytes) -> list[dict]:
    """The events of an SSE body: each ``event:`` name must match its data's ``type``."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        events.append(data)
    return events


def validated(events: list[dict]) -> list:
    """Each event as the ``openai`` package's model of its type, validated strictly; sequence numbers count up."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return [_EVENT_CLASSES[e["type"]].model_validate(e) for e in events]


# -- the request's translation (no model) --------------------------------------------

def test_input_items_become_chat_messages():
    body = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.5, "top_p": 0.9,
            "tools": WEATHER, "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
            "metadata": {"k": "v"}, "user": "u", "store": True, "parallel_tool_calls": False,
            "reasoning": {"effort": "low"}, "include": [], "truncation": "disabled",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                                 {"type": "input_text", "text": "in Paris?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "I should call it."}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Nice"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
                {"type": "function_call_output", "call_id": "call_2",
                 "output": [{"type": "input_text", "text": "25 C"}]},
            ]}
    checked = responses_request(body, CONFIG, ResponseStore())
    call = checked.call
    assert call.chat and call.model == "m" and not call.stream
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}
             for i, args in ((1, '{"city":"Paris"}'), (2, '{"city":"Nice"}'))]
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "I should call it.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25 C"},
    ]
    assert checked.conversation == call.messages[1:]  # the instructions are not stored
    assert call.tools == CHAT_WEATHER
    assert call.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert call.options == {"max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "response_format": {
        "type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True}},
        "chat_template_kwargs": {"reasoning_effort": "low"},  # reasoning.effort, as llama.cpp passes it
        "parallel_tool_calls": False}
    assert checked.echo["text"]["format"]["name"] == "w" and checked.echo["metadata"] == {"k": "v"}
    assert checked.echo["reasoning"]["effort"] == "low" and checked.echo["parallel_tool_calls"] is False


def test_text_formats_and_a_lone_call():
    def options(fmt):
        return responses_request({"input": "x", "text": {"format": fmt}}, CONFIG, None).call.options
    assert "response_format" not in options({"type": "text"})
    assert options({"type": "json_object"})["response_format"] == {"type": "json_object"}
    lone = responses_request({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                        {"type": "function_call_output", "call_id": "c", "output": "ok"}]},
                             CONFIG, None).call.messages
    # "", not None: SmolLM2's template prints every message's content.
    assert lone[0] == {"role": "assistant", "content": "",
                       "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


BAD = [  # (body, the param the 400 names)
    ([1], None),
    ({"input": "x", "bogus": 1}, "bogus"),
    ({"input": "x", "conversation": "c"}, "conversation"),
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": ["hi"]}, "input[0]"),
    ({"input": [{"content": "no role"}]}, "input[0].type"),
    ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "reasoning", "summary": "x"}]}, "input[0].summary"),
    ({"input": "x", "instructions": 5}, "instructions"),
    ({"input": "x", "tools": {"type": "function"}}, "tools"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters"),
    ({"input": "x", "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format"),
    ({"input": "x", "text": {"form": {}}}, "text"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": "9"}, "max_output_tokens"),
    ({"input": "x", "stream": "yes"}, "stream"),
    ({"input": "x", "stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "store": "no"}, "store"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata"),
    ({"input": "x", "reasoning": {"effort": 3}}, "reasoning"),
    ({"input": "x", "model": 5}, "model"),
    ({"input": [{"role": "user", "content": "x"}] * 17}, "input"),  # past max_messages
    ({"input": "x", "previous_response_id": "resp_unknown"}, "previous_response_id"),
]


@pytest.mark.parametrize("body, param", BAD)
def test_bad_requests_are_400s_naming_the_field(body, param):
    with pytest.raises(APIError) as raised:
        responses_request(body, CONFIG, ResponseStore())
    assert raised.value.status == 400 and raised.value.param == param, raised.value.message


def test_previous_response_id_continues_the_stored_conversation_with_new_instructions():
    store = ResponseStore()
    first = responses_request({"input": "My name is Ada.", "instructions": "Old."}, CONFIG, store)
    wire = ResponsesWire("m", first.echo, first.conversation, store)
    body = wire.whole(chat_completion("Hello Ada."), USAGE)
    follow = responses_request({"input": "What is my name?", "instructions": "New.",
                                "previous_response_id": body["id"]}, CONFIG, store)
    assert follow.call.messages == [{"role": "system", "content": "New."},
                                    {"role": "user", "content": "My name is Ada."},
                                    {"role": "assistant", "content": "Hello Ada."},
                                    {"role": "user", "content": "What is my name?"}]
    assert follow.echo["previous_response_id"] == body["id"]
    unstored = ResponsesWire("m", first.echo, first.conversation, None).whole(chat_completion("Hi."), USAGE)
    assert unstored["store"] is False
    with pytest.raises(APIError) as raised:
        responses_request({"input": "x", "previous_response_id": unstored["id"]}, CONFIG, store)
    assert raised.value.code == "previous_response_not_found"


def test_the_store_is_bounded_least_recently_used_first():
    store = ResponseStore(capacity=3, max_bytes=1000)
    for i in range(4):
        assert store.put(f"r{i}", [{"role": "user", "content": str(i)}])
    assert store.get("r0") is None and len(store) == 3
    assert store.get("r1") is not None  # now the most recently used
    store.put("r4", [])
    assert store.get("r2") is None and store.get("r1") is not None
    assert not store.put("big", [{"role": "user", "content": "x" * 2000}]) and store.get("big") is None
    store.put("r5", [{"role": "user", "content": "y" * 960}])  # the byte budget pushes the others out
    assert store.get("r5") is not None and len(store) == 1 and store.bytes <= 1000


# -- the answer's shapes (no model) ------------------------------------------------------

USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
         "completion_tokens_details": {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}


def chat_completion(content, finish="stop", tool_calls=None, reasoning=None) -> dict:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]}


def chunk(delta, finish=None) -> dict:
    return {"id": "chatcmpl-1", "model": "m", "created": 1, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def new_wire(store=None, **echo):
    checked = responses_request({"input": "Weather in Paris and Nice?", "tools": WEATHER, **echo}, CONFIG, store)
    return ResponsesWire("m", checked.echo, checked.conversation, store)


def test_a_whole_answer_with_reasoning_text_and_calls():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]
    store = ResponseStore()
    body = new_wire(store).whole(chat_completion("Checking.", "tool_calls", calls, "They want weather."), USAGE)
    response = Response.model_validate(body)
    assert response.status == "completed" and response.incomplete_details is None and response.model == "m"
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output[0].content[0].text == "They want weather."
    assert response.output_text == "Checking."
    call = response.output[2]
    assert call.call_id == "call_a" and call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.id.startswith("fc_") and response.id.startswith("resp_")
    assert response.usage.input_tokens == 7 and response.usage.output_tokens == 5 and response.usage.total_tokens == 12
    assert response.tools[0].name == "get_weather" and response.tool_choice == "auto"
    assert store.get(response.id)[-1] == {"role": "assistant", "content": "Checking.",
                                          "reasoning_content": "They want weather.", "tool_calls": calls}


def test_whole_answers_calls_only_empty_and_cut():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    only_calls = Response.model_validate(new_wire().whole(chat_completion(None, "tool_calls", calls), USAGE))
    assert [item.type for item in only_calls.output] == ["function_call"]
    empty = Response.model_validate(new_wire().whole(chat_completion(""), USAGE))
    assert [item.type for item in empty.output] == ["message"] and empty.output_text == ""
    cut = Response.model_validate(new_wire(max_output_tokens=5).whole(chat_completion("Once upon", "length"), USAGE))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[0].status == "incomplete" and cut.max_output_tokens == 5


def stream_of(wire, chunks) -> list[dict]:
    raw = b"".join(event for c in chunks for event in wire.events(c)) + b"".join(wire.end(USAGE))
    return parse_sse(raw)


def test_a_stream_of_reasoning_text_and_two_calls():
    store = ResponseStore()
    wire = new_wire(store)
    chunks = [chunk({"role": "assistant"}), chunk({"reasoning_content": "Two "}), chunk({"reasoning_content": "cities."}),
              chunk({"content": "Look"}), chunk({"content": "ing."})]
    for index, (call_id, city) in enumerate((("call_a", "Paris"), ("call_b", "Nice"))):
        chunks += [chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                          "function": {"name": "get_weather", "arguments": ""}}]}),
                   chunk({"tool_calls": [{"index": index, "function": {"arguments": '{"city": '}}]}),
                   chunk({"tool_calls": [{"index": index, "function": {"arguments": f'"{city}"}}'}}]})]
    chunks.append(chunk({}, "tool_calls"))
    events = stream_of(wire, chunks)
    validated(events)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        *["response.output_item.added", "response.function_call_arguments.delta",
          "response.function_call_arguments.delta", "response.function_call_arguments.done",
          "response.output_item.done"] * 2,
        "response.completed"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2, 3]
    final = Response.model_validate(events[-1]["response"])
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call", "function_call"]
    assert final.output[0].content[0].text == "Two cities." and final.output_text == "Looking."
    assert [json.loads(item.arguments)["city"] for item in final.output[2:]] == ["Paris", "Nice"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert all(e["response"]["id"] == final.id for e in events if "response" in e)
    # The client's own accumulator follows the sequence and agrees with the final response.
    from openai.lib.streaming.responses import ResponseStreamState
    state = ResponseStreamState(input_tools=WEATHER, text_format=openai.omit)
    for event in validated(events):
        state.handle_event(event)
    assert store.get(final.id)[-1]["tool_calls"][1]["function"]["arguments"] == '{"city": "Nice"}'


def test_a_stream_cut_by_max_output_tokens_is_incomplete():
    events = stream_of(new_wire(), [chunk({"role": "assistant"}), chunk({"content": "Once"}), chunk({}, "length")])
    validated(events)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"


def test_an_empty_stream_still_has_its_message():
    events = stream_of(new_wire(), [chunk({"role": "assistant"}), chunk({}, "stop")])
    validated(events)
    final = Response.model_validate(events[-1]["response"])
    assert [item.type for item in final.output] == ["message"] and final.output_text == ""


def test_an_error_after_the_stream_started_is_an_error_event_then_response_failed():
    wire = new_wire()
    raw = b"".join(wire.events(chunk({"role": "assistant"})) + wire.events(chunk({"content": "Hi"})))
    raw += wire.error_event(APIError(503, "the server is shutting down", type="server_overloaded"))
    events = parse_sse(raw)
    validated(events)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["message"] == "the server is shutting down"
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error.code == "server_error"


# -- the real client against the server -------------------------------------------------

@pytest.fixture(scope="module")
def server(smollm_path):
    running = InProcessServer(ServerConfig(models=[str(smollm_path)], api_key=KEY, parallel=2, n_ctx=1024,
                                           keep_alive=None, n_threads=1, max_messages=16))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def post(server, body):
    return httpx.post(server.url + "/v1/responses", json=body, headers={"authorization": f"Bearer {KEY}"},
                      timeout=120)


BRIEF = {"instructions": "Answer in one short sentence.", "input": "What is the capital of France?",
         "max_output_tokens": 40, "temperature": 0}


@pytest.mark.real_model
def test_create_whole_and_streamed_agree(client, server):
    whole = client.responses.create(model=server.model.id, **BRIEF)
    assert whole.object == "response" and whole.model == server.model.id and whole.status in ("completed", "incomplete")
    assert whole.output_text.strip() and whole.instructions == BRIEF["instructions"]
    assert whole.usage.output_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    Response.model_validate(post(server, {"model": server.model.id, **BRIEF}).json())  # the raw JSON, strictly

    events = list(client.responses.create(model=server.model.id, stream=True, **BRIEF))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if whole.status == "completed" else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.real_model
def test_the_clients_stream_helper_follows_the_events(client, server):
    with client.responses.stream(model=server.model.id, input=[{"role": "user", "content": "Say hi."}],
                                 max_output_tokens=8, temperature=0,
                                 extra_body={"logit_bias": no_end(server)}) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    final = client.responses.create(model=server.model.id, input="Say hi.", max_output_tokens=8, temperature=0,
                                    extra_body={"logit_bias": no_end(server)})
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert "".join(deltas) == final.output_text and final.usage.output_tokens == 8


@pytest.mark.real_model
def test_a_function_call_round_trip(client, server):
    ask = "What is the weather in Paris?"
    # SmolLM2 knows no tool format: it writes free text until the forced call (sampling/lazy.py's FREE_TOKENS).
    first = client.responses.create(model=server.model.id, input=ask, tools=WEATHER, max_output_tokens=120,
                                    tool_choice={"type": "function", "name": "get_weather"})
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments) and call.call_id.startswith("call_")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny", "celsius": 21}'}

    # With previous_response_id: only the new item is sent, the server holds the rest.
    second = client.responses.create(model=server.model.id, previous_response_id=first.id, input=[result],
                                     tools=WEATHER, tool_choice="none", max_output_tokens=30, temperature=0)
    assert second.previous_response_id == first.id
    assert [item.type for item in second.output] == ["message"] and second.output_text.strip()
    assert second.usage.input_tokens > first.usage.input_tokens + len(call.arguments) // 8

    # Without it: the client sends the whole conversation, the first response's output included.
    stateless = client.responses.create(model=server.model.id, max_output_tokens=30, temperature=0,
                                        input=[{"role": "user", "content": ask}, *first.output, result],
                                        tools=WEATHER, tool_choice="none")
    assert stateless.output_text == second.output_text and stateless.usage.input_tokens == second.usage.input_tokens


@pytest.mark.real_model
def test_a_streamed_function_call(client, server):
    events = list(client.responses.create(model=server.model.id, input="What is the weather in Paris?",
                                          tools=WEATHER, tool_choice="required", max_output_tokens=120, stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    # a message item may come first (SmolLM2's free text before the forced call), then the call
    added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
    assert added.item.name == "get_weather"
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == arguments and "city" in json.loads(arguments)
    assert events[-1].response.output[-1].arguments == arguments


@pytest.mark.real_model
def test_text_format_json_schema(client, server):
    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        country: str = pydantic.Field(max_length=20)

    parsed = client.responses.parse(model=server.model.id, text_format=City, max_output_tokens=80, temperature=0,
                                    instructions="You reply with JSON only.", input="Describe Paris as JSON.")
    assert isinstance(parsed.output_parsed, City)
    schema = {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string"},
                                                          "maxItems": 3}},
              "required": ["colors"], "additionalProperties": False}
    raw = client.responses.create(model=server.model.id, max_output_tokens=80, temperature=0,
                                  instructions="You reply with JSON only.", input="Name three colors.",
                                  text={"format": {"type": "json_schema", "name": "colors", "schema": schema,
                                                   "strict": True}})
    assert isinstance(json.loads(raw.output_text)["colors"], list) and raw.text.format.name == "colors"


@pytest.mark.real_model
def test_previous_response_id_carries_the_conversation_and_store_false_keeps_nothing(client, server):
    first = client.responses.create(model=server.model.id, input="My name is Ada.", max_output_tokens=16,
                                    temperature=0)
    second = client.responses.create(model=server.model.id, input="What is my name?", max_output_tokens=16,
                                     temperature=0, previous_response_id=first.id)
    alone = client.responses.create(model=server.model.id, input="What is my name?", max_output_tokens=16,
                                    temperature=0)
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens
    unstored = client.responses.create(model=server.model.id, input="Hi", max_output_tokens=4, store=False)
    assert unstored.store is False
    for missing in (unstored.id, "resp_never_made"):
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model=server.model.id, input="Hi", previous_response_id=missing)
        assert raised.value.body["param"] == "previous_response_id"
        assert raised.value.body["code"] == "previous_response_not_found"


@pytest.mark.real_model
def test_bad_input_is_a_400_in_openais_error_shape(client, server):
    for body, param in BAD[1:]:
        assert error_of(post(server, {"model": server.model.id, **body}), 400)["param"] == param
    # Errors the library finds (before any output): the same JSON, with the Responses API's names.
    error_of(post(server, {"input": "x", "tool_choice": "required"}), 400)
    error_of(post(server, {"input": "x", "tools": WEATHER, "tool_choice": {"type": "function", "name": "nope"}}), 400)
    too_long = error_of(post(server, {"input": "x", "max_output_tokens": 1024}), 400)
    assert "max_output_tokens" in too_long["message"] and "max_tokens" not in too_long["message"].replace(
        "max_output_tokens", "")
    error_of(post(server, {"input": "x", "text": {"format": {"type": "json_schema", "name": "x",
                                                             "schema": {"type": "nonsense"}}}}), 400)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=server.model.id, input=[{"type": "computer_call_output", "call_id": "c"}])
    with pytest.raises(openai.BadRequestError):  # streamed: the error comes before the stream starts
        client.responses.create(model=server.model.id, input="word " * 1100, stream=True)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="Hi")


@pytest.mark.real_model
def test_a_client_dropped_mid_stream_frees_its_sequence(server):
    wait_until(lambda: server.model.in_flight == 0)   # an earlier test's stream may still be ending
    before = server.state.metrics.requests[("/v1/responses", 499)]
    server.model.close_idle_sessions()  # so any cell still used after the drop would be the dropped request's
    body = {"model": server.model.id, "input": "Tell me a long story.", "max_output_tokens": 800, "stream": True,
            "logit_bias": no_end(server)}  # it would run on for long
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + "/v1/responses", json=body,
                         headers={"authorization": f"Bearer {KEY}"}) as response:
            deltas, seen = 0, []
            for line in response.iter_lines():
                seen.append(line)
                deltas += line == "event: response.output_text.delta"
                if deltas == 3:
                    break
            assert deltas == 3, (response.status_code, seen[-6:])   # the stream runs, else say what came
            assert cells_used(server) > 0 and server.model.in_flight == 1
    wait_until(lambda: idle(server), seconds=5)
    assert server.model.idle_sessions == 0  # closed, not kept: its cells are freed at once
    assert server.state.metrics.requests[("/v1/responses", 499)] == before + 1
