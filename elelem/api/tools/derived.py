"""Calls in the markup a chat template shows, read with the markers derived from it.

:mod:`.template_markers` renders a template with a probe conversation and
reads its call markup (:class:`~.template_markers.Markers`); this format
reads replies with those markers, so a model whose template writes calls in
one of the common shapes needs no parser of its own, as llama.cpp's
autoparser (``common/chat-auto-parser-generator.cpp``) needs none.  Among
the models whose format is read this way: MiniMax-M2 (``<minimax:tool_call>``,
``<invoke name=...>``, ``<parameter name=...>``), Seed-OSS
(``<seed:tool_call>``, ``<function=...>``, ``<parameter=...>``), NVIDIA
Nemotron Nano 2 (``<TOOLCALL>[{...}]</TOOLCALL>``), MiniMax-M1, DeepSeek
V3.1 and R1, Apriel, Hunyuan.

Whitespace in the markers is loose (a model may write a newline where the
template writes none, or the reverse), except next to a value, where the
template's own whitespace is markup and the rest is the value's.  A value is
typed by its tool's schema, as for the other XML formats
(:func:`~.base.typed_value`).  A reply that ends before the markup's last
marker (the model stopped there) is read as far as it goes.

Constrained calls write the markers exactly as the template renders them.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from ...sampling.grammar import tool_call_grammar
from .base import ToolCallParser, ToolSpecs, call_of_object, is_identifier, json_end, load_json, tool_call_dict, \
    typed_value
from .hermes import HermesParser
from .constrained import Rules, call_choice, json_expr, lark_string, ordered_parameters, parameters_schema, \
    typed_parameter_expr
from .template_markers import NAMED_JSON, OBJECT_JSON, TAGGED, Markers, derive

# A function's name, up to the markup that follows it.
_NAME = re.compile(r"[^\s<>\"'\[\](){},=:]+(?:[:.\-][^\s<>\"'\[\](){},=:]+)*")


def _loose(marker: str, *, exact_lead: bool = False, exact_trail: bool = False) -> re.Pattern:
    """A pattern for ``marker`` where whitespace may be any (none included); with ``exact_lead``
    or ``exact_trail``, the marker's own whitespace at that end is optional but nothing more."""
    core = marker.strip()
    lead = marker[:len(marker) - len(marker.lstrip())]
    trail = marker[len(marker.rstrip()):]
    body = r"\s*".join(re.escape(word) for word in core.split()) if core else ""
    head = f"(?:{re.escape(lead)})?" if exact_lead else r"\s*"
    tail = f"(?:{re.escape(trail)})?" if exact_trail else r"\s*"
    if exact_lead and not lead:
        head = ""
    if exact_trail and not trail:
        tail = ""
    return re.compile(head + body + tail)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


