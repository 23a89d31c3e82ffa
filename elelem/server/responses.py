"""``POST /v1/responses``: OpenAI's Responses API, over the same chat call as ``/v1/chat/completions``.

A request is translated into a chat body and checked by
:func:`.schema.chat_call` (so the server's limits hold the same way), then
run by :class:`.generation.Generation` with a :class:`.responses_wire.ResponsesWire`
that writes the answer as a ``response`` object, or as its typed stream
events.

* ``instructions`` becomes a system message ahead of the conversation;
* ``input`` is a string (one user message) or a list of items: messages
  (``role`` ``user``/``system``/``developer``/``assistant``, content a string
  or ``input_text``/``output_text`` parts), ``function_call`` (an assistant
  message's tool call; consecutive calls, and calls after an assistant's
  text, join that message) and ``function_call_output`` (a ``tool``
  message); a ``reasoning`` item's text becomes the ``reasoning_content`` of
  the assistant message after it (templates that know it, Qwen3's, show it
  in a tool-calling turn; others leave it out);
* function ``tools`` (``{"type": "function", "name", "parameters", ...}``)
  and ``tool_choice`` map to chat's; ``text.format`` to ``response_format``;
  ``max_output_tokens`` to ``max_tokens``;
* ``previous_response_id`` continues a conversation this server still
  holds (:mod:`.responses_store`); an unknown one is a 400.

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

from . import schema
from .config import ServerConfig
from .errors import APIError, bad_request
from .generation import Generation
from .responses_store import ResponseStore
from .responses_wire import ResponsesWire, renamed

_USED = {"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
         "text", "stream", "previous_response_id", "store", "parallel_tool_calls", "metadata", "user"}
# Accepted, and changing nothing here: the answer is the same with or without them.
_ACCEPTED = {"include", "reasoning", "truncation", "stream_options", "service_tier", "prompt_cache_key",
             "safety_identifier", "background", "max_tool_calls"}
# elelem's extensions, as /v1/chat/completions takes them.
_EXTENSIONS = {"top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "seed",
               "stop"}
_FIELDS = _USED | _ACCEPTED | _EXTENSIONS
_MESSAGE_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "text"}


@dataclass
class ResponsesRequest:
    """A checked request: the chat call to run, and what the response object repeats back."""

    call: schema.Call
    conversation: list                    # the chat messages without the instructions: what is stored
    echo: dict = field(default_factory=dict)   # the request's fields as the response object shows them
    store: bool = True


def handler(read_body):
    """The route's handler, ``handler(state, request)``; ``read_body(request, limit)`` reads the JSON body.

    The store of the conversations belongs to this handler, so to the app
    that routes to it (one per :func:`~.app.create_app`).
    """
    store = ResponseStore()

    async def respond(state, request):
        body = await read_body(request, state.config.max_body_bytes)
        checked = responses_request(body, state.config, store)
        model = state.registry.get(checked.call.model)
        await model.reserve()  # may wait in the queue; 503 with Retry-After past its bounds
        wire = ResponsesWire(model.id, checked.echo, checked.conversation, store if checked.store else None)
        return Generation(request.url.path, model, checked.call, state.metrics, state.limiter,
                          state.config.retry_after_seconds, live=state.generations, wire=wire)

    respond.store = store
    return respond


def responses_request(body: Any, config: ServerConfig, store: Optional[ResponseStore]) -> ResponsesRequest:
    """Check a Responses body and translate it into a chat :class:`~.schema.Call` (bad input: a 400)."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}", unknown[0])
    _check_accepted(body)

    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string", "instructions")
    previous_id = body.get("previous_response_id")
    history: list = []
    if previous_id is not None:
        if not isinstance(previous_id, str):
            raise bad_request("previous_response_id must be a string", "previous_response_id")
        found = store.get(previous_id) if store is not None else None
        if found is None:
            raise bad_request(f"no response with id {previous_id!r}: this server holds only its most recent "
                              "stored responses, in memory", "previous_response_id",
                              code="previous_response_not_found")
        history = found
    conversation = history + input_messages(body.get("input"))
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation

    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"))
    text_format = _text_format(body.get("text"))
    chat: dict = {"model": body.get("model"), "messages": messages, "stream": body.get("stream")}
    for name in ("temperature", "top_p", "parallel_tool_calls", "user") + tuple(_EXTENSIONS):
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
    effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort is not None:  # gpt-oss's template reads it ("Reasoning: low"), as llama.cpp passes it
        chat["chat_template_kwargs"] = {"reasoning_effort": effort}
    try:
        call = schema.chat_call(chat, config)
    except APIError as error:
        raise renamed(error) from None

    store_it = body.get("store")
    if store_it not in (None, True, False):
        raise bad_request("store must be a boolean", "store")
    metadata = body.get("metadata")
    if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise bad_request("metadata must be an object of at most 16 string values", "metadata")
    reasoning = body.get("reasoning")
    echo = {
        "instructions": instructions,
        "tools": [dict(t) for t in body.get("tools") or []],
        "tool_choice": body.get("tool_choice") or "auto",
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": previous_id,
        "parallel_tool_calls": body.get("parallel_tool_calls") is True,  # one call unless asked, as llama.cpp
        "metadata": metadata or {},
        "text": {"format": text_format or {"type": "text"}},
        "reasoning": {"effort": (reasoning or {}).get("effort"), "summary": (reasoning or {}).get("summary")},
        "store": store_it is not False,
        "truncation": "disabled",
        "user": body.get("user"),
        "background": False,
        "service_tier": "default",
    }
    return ResponsesRequest(call, conversation, echo, store=store_it is not False)


