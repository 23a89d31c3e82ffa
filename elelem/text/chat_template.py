"""Chat templates: the GGUF's Jinja ``tokenizer.chat_template``, rendered in a sandbox.

A chat template turns a list of messages into the prompt text a model was
trained on. GGUF files carry it as Jinja source, the same source Hugging Face
``transformers`` renders with ``apply_chat_template``; :class:`ChatTemplate`
renders it the same way (``ImmutableSandboxedEnvironment``, ``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``,
``strftime_now`` and HF's ``tojson``), so prompts match what the model saw in
training. Models without a template get :data:`CHATML_TEMPLATE`.

The template comes from a model file, so it is untrusted code: it renders in
the sandbox of :mod:`elelem.text.template_sandbox`, under a budget
(:class:`RenderLimits`), and what goes into it is checked here first.

Differences from ``transformers``, all deliberate:

* ``render`` defaults to ``add_generation_prompt=True`` (elelem renders
  prompts to generate from);
* messages are validated (see :meth:`ChatTemplate.render`), and all data given
  to the template must be plain JSON-like values -- tools are JSON schemas, not
  Python functions to be converted;
* the ``{% generation %}`` tag is accepted but only renders its body (elelem
  does not build assistant-token masks).
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import GGUFError, InvalidArgumentError, InvalidTokenError, TemplateError, TemplateLimitError
from .template_sandbox import (
    MAX_CALL_DEPTH,
    MAX_OUTPUT_CHARS,
    MAX_RANGE_ITEMS,
    MAX_TEMPLATE_CHARS,
    MAX_TEMPLATE_TOKENS,
    MAX_WORK_CHARS,
    RENDER_TIMEOUT_S,
    RenderLimits,
    compile_template,
    render_template,
)

__all__ = [
    "ChatTemplate",
    "RenderLimits",
    "CHATML_TEMPLATE",
    "RENDER_TIMEOUT_S",
    "MAX_OUTPUT_CHARS",
    "MAX_WORK_CHARS",
    "MAX_RANGE_ITEMS",
    "MAX_CALL_DEPTH",
    "MAX_TEMPLATE_CHARS",
    "MAX_TEMPLATE_TOKENS",
]

logger = logging.getLogger("elelem")

# Nesting depth allowed in the messages, tools and other data given to a template.
_MAX_DATA_DEPTH = 64

#: ChatML, used when a model has no template of its own (llama.cpp makes the
#: same choice). Assistant tool calls are written Hermes-style, one
#: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` each; a ``tools``
#: list is not shown to the model, as ChatML has no convention for it.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
    "{%- if message['tool_calls'] is defined -%}"
    "{%- for tool_call in message['tool_calls'] -%}"
    "{%- set call = tool_call['function'] if tool_call['function'] is defined else tool_call -%}"
    "{%- set arguments = call['arguments'] if call['arguments'] is defined else {} -%}"
    "{%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n' + {'name': call['name'], 'arguments': arguments} | tojson + '\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


# --- validating what goes into a template -------------------------------------------


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """A copy of ``value`` made only of JSON-like Python types.

    Templates can call methods on what they are given; restricting the data to
    str, numbers, bools, None, lists and dicts keeps objects with dangerous
    methods (files, models, arrays) out of the sandbox.
    """
    if depth > _MAX_DATA_DEPTH:
        raise InvalidArgumentError(f"{where} is nested more than {_MAX_DATA_DEPTH} levels deep")
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass may carry extra methods
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, numbers.Real))):
                raise InvalidArgumentError(f"{where} has a key of type {type(key).__name__}; use strings")
            plain_key = _plain(key, where, depth + 1)
            plain[plain_key] = _plain(item, f"{where}[{plain_key!r}]", depth + 1)
        return plain
    if isinstance(value, (list, tuple)):
        items = [_plain(item, f"{where}[{index}]", depth + 1) for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise InvalidArgumentError(
        f"{where} is a {type(value).__name__}; chat template data must be str, int, float, bool, None, list or dict"
    )


def _checked_tool_calls(tool_calls: Any, where: str) -> None:
    if isinstance(tool_calls, (str, bytes)) or not isinstance(tool_calls, Sequence):
        raise InvalidArgumentError(f"{where}['tool_calls'] must be a list of tool calls")
    for index, tool_call in enumerate(tool_calls):
        call_where = f"{where}['tool_calls'][{index}]"
        if not isinstance(tool_call, Mapping):
            raise InvalidArgumentError(f"{call_where} must be a dict, got {type(tool_call).__name__}")
        # OpenAI nests the call under 'function'; some callers pass it flat.
        function = tool_call.get("function", tool_call)
        if not isinstance(function, Mapping):
            raise InvalidArgumentError(f"{call_where}['function'] must be a dict, got {type(function).__name__}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidArgumentError(f"{call_where} needs a non-empty string 'name'")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, (str, Mapping)):
            raise InvalidArgumentError(
                f"{call_where}['arguments'] must be a dict or a JSON string, got {type(arguments).__name__}"
            )


def _checked_messages(messages: Any) -> list[dict]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("messages must be a list of dicts like {'role': 'user', 'content': '...'}")
    if not messages:
        raise InvalidArgumentError("messages must not be empty")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise InvalidArgumentError(
                f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidArgumentError(f"{where}['role'] must be a non-empty string, got {role!r}")
        tool_calls = message.get("tool_calls")
        if "content" not in message and not (role == "assistant" and tool_calls):
            raise InvalidArgumentError(
                f"{where} has no 'content' (only an assistant message with tool_calls may omit it)"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise InvalidArgumentError(f"{where}['content'] must be a string or None, got {type(content).__name__}")
        if tool_calls is not None:
            if role != "assistant":
                raise InvalidArgumentError(f"{where} has 'tool_calls' but only assistant messages may make tool calls")
            _checked_tool_calls(tool_calls, where)
        if message.get("tool_call_id") is not None:
            if role != "tool":
                raise InvalidArgumentError(f"{where} has 'tool_call_id' but only tool messages answer a tool call")
            if not isinstance(message["tool_call_id"], str):
                raise InvalidArgumentError(f"{where}['tool_call_id'] must be a string")
        if message.get("name") is not None and not isinstance(message["name"], str):
            raise InvalidArgumentError(f"{where}['name'] must be a string")
        # Drop None-valued keys (templates test for a missing ``name`` or
        # ``tool_call_id``, and would print "None"), except ``content``: every
        # message keeps it, None (or, beside tool calls, absent) being "" as
        # llama.cpp gives it -- templates read ``message.content`` (Qwen3's,
        # DeepSeek-R1's, SmolLM2's) and test it with ``in`` or ``+``.
        plain = {key: value for key, value in message.items() if value is not None}
        plain.setdefault("content", "")
        checked.append(_plain(plain, where))
    return checked


def _checked_dict_list(value: Any, name: str) -> list | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"{name} must be a list of dicts")
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise InvalidArgumentError(
                f"{name}[{index}] must be a dict (a JSON schema for tools), got {type(item).__name__}"
            )
    return _plain(list(value), name)


# --- the public class ---------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template, ready to render conversations into prompts.

    ``source`` is Jinja source as found in ``tokenizer.chat_template``;
    ``bos_token``/``eos_token`` are the token *strings* the template may print.
    The source is compiled (and cached by its text) here, so a broken template
    fails at construction with :class:`~elelem.errors.TemplateError`.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        limits: RenderLimits | None = None,
    ) -> None:
        if not isinstance(source, str):
            raise InvalidArgumentError(f"a chat template must be a string of Jinja source, got {type(source).__name__}")
        if not source.strip():
            raise TemplateError("the chat template is empty")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TemplateLimitError(
                f"the chat template has {len(source):,} characters; the limit is {MAX_TEMPLATE_CHARS:,}"
            )
        for name, token in (("bos_token", bos_token), ("eos_token", eos_token)):
            if not isinstance(token, str):
                raise InvalidArgumentError(f"{name} must be a string, got {type(token).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.limits = limits if limits is not None else RenderLimits()
        #: True when this is the ChatML fallback for a model without a template.
        self.is_fallback = False
        self._template = compile_template(source)

    @classmethod
    def from_metadata(
        cls,
        metadata: Mapping[str, Any],
        *,
        token_text: Callable[[int], str] | None = None,
        name: str | None = None,
        limits: RenderLimits | None = None,
    ) -> ChatTemplate:
        """The template a GGUF file's metadata describes.

        Reads ``tokenizer.chat_template`` (or ``tokenizer.chat_template.<name>``
        for one of a model's named templates, such as ``"tool_use"``). The BOS
        and EOS strings come from ``tokenizer.ggml.bos_token_id`` /
        ``eos_token_id``, looked up with ``token_text`` or else in the
        ``tokenizer.ggml.tokens`` list. A model without a template gets
        :data:`CHATML_TEMPLATE` (``is_fallback`` is then True), as llama.cpp does.
        """
        key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
        source = _metadata_text(metadata.get(key), key)
        if name is not None and source is None:
            available = metadata.get("tokenizer.chat_templates") or []
            raise TemplateError(f"the model has no chat template named {name!r} (it has: {list(available)})")
        bos_token = _special_token_text(metadata, "tokenizer.ggml.bos_token_id", token_text)
        eos_token = _special_token_text(metadata, "tokenizer.ggml.eos_token_id", token_text)
        if source is None or not source.strip():
            logger.info("the model has no chat template; using ChatML")
            template = cls(CHATML_TEMPLATE, bos_token=bos_token, eos_token=eos_token, limits=limits)
            template.is_fallback = True
            return template
        return cls(source, bos_token=bos_token, eos_token=eos_token, limits=limits)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages``.

        Each message is a dict with a non-empty string ``role`` and a
        ``content`` that is a string or None; an assistant message may carry
        ``tool_calls`` (a list of ``{"function": {"name", "arguments"}}``, and
        may then omit ``content``), a tool message ``tool_call_id``, and any
        message a string ``name``. Other keys are passed through. Bad shapes
        raise :class:`~elelem.errors.InvalidArgumentError`.

        ``tools`` (JSON schemas) and ``documents`` are handed to the template
        as they are (absent or empty tools, and absent documents, are left
        undefined, as llama.cpp leaves them), and so is ``extra`` (e.g.
        ``enable_thinking=False``), which may also override ``bos_token``/``eos_token``. With
        ``add_generation_prompt`` the prompt ends with the header of an
        assistant turn, ready for the model to continue.

        Raises :class:`~elelem.errors.TemplateError` when the template fails or
        calls ``raise_exception``; its subclasses
        :class:`~elelem.errors.UnsafeTemplateError` and
        :class:`~elelem.errors.TemplateLimitError` say the template tried to
        leave the sandbox or to exceed :attr:`limits`.
        """
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **{key: _plain(value, key) for key, value in extra.items()},
            "messages": _checked_messages(messages),
            "add_generation_prompt": bool(add_generation_prompt),
        }
        # Absent (or empty) tools are undefined, as llama.cpp leaves them: templates test
        # ``tools is defined`` or ``is not none`` before they write a tool section.
        tool_list = _checked_dict_list(tools, "tools")
        if tool_list:
            variables["tools"] = tool_list
        document_list = _checked_dict_list(documents, "documents")
        if document_list is not None:
            variables["documents"] = document_list
        return render_template(self._template, variables, self.limits)

    def __repr__(self) -> str:
        kind = "ChatML fallback" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind}, bos_token={self.bos_token!r}, eos_token={self.eos_token!r})"


def _metadata_text(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise GGUFError(f"{key} is not valid UTF-8") from error
    raise GGUFError(f"{key} must be a string, got {type(value).__name__}")


def _special_token_text(metadata: Mapping[str, Any], key: str, token_text: Callable[[int], str] | None) -> str:
    token_id = metadata.get(key)
    if token_id is None:
        return ""
    if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
        raise GGUFError(f"{key} must be an integer, got {token_id!r}")
    token_id = int(token_id)
    if token_text is not None:
        return _metadata_text(token_text(token_id), key) or ""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        logger.debug("%s is set but the metadata has no token list; using an empty string", key)
        return ""
    if not 0 <= token_id < len(tokens):
        raise InvalidTokenError(f"{key} is {token_id}, outside the vocabulary [0, {len(tokens)})")
    return _metadata_text(tokens[token_id], key) or ""
