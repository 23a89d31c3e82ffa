"""Reasoning: a reply's thinking as ``reasoning_content``, apart from its ``content``.

Reasoning models think before they answer, in markup their chat template
shows:

* ``<think>...</think>`` (Qwen3, QwQ, Qwen3.5, DeepSeek-R1 and its distills,
  GLM-4.5+, SmolLM3, ...), ``[THINK]...[/THINK]`` (Magistral, Ministral 3
  Reasoning), ``<seed:think>...</seed:think>`` (Seed-OSS): read here;
* gpt-oss's ``analysis`` channel: read by its tool-call format
  (:mod:`.tools.harmony`), which carries the whole reply;
* any other markup a template writes around a turn's ``reasoning_content``
  (``<|START_THINKING|>``, ``<mm:think>``, ...), read off a render of it
  (:func:`.tools.template_markers.derive_reasoning`).

A template that opens the block in the prompt (Qwen3.5's and Qwen3's
generation prompt ends with ``<think>\\n`` when thinking is on; llama.cpp's
"thinking forced open") makes the reply start inside it, without the
opening tag: that is read from the rendered prompt.  The block's own
whitespace is dropped, and so is the whitespace between it and the content;
a block that never closes (the reply ran out of tokens) is all reasoning.
The text after it is the content, read for tool calls when there are tools,
so a reply has reasoning, then content, then calls.

``reasoning_format`` (as llama.cpp's server takes it): ``"auto"`` (the
default; ``"deepseek"`` is the same) extracts the reasoning; ``"none"``
leaves the reply as it is, markup and all, in ``content``.
``chat_template_kwargs`` are variables for the template (``enable_thinking``,
``reasoning_effort``, anything a template reads).  Messages sent back may
carry ``reasoning_content`` (or ollama's ``reasoning``, the same), which a
template that knows it shows (gpt-oss's reads it as ``thinking``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..errors import InvalidArgumentError
from ..sampling.lazy import ReasoningSpan
from .tools.template_markers import derive_reasoning
from .tools.base import CallStream, Event, ParsedReply, ToolCallParser, ToolSpecs, collect, find_first, partial_suffix

REASONING_FORMATS = ("auto", "none", "deepseek")
#: Template variables that chat_template_kwargs may not set: the render's own arguments.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


@dataclass(frozen=True)
class ThinkTags:
    start: str
    end: str


#: The reasoning markup of each family, tried in order against a template's source.
THINK_TAGS = (ThinkTags("<seed:think>", "</seed:think>"), ThinkTags("[THINK]", "[/THINK]"),
              ThinkTags("<think>", "</think>"))


def extracts_reasoning(reasoning_format: Optional[str]) -> bool:
    """Whether ``reasoning_format`` asks for the reasoning apart (None: the default, ``"auto"``)."""
    if reasoning_format is None:
        return True
    if not isinstance(reasoning_format, str) or reasoning_format not in REASONING_FORMATS:
        raise InvalidArgumentError(f"reasoning_format must be one of {list(REASONING_FORMATS)}, "
                                   f"got {reasoning_format!r}")
    return reasoning_format != "none"


def think_tags(template_source: str) -> Optional[ThinkTags]:
    """The reasoning markup a chat template shows, or None: one of :data:`THINK_TAGS` in its
    source, else the markup it writes around a turn's ``reasoning_content`` (derived from a
    render, as llama.cpp's autoparser derives it: Cohere's ``<|START_THINKING|>``, MiniMax-M3's
    ``<mm:think>``, Hunyuan's ``<think:opensource>``)."""
    source = template_source or ""
    for tags in THINK_TAGS:
        if tags.start in source and tags.end in source:
            return tags
    derived = derive_reasoning(source)
    return ThinkTags(*derived) if derived is not None else None


def thinking_forced_open(tags: ThinkTags, prompt: str) -> bool:
    """Whether the prompt ends inside an opened reasoning block (the reply starts in it)."""
    return prompt.rstrip().endswith(tags.start)


