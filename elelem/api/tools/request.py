"""``tools`` and ``tool_choice`` of one request: checked, and turned into a plan.

* ``"auto"`` (the default when tools are given): the model sees the tools
  and decides; calls are parsed out of its reply, and a call it starts (its
  format's marker) is held to a valid one, as llama.cpp's lazy grammars do.
* ``"none"``: the model does not see the tools (so it answers in text), and
  nothing is parsed.  Earlier tool calls and results in ``messages`` still
  render.
* ``"required"``: the reply makes one call of one of the tools, constrained
  token by token by the same engine as ``response_format``
  (:mod:`elelem.sampling.lazy`, over llguidance) from the format's marker
  on; text before the marker is free, but the reply cannot end without the call.
* ``{"type": "function", "function": {"name": ...}}``: the same, for that tool.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ...errors import GrammarError, InvalidArgumentError
from ...sampling.lazy import LazyConstraint, ReasoningSpan
from .constrained import Vocabulary
from .parsers import ToolCallParser, parser_for

log = logging.getLogger("elelem")

Tools = Optional[Sequence[Mapping[str, Any]]]
ToolChoice = Any  # "auto" | "none" | "required" | {"type": "function", "function": {"name": str}}


@dataclass
class ToolPlan:
    """What a request with tools does: which tools the template shows, how the
    reply is parsed, and (forced modes) which functions the call may name."""

    template_tools: Optional[list]
    parser: Optional[ToolCallParser]
    tool_names: tuple[str, ...]
    forced_functions: Optional[list]  # None: the model is free ("auto", "none", no tools)
    functions: list = field(default_factory=list)  # every tool's function dict (names and schemas)
    parallel: bool = False  # parallel_tool_calls: more calls may follow the first (llama.cpp's default: no)

    @property
    def parses_calls(self) -> bool:
        return self.parser is not None

    def constraint(self, assets, reasoning: Optional[ReasoningSpan] = None) -> Optional[LazyConstraint]:
        """The token constraint of the reply's tool calls (for ``assets``, the model's
        :class:`~elelem.api.assets.ModelAssets`), or None when nothing is parsed.

        Lazy, as llama.cpp's grammars: the reply is free until the format's
        marker, and from there held to a valid call of one of the functions.
        A forced call ("required", named) must come: the reply cannot end
        before it.  Under "auto" a call the model starts is held too; a schema
        the engine cannot enforce then leaves the calls unconstrained (logged)
        rather than failing the request.  ``reasoning``: the reply's think
        tags, inside which a marker starts nothing."""
        if self.parser is None:
            return None
        forced = self.forced_functions
        required = forced is not None
        vocab = tool_vocabulary(assets)
        try:
            triggers = self.parser.call_triggers(forced if forced is not None else self.functions, vocab,
                                                 required=required)
            return LazyConstraint(triggers, assets.grammar_tokenizer, vocab.encode, require_call=required,
                                  reasoning=reasoning, parallel=self.parallel)
        except GrammarError as error:
            if required:
                raise
            log.warning("tool calls under tool_choice='auto' are left unconstrained: %s", error)
            return None


def tool_vocabulary(assets) -> Vocabulary:
    """The model's :class:`.constrained.Vocabulary`, built once per model."""
    vocab = getattr(assets, "_tool_vocabulary", None)
    if vocab is None:
        vocab = Vocabulary.of(assets)
        assets._tool_vocabulary = vocab
    return vocab


def plan_tools(tools: Tools, tool_choice: ToolChoice, template_source: str,
               tool_call_format: Optional[str] = None, parallel_tool_calls: Optional[bool] = None) -> ToolPlan:
    """What ``tools`` and ``tool_choice`` mean for a model with this chat template;
    ``tool_call_format`` names the format instead of reading it from the template;
    ``parallel_tool_calls=True`` lets more calls follow the first (default: one, as llama.cpp's server)."""
    plan = _plan(tools, tool_choice, template_source, tool_call_format)
    if parallel_tool_calls not in (None, True, False):
        raise InvalidArgumentError("parallel_tool_calls must be True or False")
    plan.parallel = parallel_tool_calls is True
    return plan


def _plan(tools: Tools, tool_choice: ToolChoice, template_source: str, tool_call_format: Optional[str]) -> ToolPlan:
    functions = _functions(tools)
    if tool_choice is None:
        tool_choice = "auto" if functions else "none"
    if tool_choice == "none" or not functions:
        if tool_choice not in ("none", "auto"):
            raise InvalidArgumentError(f"tool_choice={tool_choice!r} needs tools")
        return ToolPlan(None, None, (), None, functions)
    parser = parser_for(template_source, tool_call_format)
    names = tuple(f["name"] for f in functions)
    template_tools = [dict(t) for t in tools or ()]  # tools there are: they gave the functions
    if tool_choice == "auto":
        return ToolPlan(template_tools, parser, names, None, functions)
    if tool_choice == "required":
        return ToolPlan(template_tools, parser, names, functions, functions)
    name = _named_choice(tool_choice)
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise InvalidArgumentError(f"tool_choice names {name!r}, which is not among the tools {list(names)}")
    return ToolPlan(template_tools, parser, names, chosen, functions)


def _functions(tools: Tools) -> list[dict]:
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InvalidArgumentError("tools must be a list of {'type': 'function', 'function': {...}} dicts")
    functions = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise InvalidArgumentError(f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}")
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidArgumentError(f"tools[{index}]['function'] must be a dict with a non-empty 'name'")
        functions.append(dict(function))
    return functions


def _named_choice(tool_choice: ToolChoice) -> str:
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return function["name"]
    raise InvalidArgumentError(
        "tool_choice must be 'auto', 'none', 'required' or "
        f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r}")


def messages_for_template(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """``messages`` with each assistant tool call's ``arguments`` as a dict.

    OpenAI messages carry ``arguments`` as a JSON string, but chat templates
    (Qwen2.5's, HF's convention) write them with ``tojson``, which would
    quote the string a second time; llama.cpp decodes them the same way.
    Arguments that are not valid JSON are left as they are.
    """
    if not isinstance(messages, Sequence) or not any(
            isinstance(m, Mapping) and m.get("tool_calls") for m in messages):
        return messages
    return [_decoded_calls(m) if isinstance(m, Mapping) and m.get("tool_calls") else m for m in messages]


def _decoded_calls(message: Mapping[str, Any]) -> dict:
    calls = message["tool_calls"]
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        return dict(message)  # the template's own checks report the bad shape
    decoded = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        if isinstance(function, Mapping) and isinstance(arguments, str):
            try:
                call = {**call, "function": {**function, "arguments": json.loads(arguments)}}
            except ValueError:
                pass
        decoded.append(call)
    return {**message, "tool_calls": decoded}
