"""Qwen3-Coder and Qwen3.5 XML calls (also Nemotron Nano 3, StepFun 3.5)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

A parameter's value is its raw text (one newline after the opening tag and
one before the closing tag are markup), read as its tool's JSON schema
says, as llama.cpp does: a string where the schema allows only strings,
else the JSON it is (``2``, ``true``, ``{"a": 1}``; Python's ``True``, as
the templates print booleans, too), else the text.  Qwen3.5's ``<think>``
reasoning is read by :mod:`elelem.api.reasoning`.

Constrained: ``<tool_call>\\n<function=`` forced, then a function's name
and its parameters (required ones, then optional ones, in the schema's
order): strings as raw text up to ``\\n</parameter>``, other types as JSON
valid against their schemas; then ``</function>\\n</tool_call>``.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from .base import ToolCallParser, ToolSpecs, is_identifier, tool_call_dict, typed_value
from .constrained import Rules, call_choice, lark_string, ordered_parameters, typed_parameter_expr

_FUNCTION = re.compile(r"\s*<function=([^>\n]*)>(.*?)(?:</function>\s*)?$", re.DOTALL)
_OPEN = re.compile(r"\s*<parameter=([^>\n]*)>\n?")
_CLOSE, _CLOSE_NL = "</parameter>", "\n</parameter>"


def parameters(inner: str) -> Optional[list[tuple[str, str]]]:
    """The (name, raw value) pairs of a function's body, or None if it is not only parameters.

    A value ends at the first ``\n</parameter>`` (as the grammar ends it), or, for a value
    written inline (``<parameter=k>v</parameter>``), at ``</parameter>``."""
    out: list[tuple[str, str]] = []
    pos = 0
    while True:
        opened = _OPEN.match(inner, pos)
        if opened is None:
            return out if not inner[pos:].strip() else None
        start = opened.end()
        newline, plain = inner.find(_CLOSE_NL, start), inner.find(_CLOSE, start)
        after = inner.find("<parameter=", start)
        if newline >= 0 and (after < 0 or newline < after):
            end, pos = newline, newline + len(_CLOSE_NL)
        elif plain >= 0:
            end, pos = plain, plain + len(_CLOSE)
        else:
            return None
        out.append((opened.group(1).strip(), inner[start:end]))


class Qwen3CoderParser(ToolCallParser):
    name = "qwen3_coder"
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def parse_call(self, body: str) -> Optional[dict]:
        calls = self.read_calls(self.start_tag, body, ToolSpecs())
        return calls[0] if calls else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        match = _FUNCTION.match(body)
        if match is None:
            return None
        name, inner = match.group(1).strip(), match.group(2)
        if not is_identifier(name) or not tools.known(name):
            return None
        pairs = parameters(inner)
        if pairs is None or not all(key for key, _ in pairs):
            return None  # an unclosed parameter, or text that is not parameters
        arguments = {key: typed_value(raw, tools.property_schema(name, key)) for key, raw in pairs}
        return [tool_call_dict(name, arguments)]

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        rules = Rules()

        def call(function) -> str:
            parts = [lark_string(function["name"] + ">\n")]
            for key, schema, required in ordered_parameters(function):
                value = typed_parameter_expr(schema, "\n</parameter>", rules, vocab) + " " + vocab.lit("\n")
                item = f"{vocab.lit(f'<parameter={key}>' + chr(10))} {value}"
                parts.append(item if required else f"({item})?")
            return " ".join(parts + [vocab.lit("</function>\n")])
        return [Forced(vocab.encode("<tool_call>\n<function=")), rules.grammar(call_choice(functions, rules, call)),
                Forced(vocab.encode("</tool_call>"))]


def matches(source: str) -> bool:
    # llama.cpp's test; Qwen3.5's variant without newlines between the tags is excluded there too.
    return ("<tool_call>" in source and "<function=" in source and "<parameter=" in source
            and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in source)
