"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions``, checked field by field.

Every field OpenAI defines for these endpoints is either used, accepted when
it asks for the only behaviour there is (``n`` of 1), or refused with a
400 naming it; an unknown field is refused too, so a typo
never passes silently.  llama.cpp's sampling extensions (``top_k``,
``min_p``, ``repeat_penalty``) and its ``grammar`` (GBNF text) are accepted
as well, and so are its ``reasoning_format`` (``"auto"``: a reasoning
model's thinking as ``reasoning_content``; ``"none"``: left in the content)
and ``chat_template_kwargs`` (variables for the chat template, e.g.
``{"enable_thinking": false}``); ``tool_call_format`` names the format of a
model's tool calls when its template does not show it.  ``response_format``
is passed to the library, which compiles it (a schema it cannot enforce is
a 400 naming the keyword).  Value ranges
(temperature, penalties, logit_bias ids) are checked by the library, whose
errors become 400s too.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Optional

from ..api.prompts import content_text
from ..api.reasoning import REASONING_FORMATS
from ..api.tools.parsers import format_named
from ..errors import InvalidArgumentError
from ..sampling.logprobs import chat_logprobs_count
from .config import ServerConfig
from .errors import bad_request

_SAMPLING = {"temperature", "top_p", "presence_penalty", "frequency_penalty", "logit_bias", "seed",
             "top_k", "min_p", "repeat_penalty"}
_PASSED_ON = _SAMPLING | {"grammar"}  # handed to the library as they are; it checks them
_COMMON = _PASSED_ON | {"model", "stream", "stream_options", "stop", "max_tokens", "n", "user", "logprobs"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
                   "top_logprobs", "response_format", "reasoning_format", "chat_template_kwargs",
                   "tool_call_format"}
_COMPLETION = _COMMON | {"prompt", "echo", "suffix", "best_of"}
_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass
class Call:
    """One checked request: what to run and how to answer."""

    chat: bool
    model: Optional[str]
    stream: bool = False
    include_usage: bool = False
    messages: list = field(default_factory=list)
    tools: Optional[list] = None
    tool_choice: Any = None
    prompt: Any = None
    echo: bool = False
    options: dict = field(default_factory=dict)   # max_tokens, stop and sampling, as the library takes them


def chat_call(body: Any, config: ServerConfig) -> Call:
    body = _object(body)
    _known(body, _CHAT)
    call = Call(chat=True, **_common(body, config))
    if body.get("max_completion_tokens") is not None:  # the newer name wins, as in OpenAI's API
        call.options["max_tokens"] = _max_tokens(body, "max_completion_tokens", config)
    call.messages = _messages(body.get("messages"), config)
    call.tools = body.get("tools")
    if call.tools is not None and not isinstance(call.tools, list):
        raise bad_request("tools must be a list of function tools", "tools")
    call.tool_choice = body.get("tool_choice")
    if body.get("parallel_tool_calls") not in (None, True, False):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if body.get("parallel_tool_calls") is not None:
        call.options["parallel_tool_calls"] = body["parallel_tool_calls"]
    response_format = body.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict):
            raise bad_request("response_format must be an object", "response_format")
        call.options["response_format"] = response_format
    _reasoning_options(body, call.options)
    try:
        n_top = chat_logprobs_count(body.get("logprobs"), body.get("top_logprobs"))
    except InvalidArgumentError as error:
        raise bad_request(str(error), "top_logprobs" if "top_logprobs" in str(error) else "logprobs") from None
    if n_top is not None:
        call.options["logprobs"] = n_top
    return call


