"""OpenAI-style tool calling: parse calls from a model's own format, and constrain forced calls.

* :mod:`.parsers` -- the formats (Hermes/Qwen ``<tool_call>``), chosen by chat template;
* :mod:`.streaming` -- the same, incrementally, for streamed replies;
* :mod:`elelem.sampling.json_automaton` and :mod:`elelem.sampling.constrained` -- JSON-schema
  constrained decoding (token constraints live with sampling; re-exported here);
* :mod:`.request` -- what ``tools`` / ``tool_choice`` mean for one request;
* :mod:`.responses` -- the ``chat.completion`` dicts and chunks with ``tool_calls``.
"""
from __future__ import annotations

from ...sampling.constrained import Forced, TokenConstraint, TokenTexts
from ...sampling.json_automaton import JsonAutomaton, Limits
from .parsers import HermesParser, ParsedReply, ToolCallParser, parser_for, register_parser
from .streaming import StreamingToolCallParser

__all__ = [
    "Forced", "TokenConstraint", "TokenTexts", "JsonAutomaton", "Limits", "HermesParser",
    "ParsedReply", "ToolCallParser", "parser_for", "register_parser", "StreamingToolCallParser",
]
