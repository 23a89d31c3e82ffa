"""Liquid LFM2 and LFM2.5 calls: a Python-style list between two control tokens::

    <|tool_call_start|>[get_weather(city="Paris", days=2), get_time(tz='UTC')]<|tool_call_end|>

As llama.cpp reads them (``common/parsers/lfm2.cpp``, ``python_style_tool_calls``):
keyword arguments only, values as Python literals (strings in either quote,
numbers, ``True``/``False``/``None``, lists, dicts) or JSON's ``true``/
``false``/``null``.  The templates do not write the calls of earlier turns
back in a shape that shows the markup, so the format is chosen by the
template's tool list, as llama.cpp chooses it: LFM2's
``<|tool_list_start|>``, LFM2.5's ``List of tools: [``.  ``<think>``
reasoning (LFM2.5 thinking models) is read by :mod:`elelem.api.reasoning`.

Constrained: ``<|tool_call_start|>[`` forced, then one call of a function
with its arguments (required ones, then optional ones) as JSON values (valid
Python literals), then ``]<|tool_call_end|>``.
"""
from __future__ import annotations

import ast
import re
from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from .base import ToolCallParser, ToolSpecs, tool_call_dict
from .constrained import Rules, call_choice, json_expr, lark_string, ordered_parameters

_NAME = re.compile(r"\s*([A-Za-z_][\w\-]*)\s*\(")
_JSON_LITERALS = {"true": True, "false": False, "null": None}


def _literal(node: ast.AST) -> Any:
    """A Python literal's value, JSON's ``true``/``false``/``null`` included (ValueError otherwise)."""
    if isinstance(node, ast.Name) and node.id in _JSON_LITERALS:
        return _JSON_LITERALS[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    return ast.literal_eval(node)


def _closing_paren(text: str, start: int) -> int:
    """The index of the ``)`` that closes the call whose arguments start at ``start`` (-1: none)."""
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i if ch == ")" else -1
            depth -= 1
    return -1


def python_calls(text: str, tools: ToolSpecs) -> Optional[list[dict]]:
    """The calls of ``[name(key=value, ...), ...]`` (None unless all of the text is that)."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    inner, pos, calls = text[1:-1], 0, []
    while True:
        named = _NAME.match(inner, pos)
        if named is None:
            return None
        name = named.group(1)
        close = _closing_paren(inner, named.end())
        if close < 0 or not tools.known(name):
            return None
        try:
            node = ast.parse(f"f({inner[named.end():close]})", mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            return None
        try:
            arguments = {k.arg: _literal(k.value) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None  # not a literal (an expression, a name): not a call
        calls.append(tool_call_dict(name, arguments))
        rest = inner[close + 1:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(","):
            return None
        pos = len(inner) - len(rest) + 1


class LFM2Parser(ToolCallParser):
    name = "lfm2"
    start_tag = "<|tool_call_start|>"
    end_tag = "<|tool_call_end|>"
    preserved_tokens = ("<|tool_call_start|>", "<|tool_call_end|>")
    reasoning_as_thinking = True  # parsers/lfm2.cpp: LFM2.5's thinking template prints message.thinking

    def parse_call(self, body: str) -> Optional[dict]:
        calls = python_calls(body, ToolSpecs())
        return calls[0] if calls else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        return python_calls(body, tools)

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        rules = Rules()

        def call(function) -> str:
            items = [(f"{lark_string(key + '=')} {json_expr(schema)}", required)
                     for key, schema, required in ordered_parameters(function)]
            return f"{lark_string(function['name'] + '(')} {_arguments(items)} {lark_string(')')}".replace("  ", " ")
        return [Forced(vocab.encode("<|tool_call_start|>[")), rules.grammar(call_choice(functions, rules, call)),
                Forced(vocab.encode("]<|tool_call_end|>"))]


def _arguments(items: list[tuple[str, bool]]) -> str:
    """Keyword arguments separated by commas, the optional ones may be left out (no comma dangles)."""
    comma = lark_string(", ")
    required = [expr for expr, req in items if req]
    optional = [expr for expr, req in items if not req]
    if required:
        return " ".join([f" {comma} ".join(required)] + [f"({comma} {expr})?" for expr in optional])
    if not optional:
        return ""
    choices = [" ".join([optional[i]] + [f"({comma} {expr})?" for expr in optional[i + 1:]])
               for i in range(len(optional))]
    return "(" + " | ".join(f"({c})" for c in choices) + ")?"


def matches(source: str) -> bool:
    # llama.cpp's two tests (chat.cpp): LFM2's tool-list tokens, or LFM2.5's plain tool list.
    return ("<|tool_list_start|>" in source and "<|tool_list_end|>" in source) or "List of tools: [" in source
