"""Tools in chat's shapes, which every protocol's tools and tool calls are translated into and out of.

The engine's chat call takes Chat Completions' shapes: a function tool
``{"type": "function", "function": {"name", "description", "parameters"}}``,
a ``tool_choice`` of ``"auto"``, ``"none"``, ``"required"`` or one named
function, and an assistant message's ``tool_calls``, whose ``arguments``
are a JSON string.  The Responses API writes a function tool flat
(``{"type": "function", "name", "parameters"}``) and Anthropic's Messages
API as ``{"name", "input_schema"}`` with the arguments as an object; each
describes its tool with a :class:`ToolFormat`, and :func:`function_tools`
reads a list of them into chat's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .errors import bad_request
from .fields import LIST, Field, Spec, Style

#: Chat's ``tool_choice`` strings; a named function is :func:`forced_function`'s object.
TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolFormat:
    """How a protocol writes a function tool.

    ``spec``: its fields (``name``, ``description``, the schema field, and
    ``strict`` when the protocol passes it on), in the order chat's function
    object takes them.  ``parameters``:
    the name of the field that holds the arguments' JSON schema.
    ``types``: the values of its ``type`` that mean a function tool (None:
    no ``type``).  ``other_type``: the refusal of any other tool, with
    ``{path}`` and ``{kind!r}`` filled in; it names the tool's ``type`` when
    ``refuse_at_type``, else the tool.  ``empty_description``: whether a
    description of ``""`` is passed on (Anthropic's tools leave it out).
    """

    spec: Spec
    parameters: str
    types: tuple
    other_type: str
    refuse_at_type: bool = False
    list_message: str = "{path} must be a list of function tools"
    empty_description: bool = True


def function_tools(tools: Any, fmt: ToolFormat, style: Style, path: str = "tools") -> Optional[list]:
    """A protocol's ``tools`` (None: none given) as chat's function tools; a 400 for the first wrong one."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise style.refuse(path, Field(LIST, message=fmt.list_message), tools)
    converted = []
    for index, tool in enumerate(tools):
        where = style.path(path, index)
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in fmt.types:  # a tool that is not an object has no type
            place = style.path(where, "type") if fmt.refuse_at_type else where
            raise bad_request(fmt.other_type.format(path=place, kind=kind), place)
        fmt.spec.check(tool, style, where)
        converted.append({"type": "function", "function": _function(tool, fmt)})
    return converted


def _function(tool: dict, fmt: ToolFormat) -> dict:
    """A checked tool's ``function`` object.  Its fields come in the order the protocol's spec lists
    them: a template that prints a tool as JSON (Qwen's) prints them in that order."""
    chat_names = {"name": "name", "description": "description", fmt.parameters: "parameters", "strict": "strict"}
    function: dict = {}
    for name in fmt.spec.fields:
        value = tool.get(name)
        if name not in chat_names or value is None or (name == "description" and value == ""
                                                       and not fmt.empty_description):
            continue
        function[chat_names[name]] = value
    return function


def forced_function(name: str) -> dict:
    """Chat's ``tool_choice`` that makes the model call the function ``name``."""
    return {"type": "function", "function": {"name": name}}


def tool_call(call_id: str, name: str, arguments: str) -> dict:
    """One of chat's ``tool_calls``: ``arguments`` is a JSON string."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def arguments_json(arguments: dict) -> str:
    """Arguments given as an object, as chat's JSON string."""
    return json.dumps(arguments, ensure_ascii=False)


def arguments_object(arguments: Any) -> dict:
    """A call's ``arguments`` (a JSON string) as an object; arguments that are not a JSON object are
    kept under ``"input"``."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        value = arguments
    return value if isinstance(value, dict) else {"input": value}
