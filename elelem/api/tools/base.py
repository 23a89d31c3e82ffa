"""The shared interface of the tool-call formats, and what they have in common.

A format (:class:`ToolCallParser`) is one way a model family writes tool
calls.  Each one, in its own module of this package, says:

* how a call is marked up: :attr:`~ToolCallParser.start_tags` (its
  markers), where a call's body ends (:meth:`~ToolCallParser.body_end`),
  and how a body becomes OpenAI calls (:meth:`~ToolCallParser.read_calls`);
* which control tokens its markup uses (:attr:`~ToolCallParser.preserved_tokens`:
  the reply's text must show them, as llama.cpp's preserved tokens);
* what a constrained call looks like (:meth:`~ToolCallParser.constraint_phases`),
  and where in free text it starts (:meth:`~ToolCallParser.call_triggers`).

Every format reads a reply incrementally: :meth:`ToolCallParser.stream`
gives a :class:`CallStream` fed with text deltas, whatever their split,
which gives back events -- ``("content", text)``, ``("reasoning", text)``
and ``("tool_call", call)`` -- as soon as they are certain.  Text that may be
the start of a marker is held back, so markup never shows up as content.
:meth:`ToolCallParser.parse` is the same stream fed the whole reply at once,
so a reply parses the same, streamed or not.

Broken output never raises: a call whose body does not parse, that names
a function that is not among the tools, or that never ends, goes back as
content, markup included, and a warning is logged.
"""
from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from ...sampling.lazy import Trigger
from ...text.stop_strings import partial_suffix  # noqa: F401 -- the tool parsers hold back a tag's start with it

log = logging.getLogger("elelem")

Event = tuple  # ("content", str) | ("reasoning", str) | ("tool_call", dict)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_dict(name: str, arguments: Any, call_id: Optional[str] = None) -> dict:
    """OpenAI's shape: ``{"id", "type": "function", "function": {"name", "arguments"}}``,
    with ``arguments`` as a JSON string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


@dataclass
class ParsedReply:
    """A reply split into its text (``content``, None when empty), its tool
    calls, and its reasoning (``reasoning``, None when there is none)."""

    content: Optional[str]
    tool_calls: list[dict] = field(default_factory=list)
    reasoning: Optional[str] = None


class ToolSpecs:
    """The functions a reply may call: their names and their parameters' schemas.

    Built from OpenAI tools (``{"type": "function", "function": {...}}``),
    function dicts, or bare names (no schemas then).  With no functions at
    all, any name is accepted (a parser used on its own)."""

    def __init__(self, functions: Iterable[Mapping[str, Any]] = ()):
        self.functions: dict[str, Mapping[str, Any]] = {}
        for function in functions:
            name = function.get("name")
            if isinstance(name, str) and name:
                self.functions.setdefault(name, function)

    @classmethod
    def of(cls, tools: Any) -> "ToolSpecs":
        if isinstance(tools, ToolSpecs):
            return tools
        functions: list[Mapping[str, Any]] = []
        for tool in tools or ():
            if isinstance(tool, str):
                functions.append({"name": tool})
            elif isinstance(tool, Mapping):
                inner = tool.get("function")
                functions.append(inner if isinstance(inner, Mapping) else tool)
        return cls(functions)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.functions)

    def known(self, name: Any) -> bool:
        return isinstance(name, str) and bool(name) and (not self.functions or name in self.functions)

    def schema(self, name: str) -> Optional[Mapping[str, Any]]:
        """The JSON schema of ``name``'s parameters (None when unknown)."""
        parameters = self.functions.get(name, {}).get("parameters")
        return parameters if isinstance(parameters, Mapping) else None

    def property_schema(self, name: str, key: str) -> Optional[Mapping[str, Any]]:
        schema = self.schema(name)
        properties = schema.get("properties") if schema is not None else None
        value = properties.get(key) if isinstance(properties, Mapping) else None
        return value if isinstance(value, Mapping) else None


