"""Llama 3.1, 3.2 and 3.3 JSON calls: ``{"name": "get_weather", "parameters": {"city": "Paris"}}``.

The reply is the call itself, JSON with no markup (several are separated
by ``;``), as Meta's templates ask for and write back; ``<|python_tag|>``
(a control token: the reply's text shows it) may come first.  A reply that
starts with ``{`` is held to its end, then read as calls of known tools or
given back as content; ``"arguments"`` is read as ``"parameters"``, and a
``"type": "function"`` key is allowed.  Text after ``<|python_tag|>`` that
is not JSON calls (a built-in tool's Python) is content.

Constrained: the JSON of one call, its name among the functions and its
parameters valid against the schema, from ``<|python_tag|>`` or from a
reply's opening ``{"name": "``.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from ...sampling.lazy import Trigger
from .base import ToolCallParser, ToolSpecs, read_json_calls
from .constrained import BARE_CALL_START, Rules, call_choice, json_expr, parameters_schema

_SEPARATORS = " \t\r\n;"
_KEYS = ("parameters", "arguments")


class Llama3Parser(ToolCallParser):
    name = "llama3"
    start_tag = "<|python_tag|>"
    preserved_tokens = ("<|python_tag|>",)
    bare_calls = True

    def body_end(self, text: str, tag: str, state: Optional[dict] = None) -> Optional[tuple[int, int]]:
        return None  # the calls run to the end of the reply

    def parse_call(self, body: str) -> Optional[dict]:
        calls = read_json_calls(body, ToolSpecs(), separators=_SEPARATORS, keys=_KEYS)
        return calls[0] if calls and len(calls) == 1 else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        return read_json_calls(body, tools, separators=_SEPARATORS, keys=_KEYS)

    def read_bare(self, text: str, tools: ToolSpecs) -> Optional[list[dict]]:
        return read_json_calls(text, tools, separators=_SEPARATORS, keys=_KEYS)

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        rules = Rules()

        def call(function) -> str:
            return json_expr({"type": "object", "properties": {"name": {"const": function["name"]},
                                                                "parameters": parameters_schema(function)},
                              "required": ["name", "parameters"]})
        return [rules.grammar(call_choice(functions, rules, call))]

    def call_triggers(self, functions: Sequence[Mapping[str, Any]], vocab, *, required: bool) -> list:
        # <|python_tag|> then the JSON, or a reply that starts as the JSON itself.
        phases = self.constraint_phases(functions, vocab)
        return [Trigger.word(self.start_tag, [Forced(vocab.encode(self.start_tag)), *phases]),
                Trigger(BARE_CALL_START, phases, at_start=True)]


def matches(source: str) -> bool:
    # Meta's templates: the ipython role, and calls written as {"name": ..., "parameters": ...}.
    return "<|start_header_id|>" in source and ("ipython" in source or '"parameters"' in source)
