"""A Messages request, checked in Anthropic's terms and translated into the engine's chat call.

The body is checked field by field and block by block (its paths, such as
``messages.2.content.0.type``, name what is wrong), then turned into a Chat
Completions body that goes through :func:`..chat.request.chat_call`, so the
server's bounds hold here too:

* ``system`` (a string or text blocks) is a system message; a message's
  ``content`` is a string or blocks: ``text`` blocks (joined by a blank
  line), an assistant's ``tool_use`` blocks (its ``tool_calls``) and
  ``thinking`` blocks (its ``reasoning_content``, which chat templates may
  show), a user's ``tool_result`` blocks (``tool`` messages, ahead of the
  user's text); ``redacted_thinking`` is dropped.  Other block types
  (images, documents, server tools' blocks) are a 400 naming them.
* ``tools`` (custom tools: ``name``, ``description``, ``input_schema``) are
  function tools; ``tool_choice`` ``auto``/``any``/``tool``/``none`` is
  ``"auto"``/``"required"``/a named function/``"none"``; ``max_tokens`` is
  required; ``stop_sequences`` go to the library as they are (up to
  :data:`MAX_STOP_SEQUENCES`; Chat Completions' ``stop`` takes 4);
  ``temperature``, ``top_p``, ``top_k`` (and llama.cpp's sampling
  extensions, as Chat Completions takes them: ``min_p``,
  ``repeat_penalty``, the presence and frequency penalties, ``logit_bias``,
  ``seed``); ``output_config.format`` (a JSON schema) is
  ``response_format``.
* ``thinking`` ``{"type": "enabled"}`` / ``{"type": "disabled"}`` sets the
  chat template's ``enable_thinking`` to true / false (``adaptive`` leaves
  it to the template; ``budget_tokens`` is checked and not enforced).
  ``metadata``, ``service_tier``, ``cache_control`` and the like are
  accepted and ignored, and so are the ``anthropic-version`` and
  ``anthropic-beta`` headers.  Any other field is a 400, as Anthropic's own
  API answers it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..call import Call
from ..chat.request import chat_call
from ..config import ServerConfig
from ..errors import bad_request
from ..fields import FLAG, JSON_SCHEMA, NONEMPTY_LIST, NONEMPTY_STRING, OBJECT, STRING, Field, Kind, Spec
from ..tools import ToolFormat, arguments_json, forced_function, function_tools, tool_call
from .errors import ANTHROPIC

MAX_STOP_SEQUENCES = 64

# Passed to the chat call as they are: Anthropic's sampling fields, and llama.cpp's extensions as Chat
# Completions takes them; their values are checked there.
_PASSED_ON = ("model", "stream", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty",
              "frequency_penalty", "logit_bias", "seed")
_STOPS = Kind("a list of non-empty strings",
              lambda value: isinstance(value, list) and all(isinstance(s, str) and s for s in value))

REQUEST = Spec({
    "max_tokens": Field(required=True),   # its value is checked by the chat call
    "messages": Field(NONEMPTY_LIST, required=True,
                      message="{path}: must be a non-empty list of {{'role', 'content'}} objects"),
    "system": Field(),
    "stop_sequences": Field(_STOPS),
    "tools": Field(),
    "tool_choice": Field(),
    "thinking": Field(),
    "output_config": Field(),
    **{name: Field() for name in _PASSED_ON},
}, ignored=frozenset({  # bookkeeping, and Anthropic's prompt caching (the KV cache reuses prefixes anyway)
    "metadata", "service_tier", "cache_control", "inference_geo", "speed", "diagnostics", "context_management"}))
_MESSAGE = Spec({"role": Field(), "content": Field()})

# Each block type: the roles that may send it, and its fields.
_BLOCKS = {
    "text": ({"user", "assistant"}, Spec({"type": Field(), "text": Field(STRING, required=True)},
                                         ignored=frozenset({"cache_control", "citations"}))),
    "thinking": ({"assistant"}, Spec({"type": Field(), "thinking": Field(STRING, required=True)},
                                     ignored=frozenset({"signature", "cache_control"}))),
    "redacted_thinking": ({"assistant"}, Spec({"type": Field(), "data": Field(STRING, required=True)},
                                              ignored=frozenset({"cache_control"}))),
    "tool_use": ({"assistant"}, Spec({"type": Field(), "id": Field(STRING, required=True),
                                      "name": Field(STRING, required=True), "input": Field(OBJECT, required=True)},
                                     ignored=frozenset({"cache_control", "caller", "toolset_name"}))),
    # An image: passed on as a chat image part (a model opened with a projector reads it, api/images.py).
    "image": ({"user"}, Spec({"type": Field(), "source": Field(OBJECT, required=True)},
                             ignored=frozenset({"cache_control"}))),
    "tool_result": ({"user"}, Spec({"type": Field(), "tool_use_id": Field(STRING, required=True),
                                    "is_error": Field(FLAG), "content": Field()},
                                   ignored=frozenset({"cache_control", "toolset_name"}))),
}
_UNSUPPORTED_BLOCKS = {"document", "search_result", "container_upload", "server_tool_use",
                       "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
                       "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
                       "tool_search_tool_result", "mcp_tool_use", "mcp_tool_result", "tool_reference",
                       "browser_state"}

TOOLS = ToolFormat(
    Spec({"type": Field(), "name": Field(NONEMPTY_STRING, required=True),
          "input_schema": Field(JSON_SCHEMA, required=True), "description": Field(STRING)},
         ignored=frozenset({"cache_control", "strict", "input_examples", "defer_loading", "eager_input_streaming",
                            "allowed_callers"})),
    parameters="input_schema", types=(None, "custom"), refuse_at_type=True,
    other_type="{path}: {kind!r} (a tool Anthropic's servers run) is not supported; this server takes custom "
               "tools, with a name and an input_schema",
    list_message="{path}: must be a list of tools", empty_description=False)
_TOOL_CHOICE = Spec({"type": Field(), "name": Field(), "disable_parallel_tool_use": Field(FLAG)})
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_THINKING = {"enabled", "disabled", "adaptive"}


@dataclass
class MessagesRequest:
    """A checked Messages request: the chat call to run, and what only this API uses."""

    call: Call
    thinking: Optional[dict] = None  # {"type": "enabled", "budget_tokens": N} etc.: enable_thinking


def messages_request(body: Any, config: ServerConfig) -> MessagesRequest:
    """The chat call of a Messages body; a 400 (``APIError``) naming the first thing wrong."""
    body = REQUEST.check(body, ANTHROPIC)
    chat: dict[str, Any] = {"messages": _system(body.get("system")) + _messages(body["messages"]),
                            "max_tokens": body["max_tokens"]}
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = function_tools(body.get("tools"), TOOLS, ANTHROPIC)
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"], parallel = _tool_choice(choice)
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    response_format = _output_format(body.get("output_config"))
    if response_format is not None:
        chat["response_format"] = response_format
    thinking = _thinking(body.get("thinking"))
    if thinking is not None and thinking["type"] in ("enabled", "disabled"):
        # The template's switch (Qwen3's, GLM's, ...), as llama.cpp's chat_template_kwargs set it.
        chat["chat_template_kwargs"] = {"enable_thinking": thinking["type"] == "enabled"}
    call = chat_call(chat, config)
    stops = _stop_sequences(body.get("stop_sequences"))
    if stops:
        call.options["stop"] = stops
    return MessagesRequest(call, thinking)


# -- content: system, messages, blocks -> chat messages ------------------------------

def _system(system: Any) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        text = system
    elif isinstance(system, list):
        text = _texts([_block(block, f"system.{i}", "system") for i, block in enumerate(system)])
    else:
        raise bad_request("system: must be a string or a list of text blocks", "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(messages: list) -> list[dict]:
    chat = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where}: must be an object whose role is 'user' or 'assistant'", where)
        _MESSAGE.check(message, ANTHROPIC, where)
        content = message.get("content")
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
        elif isinstance(content, list) and content:
            role = message["role"]
            blocks = [_block(block, f"{where}.content.{j}", role) for j, block in enumerate(content)]
        else:
            raise bad_request(f"{where}.content: must be a string or a non-empty list of content blocks",
                              f"{where}.content")
        chat += _user(blocks) if message["role"] == "user" else [_assistant(blocks)]
    return chat


def _block(block: Any, where: str, role: str) -> dict:
    """One content block, checked: its type known and allowed in its place, its fields present and typed.
    ``role`` is the message's, or ``"system"`` for the system prompt and a tool result's content (text only)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise bad_request(f"{where}: a content block must be an object with a string 'type'", where)
    if kind in _UNSUPPORTED_BLOCKS:
        raise bad_request(f"{where}.type: {kind!r} blocks are not supported: this server's models read text "
                          f"and images (text, image, tool_use, tool_result and thinking blocks)", f"{where}.type")
    if kind not in _BLOCKS:
        raise bad_request(f"{where}.type: unknown content block type {kind!r}; expected one of "
                          f"{sorted(_BLOCKS)}", f"{where}.type")
    if kind == "image" and role == "system":   # images in a system prompt or a tool result: not read
        raise bad_request(f"{where}.type: an 'image' block cannot be in a system prompt or a tool result",
                          f"{where}.type")
    roles, spec = _BLOCKS[kind]
    allowed = kind == "text" if role == "system" else role in roles
    if not allowed:
        place = "a system prompt or a tool result" if role == "system" else f"a {role} message"
        raise bad_request(f"{where}: a {kind!r} block cannot be in {place}", where)
    spec.check(block, ANTHROPIC, where)
    if kind == "image":
        source = block["source"]
        if not (source.get("type") == "base64" and isinstance(source.get("data"), str)
                or source.get("type") == "url" and isinstance(source.get("url"), str)):
            raise bad_request(f"{where}.source: must be {{'type': 'base64', 'media_type': ..., 'data': ...}} or "
                              f"{{'type': 'url', 'url': ...}}", f"{where}.source")
    if kind == "tool_use" and not (block["id"] and block["name"]):
        raise bad_request(f"{where}: a tool_use block needs a non-empty id and name", where)
    if kind == "tool_result":
        if not block["tool_use_id"]:
            raise bad_request(f"{where}.tool_use_id: must not be empty", f"{where}.tool_use_id")
        content = block.get("content")
        if isinstance(content, list):
            block = {**block, "content": _texts(
                [_block(part, f"{where}.content.{k}", "system") for k, part in enumerate(content)])}
        elif content is not None and not isinstance(content, str):
            raise bad_request(f"{where}.content: must be a string or a list of text blocks", f"{where}.content")
    return block


