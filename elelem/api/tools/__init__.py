"""OpenAI-style tool calling: parse calls from a model's own format, and constrain forced calls.

* :mod:`.base` -- the shared interface of a format, and what the formats share;
* one module per format: :mod:`.hermes` (``<tool_call>{json}</tool_call>``),
  :mod:`.qwen3_coder` (Qwen3-Coder/Qwen3.5 XML), :mod:`.harmony` (gpt-oss),
  :mod:`.mistral` (``[TOOL_CALLS]``), :mod:`.llama3` (Llama 3.x JSON),
  :mod:`.glm` (GLM-4.5 ``<arg_key>``/``<arg_value>``), :mod:`.lfm2` (LFM2's Python-style calls),
  :mod:`.kimi_k2` (Kimi K2's ``functions.NAME:0`` ids);
* :mod:`.template_markers` and :mod:`.derived` -- the markup a template writes, read off a probe
  render, and the format that reads calls with it (MiniMax-M2, Seed-OSS, Nemotron Nano 2, ...);
* :mod:`.parsers` -- which format a chat template writes (or the one named);
* :mod:`.streaming` -- the same, incrementally, for streamed replies;
* :mod:`.constrained` -- the pieces of each format's grammar for forced calls,
  over :mod:`elelem.sampling.grammar` and :mod:`elelem.sampling.constrained`
  (llguidance, shared with ``response_format``; re-exported here);
* :mod:`.request` -- what ``tools`` / ``tool_choice`` mean for one request;
* :mod:`.responses` -- the ``chat.completion`` dicts and chunks with ``tool_calls``.

Reasoning (``reasoning_content``) is read by :mod:`elelem.api.reasoning`.
"""
from __future__ import annotations

from ...sampling.constrained import Forced, TokenConstraint
from ...sampling.grammar import Grammar, tool_call_grammar
from .base import CallStream, ParsedReply, ToolCallParser, ToolSpecs
from .derived import TemplateFormatParser
from .glm import GLMParser
from .harmony import HarmonyParser
from .hermes import HermesParser
from .kimi_k2 import KimiK2Parser
from .lfm2 import LFM2Parser
from .llama3 import Llama3Parser
from .mistral import MistralParser
from .parsers import FORMATS, format_named, parser_for, register_parser
from .qwen3_coder import Qwen3CoderParser
from .streaming import StreamingToolCallParser

__all__ = [
    "Forced", "TokenConstraint", "Grammar", "tool_call_grammar", "ParsedReply", "ToolCallParser", "ToolSpecs",
    "CallStream", "HermesParser", "Qwen3CoderParser", "HarmonyParser", "MistralParser", "Llama3Parser",
    "GLMParser", "LFM2Parser", "KimiK2Parser", "TemplateFormatParser", "FORMATS", "format_named", "parser_for", "register_parser", "StreamingToolCallParser",
]
