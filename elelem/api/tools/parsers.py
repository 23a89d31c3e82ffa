"""Which tool-call format a model writes: chosen from its chat template, or named.

Each format is a :class:`ToolCallParser` in its own module (see
:mod:`.base` for the interface):

========================  =====================================================  =================
``tool_call_format``      markup                                                 models
========================  =====================================================  =================
``hermes``                ``<tool_call>{"name", "arguments"}</tool_call>``       Qwen2.5, Qwen3, Hermes, SmolLM3
``qwen3_coder``           ``<tool_call><function=NAME><parameter=K>v...``        Qwen3-Coder, Qwen3.5, Nemotron 3
``harmony``               ``<|channel|>commentary to=functions.NAME...``         gpt-oss
``mistral``               ``[TOOL_CALLS]NAME[ARGS]{...}``, ``[TOOL_CALLS][...]``  Mistral, Ministral, Devstral
``llama3``                ``{"name", "parameters"}``, after ``<|python_tag|>``  Llama 3.1, 3.2, 3.3
``glm``                   ``<tool_call>NAME<arg_key>k</arg_key><arg_value>v...``  GLM-4.5, 4.6, 4.7, Laguna
``lfm2``                  ``<|tool_call_start|>[NAME(k="v")]<|tool_call_end|>``  LFM2, LFM2.5
``kimi_k2``               ``<|tool_call_begin|>functions.NAME:0<|tool_call_arg...``  Kimi K2
``template``              the markup the template writes, derived from it        MiniMax-M2, Seed-OSS,
                                                                                 Nemotron Nano 2, DeepSeek V3.1
========================  =====================================================  =================

:func:`parser_for` reads the template's source as llama.cpp's chat-format
detection does (``common_chat_try_specialized_template`` and its
autoparser): gpt-oss's ``<|channel|>``, Mistral's ``[TOOL_CALLS]``,
Kimi K2's tool-call section, LFM2's tool list, Qwen3-Coder's ``<function=``/``<parameter=`` inside
``<tool_call>``, GLM's ``<arg_key>``, then the markup the template itself
writes for a probe call (:mod:`.template_markers`, as llama.cpp's
autoparser diffs renders), then Hermes' ``<tool_call>``, Llama 3's
``ipython`` role, in that order; a template that shows none of them gets
Hermes (llama.cpp's generic fallback, and what the ChatML fallback template
writes).  The hand-written formats come first where llama.cpp has a
specialized handler or where they read more than the markers say (Hermes'
bare JSON calls); the derived one needs no code for a new model.
:func:`format_named` gives a format by name (``LLM(tool_call_format=...)``,
or per call); :func:`register_parser` adds one.
"""
from __future__ import annotations

from typing import Callable, Optional

from ...errors import InvalidArgumentError
from . import derived, glm, harmony, hermes, kimi_k2, lfm2, llama3, mistral, qwen3_coder
from .base import ParsedReply, ToolCallParser, new_call_id, tool_call_dict
from .derived import TemplateFormatParser
from .glm import GLMParser
from .harmony import HarmonyParser
from .hermes import HermesParser
from .kimi_k2 import KimiK2Parser
from .lfm2 import LFM2Parser
from .llama3 import Llama3Parser
from .mistral import MistralParser
from .qwen3_coder import Qwen3CoderParser

#: (parser class, does this chat template source use its format?), tried in order.
PARSERS: list[tuple[type[ToolCallParser], Callable[[str], bool]]] = [
    (HarmonyParser, harmony.matches),
    (MistralParser, mistral.matches),
    (KimiK2Parser, kimi_k2.matches),
    (LFM2Parser, lfm2.matches),
    (Qwen3CoderParser, qwen3_coder.matches),
    (GLMParser, glm.matches),
    (TemplateFormatParser, derived.matches),
    (HermesParser, hermes.matches),
    (Llama3Parser, llama3.matches),
]
DEFAULT_PARSER: type[ToolCallParser] = HermesParser

#: The formats by name, and the other names they are known by.
FORMATS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser, "qwen3_coder": Qwen3CoderParser, "harmony": HarmonyParser,
    "mistral": MistralParser, "llama3": Llama3Parser, "glm": GLMParser, "lfm2": LFM2Parser,
    "kimi_k2": KimiK2Parser, "template": TemplateFormatParser,
}
ALIASES = {"qwen": "hermes", "qwen2.5": "hermes", "qwen3": "hermes", "chatml": "hermes",
           "qwen3-coder": "qwen3_coder", "qwen3.5": "qwen3_coder", "qwen3_xml": "qwen3_coder",
           "gpt-oss": "harmony", "gpt_oss": "harmony", "llama-3": "llama3", "llama3.x": "llama3",
           "llama3_json": "llama3", "glm4.5": "glm", "glm-4.5": "glm", "glm45": "glm", "mistral-nemo": "mistral",
           "lfm2.5": "lfm2", "liquid": "lfm2", "derived": "template", "minimax-m2": "template",
           "seed-oss": "template", "seed_oss": "template", "kimi": "kimi_k2", "kimi-k2": "kimi_k2"}


def register_parser(parser: type[ToolCallParser], matches: Callable[[str], bool]) -> None:
    """Use ``parser`` for chat templates whose source ``matches`` (checked before the built-in ones),
    and under its ``name`` for ``tool_call_format``."""
    PARSERS.insert(0, (parser, matches))
    if parser.name and parser.name != "base":
        FORMATS.setdefault(parser.name, parser)


def parser_for(template_source: str, tool_call_format: Optional[str] = None) -> ToolCallParser:
    """The parser of the format a chat template writes tool calls in (Hermes when no
    registered format matches, as llama.cpp's generic fallback), or of the format named."""
    source = template_source or ""
    if tool_call_format is not None:
        return format_named(tool_call_format).for_template(source)
    for parser, matches in PARSERS:
        if matches(source):
            return parser.for_template(source)
    return DEFAULT_PARSER.for_template(source)


def format_named(name: str) -> type[ToolCallParser]:
    """The format called ``name`` (see :data:`FORMATS` and :data:`ALIASES`)."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"tool_call_format must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in FORMATS:
        raise InvalidArgumentError(f"unknown tool_call_format {name!r}; the formats are {sorted(FORMATS)}")
    return FORMATS[key]


__all__ = ["PARSERS", "FORMATS", "ALIASES", "DEFAULT_PARSER", "register_parser", "parser_for", "format_named",
           "ToolCallParser", "ParsedReply", "HermesParser", "Qwen3CoderParser", "HarmonyParser", "MistralParser",
           "Llama3Parser", "GLMParser", "LFM2Parser", "KimiK2Parser", "TemplateFormatParser", "new_call_id", "tool_call_dict"]