def _texts(blocks: list[dict]) -> str:
    return "\n\n".join(block["text"] for block in blocks)


def _user(blocks: list[dict]) -> list[dict]:
    """A user turn: its tool results as ``tool`` messages, then its text (if any)."""
    results = [{"role": "tool", "tool_call_id": b["tool_use_id"],
                "content": ("Error: " if b.get("is_error") else "") + (b.get("content") or "")}
               for b in blocks if b["type"] == "tool_result"]
    texts = [b for b in blocks if b["type"] == "text"]
    if any(b["type"] == "image" for b in blocks):   # text and images in their order, as chat content parts
        results.append({"role": "user", "content": [b if b["type"] == "image" else {"type": "text", "text": b["text"]}
                                                    for b in blocks if b["type"] in ("text", "image")]})
    elif texts or not results:
        results.append({"role": "user", "content": _texts(texts)})
    return results


def _assistant(blocks: list[dict]) -> dict:
    calls = [tool_call(b["id"], b["name"], arguments_json(b["input"])) for b in blocks if b["type"] == "tool_use"]
    texts = [b for b in blocks if b["type"] == "text"]
    # Text, or "" beside calls: a template may read a message's content without testing for it.
    message: dict[str, Any] = {"role": "assistant", "content": _texts(texts)}
    thinking = "\n\n".join(b["thinking"] for b in blocks if b["type"] == "thinking")
    if thinking:
        message["reasoning_content"] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


