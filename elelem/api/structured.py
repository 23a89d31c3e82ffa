"""``response_format`` and ``grammar``: what a request asks its output to match.

``response_format`` takes each shape in use:

* ``{"type": "text"}`` (or None): free text;
* ``{"type": "json_object"}``: any JSON object (OpenAI);
* ``{"type": "json_object", "schema": {...}}``: JSON valid against the schema (llama-cpp-python);
* ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (OpenAI's structured
  outputs; the schema is enforced whatever ``strict`` says, and without one any JSON object is).

``grammar`` is GBNF text, as llama.cpp takes it.  The constraint itself is
:mod:`elelem.sampling.constrained` over :mod:`elelem.sampling.grammar`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..errors import GrammarError
from ..sampling.constrained import TokenConstraint
from ..sampling.grammar import Grammar, gbnf_grammar, json_object_grammar, json_schema_grammar
from .assets import ModelAssets

_FORMATS = ("text", "json_object", "json_schema")


def output_grammar(response_format: Any = None, grammar: Any = None) -> Optional[Grammar]:
    """The grammar the output must match, or None for free text."""
    from_format = _format_grammar(response_format)
    if grammar is None:
        return from_format
    if from_format is not None:
        raise GrammarError("give either grammar or a JSON response_format, not both", param="grammar")
    return gbnf_grammar(grammar)


def output_constraint(assets: ModelAssets, grammar: Optional[Grammar]) -> Optional[TokenConstraint]:
    """The token constraint of one generation, compiled now (a bad grammar raises before any compute)."""
    return None if grammar is None else TokenConstraint([grammar], assets.grammar_tokenizer)


def _format_grammar(response_format: Any) -> Optional[Grammar]:
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping) or response_format.get("type") not in _FORMATS:
        raise GrammarError(f"response_format must be a dict whose type is one of {list(_FORMATS)}, "
                           f"got {response_format!r:.200}", param="response_format")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return json_object_grammar() if schema is None else json_schema_grammar(schema)
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise GrammarError("response_format of type 'json_schema' needs a 'json_schema' dict "
                           "({'name', 'schema', 'strict'})", param="response_format")
    if spec.get("name") is not None and not isinstance(spec["name"], str):
        raise GrammarError("response_format.json_schema.name must be a string", param="response_format")
    if spec.get("strict") not in (None, True, False):
        raise GrammarError("response_format.json_schema.strict must be a boolean", param="response_format")
    schema = spec.get("schema")
    return json_object_grammar() if schema is None else json_schema_grammar(schema)
