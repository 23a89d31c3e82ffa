"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions``, checked into a :class:`~..call.Call`.

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

The Responses and Messages APIs translate their bodies into a chat body and
check it here, so the server's bounds hold the same way for them.
"""
from __future__ import annotations

import numbers
from typing import Any, Optional, Union

from ...api.prompts import IMAGE_PART_TYPES, content_text
from ...api.reasoning import REASONING_FORMATS
from ...api.tools.parsers import format_named
from ...errors import InvalidArgumentError
from ...sampling.logprobs import chat_logprobs_count
from ..call import Call
from ..config import ServerConfig
from ..errors import bad_request
from ..lora import LORA_LIST
from ..fields import (ANY, BOOLEAN, FLAG, LIST, NONEMPTY_LIST, OBJECT, POSITIVE_INTEGER, STRING, Field, Kind, Spec,
                      number_in, one_of)

# Handed to the library as they are; it checks them.
_PASSED_ON = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "logit_bias", "seed",
              "top_k", "min_p", "repeat_penalty", "grammar")
_PENALTY = Field(number_in(-2, 2), message="{path} must be a number in [-2, 2], got {value!r}")  # OpenAI's range
_MAX_TOKENS = Field(POSITIVE_INTEGER, message="{path} must be a positive integer, got {value!r}")
_STOP = Kind("a string or a list of at most 4 non-empty strings", lambda value: bool(value) if isinstance(
    value, str) else isinstance(value, list) and len(value) <= 4 and all(isinstance(s, str) and s for s in value))

_COMMON = {
    **{name: Field() for name in _PASSED_ON},
    "presence_penalty": _PENALTY,
    "frequency_penalty": _PENALTY,
    "model": Field(STRING),
    "stream": Field(BOOLEAN),
    "stream_options": Field(),  # only with stream: true, so checked with it
    "stop": Field(_STOP),
    "max_tokens": _MAX_TOKENS,
    "n": Field(one_of(1), message="{path} must be 1: one choice per request"),
    "user": Field(STRING),
    "logprobs": Field(),  # checked with top_logprobs by the sampling layer
    "lora": Field(LORA_LIST),   # llama-server's per-request adapter scales
}
CHAT = Spec({
    **_COMMON,
    "messages": Field(NONEMPTY_LIST, required=True, message="{path} must be a non-empty list"),
    "max_completion_tokens": _MAX_TOKENS,
    "tools": Field(LIST, message="{path} must be a list of function tools"),
    "tool_choice": Field(),  # checked by the library against the tools
    "parallel_tool_calls": Field(FLAG),
    "top_logprobs": Field(),
    "response_format": Field(OBJECT),
    "reasoning_format": Field(STRING),
    "chat_template_kwargs": Field(OBJECT, message="{path} must be an object of template variables"),
    "tool_call_format": Field(STRING),
})
COMPLETION = Spec({
    **_COMMON,
    "prompt": Field(ANY),
    "echo": Field(BOOLEAN),
    "suffix": Field(STRING),
    "best_of": Field(one_of(1), message="{path} must be 1"),
})
_ROLES = {"system", "developer", "user", "assistant", "tool"}


def chat_call(body: Any, config: ServerConfig) -> Call:
    body = CHAT.check(body)
    call = Call(chat=True, **_common(body, config))
    if body.get("max_completion_tokens") is not None:  # the newer name wins, as in OpenAI's API
        call.options["max_tokens"] = _max_tokens(body, "max_completion_tokens", config)
    call.messages = _messages(body["messages"], config)
    call.tools = body.get("tools")
    call.tool_choice = body.get("tool_choice")
    for name in ("parallel_tool_calls", "response_format", "reasoning_format", "tool_call_format",
                 "chat_template_kwargs"):
        if body.get(name) is not None:
            call.options[name] = body[name]
    if call.options.get("reasoning_format", "auto") not in REASONING_FORMATS:
        raise bad_request(f"reasoning_format must be one of {list(REASONING_FORMATS)}", "reasoning_format")
    if "tool_call_format" in call.options:
        try:
            format_named(call.options["tool_call_format"])
        except InvalidArgumentError as error:
            raise bad_request(str(error), "tool_call_format") from None
    try:
        n_top = chat_logprobs_count(body.get("logprobs"), body.get("top_logprobs"))
    except InvalidArgumentError as error:
        raise bad_request(str(error), "top_logprobs" if "top_logprobs" in str(error) else "logprobs") from None
    if n_top is not None:
        call.options["logprobs"] = n_top
    return call


def completion_call(body: Any, config: ServerConfig) -> Call:
    body = COMPLETION.check(body)
    call = Call(chat=False, **_common(body, config))
    call.options.setdefault("max_tokens", 16)  # OpenAI's default for completions
    call.prompt = _prompt(body.get("prompt"))
    call.echo = body.get("echo") is True
    if body.get("logprobs") is not None:
        if call.echo:
            raise bad_request("logprobs together with echo are not supported", "logprobs")
        call.options["logprobs"] = body["logprobs"]       # checked by the library (0..20)
    if body.get("suffix"):  # fill-in-the-middle; a model without FIM tokens refuses it
        call.options["suffix"] = body["suffix"]
    return call


def _common(body: dict, config: ServerConfig) -> dict:
    stream = body.get("stream") is True
    options: dict = {name: body[name] for name in _PASSED_ON if body.get(name) is not None}
    if body.get("lora"):   # an empty list: the server's scales, as llama-server
        options["lora"] = body["lora"]
    if body.get("max_tokens") is not None:
        options["max_tokens"] = _max_tokens(body, "max_tokens", config)
    stop = body.get("stop")
    if stop is not None:
        options["stop"] = [stop] if isinstance(stop, str) else stop
    return {"model": body.get("model"), "stream": stream, "include_usage": _include_usage(body, stream),
            "options": options}


def _include_usage(body: dict, stream: bool) -> bool:
    stream_options = body.get("stream_options")
    if stream_options is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise bad_request("stream_options must be {'include_usage': bool}", "stream_options")
    include = stream_options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise bad_request("include_usage must be a boolean", "include_usage")
    return include is True


def _max_tokens(body: dict, name: str, config: ServerConfig) -> int:
    value = body[name]
    if config.max_tokens_limit is not None and value > config.max_tokens_limit:
        raise bad_request(f"{name} is {value}; this server allows at most {config.max_tokens_limit}", name)
    return value


def _messages(messages: list, config: ServerConfig) -> list:
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


def _content(content: Any, message: dict, param: str) -> Union[str, list, None]:
    if content is None:
        if message["role"] == "assistant" and message.get("tool_calls"):
            return None
        raise bad_request(f"{param} is missing", param)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if any(isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES for part in content):
            # Images go to the model as parts: one opened with a projector reads them (api/images.py),
            # a text model refuses them with a 400 naming the part.
            for index, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") not in ("text", *IMAGE_PART_TYPES):
                    raise bad_request(f"{param}[{index}] must be a text or an image part", f"{param}[{index}]")
            return content
        try:
            return content_text(content, param)
        except InvalidArgumentError as error:
            raise bad_request(str(error), param) from None
    raise bad_request(f"{param} must be a string or a list of text and image parts", param)


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
