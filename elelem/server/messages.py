"""``POST /v1/messages``: Anthropic's Messages API, over the same chat calls as Chat Completions.

A request is checked field by field and block by block in Anthropic's
terms (its paths, such as ``messages.2.content.0.type``, name what is
wrong), then turned into a Chat Completions body that goes through
:func:`.schema.chat_call`, so the server's bounds hold here too:

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
  it to the template; ``budget_tokens`` is checked and not enforced); the
  reply's reasoning comes back as ``thinking`` blocks.  ``metadata``,
  ``service_tier``, ``cache_control`` and the like are accepted and
  ignored, and so are the ``anthropic-version`` and ``anthropic-beta``
  headers.  Any other field is a 400, as Anthropic's own
  API answers it.

:class:`MessagesWire` writes the answer: a ``message`` object, or the
events ``message_start``, ``content_block_start``/``_delta``/``_stop``
(``text_delta``, ``input_json_delta``, ``thinking_delta``),
``message_delta`` and ``message_stop``.  Every error is Anthropic's
``{"type": "error", "error": {"type", "message"}}``, with its statuses (a
full queue is 529 ``overloaded_error``); an error after a stream started is
an ``event: error``.  The key may come as ``x-api-key`` (Anthropic's
clients) or as ``Authorization: Bearer``.

``stop_sequence`` is always null, and ``stop_reason`` ``end_turn`` when a
stop sequence ended the text: the library's stream does not say which stop
string matched, or whether one did rather than an end-of-generation token.
``usage.cache_read_input_tokens`` counts the prompt's tokens found in the
KV cache (prefix reuse), which ``input_tokens`` then leaves out, as in
Anthropic's accounting.
"""
from __future__ import annotations

import hmac
import json
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import schema
from .config import ServerConfig
from .errors import APIError, bad_request, from_exception
from .generation import Generation
from .wire import Wire, sse

MAX_STOP_SEQUENCES = 64

_SAMPLING = {"temperature", "top_p", "top_k"}
# llama.cpp's sampling extensions, as Chat Completions takes them here.
_EXTENSIONS = {"min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "seed"}
_USED = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "tools", "tool_choice",
         "thinking", "output_config"} | _SAMPLING | _EXTENSIONS
# Accepted and ignored: bookkeeping, and Anthropic's prompt caching (the KV cache reuses prefixes anyway).
_IGNORED = {"metadata", "service_tier", "cache_control", "inference_geo", "speed", "diagnostics",
            "context_management"}
# Each block type, the roles that may send it, its required fields and their types, and its optional ones.
_BLOCKS = {
    "text": ({"user", "assistant"}, {"text": str}, {"cache_control", "citations"}),
    "thinking": ({"assistant"}, {"thinking": str}, {"signature", "cache_control"}),
    "redacted_thinking": ({"assistant"}, {"data": str}, {"cache_control"}),
    "tool_use": ({"assistant"}, {"id": str, "name": str, "input": dict}, {"cache_control", "caller", "toolset_name"}),
    "tool_result": ({"user"}, {"tool_use_id": str}, {"content", "is_error", "cache_control", "toolset_name"}),
}
_UNSUPPORTED_BLOCKS = {"image", "document", "search_result", "container_upload", "server_tool_use",
                       "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
                       "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
                       "tool_search_tool_result", "mcp_tool_use", "mcp_tool_result", "tool_reference",
                       "browser_state"}
_TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict", "input_examples",
              "defer_loading", "eager_input_streaming", "allowed_callers"}
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_THINKING = {"enabled", "disabled", "adaptive"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                529: "overloaded_error"}


@dataclass
class MessagesRequest:
    """A checked Messages request: the chat call to run, and what only this API uses."""

    call: schema.Call
    thinking: Optional[dict] = None  # {"type": "enabled", "budget_tokens": N} etc.: enable_thinking


# -- the route ---------------------------------------------------------------------