def _reasoning_options(body: dict, options: dict) -> None:
    """llama.cpp's server fields: ``reasoning_format``, ``chat_template_kwargs``; and elelem's
    ``tool_call_format``.  Their values are checked by the library (its errors are 400s)."""
    for name in ("reasoning_format", "tool_call_format"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise bad_request(f"{name} must be a string", name)
            options[name] = value
    if options.get("reasoning_format", "auto") not in REASONING_FORMATS:
        raise bad_request(f"reasoning_format must be one of {list(REASONING_FORMATS)}", "reasoning_format")
    if "tool_call_format" in options:
        try:
            format_named(options["tool_call_format"])
        except InvalidArgumentError as error:
            raise bad_request(str(error), "tool_call_format") from None
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise bad_request("chat_template_kwargs must be an object of template variables",
                              "chat_template_kwargs")
        options["chat_template_kwargs"] = kwargs


def completion_call(body: Any, config: ServerConfig) -> Call:
    body = _object(body)
    _known(body, _COMPLETION)
    call = Call(chat=False, **_common(body, config))
    call.options.setdefault("max_tokens", 16)  # OpenAI's default for completions
    call.prompt = _prompt(body.get("prompt"))
    call.echo = _flag(body, "echo")
    if body.get("logprobs") is not None:
        if call.echo:
            raise bad_request("logprobs together with echo are not supported", "logprobs")
        call.options["logprobs"] = body["logprobs"]       # checked by the library (0..20)
    if body.get("suffix") not in (None, ""):  # fill-in-the-middle; a model without FIM tokens refuses it
        if not isinstance(body["suffix"], str):
            raise bad_request("suffix must be a string", "suffix")
        call.options["suffix"] = body["suffix"]
    if body.get("best_of") not in (None, 1):
        raise bad_request("best_of must be 1", "best_of")
    return call


def _common(body: dict, config: ServerConfig) -> dict:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    if body.get("n") not in (None, 1):
        raise bad_request("n must be 1: one choice per request", "n")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request("user must be a string", "user")
    stream = _flag(body, "stream")
    options: dict = {name: body[name] for name in _PASSED_ON if body.get(name) is not None}
    for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's range; the library takes any
        value = options.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not -2 <= value <= 2:
            raise bad_request(f"{name} must be a number in [-2, 2], got {value!r}", name)
    if body.get("max_tokens") is not None:
        options["max_tokens"] = _max_tokens(body, "max_tokens", config)
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
            raise bad_request("stop must be a string or a list of at most 4 non-empty strings", "stop")
        options["stop"] = stop
    return {"model": model, "stream": stream, "include_usage": _include_usage(body, stream), "options": options}


def _include_usage(body: dict, stream: bool) -> bool:
    stream_options = body.get("stream_options")
    if stream_options is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise bad_request("stream_options must be {'include_usage': bool}", "stream_options")
    return _flag(stream_options, "include_usage")


def _max_tokens(body: dict, name: str, config: ServerConfig) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"{name} must be a positive integer, got {value!r}", name)
    if config.max_tokens_limit is not None and value > config.max_tokens_limit:
        raise bad_request(f"{name} is {value}; this server allows at most {config.max_tokens_limit}", name)
    return value


def _messages(messages: Any, config: ServerConfig) -> list:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    if len(messages) > config.max_messages:
        raise bad_request(f"{len(messages)} messages; this server allows at most {config.max_messages}",
                          "messages")
    checked = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise bad_request(f"{param} must be an object with a role among {sorted(_ROLES)}", param)
        message = dict(message)
        message["content"] = _content(message.get("content"), message, f"{param}.content")
        if message["role"] == "developer":  # OpenAI's newer name for the system role
            message["role"] = "system"
        checked.append(message)
    return checked


def _content(content: Any, message: dict, param: str) -> Optional[str]:
    if content is None:
        if message["role"] == "assistant" and message.get("tool_calls"):
            return None
        raise bad_request(f"{param} is missing", param)
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text ones can be shown to a text model
        try:
            return content_text(content, param)
        except InvalidArgumentError as error:
            raise bad_request(str(error), param) from None
    raise bad_request(f"{param} must be a string or a list of text parts", param)


def _prompt(prompt: Any):
    # A string, a list of token ids, or either wrapped in a list of one (OpenAI allows batches; we run one).
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
        return [int(t) for t in prompt]
    raise bad_request("prompt must be a string or a non-empty list of token ids (one prompt per request)",
                      "prompt")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean", name)
    return value


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def _known(body: dict, names: set) -> None:
    unknown = sorted(set(body) - names)
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}", unknown[0])