# -- JSON helpers ------------------------------------------------------------------

def load_json(text: str) -> tuple[bool, Any]:
    """(True, value) for valid JSON, else (False, None); never raises."""
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        return False, None


def json_end(text: str, start: int = 0) -> Optional[int]:
    """Where the JSON object or array starting at ``text[start]`` (after
    whitespace) ends: the index after its closing bracket, -1 when the text
    there is not an object or array, None when it is not closed yet.

    Only the brackets outside strings are counted: whether the closed text
    is valid JSON is for :func:`load_json` to say."""
    return JsonEnd(start).scan(text)


class JsonEnd:
    """:func:`json_end` over a text that grows: each :meth:`scan` goes on from where the
    last one stopped, so a long value streamed in many deltas is scanned once."""

    def __init__(self, start: int = 0):
        self._i = start
        self._depth = 0
        self._begun = False
        self._in_string = False
        self._escaped = False

    def scan(self, text: str) -> Optional[int]:
        """As :func:`json_end` (``text`` being the earlier text plus more)."""
        i, n = self._i, len(text)
        if not self._begun:
            while i < n and text[i] in " \t\r\n":
                i += 1
            self._i = i
            if i == n:
                return None
            if text[i] not in "{[":
                return -1
            self._begun = True
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        for j in range(i, n):
            ch = text[j]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    self._i = j + 1
                    return j + 1
        self._i, self._depth, self._in_string, self._escaped = n, depth, in_string, escaped
        return None