def messages_handler(read_body: Callable[[Request, int], Awaitable[Any]]):
    """The handler of ``POST /v1/messages`` for the app's ``_endpoint(..., auth=False)``: it checks the
    key itself (``x-api-key`` or Bearer) and answers every error before the generation in Anthropic's JSON."""
    async def handler(state, request: Request) -> Response:
        config: ServerConfig = state.config
        try:
            check_key(config.api_key, request)
            checked = messages_request(await read_body(request, config.max_body_bytes), config)
            model = state.registry.get(checked.call.model)
            await model.reserve()  # may wait in the queue; 529 with Retry-After past its bounds
        except Exception as error:  # noqa: B902 -- every failure in Anthropic's shape
            return error_response(from_exception(error, config.retry_after_seconds))
        wire = MessagesWire(model.id)
        generation = Generation(request.url.path, model, checked.call, state.metrics, state.limiter,
                                config.retry_after_seconds, live=state.generations, wire=wire)
        wire.bind(generation)
        return generation
    return handler


def check_key(api_key: Optional[str], request: Request) -> None:
    """The server's key, as ``x-api-key: KEY`` or ``Authorization: Bearer KEY`` (either one may match)."""
    if api_key is None:
        return
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    given = [request.headers.get("x-api-key", "")] + ([bearer] if scheme.lower() == "bearer" else [])
    # Compared in constant time, so the response time does not reveal how much of a guess was right.
    if not any(hmac.compare_digest(g.strip().encode(), api_key.encode()) for g in given):
        raise APIError(401, "a missing or wrong API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'")


def error_body(error: APIError) -> tuple[int, dict]:
    """Anthropic's status and JSON for an error (a 503, the server's 'overloaded', is its 529)."""
    status = 529 if error.status == 503 else error.status
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    message = error.message
    if error.param and not message.startswith(error.param):
        message = f"{error.param}: {message}"
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def error_response(error: APIError) -> JSONResponse:
    status, body = error_body(error)
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


# -- the request ---------------------------------------------------------------------

