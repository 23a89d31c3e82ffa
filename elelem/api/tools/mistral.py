"""Mistral's calls: ``[TOOL_CALLS]NAME[ARGS]{json}``, and the older ``[TOOL_CALLS][{...}]``.

* Ministral 3, Magistral, Devstral: ``[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}``,
  one ``[TOOL_CALLS]`` per call;
* Mistral Small 3.2: the same with the call's id, ``[TOOL_CALLS]NAME[CALL_ID]a1b2c3d4e[ARGS]{...}``;
* Mistral Nemo and older: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]``.

All three are read whatever the template.  ``[TOOL_CALLS]``, ``[ARGS]`` and
``[CALL_ID]`` are control tokens of Mistral's vocabularies: the reply's
text shows them (preserved tokens).  A call's JSON ends where its brackets
close, so calls are given out as soon as they are whole.  Mistral's
templates check that call ids are 9 letters and digits: the calls read here
get such ids, so they go back through the template as they came.
Magistral's ``[THINK]`` reasoning is read by :mod:`elelem.api.reasoning`.

Constrained: ``[TOOL_CALLS]`` forced, then a function's name, ``[ARGS]`` and
JSON valid against its schema (or, for a template without ``[ARGS]``, the
array form).
"""
from __future__ import annotations

import random
import string
from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from .base import ToolCallParser, ToolSpecs, call_of_object, is_identifier, JsonEnd, load_json, tool_call_dict
from .constrained import Rules, call_choice, json_expr, lark_string, parameters_schema

_ALPHANUMERIC = string.ascii_letters + string.digits
_MAX_NAME = 256


def mistral_call_id() -> str:
    """A call id Mistral's templates accept: 9 letters and digits."""
    return "".join(random.SystemRandom().choice(_ALPHANUMERIC) for _ in range(9))


class MistralParser(ToolCallParser):
    name = "mistral"
    start_tag = "[TOOL_CALLS]"
    preserved_tokens = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")

    def __init__(self, args_form: bool = True):
        self.args_form = args_form  # constrain to [TOOL_CALLS]NAME[ARGS]{...} (else the JSON array form)

    @classmethod
    def for_template(cls, source: str) -> "MistralParser":
        return cls(args_form="[ARGS]" in source)

    def body_end(self, text: str, tag: str, state: Optional[dict] = None) -> Optional[tuple[int, int]]:
        stripped = text.lstrip()
        if not stripped:
            return None
        if stripped.startswith("[") and not "[ARGS]".startswith(stripped[:6]):
            start = len(text) - len(stripped)
        else:
            # The name (and call id) end at [ARGS]; a newline or 256 characters first: no call.
            args, newline = text.find("[ARGS]", 0, _MAX_NAME + 6), text.find("\n", 0, _MAX_NAME)
            if args < 0 or 0 <= newline < args:
                if newline >= 0:
                    return newline, newline
                return (_MAX_NAME, _MAX_NAME) if len(text) >= _MAX_NAME + 6 else None
            start = args + len("[ARGS]")
        scanner = (state if state is not None else {}).setdefault("json", JsonEnd(start))
        end = scanner.scan(text)
        if end is None:
            return None
        if end < 0:  # not JSON after the name: the call ends here, malformed
            return start, start
        return end, end

    def parse_call(self, body: str) -> Optional[dict]:
        calls = self.read_calls(self.start_tag, body, ToolSpecs())
        return calls[0] if calls and len(calls) == 1 else None

    def read_calls(self, tag: str, body: str, tools: ToolSpecs) -> Optional[list[dict]]:
        stripped = body.strip()
        if stripped.startswith("["):  # [{"name", "arguments", "id"}, ...]
            ok, value = load_json(stripped)
            if not ok or not isinstance(value, list) or not value:
                return None
            read = [call_of_object(obj, tools) for obj in value]
            calls = [call for call in read if call is not None]
            if len(calls) < len(read):
                return None
            for call, obj in zip(calls, value):
                if not (isinstance(obj.get("id"), str) and obj["id"]):
                    call["id"] = mistral_call_id()
            return calls
        head, sep, arguments = body.partition("[ARGS]")
        if not sep:
            return None
        name, _, call_id = head.partition("[CALL_ID]")
        name, call_id = name.strip(), call_id.strip()
        if not is_identifier(name) or not tools.known(name):
            return None
        ok, value = load_json(arguments)
        if not ok or not isinstance(value, dict):
            return None
        return [tool_call_dict(name, value, call_id or mistral_call_id())]

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        rules = Rules()

        def call(function) -> str:
            schema = parameters_schema(function)
            if self.args_form:
                return f"{lark_string(function['name'])} {vocab.lit('[ARGS]')} {json_expr(schema)}"
            whole = {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": schema},
                     "required": ["name", "arguments"]}
            return f'"[" {json_expr(whole)} "]"'
        return [Forced(vocab.encode("[TOOL_CALLS]")), rules.grammar(call_choice(functions, rules, call))]


def matches(source: str) -> bool:
    return "[TOOL_CALLS]" in source