def _check_accepted(body: dict) -> None:
    def refuse(name: str, why: str):
        raise bad_request(f"{name} {why}", name)

    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(i, str) for i in include)):
        refuse("include", "must be a list of strings")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary", "generate_summary"}:
            refuse("reasoning", "must be an object {'effort', 'summary'}")
        if reasoning.get("effort") is not None and not isinstance(reasoning["effort"], str):
            refuse("reasoning", "effort must be a string")
    if body.get("truncation") not in (None, "disabled"):
        refuse("truncation", "must be 'disabled': a conversation past the context is an error, never cut")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if body.get("stream") is not True:
            refuse("stream_options", "is only allowed with stream: true")
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_obfuscation"}:
            refuse("stream_options", "must be {'include_obfuscation': bool}")
    if body.get("background") not in (None, False):
        refuse("background", "is not supported: responses run while their request waits")
    if body.get("max_tool_calls") is not None:
        refuse("max_tool_calls", "is not supported")
    for name in ("service_tier", "prompt_cache_key", "safety_identifier"):
        if body.get(name) is not None and not isinstance(body[name], str):
            refuse(name, "must be a string")


# -- input items -> chat messages -------------------------------------------------

def input_messages(given: Any) -> list:
    """The chat messages of ``input``: a string, or a list of message, function call and output items."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise bad_request("input must be a string or a non-empty list of items", "input")
    messages: list = []
    reasoning: list[str] = []  # reasoning items' text, for the assistant message that follows them
    for index, item in enumerate(given):
        param = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"{param} must be an object", param)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            call = _function_call(item, param)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last["tool_calls"] = [*last.get("tool_calls", []), call]
            else:
                # "", not None: a template without a tool-call convention (SmolLM2's) prints every content.
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_function_output(item, param))
        elif kind == "reasoning":
            reasoning.append(_reasoning(item, param))
            continue
        elif kind is None:
            raise bad_request(f"{param} has no type (nor a role, for a message)", f"{param}.type")
        else:
            raise bad_request(f"{param} is of type {kind!r}; this server takes 'message', 'function_call', "
                              "'function_call_output' and 'reasoning' items", f"{param}.type")
        if reasoning and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = "\n\n".join(r for r in reasoning if r)
        reasoning = []
    return messages


def _message(item: dict, param: str) -> dict:
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        raise bad_request(f"{param}.role must be one of {sorted(_MESSAGE_ROLES)}, got {role!r}", f"{param}.role")
    content = item.get("content")
    if isinstance(content, list):
        content = _parts_text(content, f"{param}.content")
    elif not isinstance(content, str):
        raise bad_request(f"{param}.content must be a string or a list of text parts", f"{param}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def _parts_text(parts: list, param: str) -> str:
    texts = []
    for index, part in enumerate(parts):
        where = f"{param}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in _TEXT_PARTS or kind == "refusal":
            raise bad_request(f"{where} has no string {'refusal' if kind == 'refusal' else 'text'}", where)
        else:
            raise bad_request(f"{where} is a {kind or type(part).__name__!r} part; this model reads text only: "
                              "use {'type': 'input_text', 'text': ...} parts", where)
    return "".join(texts)


def _string_field(item: dict, name: str, param: str, *, empty: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str) or (not value and not empty):
        raise bad_request(f"{param}.{name} must be a {'' if empty else 'non-empty '}string", f"{param}.{name}")
    return value


def _function_call(item: dict, param: str) -> dict:
    call_id = _string_field(item, "call_id", param)
    name = _string_field(item, "name", param)
    arguments = _string_field(item, "arguments", param, empty=True)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _function_output(item: dict, param: str) -> dict:
    call_id = _string_field(item, "call_id", param)
    output = item.get("output")
    if isinstance(output, list):
        output = _parts_text(output, f"{param}.output")
    elif not isinstance(output, str):
        raise bad_request(f"{param}.output must be a string or a list of text parts", f"{param}.output")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _reasoning(item: dict, param: str) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else its summary."""
    texts = {}
    for name in ("content", "summary"):
        parts = item.get(name)
        if parts is None:
            parts = []
        if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                  for p in parts):
            raise bad_request(f"{param}.{name} must be a list of {{'type', 'text'}} parts", f"{param}.{name}")
        texts[name] = "".join(p["text"] for p in parts)
    return texts["content"] or texts["summary"]


# -- tools, tool_choice, text.format ----------------------------------------------

def _tools(tools: Any) -> Optional[list]:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function tools", "tools")
    converted = []
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_request(f"{param} is a {kind!r} tool; this server runs function tools only "
                              "({'type': 'function', 'name', 'parameters'})", param)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"{param}.name must be a non-empty string", f"{param}.name")
        function: dict = {"name": name}
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise bad_request(f"{param}.description must be a string", f"{param}.description")
            function["description"] = tool["description"]
        if tool.get("parameters") is not None:
            if not isinstance(tool["parameters"], dict):
                raise bad_request(f"{param}.parameters must be a JSON schema object", f"{param}.parameters")
            function["parameters"] = tool["parameters"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
                      "tool_choice")


def _text_format(text: Any) -> Optional[dict]:
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
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

