"""GLM-4.5, 4.6 and 4.7 calls::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>2</arg_value>
    </tool_call>

(GLM-4.7 writes the same without the newlines.)  A value is raw text when
the tool's schema makes it a string, else the JSON it is, as the templates
write it (``tojson`` for anything but a string) and llama.cpp reads it.
GLM's ``<think>`` reasoning is read by :mod:`elelem.api.reasoning`.

Constrained: ``<tool_call>`` forced, then a function's name and its
arguments (required, then optional, in the schema's order): strings as raw
text up to ``</arg_value>``, other types as JSON valid against their
schemas, then ``</tool_call>``.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from .base import ToolCallParser, ToolSpecs, is_identifier, tool_call_dict, typed_value
from .constrained import Rules, call_choice, lark_string, ordered_parameters, typed_parameter_expr

_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GLMParser(ToolCallParser):
    name = "glm"
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def __init__(self, newlines: bool = True):
        self.newlines = newlines  # GLM-4.5/4.6 put a newline after the name and after each value; 4.7 does not

    @classmethod
    def for_template(cls, source: str) -> "GLMParser":
        return cls(newlines="</arg_key>\\n" in source or "</arg_key>\n" in source)

    def parse_call(self, body: str) -> Optional[dict]:
        calls = self.read_calls(self.start_tag, body, ToolSpecs())
        return calls[0] if calls else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        first = body.find("<arg_key>")
        name = (body if first < 0 else body[:first]).strip()
        if not is_identifier(name) or not tools.known(name):
            return None
        arguments: dict[str, Any] = {}
        rest = "" if first < 0 else body[first:]
        end = 0
        for argument in _ARGUMENT.finditer(rest):
            if rest[end:argument.start()].strip():
                return None
            key = argument.group(1).strip()
            if not key:
                return None
            arguments[key] = typed_value(argument.group(2), tools.property_schema(name, key))
            end = argument.end()
        if rest[end:].strip():
            return None
        return [tool_call_dict(name, arguments)]

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        nl = "\n" if self.newlines else ""
        rules = Rules()

        def call(function) -> str:
            parts = [lark_string(function["name"] + nl)]
            for key, schema, required in ordered_parameters(function):
                value = typed_parameter_expr(schema, "</arg_value>", rules, vocab)
                if nl:
                    value += " " + vocab.lit(nl)
                item = f"{vocab.lit(f'<arg_key>{key}</arg_key>{nl}<arg_value>')} {value}"
                parts.append(item if required else f"({item})?")
            return " ".join(parts)
        return [Forced(vocab.encode("<tool_call>")), rules.grammar(call_choice(functions, rules, call)),
                Forced(vocab.encode("</tool_call>"))]


def matches(source: str) -> bool:
    return "<tool_call>" in source and "<arg_key>" in source

