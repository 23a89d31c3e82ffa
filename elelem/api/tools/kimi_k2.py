"""Kimi K2 (Instruct, Thinking) calls, each named by an id that holds the function's name::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

As llama.cpp reads them (``common/parsers/kimi-k2.cpp``): the section markers
are optional, the id is ``functions.NAME:INDEX`` and becomes the call's id
(the templates write it back in later turns), the arguments are JSON, and a
call's end marker may be missing at the end of the reply.  The templates
write a call's id where others write its name, so the markers cannot be
derived from a render (:mod:`.template_markers`): this format is chosen by
its section markers, as llama.cpp's specialized handler is.  Kimi K2
Thinking's ``<think>`` reasoning is read by :mod:`elelem.api.reasoning`.

Constrained: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.``
forced, then a function's name, ``:0``, the argument marker and JSON valid
against its schema, then the end markers.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from .base import ToolCallParser, ToolSpecs, json_end, load_json, tool_call_dict
from .constrained import Rules, call_choice, json_expr, lark_string, parameters_schema

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"\s*(functions\.([^\s:<>]+):(\d+))\s*" + re.escape(ARGS_BEGIN))


class KimiK2Parser(ToolCallParser):
    name = "kimi_k2"
    preserved_tokens = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGS_BEGIN, CALL_END)

    @property
    def start_tags(self) -> tuple[str, ...]:
        return (SECTION_BEGIN, CALL_BEGIN)

    @property
    def start_tag(self) -> str:  # type: ignore[override]
        return SECTION_BEGIN

    def body_end(self, text: str, tag: str, state: Optional[dict] = None) -> Optional[tuple[int, int]]:
        end = SECTION_END if tag == SECTION_BEGIN else CALL_END
        at = text.find(end)
        return None if at < 0 else (at, at + len(end))

    def parse_call(self, body: str) -> Optional[dict]:
        calls = self.read_calls(CALL_BEGIN, body, ToolSpecs())
        return calls[0] if calls else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        text = body if tag == SECTION_BEGIN else CALL_BEGIN + body + CALL_END
        calls: list[dict] = []
        pos = 0
        while True:
            rest = text[pos:].lstrip()
            if not rest:
                return calls or None
            if not rest.startswith(CALL_BEGIN):
                return None
            pos = len(text) - len(rest) + len(CALL_BEGIN)
            named = _ID.match(text, pos)
            if named is None or not tools.known(named.group(2)):
                return None
            end = json_end(text, named.end())
            if end is None or end < 0:
                return None
            ok, arguments = load_json(text[named.end():end])
            if not ok or not isinstance(arguments, dict):
                return None
            calls.append(tool_call_dict(named.group(2), arguments, named.group(1)))
            after = text[end:].lstrip()
            pos = len(text) - len(after)
            if after.startswith(CALL_END):
                pos += len(CALL_END)
            elif after:  # a call's end marker may be missing only at the end (llama.cpp's optional close)
                return None

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        rules = Rules()

        def call(function) -> str:
            return (f"{lark_string(function['name'] + ':0')} {vocab.lit(ARGS_BEGIN)} "
                    f"{json_expr(parameters_schema(function))}")
        return [Forced(vocab.encode(SECTION_BEGIN + CALL_BEGIN + "functions.")),
                rules.grammar(call_choice(functions, rules, call)), Forced(vocab.encode(CALL_END + SECTION_END))]


def matches(source: str) -> bool:
    # llama.cpp's test (chat.cpp, common_chat_try_specialized_template)
    return SECTION_BEGIN in source and CALL_BEGIN in source
