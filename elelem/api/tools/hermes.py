"""Hermes: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one or several.

Hermes 2/3, Qwen2 and Qwen2.5, Qwen3 (with ``<think>`` reasoning, read by
:mod:`elelem.api.reasoning`), SmolLM3, and the ChatML fallback template; it
is also the format of a template that shows no other (as llama.cpp's
generic fallback).  ``parameters`` is accepted for ``arguments``, and
arguments written as a JSON string (OpenAI's way) are decoded.  Small Qwen
models sometimes write the JSON without its tags: a reply that is only
that, for a known tool, is a call too.

Constrained: ``<tool_call>\\n`` forced, then JSON holding a name among the
functions and arguments valid against its schema, then ``\\n</tool_call>``;
a reply that starts as a bare call (``{"name": "``, maybe in a ```json
fence) is held to the same JSON, without the tags.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from ...sampling.grammar import tool_call_grammar
from ...sampling.lazy import Trigger
from .base import ToolCallParser, ToolSpecs, call_of_object, load_json, read_json_calls
from .constrained import BARE_CALL_START


class HermesParser(ToolCallParser):
    name = "hermes"
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    forced_prefix = "<tool_call>\n"
    forced_suffix = "\n</tool_call>"
    bare_calls = True

    def parse_call(self, body: str) -> Optional[dict]:
        ok, obj = load_json(body)
        return call_of_object(obj, ToolSpecs()) if ok else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        ok, obj = load_json(body)
        call = call_of_object(obj, tools) if ok else None
        return None if call is None else [call]

    def read_bare(self, text: str, tools: ToolSpecs) -> Optional[list[dict]]:
        return read_json_calls(text, tools)

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        return [Forced(vocab.encode(self.forced_prefix)), tool_call_grammar(functions),
                Forced(vocab.encode(self.forced_suffix))]

    def call_triggers(self, functions: Sequence[Mapping[str, Any]], vocab, *, required: bool) -> list:
        # <tool_call>, or a reply that starts as a bare JSON call (Qwen2.5 writes those too).
        return [*super().call_triggers(functions, vocab, required=required),
                Trigger(BARE_CALL_START, [tool_call_grammar(functions)], at_start=True)]


def matches(source: str) -> bool:
    return "<tool_call>" in source
