"""A Responses request, checked and translated into the engine's chat call.

The body is translated into a chat body and checked by
:func:`..chat.request.chat_call` (so the server's limits hold the same way):

* ``instructions`` becomes a system message ahead of the conversation;
* ``input`` is a string or a list of items (:mod:`.items`);
* function ``tools`` (``{"type": "function", "name", "parameters", ...}``)
  and ``tool_choice`` map to chat's; ``text.format`` to ``response_format``;
  ``max_output_tokens`` to ``max_tokens``;
* ``previous_response_id`` continues a conversation this server still
  holds (:mod:`.store`); an unknown one is a 400.

``reasoning.effort`` is the chat template's ``reasoning_effort`` variable
(gpt-oss's template reads it), as llama.cpp's ``chat_template_kwargs`` pass it.

Every field of the API is used, accepted when it asks for nothing this
server would do differently (``metadata``, ``user``, ``store``, ``include``,
``reasoning.summary``, ``truncation: "disabled"``, ...), or refused with a 400 naming
it, as are unknown fields.  As in ``/v1/chat/completions``, the sampling
extensions ``top_k``, ``min_p``, ``repeat_penalty``, ``presence_penalty``,
``frequency_penalty``, ``logit_bias``, ``seed`` and ``stop`` are taken too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..call import Call
from ..chat.request import chat_call
from ..config import ServerConfig
from ..errors import APIError, bad_request
from ..fields import (FLAG, JSON_SCHEMA, NONEMPTY_STRING, OBJECT, OPENAI, STRING, STRINGS, Field, Kind,
                      Spec, one_of)
from ..tools import TOOL_CHOICES, ToolFormat, forced_function, function_tools
from .errors import renamed
from .items import input_messages
from .store import ResponseStore

# Passed to the chat call as they are (its checks name them); the extensions are elelem's, as
# /v1/chat/completions takes them.
_PASSED_ON = ("temperature", "top_p", "parallel_tool_calls", "user", "top_k", "min_p", "repeat_penalty",
              "presence_penalty", "frequency_penalty", "logit_bias", "seed", "stop")
_METADATA = Kind("an object of at most 16 string values", lambda value: isinstance(value, dict) and len(
    value) <= 16 and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()))
_REFUSED = one_of()  # a field of the API whose every value asks for what this server does not do

REQUEST = Spec({
    "model": Field(),
    "input": Field(),
    "instructions": Field(STRING),
    "previous_response_id": Field(STRING),
    "tools": Field(),
    "tool_choice": Field(),
    "max_output_tokens": Field(),
    "text": Field(OBJECT, message="{path} must be an object {{'format', 'verbosity'}}"),
    "stream": Field(),
    "store": Field(FLAG),
    "metadata": Field(_METADATA),
    # Accepted, and changing nothing here: the answer is the same with or without them.
    "include": Field(STRINGS),
    "reasoning": Field(OBJECT, message="{path} must be an object {{'effort', 'summary'}}"),
    "truncation": Field(one_of("disabled"),
                        message="{path} must be 'disabled': a conversation past the context is an error, never cut"),
    "stream_options": Field(),  # only with stream: true, so checked with it
    "service_tier": Field(STRING),
    "prompt_cache_key": Field(STRING),
    "safety_identifier": Field(STRING),
    "background": Field(one_of(False), message="{path} is not supported: responses run while their request waits"),
    "max_tool_calls": Field(_REFUSED, message="{path} is not supported"),
    **{name: Field() for name in _PASSED_ON},
})
TOOLS = ToolFormat(
    Spec({"type": Field(), "name": Field(NONEMPTY_STRING, required=True, message="{path} must be a non-empty string"),
          "description": Field(STRING), "parameters": Field(JSON_SCHEMA), "strict": Field()}, open=True),
    parameters="parameters", types=("function",),
    other_type="{path} is a {kind!r} tool; this server runs function tools only "
               "({{'type': 'function', 'name', 'parameters'}})")


@dataclass
class ResponsesRequest:
    """A checked request: the chat call to run, and what the response object repeats back."""

    call: Call
    conversation: list                    # the chat messages without the instructions: what is stored
    echo: dict = field(default_factory=dict)   # the request's fields as the response object shows them
    store: bool = True


def responses_request(body: Any, config: ServerConfig, store: Optional[ResponseStore]) -> ResponsesRequest:
    """Check a Responses body and translate it into a chat :class:`~..call.Call` (bad input: a 400)."""
    body = REQUEST.check(body)
    _check_nested(body)
    instructions = body.get("instructions")
    previous_id = body.get("previous_response_id")
    history: list = []
    if previous_id is not None:
        found = store.get(previous_id) if store is not None else None
        if found is None:
            raise bad_request(f"no response with id {previous_id!r}: this server holds only its most recent "
                              "stored responses, in memory", "previous_response_id",
                              code="previous_response_not_found")
        history = found
    conversation = history + input_messages(body.get("input"))
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation

    tools = function_tools(body.get("tools"), TOOLS, OPENAI)
    tool_choice = _tool_choice(body.get("tool_choice"))
    text_format = _text_format(body.get("text"))
    chat: dict = {"model": body.get("model"), "messages": messages, "stream": body.get("stream")}
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    if tools:
        chat["tools"] = tools
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if text_format is not None and text_format["type"] != "text":
        chat["response_format"] = _response_format(text_format)
    reasoning = body.get("reasoning") or {}
    if reasoning.get("effort") is not None:  # gpt-oss's template reads it ("Reasoning: low"), as llama.cpp passes it
        chat["chat_template_kwargs"] = {"reasoning_effort": reasoning["effort"]}
    try:
        call = chat_call(chat, config)
    except APIError as error:
        raise renamed(error) from None

    stored = body.get("store") is not False
    echo = {
        "instructions": instructions,
        "tools": [dict(t) for t in body.get("tools") or []],
        "tool_choice": body.get("tool_choice") or "auto",
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": previous_id,
        "parallel_tool_calls": body.get("parallel_tool_calls") is True,  # one call unless asked, as llama.cpp
        "metadata": body.get("metadata") or {},
        "text": {"format": text_format or {"type": "text"}},
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": stored,
        "truncation": "disabled",
        "user": body.get("user"),
        "background": False,
        "service_tier": "default",
    }
    return ResponsesRequest(call, conversation, echo, store=stored)


def _check_nested(body: dict) -> None:
    """What the spec's types leave: the keys of ``reasoning``, and ``stream_options``."""
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if set(reasoning) - {"effort", "summary", "generate_summary"}:
            raise bad_request("reasoning must be an object {'effort', 'summary'}", "reasoning")
        if reasoning.get("effort") is not None and not isinstance(reasoning["effort"], str):
            raise bad_request("reasoning effort must be a string", "reasoning")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if body.get("stream") is not True:
            raise bad_request("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_obfuscation"}:
            raise bad_request("stream_options must be {'include_obfuscation': bool}", "stream_options")


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return forced_function(choice["name"])
    raise bad_request("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
                      "tool_choice")


def _text_format(text: Optional[dict]) -> Optional[dict]:
    if text is None:
        return None
    if set(text) - {"format", "verbosity"}:
        raise bad_request("text must be an object {'format', 'verbosity'}", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("text.format must be {'type': 'text'}, {'type': 'json_object'} or "
                          "{'type': 'json_schema', 'name', 'schema', 'strict'}", "text.format")
    if fmt["type"] == "json_schema":
        if not isinstance(fmt.get("name"), str) or not fmt["name"]:
            raise bad_request("text.format.name must be a non-empty string", "text.format.name")
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("text.format.schema must be a JSON schema object", "text.format.schema")
    return dict(fmt)


def _response_format(fmt: dict) -> dict:
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    spec = {name: fmt[name] for name in ("name", "schema", "strict", "description") if name in fmt}
    return {"type": "json_schema", "json_schema": spec}
