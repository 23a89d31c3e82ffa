"""OpenAI-style tool calling: parse calls from a model's own format, and constrain forced calls.

* :mod:`.parsers` -- the formats (Hermes/Qwen ``<tool_call>``), chosen by chat template;
* :mod:`.streaming` -- the same, incrementally, for streamed replies;
* :mod:`elelem.sampling.grammar` and :mod:`elelem.sampling.constrained` -- constrained
  decoding over llguidance, shared with ``response_format`` (it lives with sampling;
  re-exported here);
* :mod:`.request` -- what ``tools`` / ``tool_choice`` mean for one request;
* :mod:`.responses` -- the ``chat.completion`` dicts and chunks with ``tool_calls``.
"""
from __future__ import annotations

from ...sampling.constrained import Forced, TokenConstraint
from ...sampling.grammar import Grammar, tool_call_grammar
from .parsers import HermesParser, ParsedReply, ToolCallParser, parser_for, register_parser
from .streaming import StreamingToolCallParser

__all__ = [
    "Forced", "TokenConstraint", "Grammar", "tool_call_grammar", "HermesParser",
    "ParsedReply", "ToolCallParser", "parser_for", "register_parser", "StreamingToolCallParser",
]