class TemplateFormatParser(ToolCallParser):
    """The calls of a template whose markup :func:`~.template_markers.derive` read."""

    name = "template"

    def __init__(self, markers: Markers):
        self.markers = markers
        self.start_tag = markers.start
        self.end_tag = markers.end
        self.preserved_tokens = markers.tokens
        m = markers
        self._section_open = _loose(m.section_open)
        self._call_open = _loose(m.call_open)
        self._name_close = _loose(m.name_close, exact_trail=m.shape == NAMED_JSON)
        self._key_open = _loose(m.key_open)
        self._key_close = _loose(m.key_close, exact_trail=True)
        self._value_close = _loose(m.value_close, exact_lead=True)
        self._call_close = _loose(m.call_close)
        self._separator = _loose(m.separator)
        self._closing = _squash(m.call_close + m.section_close)
        self._section_closing = _squash(m.section_close)

    @classmethod
    def for_template(cls, source: str) -> "ToolCallParser":
        markers = derive(source)
        if markers is None:
            return HermesParser()  # the generic fallback, as parsers.parser_for's
        return cls(markers)

    def __repr__(self) -> str:
        return f"TemplateFormatParser({self.markers.shape}, start={self.start_tag!r}, end={self.end_tag!r})"

    # -- reading ---

    def parse_call(self, body: str) -> Optional[dict]:
        calls = self.read_calls(self.start_tag, body, ToolSpecs())
        return calls[0] if calls else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        text = tag + body
        pos = 0
        if self.markers.section_open.strip():
            opened = self._section_open.match(text)
            if opened is None:
                return None
            pos = opened.end()
        calls: list[dict] = []
        while True:
            read = self._read_call(text, pos, tools)
            if read is None:
                break
            call, pos, closed = read
            calls.append(call)
            if not closed:
                return calls  # the rest is the start of the closing markup
            sep = self._separator.match(text, pos)
            if sep is not None:
                pos = sep.end()
        rest = _squash(text[pos:])
        if not calls or not (self._closing.startswith(rest) or self._section_closing.startswith(rest)):
            return None
        return calls

    def _read_call(self, text: str, pos: int, tools: ToolSpecs) -> Optional[tuple[dict, int, bool]]:
        """(the call at ``pos``, where it ends, whether its closing markup was there), or None."""
        m = self.markers
        opened = self._call_open.match(text, pos)
        if opened is None:
            return None
        pos = opened.end()
        if m.shape == OBJECT_JSON:
            end = json_end(text, pos)
            if end is None or end < 0:
                return None
            ok, obj = load_json(text[pos:end])
            call = call_of_object(obj, tools) if ok else None
            if call is None:
                return None
            return self._closed(call, text, end)
        named = _NAME.match(text, pos)
        if named is None:
            return None
        name = named.group(0)
        if not is_identifier(name) or not tools.known(name):
            return None
        closed_name = self._name_close.match(text, named.end())
        if closed_name is None:
            return None
        pos = closed_name.end()
        if m.shape == NAMED_JSON:
            end = json_end(text, pos)
            if end is None or end < 0:
                return None
            ok, decoded = load_json(text[pos:end])
            if not ok or not isinstance(decoded, dict):
                return None
            return self._closed(tool_call_dict(name, decoded), text, end)
        arguments: dict[str, Any] = {}
        while True:
            key_opened = self._key_open.match(text, pos)
            if key_opened is None:
                break
            key_end = self._key_close.search(text, key_opened.end())
            if key_end is None:
                return None
            key = text[key_opened.end():key_end.start()].strip()
            value_end = self._value_close.search(text, key_end.end())
            if not key or value_end is None:
                return None
            arguments[key] = typed_value(text[key_end.end():value_end.start()], tools.property_schema(name, key))
            pos = value_end.end()
        return self._closed(tool_call_dict(name, arguments), text, pos)

    def _closed(self, call: dict, text: str, pos: int) -> Optional[tuple[dict, int, bool]]:
        if not self.markers.call_close.strip():
            return call, pos, True
        closed = self._call_close.match(text, pos)
        if closed is not None:
            return call, closed.end(), True
        # the last call of a reply that stopped inside the closing markup (its end tag not fed)
        return (call, pos, False) if self._closing.startswith(_squash(text[pos:])) else None

    # -- constraining ---

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        m = self.markers
        opening = (m.section_open + m.call_open).lstrip()
        closing = (m.call_close + m.section_close).rstrip()
        rules = Rules()
        if m.shape == OBJECT_JSON:
            phases: list = [Forced(vocab.encode(opening)), tool_call_grammar(functions)]
        else:
            def call(function) -> str:
                parts = [lark_string(function["name"] + m.name_close)]
                if m.shape == NAMED_JSON:
                    parts.append(json_expr(parameters_schema(function)))
                    return " ".join(parts)
                for key, schema, required in ordered_parameters(function):
                    value = typed_parameter_expr(schema, m.value_close, rules, vocab)
                    item = f"{vocab.lit(m.key_open + key + m.key_close)} {value}"
                    parts.append(item if required else f"({item})?")
                return " ".join(parts)
            phases = [Forced(vocab.encode(opening)), rules.grammar(call_choice(functions, rules, call))]
        if closing:
            phases.append(Forced(vocab.encode(closing)))
        return phases


def matches(source: str) -> bool:
    """Whether the template shows call markup this format reads (and that is not Hermes': the
    Hermes format reads that, and also calls written without it)."""
    markers = derive(source)
    if markers is None:
        return False
    hermes = markers.shape == OBJECT_JSON and markers.start == "<tool_call>" and not markers.section_open.strip()
    return not hermes


__all__ = ["TemplateFormatParser", "matches", "TAGGED", "NAMED_JSON", "OBJECT_JSON"]