def messages_request(body: Any, config: ServerConfig) -> MessagesRequest:
    """The chat call of a Messages body; a 400 (``APIError``) naming the first thing wrong."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - _USED - _IGNORED)
    if unknown:
        raise bad_request(f"{unknown[0]}: Extra inputs are not permitted (this server does not support it)",
                          unknown[0])
    if body.get("max_tokens") is None:
        raise bad_request("max_tokens: Field required", "max_tokens")
    chat: dict[str, Any] = {"messages": _system(body.get("system")) + _messages(body.get("messages")),
                            "max_tokens": body["max_tokens"]}
    for name in ("model", "stream", *sorted(_SAMPLING | _EXTENSIONS)):
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = _tools(body.get("tools"))
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
    call = schema.chat_call(chat, config)
    stops = _stop_sequences(body.get("stop_sequences"))
    if stops:
        call.options["stop"] = stops
    return MessagesRequest(call, thinking)


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


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: must be a non-empty list of {'role', 'content'} objects", "messages")
    chat = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where}: must be an object whose role is 'user' or 'assistant'", where)
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise bad_request(f"{where}.{extra[0]}: Extra inputs are not permitted", f"{where}.{extra[0]}")
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
                          f"(text, tool_use, tool_result and thinking blocks)", f"{where}.type")
    if kind not in _BLOCKS:
        raise bad_request(f"{where}.type: unknown content block type {kind!r}; expected one of "
                          f"{sorted(_BLOCKS)}", f"{where}.type")
    roles, required, optional = _BLOCKS[kind]
    allowed = kind == "text" if role == "system" else role in roles
    if not allowed:
        place = "a system prompt or a tool result" if role == "system" else f"a {role} message"
        raise bad_request(f"{where}: a {kind!r} block cannot be in {place}", where)
    for name, expected in required.items():
        if not isinstance(block.get(name), expected):
            raise bad_request(f"{where}.{name}: Field required, as {'a string' if expected is str else 'an object'}",
                              f"{where}.{name}")
    extra = sorted(set(block) - {"type"} - set(required) - optional)
    if extra:
        raise bad_request(f"{where}.{extra[0]}: Extra inputs are not permitted", f"{where}.{extra[0]}")
    if kind == "tool_use" and not (block["id"] and block["name"]):
        raise bad_request(f"{where}: a tool_use block needs a non-empty id and name", where)
    if kind == "tool_result":
        if not block["tool_use_id"]:
            raise bad_request(f"{where}.tool_use_id: must not be empty", f"{where}.tool_use_id")
        if block.get("is_error") not in (None, True, False):
            raise bad_request(f"{where}.is_error: must be a boolean", f"{where}.is_error")
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
    if texts or not results:
        results.append({"role": "user", "content": _texts(texts)})
    return results


def _assistant(blocks: list[dict]) -> dict:
    calls = [{"id": b["id"], "type": "function",
              "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}}
             for b in blocks if b["type"] == "tool_use"]
    texts = [b for b in blocks if b["type"] == "text"]
    # Text, or "" beside calls: a template may read a message's content without testing for it.
    message: dict[str, Any] = {"role": "assistant", "content": _texts(texts)}
    thinking = "\n\n".join(b["thinking"] for b in blocks if b["type"] == "thinking")
    if thinking:
        message["reasoning_content"] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> Optional[list]:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools: must be a list of tools", "tools")
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise bad_request(f"{where}: must be an object", where)
        if tool.get("type") not in (None, "custom"):
            raise bad_request(f"{where}.type: {tool['type']!r} (a tool Anthropic's servers run) is not supported; "
                              f"this server takes custom tools, with a name and an input_schema", f"{where}.type")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"{where}.name: Field required, as a non-empty string", f"{where}.name")
        if not isinstance(tool.get("input_schema"), dict):
            raise bad_request(f"{where}.input_schema: Field required, as a JSON schema object",
                              f"{where}.input_schema")
        if tool.get("description") is not None and not isinstance(tool["description"], str):
            raise bad_request(f"{where}.description: must be a string", f"{where}.description")
        extra = sorted(set(tool) - _TOOL_KEYS)
        if extra:
            raise bad_request(f"{where}.{extra[0]}: Extra inputs are not permitted", f"{where}.{extra[0]}")
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any) -> tuple[Any, Optional[bool]]:
    """Chat's ``tool_choice``, and ``parallel_tool_calls`` (False with ``disable_parallel_tool_use``)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in (*_TOOL_CHOICES, "tool"):
        raise bad_request("tool_choice: must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                          "tool_choice")
    extra = sorted(set(choice) - {"type", "name", "disable_parallel_tool_use"})
    if extra:
        raise bad_request(f"tool_choice.{extra[0]}: Extra inputs are not permitted", f"tool_choice.{extra[0]}")
    disable = choice.get("disable_parallel_tool_use")
    if disable not in (None, True, False):
        raise bad_request("tool_choice.disable_parallel_tool_use: must be a boolean",
                          "tool_choice.disable_parallel_tool_use")
    parallel = None if disable is None else not disable
    if kind != "tool":
        return _TOOL_CHOICES[kind], parallel
    if not isinstance(choice.get("name"), str) or not choice["name"]:
        raise bad_request("tool_choice.name: Field required with type 'tool'", "tool_choice.name")
    return {"type": "function", "function": {"name": choice["name"]}}, parallel


def _stop_sequences(stops: Any) -> list[str]:
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("stop_sequences: must be a list of non-empty strings", "stop_sequences")
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


# -- the answer ----------------------------------------------------------------------

def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` id for a chat tool call's ``call_`` one (any other id stays as it is)."""
    return "toolu_" + call_id[len("call_"):] if call_id.startswith("call_") else call_id


def tool_input(arguments: Any) -> dict:
    """A call's ``arguments`` (a JSON string) as a ``tool_use`` block's ``input`` object; arguments that
    are not a JSON object are kept under ``"input"``."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        value = arguments
    return value if isinstance(value, dict) else {"input": value}


class MessagesWire(Wire):
    """A chat answer as a ``message`` object or as the Messages API's stream events.

    ``message_start`` waits for the first output (so an error while the
    prompt is read is still a JSON error with its status, and the usage it
    carries knows the cached prompt tokens); a thinking, text or tool_use
    block opens when its first delta comes, and closes when another kind of
    content, or the end, does.
    """

    def __init__(self, model_id: str):
        self.model_id = model_id
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self._generation = None
        self._started = False
        self._open: Optional[str] = None  # the kind of the open content block
        self._index = -1                  # the last content block's index
        self._tool_blocks: dict[Any, int] = {}  # a chat tool call's index -> its block's
        self._finish: Optional[str] = None

    def bind(self, generation: Generation) -> None:
        """The generation this wire answers for: its library stream has the prompt's token counts."""
        self._generation = generation

    def _stream(self):
        answer = getattr(self._generation, "_answer", None)  # set once the call is started
        return getattr(answer, "text", None)

    def _usage(self, usage: Optional[dict] = None) -> dict:
        stream = self._stream()
        prompt = usage["prompt_tokens"] if usage else (stream.prompt_tokens if stream is not None else 0)
        cached = min(stream.reused_tokens, prompt) if stream is not None else 0
        return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached, "output_tokens": usage["completion_tokens"] if usage else 0}

    # -- a whole answer ---

    def whole(self, response: dict, usage: dict) -> dict:
        choice = response["choices"][0]
        message = choice["message"]
        content: list[dict] = []
        if message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"],
                            "input": tool_input(call["function"].get("arguments"))})
        return {**self._message(content, _STOP_REASONS.get(choice.get("finish_reason"), "end_turn")),
                "usage": self._usage(usage)}

    def _message(self, content: list, stop_reason: Optional[str]) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_id, "content": content,
                "stop_reason": stop_reason, "stop_sequence": None}

    # -- a stream ---

    def events(self, chunk: dict) -> list[bytes]:
        choices = chunk.get("choices") or []
        if not choices:
            return []
        choice = choices[0]
        delta = choice.get("delta") or {}
        out: list[bytes] = []
        if delta.get("reasoning_content"):
            out += self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            out += self._open_block("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") is not None:  # a new call: its block opens
                out += self._close_block()
                out += self._open_block("tool_use", {"type": "tool_use", "id": tool_use_id(call["id"]),
                                                     "name": function.get("name", ""), "input": {}})
                self._tool_blocks[call.get("index")] = self._index
            if function.get("arguments"):
                out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]},
                                       self._tool_blocks.get(call.get("index"), self._index)))
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return self._start() + out if out else []

    def end(self, usage: dict) -> list[bytes]:
        out = self._start() + self._close_block()
        out.append(sse({"type": "message_delta", "delta": {
            "stop_reason": _STOP_REASONS.get(self._finish, "end_turn"), "stop_sequence": None},
            "usage": self._usage(usage)}, event="message_delta"))
        out.append(sse({"type": "message_stop"}, event="message_stop"))
        return out

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [sse({"type": "message_start", "message": {**self._message([], None), "usage": self._usage()}},
                    event="message_start")]

    def _open_block(self, kind: str, block: dict) -> list[bytes]:
        if self._open == kind and kind != "tool_use":
            return []
        out = self._close_block()
        self._index += 1
        self._open = kind
        return out + [sse({"type": "content_block_start", "index": self._index, "content_block": block},
                          event="content_block_start")]

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [sse({"type": "content_block_stop", "index": self._index}, event="content_block_stop")]

    def _delta(self, delta: dict, index: Optional[int] = None) -> bytes:
        return sse({"type": "content_block_delta", "index": self._index if index is None else index,
                    "delta": delta}, event="content_block_delta")

    # -- errors ---

    def error_response(self, error: APIError) -> JSONResponse:
        return error_response(error)

    def error_event(self, error: APIError) -> bytes:
        return sse(error_body(error)[1], event="error")
