"""Constrained tool calls in each format: the pieces the formats build their grammars from.

A call is a list of phases for :class:`~elelem.sampling.constrained.TokenConstraint`:
tokens forced as they are (the format's marker: ``<tool_call>``,
``[TOOL_CALLS]``, gpt-oss's ``<|channel|>``) and grammars compiled by
llguidance for the rest of the call, in the format's own markup
(``ToolCallParser.constraint_phases``).  The phases hold the reply only from
the point where the model writes the format's marker (a trigger:
``ToolCallParser.call_triggers``), as llama.cpp's lazy grammars do; text
before it is free (:mod:`elelem.sampling.lazy`).

Grammars are written in llguidance's Lark syntax: ``%json{...}`` for a JSON
value valid against a schema (with the strictness of
:func:`~elelem.sampling.grammar.json_schema_grammar`), ``<[id]>`` for a
control token (which plain text in a grammar can never produce), and a
rule with a ``suffix`` for raw text up to a closing tag (an XML parameter's
string value).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional, Sequence

from ...errors import GrammarError
from ...sampling.grammar import JSON_WHITESPACE, Grammar, _llguidance, closed_objects, json_schema_grammar
from ...text.tokenizer.vocab import ATTR_CONTROL
from .base import value_types


class Vocabulary:
    """What a format needs of the model's vocabulary to build a constraint:
    ``encode`` (text to ids, control tokens included) and the control tokens' texts."""

    def __init__(self, encode: Callable[[str], list[int]], control: Mapping[str, int]):
        self.encode = encode
        self.control = dict(control)

    @classmethod
    def of(cls, assets) -> "Vocabulary":
        tokenizer, lock = assets.tokenizer, assets.tokenizer_lock
        vocab = tokenizer._vocab
        control = {text: i for i, (text, attr) in enumerate(zip(vocab.tokens, vocab.attrs))
                   if attr & ATTR_CONTROL and text and i < assets.n_vocab}

        def encode(text: str) -> list[int]:
            with lock:
                return tokenizer.encode(text, add_bos=False, add_eos=False, special=True)
        return cls(encode, control)

    def lit(self, text: str) -> str:
        """A Lark expression for ``text``, its control tokens as ``<[id]>``."""
        parts: list[str] = []
        plain = ""
        i = 0
        specials = sorted((t for t in self.control if t in text), key=len, reverse=True)
        while i < len(text):
            token = next((t for t in specials if text.startswith(t, i)), None)
            if token is None:
                plain += text[i]
                i += 1
                continue
            if plain:
                parts.append(lark_string(plain))
                plain = ""
            parts.append(f"<[{self.control[token]}]>")
            i += len(token)
        if plain:
            parts.append(lark_string(plain))
        return " ".join(parts) if parts else '""'


def lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def parameters_schema(function: Mapping[str, Any]) -> dict:
    parameters = function.get("parameters")
    return dict(parameters) if isinstance(parameters, Mapping) else {"type": "object", "properties": {}}


def json_expr(schema: Any) -> str:
    """``%json{...}``: JSON valid against ``schema``, as strict as ``response_format``'s."""
    if schema is True or schema is None:
        schema = {}
    schema = closed_objects(schema) if isinstance(schema, Mapping) else schema
    if isinstance(schema, Mapping):
        schema = {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE, "lenient": False,
                                           "coerce_one_of": False}}
    return "%json" + json.dumps(schema, ensure_ascii=False)


#: A call written as bare JSON at the start of the reply (no markup, or in a ```json fence), as
#: llama.cpp's lazy grammars trigger on it: the text from its ``{`` on is the call's.
BARE_CALL_START = r'\s*(?:```(?:json)?[ \t]*\n\s*)?(\{\s*"name"\s*:\s*")'


def check_functions(functions: Sequence[Mapping[str, Any]]) -> None:
    """Refuse, by name, a function whose parameters' schema the engine cannot enforce (before any compute)."""
    if not functions:
        raise GrammarError("a constrained tool call needs at least one function", param="tools")
    for function in functions:
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise GrammarError(f"a tool function needs a non-empty string name, got {name!r}", param="tools")
        json_schema_grammar(parameters_schema(function), param="tools")


def call_choice(functions: Sequence[Mapping[str, Any]], rules: "Rules", write: Callable[[Mapping[str, Any]], str]) -> str:
    """A Lark choice among one call of each of ``functions`` (checked first); ``write(function)``
    gives one call's expression."""
    check_functions(functions)
    return " | ".join(rules.add(write(function), "call") for function in functions)


def ordered_parameters(function: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    """``(key, its schema, whether it is required)`` for a function's parameters, in the order a
    constrained call writes them: the required ones, then the optional ones, each in the schema's order."""
    schema = parameters_schema(function)
    declared = schema.get("properties")
    properties: Mapping[str, Any] = declared if isinstance(declared, Mapping) else {}
    required = [k for k in schema.get("required", []) if k in properties]
    return [(k, properties[k], True) for k in required] + [(k, v, False) for k, v in properties.items()
                                                           if k not in required]


def lark_grammar(text: str, description: str = "tool call") -> Grammar:
    """A grammar from Lark text (``start`` its first rule)."""
    try:
        serialized = _llguidance().LLMatcher.grammar_from_lark(text)
    except (ValueError, TypeError) as error:
        raise GrammarError(f"the tool-call grammar cannot be built: {error}", param="tools") from None
    return Grammar(serialized, "tools", description, schema=True)


class Rules:
    """Lark rules made while building one grammar (raw text up to a suffix needs a rule each)."""

    def __init__(self):
        self.lines: list[str] = []
        self._names: dict[tuple, str] = {}

    def add(self, expr: str, hint: str = "r") -> str:
        key = ("expr", expr)
        if key not in self._names:
            name = f"{hint}{len(self._names)}"
            self._names[key] = name
            self.lines.append(f"{name}: {expr}")
        return self._names[key]

    def text_until(self, suffix: str) -> str:
        """A rule for any text up to (and with) ``suffix``: the shortest such text."""
        key = ("until", suffix)
        if key not in self._names:
            name = f"text{len(self._names)}"
            self._names[key] = name
            self.lines.append(f"{name}[suffix={lark_string(suffix)}]: /(.|\\n)*/")
        return self._names[key]

    def grammar(self, start: str, description: str = "tool call") -> Grammar:
        return lark_grammar("\n".join([f"start: {start}", *self.lines]) + "\n", description)


def typed_parameter_expr(schema: Optional[Mapping[str, Any]], close: str, rules: Rules, vocab: Vocabulary) -> str:
    """The value of an XML parameter, then ``close``: raw text when the schema allows a
    string (or says nothing), else JSON valid against it (llama.cpp's rule)."""
    types = value_types(schema)
    if not types or "string" in types:
        if schema and set(schema) & {"enum", "const"}:
            values = schema["enum"] if "enum" in schema else [schema["const"]]
            if all(isinstance(v, str) for v in values):
                return "(" + " | ".join(lark_string(v) for v in values) + ") " + vocab.lit(close)
        return rules.text_until(close)
    return f"{json_expr(schema)} {vocab.lit(close)}"