# -- the other fields ------------------------------------------------------------------

def _tool_choice(choice: Any) -> tuple[Any, Optional[bool]]:
    """Chat's ``tool_choice``, and ``parallel_tool_calls`` (False with ``disable_parallel_tool_use``)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in (*_TOOL_CHOICES, "tool"):
        raise bad_request("tool_choice: must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                          "tool_choice")
    _TOOL_CHOICE.check(choice, ANTHROPIC, "tool_choice")
    disable = choice.get("disable_parallel_tool_use")
    parallel = None if disable is None else not disable
    if kind != "tool":
        return _TOOL_CHOICES[kind], parallel
    if not isinstance(choice.get("name"), str) or not choice["name"]:
        raise bad_request("tool_choice.name: Field required with type 'tool'", "tool_choice.name")
    return forced_function(choice["name"]), parallel


def _stop_sequences(stops: Optional[list]) -> list[str]:
    if not stops:
        return []
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad_request(f"stop_sequences: {len(stops)} of them; this server takes at most {MAX_STOP_SEQUENCES}",
                          "stop_sequences")
    return list(dict.fromkeys(stops))


def _thinking(thinking: Any) -> Optional[dict]:
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in _THINKING:
        raise bad_request(f"thinking: must be an object whose type is one of {sorted(_THINKING)}", "thinking")
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise bad_request("thinking.budget_tokens: Field required with type 'enabled', as a positive integer",
                          "thinking.budget_tokens")
    return thinking


def _output_format(config: Any) -> Optional[dict]:
    """``output_config.format`` (``{"type": "json_schema", "schema"}``) as chat's ``response_format``;
    ``output_config.effort`` is accepted and ignored."""
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) - {"effort", "format"}:
        raise bad_request("output_config: must be an object with 'effort' and/or 'format'", "output_config")
    spec = config.get("format")
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") != "json_schema" or not isinstance(spec.get("schema"), dict):
        raise bad_request("output_config.format: must be {'type': 'json_schema', 'schema': {...}}",
                          "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": spec["schema"]}}
