"""Reading tool calls out of a model's reply, in the model's own format.

A :class:`ToolCallParser` knows one format: how a call is marked up, how to
turn a finished reply into content plus calls, and what a constrained call
looks like (tokens to force, and the JSON in between).  :func:`parser_for`
picks the parser for a chat template from :data:`PARSERS`; to support a new
format, write a parser and register it with :func:`register_parser`.

Malformed calls never raise: the text of a call that does not parse stays
in the content, and a warning is logged.
"""
from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

log = logging.getLogger("elelem")


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
    """A reply split into its text (``content``, None when empty) and its tool calls."""

    content: Optional[str]
    tool_calls: list[dict] = field(default_factory=list)


class ToolCallParser:
    """One tool-call format.  Subclasses set the tags and implement :meth:`parse_call`."""

    name = "base"
    start_tag = ""
    end_tag = ""

    def parse_call(self, body: str) -> Optional[dict]:
        """The OpenAI tool-call dict for the text between the tags, or None if malformed."""
        raise NotImplementedError

    def parse(self, text: str, tool_names: Sequence[str] = ()) -> ParsedReply:
        """Split a finished reply into content and tool calls."""
        calls: list[dict] = []
        content: list[str] = []
        rest = text
        while True:
            start = rest.find(self.start_tag)
            if start < 0:
                content.append(rest)
                break
            end = rest.find(self.end_tag, start + len(self.start_tag))
            body_end = len(rest) if end < 0 else end
            after = len(rest) if end < 0 else end + len(self.end_tag)
            call = self.parse_call(rest[start + len(self.start_tag):body_end])
            content.append(rest[:start])
            if call is None:
                log.warning("a tool call in the reply is malformed; it is returned as content: %.200r",
                            rest[start:after])
                content.append(rest[start:after])
            else:
                calls.append(call)
            rest = rest[after:]
        text_out = "".join(content)
        if not calls:
            bare = self.parse_bare_call(text_out, tool_names)
            if bare is not None:
                return ParsedReply(None, [bare])
        if calls:  # the text around calls is mostly the newlines between them
            return ParsedReply(text_out.strip() or None, calls)
        return ParsedReply(text_out or None, calls)

    def parse_bare_call(self, text: str, tool_names: Sequence[str]) -> Optional[dict]:
        """A call written without its tags, the whole reply being one call of a
        known tool (small models do this), or None."""
        return None


class HermesParser(ToolCallParser):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one or
    several: Hermes, Qwen2/2.5 and the ChatML fallback template."""

    name = "hermes"
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    forced_prefix = "<tool_call>\n"
    forced_suffix = "\n</tool_call>"

    def parse_call(self, body: str) -> Optional[dict]:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the JSON string OpenAI-style
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return tool_call_dict(obj["name"], arguments)

    def parse_bare_call(self, text, tool_names):
        stripped = text.strip()
        if not (tool_names and stripped.startswith("{") and stripped.endswith("}")):
            return None
        call = self.parse_call(stripped)
        if call is None or call["function"]["name"] not in tool_names:
            return None
        return call


_QWEN_LIKE = re.compile(r"<tool_call>")

#: (parser class, does this chat template source use its format?), tried in order.
PARSERS: list[tuple[type[ToolCallParser], Callable[[str], bool]]] = [
    (HermesParser, lambda source: bool(_QWEN_LIKE.search(source))),
]
DEFAULT_PARSER: type[ToolCallParser] = HermesParser


def register_parser(parser: type[ToolCallParser], matches: Callable[[str], bool]) -> None:
    """Use ``parser`` for chat templates whose source ``matches`` (checked before the built-in ones)."""
    PARSERS.insert(0, (parser, matches))


def parser_for(template_source: str) -> ToolCallParser:
    """The parser of the format a chat template writes tool calls in
    (Hermes when no registered format matches, as llama.cpp's generic fallback)."""
    for parser, matches in PARSERS:
        if matches(template_source or ""):
            return parser()
    return DEFAULT_PARSER()