def call_of_object(obj: Any, tools: "ToolSpecs", *, keys=("arguments", "parameters")) -> Optional[dict]:
    """The call a decoded ``{"name": ..., "arguments": {...}}`` object stands for, or None.

    ``parameters`` (Llama 3's key) is read as ``arguments``; arguments given
    as a JSON string (OpenAI's way) are decoded; a name outside ``tools`` is
    no call."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name or not tools.known(name):
        return None
    arguments: Any = {}
    for key in keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):
        ok, arguments = load_json(arguments)
        if not ok:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else None
    return tool_call_dict(name, arguments, call_id)


# -- typed values from text (XML formats) --------------------------------------------

_PY_LITERALS = {"True": True, "False": False, "None": None}
_TYPE_CHECKS = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "string": lambda v: isinstance(v, str),
}


def value_types(schema: Optional[Mapping[str, Any]], depth: int = 0) -> set[str]:
    """The JSON types a schema allows (empty: it does not say)."""
    if not isinstance(schema, Mapping) or depth > 8:
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            out: set[str] = set()
            for sub in schema[key]:
                out |= value_types(sub, depth + 1)
            if out:
                return out
    values = schema["enum"] if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if values is not None:
        return {next((t for t, check in _TYPE_CHECKS.items() if t != "number" and check(v)), "number")
                for v in values}
    if "properties" in schema:
        return {"object"}
    if "items" in schema:
        return {"array"}
    return set()


def typed_value(raw: str, schema: Optional[Mapping[str, Any]]) -> Any:
    """A parameter written as text, as the value its schema means (llama.cpp's rule).

    A string where the schema allows only strings; else the JSON the text is
    (Python's ``True``/``False``/``None``, which templates print with
    ``| string``, read as JSON's), if its type is one the schema allows;
    else the text as a string."""
    types = value_types(schema)
    if types == {"string"}:
        return raw
    text = raw.strip()
    ok, value = load_json(text)
    if not ok and text in _PY_LITERALS:
        ok, value = True, _PY_LITERALS[text]
    if ok and (not types or any(_TYPE_CHECKS.get(t, lambda v: False)(value) for t in types)):
        if not (isinstance(value, str) and "string" in types):
            return value
    return raw


# -- the interface -----------------------------------------------------------------

class ToolCallParser:
    """One tool-call format.  The base reads calls between a start and an end
    tag; subclasses set the tags and implement :meth:`parse_call` (or
    override the hooks below) -- see :mod:`.hermes` for the simplest."""

    #: The format's name, as ``tool_call_format=`` takes it.
    name = "base"
    #: The marker a call starts with (``start_tags`` when there are several).
    start_tag = ""
    end_tag = ""
    #: Control tokens the reply's text must show for the markup to be read.
    preserved_tokens: tuple[str, ...] = ()
    #: Whether a reply that is a bare JSON call (no markup) counts as a call.
    bare_calls = False
    #: Whether the format also carries the reply's reasoning (gpt-oss's channels).
    handles_reasoning = False
    #: Whether the family's template reads a turn's reasoning as ``thinking`` (llama.cpp's gpt-oss and
    #: LFM2 handlers copy ``reasoning_content`` there before rendering).
    reasoning_as_thinking = False

    @classmethod
    def for_template(cls, source: str) -> "ToolCallParser":
        """The parser for a chat template of this format (some formats have variants)."""
        return cls()

    @property
    def start_tags(self) -> tuple[str, ...]:
        return (self.start_tag,) if self.start_tag else ()

    # -- parsing hooks ---

    def parse_call(self, body: str) -> Optional[dict]:
        """The OpenAI tool-call dict for the text between the tags, or None if malformed."""
        raise NotImplementedError

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        """The calls of one marked-up body (None: malformed)."""
        call = self.parse_call(body)
        return None if call is None else [call]

    def body_end(self, text: str, tag: str, state: Optional[dict] = None) -> Optional[tuple[int, int]]:
        """Where the body of a call opened by ``tag`` ends in ``text`` (the text
        after the tag, which grows between calls): (end of the body, end of
        its markup), or None while it has not ended.  ``state`` is a dict kept
        for the one call (a scanner that goes on where it stopped)."""
        end = text.find(self.end_tag) if self.end_tag else -1
        return None if end < 0 else (end, end + len(self.end_tag))

    def read_bare(self, text: str, tools: ToolSpecs) -> Optional[list[dict]]:
        """The calls of a reply written as bare JSON (``bare_calls``), or None."""
        return None

    # -- whole replies and streams ---

    def stream(self, tool_names: Any = (), *, extract_reasoning: bool = True,
               parse_calls: bool = True) -> "CallStream":
        """An incremental reader of one reply (``tool_names``: names, tools or a :class:`ToolSpecs`).
        ``extract_reasoning`` and ``parse_calls`` are for a format that carries the reasoning too
        (``handles_reasoning``); one that only reads calls reads them whenever it streams."""
        return TaggedCallStream(self, ToolSpecs.of(tool_names))

    def parse(self, text: str, tool_names: Any = ()) -> ParsedReply:
        """Split a finished reply into content and tool calls (and reasoning, for a format that has it)."""
        return collect(self.stream(tool_names), [text])

    def parse_bare_call(self, text: str, tool_names: Sequence[str]) -> Optional[dict]:
        """A call written without its tags, the whole reply being one call of a
        known tool (small models do this), or None."""
        if not tool_names:
            return None
        calls = self.read_bare(text, ToolSpecs.of(tool_names))
        return calls[0] if calls and len(calls) == 1 else None

    # -- constraining ---

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        """The phases of a constrained call of one of ``functions``
        (:class:`~elelem.sampling.constrained.Forced` tokens and grammars),
        for the model's vocabulary ``vocab`` (:class:`.constrained.Vocabulary`)."""
        raise NotImplementedError(f"the {self.name} format has no constrained calls")

    def call_triggers(self, functions: Sequence[Mapping[str, Any]], vocab, *, required: bool) -> list:
        """Where a call of one of ``functions`` starts in free text, each with the phases that
        hold the call from there (:class:`~elelem.sampling.lazy.Trigger`): by default the
        format's marker, followed by :meth:`constraint_phases`.  ``required``: the reply must
        make a call (a format may then trigger earlier, on a marker every reply writes)."""
        return [Trigger.word(self.start_tag, self.constraint_phases(functions, vocab))]


class CallStream:
    """An incremental reader of one reply: :meth:`feed` text deltas, then :meth:`finish`."""

    _buffer: str  # the text fed and not yet read: each reader that drains a buffer starts it

    def __init__(self):
        self.calls: list[dict] = []

    def feed(self, delta: str) -> list[Event]:
        """By default: the text joins a buffer that ``_drain`` reads as far as it can."""
        events: list[Event] = []
        self._buffer += delta
        self._drain(events, final=False)
        return events

    def _drain(self, events: list[Event], final: bool) -> None:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError


def collect(stream: CallStream, deltas: Iterable[str]) -> ParsedReply:
    """A whole reply out of a stream: content (stripped around calls, as the
    non-streamed response gives it), calls and reasoning."""
    events = [e for d in deltas for e in stream.feed(d)] + stream.finish()
    content = "".join(v for k, v in events if k == "content")
    reasoning = "".join(v for k, v in events if k == "reasoning")
    calls = [v for k, v in events if k == "tool_call"]
    if calls:
        content = content.strip()
    return ParsedReply(content or None, calls, reasoning or None)


def find_first(text: str, tags: Iterable[str]) -> tuple[int, str]:
    """The earliest occurrence of any of ``tags`` in ``text`` (the longest tag on a tie): (index, tag) or (-1, "")."""
    best, found = -1, ""
    for tag in tags:
        i = text.find(tag)
        if i >= 0 and (best < 0 or i < best or (i == best and len(tag) > len(found))):
            best, found = i, tag
    return best, found


_TEXT, _IN_CALL, _MAYBE_BARE = "text", "in_call", "maybe_bare"

#: A Markdown code fence small models put around a bare JSON call (```json ... ```).
_FENCE_OPEN = re.compile(r"\s*```(?:json)?[ \t]*\n")
_FENCE_CLOSE = re.compile(r"\n?```\s*$")


def bare_opening(text: str) -> Optional[bool]:
    """Whether a reply starting with ``text`` may be a bare JSON call (``{``, maybe inside a
    ```json fence): True, False, or None while the text cannot tell yet."""
    stripped = text.lstrip()
    if not stripped:
        return None
    if stripped.startswith("{"):
        return True
    if not stripped.startswith("```"[:len(stripped)]):
        return False
    fence = _FENCE_OPEN.match(text)
    if fence is None:
        return None if "\n" not in stripped and len(stripped) < 16 else False
    rest = text[fence.end():].lstrip()
    return None if not rest else rest.startswith("{")


def unfenced(text: str) -> str:
    """``text`` without the code fence around it, if it has one."""
    fence = _FENCE_OPEN.match(text)
    if fence is None:
        return text
    text = text[fence.end():]
    close = _FENCE_CLOSE.search(text)
    return text[:close.start()] if close is not None else text


class TaggedCallStream(CallStream):
    """Calls marked up by a start tag in the middle of content, read as they complete.

    Text that is certainly not markup is content at once; text that could be
    the start of a marker is held back.  Whitespace between calls is dropped.
    With ``bare_calls``, a reply that starts with ``{`` may be a call written
    without markup: it is held to the end, then read as calls or given back
    as content."""

    def __init__(self, fmt: ToolCallParser, tools: ToolSpecs):
        super().__init__()
        self._fmt = fmt
        self._tools = tools
        self._tags = tuple(t for t in fmt.start_tags if t)
        self._mode = _TEXT
        self._tag = ""
        self._call_state: dict = {}
        self._buffer = ""
        self._started = False      # any non-whitespace content, or a call, seen
        self._pending_space = ""   # whitespace held until we know it is not between calls

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._mode == _MAYBE_BARE:
            calls = self._fmt.read_bare(unfenced(self._buffer), self._tools) if self._tools.functions else None
            if calls:
                self._buffer = ""
                self._emit_calls(calls, events)
            self._mode, self._started = _TEXT, True  # else text, in which marked-up calls are still read
        self._drain(events, final=True)
        buffer, self._buffer = self._buffer, ""
        if self._mode == _IN_CALL:
            self._finish_call(self._tag, buffer, self._tag + buffer, events)
        else:
            self._content(buffer, events)
        if self._pending_space and not self.calls:
            events.append(("content", self._pending_space))
        self._pending_space = ""
        self._mode = _TEXT
        return events

    def _drain(self, events: list[Event], final: bool) -> None:
        while self._buffer:
            if self._mode == _MAYBE_BARE:
                return  # held to the end
            if self._mode == _IN_CALL:
                found = self._fmt.body_end(self._buffer, self._tag, self._call_state)
                if found is None:
                    return
                end, after = found
                body, markup = self._buffer[:end], self._tag + self._buffer[:after]
                self._buffer = self._buffer[after:]
                self._mode = _TEXT
                self._finish_call(self._tag, body, markup, events)
                continue
            if not self._started and self._fmt.bare_calls and self._tools.functions:
                opening = bare_opening(self._buffer)
                if opening is None and not final:
                    return  # whitespace, or a code fence whose first line has not ended
                if opening:
                    self._mode = _MAYBE_BARE
                    return
            start, tag = find_first(self._buffer, self._tags)
            if start >= 0:
                self._content(self._buffer[:start], events)
                self._buffer = self._buffer[start + len(tag):]
                self._mode, self._tag, self._call_state = _IN_CALL, tag, {}
                self._started = True
                continue
            keep = 0 if final else partial_suffix(self._buffer, self._tags)
            self._content(self._buffer[:len(self._buffer) - keep], events)
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return

    def _finish_call(self, tag: str, body: str, markup: str, events: list[Event]) -> None:
        try:
            calls = self._fmt.read_calls(tag, body, self._tools)
        except (ValueError, TypeError, KeyError, RecursionError):
            calls = None
        if calls and all(self._tools.known(c["function"]["name"]) for c in calls):
            self._emit_calls(calls, events)
            return
        log.warning("a %s tool call in the reply is malformed or names an unknown function; it is returned as "
                    "content: %.200r", self._fmt.name, markup)
        self._content(markup, events)

    def _emit_calls(self, calls: list[dict], events: list[Event]) -> None:
        self._pending_space = ""
        self._started = True
        for call in calls:
            self.calls.append(call)
            events.append(("tool_call", call))

    def _content(self, text: str, events: list[Event]) -> None:
        if not text:
            return
        if not text.strip():
            self._pending_space += text  # maybe just the newline between two calls
            return
        self._started = True
        events.append(("content", self._pending_space + text))
        self._pending_space = ""


def read_json_calls(text: str, tools: ToolSpecs, *, separators: str = " \t\r\n", keys=("arguments", "parameters"),
                    array: bool = False) -> Optional[list[dict]]:
    """Calls written as JSON objects one after another (``separators`` between
    them), or as JSON arrays of them (``array``); None unless all of the text is calls."""
    calls: list[dict] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in separators:
            i += 1
        if i == n:
            return calls or None
        end = json_end(text, i)
        if end is None or end < 0:
            return None
        ok, value = load_json(text[i:end])
        if not ok:
            return None
        objects = value if isinstance(value, list) and array else [value]
        for obj in objects:
            call = call_of_object(obj, tools, keys=keys)
            if call is None:
                return None
            calls.append(call)
        i = end


_IDENT = re.compile(r"[A-Za-z0-9_.:\-]+")


def is_identifier(name: str) -> bool:
    """Whether ``name`` looks like a function name (no spaces, markup or punctuation)."""
    return bool(_IDENT.fullmatch(name))