def template_kwargs(chat_template_kwargs: Any) -> dict:
    """``chat_template_kwargs``, checked: a dict of variables for the template."""
    if chat_template_kwargs is None:
        return {}
    if not isinstance(chat_template_kwargs, Mapping):
        raise InvalidArgumentError("chat_template_kwargs must be a dict of template variables, "
                                   f"got {type(chat_template_kwargs).__name__}")
    for key in chat_template_kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise InvalidArgumentError(f"chat_template_kwargs keys must be variable names, got {key!r}")
        if key in RESERVED_TEMPLATE_VARIABLES:
            raise InvalidArgumentError(f"chat_template_kwargs cannot set {key!r}: pass it as its own argument")
    return dict(chat_template_kwargs)


def reasoning_messages(messages: Any, *, thinking_key: bool = False) -> Any:
    """``messages`` with ollama's ``reasoning`` read as ``reasoning_content`` (which wins
    when both are there), and, for a template that reads it so (gpt-oss's), also as ``thinking``."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not any(
            isinstance(m, Mapping) and ("reasoning" in m or (thinking_key and "reasoning_content" in m))
            for m in messages):
        return messages
    out = []
    for message in messages:
        if isinstance(message, Mapping) and ("reasoning" in message or "reasoning_content" in message):
            message = dict(message)
            alias = message.pop("reasoning", None)
            if message.get("reasoning_content") is None and alias is not None:
                message["reasoning_content"] = alias
            if thinking_key and isinstance(message.get("reasoning_content"), str) and "thinking" not in message:
                message["thinking"] = message["reasoning_content"]
        out.append(message)
    return out


class PlainStream(CallStream):
    """A reply that is all content."""

    def feed(self, delta: str) -> list[Event]:
        return [("content", delta)] if delta else []

    def finish(self) -> list[Event]:
        return []


_START, _REASONING, _CONTENT = "start", "reasoning", "content"


class ReasoningStream(CallStream):
    """Reasoning first (in ``tags``, or from the start when the prompt opened them), then
    the rest to ``inner`` (a format's call stream, or content as it is)."""

    def __init__(self, inner: Optional[CallStream], tags: ThinkTags, forced_open: bool,
                 implicit_ends: Sequence[str] = ()):
        super().__init__()
        self._inner = inner if inner is not None else PlainStream()
        self.calls = self._inner.calls
        self._tags = tags
        self._ends = (tags.end, *implicit_ends)
        self._state = _REASONING if forced_open else _START
        self._buffer = ""
        self._lead = True          # whitespace at the start of the reasoning, or of the content after it
        self._pending = ""         # the reasoning's trailing whitespace, held

    def finish(self) -> list[Event]:
        events: list[Event] = []
        self._drain(events, final=True)
        rest, self._buffer = self._buffer, ""
        if self._state == _START:
            events += self._inner.feed(rest)
        elif self._state == _REASONING:
            self._reasoning(rest, events)
        elif rest and not (self._lead and not rest.strip()):
            events += self._inner.feed(rest.lstrip() if self._lead else rest)
        return events + self._inner.finish()

    def _drain(self, events: list[Event], final: bool) -> None:
        while self._buffer:
            if self._state == _START:
                stripped = self._buffer.lstrip()
                if stripped.startswith(self._tags.start):
                    self._buffer = stripped[len(self._tags.start):]
                    self._state = _REASONING
                    continue
                if not final and (not stripped or self._tags.start.startswith(stripped)):
                    return  # maybe the opening tag, still arriving
                self._state, self._lead = _CONTENT, False  # no reasoning: the reply as it is
                continue
            if self._state == _REASONING:
                at, marker = find_first(self._buffer, self._ends)
                if at < 0:
                    keep = 0 if final else partial_suffix(self._buffer, self._ends)
                    self._reasoning(self._buffer[:len(self._buffer) - keep], events)
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return
                self._reasoning(self._buffer[:at], events)
                self._pending = ""
                skip = len(marker) if marker == self._tags.end else 0  # an implicit end is the content's
                self._buffer = self._buffer[at + skip:]
                self._state, self._lead = _CONTENT, True
                continue
            if self._lead:
                stripped = self._buffer.lstrip()
                if not stripped:
                    return  # whitespace between the reasoning and the content: held, then dropped
                self._buffer, self._lead = stripped, False
            events += self._inner.feed(self._buffer)
            self._buffer = ""
            return

    def _reasoning(self, text: str, events: list[Event]) -> None:
        if self._lead:
            text = text.lstrip()
            if not text:
                return
            self._lead = False
        body = text.rstrip()
        if body:
            events.append(("reasoning", self._pending + body))
            self._pending = ""
        self._pending += text[len(body):]


class ReplyParser:
    """How one reply is read: its reasoning, and its tool calls in a format.

    ``fmt`` is the template's tool-call format (None: no calls); ``tags`` its
    reasoning markup (None: none), ``forced_open`` whether the prompt opened
    it; ``extract`` is ``reasoning_format``'s answer; ``parse_calls`` whether
    calls are read (tools were given, and ``tool_choice`` is not ``"none"``)."""

    def __init__(self, fmt: Optional[ToolCallParser], tools: Any = (), *, parse_calls: bool = True,
                 tags: Optional[ThinkTags] = None, forced_open: bool = False, extract: bool = True):
        self.format = fmt
        self.tools = ToolSpecs.of(tools)
        self.parses_calls = bool(parse_calls and fmt is not None)
        self.tags = tags
        self.forced_open = bool(forced_open and tags is not None)
        self.extract = extract

    @property
    def tool_names(self) -> tuple[str, ...]:
        return self.tools.names

    @property
    def preserved_tokens(self) -> tuple[str, ...]:
        """The control tokens the reply's text must show for it to be read."""
        tokens: tuple[str, ...] = ()
        if self.format is not None and (self.parses_calls or self.format.handles_reasoning):
            tokens += self.format.preserved_tokens
        if self.tags is not None:
            tokens += (self.tags.start, self.tags.end)
        return tokens

    def stream(self) -> CallStream:
        fmt = self.format
        if fmt is not None and fmt.handles_reasoning:
            return fmt.stream(self.tools, extract_reasoning=self.extract, parse_calls=self.parses_calls)
        inner = fmt.stream(self.tools) if fmt is not None and self.parses_calls else None
        if self.tags is not None and self.extract:
            return ReasoningStream(inner, self.tags, self.forced_open, self._implicit_ends())
        return inner if inner is not None else PlainStream()

    def reasoning_span(self) -> Optional[ReasoningSpan]:
        """The reasoning markup as the tool-call constraint sees it (None: no reasoning is read),
        so that a marker inside the reasoning starts no call, as it starts none here."""
        if self.tags is None or not self.extract or (self.format is not None and self.format.handles_reasoning):
            return None
        return ReasoningSpan(self.tags.start, self.tags.end, self.forced_open, self._implicit_ends())

    def _implicit_ends(self) -> tuple[str, ...]:
        # Qwen3 models may start a call without closing their reasoning: <tool_call> closes it then.
        if self.format is None or not self.parses_calls:
            return ()
        return tuple(t for t in self.format.start_tags if t == "<tool_call>")

    def parse(self, text: str) -> ParsedReply:
        return collect(self.stream(), [text])


def reply_parser(fmt: Optional[ToolCallParser], template_source: str, prompt: str, *, parse_calls: bool,
                 tools: Any = (), reasoning_format: Optional[str] = None) -> Optional[ReplyParser]:
    """The parser of a reply to ``prompt``, or None when the reply is plain text
    (no calls to read, and no reasoning markup in the template)."""
    extract = extracts_reasoning(reasoning_format)
    tags = think_tags(template_source)
    if fmt is not None and fmt.handles_reasoning:
        tags = None
    elif not parse_calls:
        fmt = None
    if fmt is None and tags is None:
        return None
    return ReplyParser(fmt, tools, parse_calls=parse_calls, tags=tags,
                       forced_open=tags is not None and thinking_forced_open(tags, prompt), extract=extract)
