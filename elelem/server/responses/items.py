"""The Responses API's conversation items as chat messages, and its output items as one again.

``input`` is a string (one user message) or a list of items: messages
(``role`` ``user``/``system``/``developer``/``assistant``, content a string
or ``input_text``/``output_text`` parts), ``function_call`` (an assistant
message's tool call; consecutive calls, and calls after an assistant's
text, join that message) and ``function_call_output`` (a ``tool``
message); a ``reasoning`` item's text becomes the ``reasoning_content`` of
the assistant message after it (templates that know it, Qwen3's, show it
in a tool-calling turn; others leave it out).  A response's output items
are kept, for ``previous_response_id``, as the assistant message they
would be read back as.
"""
from __future__ import annotations

from typing import Any

from ..errors import bad_request
from ..tools import tool_call

_MESSAGE_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "text"}


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
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        content = _parts_with_images(content, f"{param}.content")
    elif isinstance(content, list):
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


def _parts_with_images(parts: list, param: str) -> list:
    """Text and ``input_image`` parts as chat content parts, in their order (a model
    opened with a projector reads the images: api/images.py)."""
    out: list = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image":
            if not isinstance(part.get("image_url"), str):
                raise bad_request(f"{param}[{index}].image_url must be a URL string (file_id is not supported)",
                                  f"{param}[{index}].image_url")
            out.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            out.append({"type": "text", "text": _parts_text([part], param)})
    return out


def _string_field(item: dict, name: str, param: str, *, empty: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str) or (not value and not empty):
        raise bad_request(f"{param}.{name} must be a {'' if empty else 'non-empty '}string", f"{param}.{name}")
    return value


def _function_call(item: dict, param: str) -> dict:
    call_id = _string_field(item, "call_id", param)
    name = _string_field(item, "name", param)
    arguments = _string_field(item, "arguments", param, empty=True)
    return tool_call(call_id, name, arguments)


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


def assistant_message(items: list) -> dict:
    """The output items as one chat assistant message, for the stored conversation: the text, the
    calls, and the reasoning as ``reasoning_content`` (as :func:`input_messages` reads input items)."""
    texts = [part.get("text", "") for item in items if item["type"] == "message" for part in item["content"]]
    reasoning = [part.get("text", "") for item in items if item["type"] == "reasoning"
                 for part in item.get("content") or []]
    calls = [tool_call(item["call_id"], item["name"], item["arguments"])
             for item in items if item["type"] == "function_call"]
    message: dict = {"role": "assistant", "content": "".join(texts)}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message
