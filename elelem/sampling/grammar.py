"""Grammars for constrained decoding, compiled by llguidance.

A grammar comes from a JSON schema (:func:`json_schema_grammar`), from "any
JSON object" (:func:`json_object_grammar`), from GBNF text as llama.cpp takes
it (:func:`gbnf_grammar`), or from the tools a forced tool call may name
(:func:`tool_call_grammar`).  :class:`GrammarTokenizer` gives llguidance the
bytes of every token id of elelem's own tokenizer; :class:`GrammarMatcher`
then follows one generation and computes, before each token, which ids may
come next.

Why llguidance (1.9, Rust, abi3 wheel, no dependencies; llama.cpp's engine):
it computes a mask over the vocabulary lazily (an Earley parser over a lexer,
walking a token trie), in tens of microseconds on Qwen's 151k tokens, and
supports recursion, ``$ref``, ``anyOf``, numeric bounds, ``pattern`` and
formats, reporting every keyword it cannot enforce.  outlines-core 0.2 (no
dependencies either) compiles a schema to one regex (recursion unrolled to a
fixed depth, no grammars) and indexes it over the whole vocabulary up front:
13 s for a four-property schema on Qwen's vocabulary here.  xgrammar needs
torch and transformers.

Nothing is loosened: llguidance's ``lenient`` option (ignore unimplemented
keywords) and ``coerce_one_of`` (read ``oneOf`` as ``anyOf``) are forced off,
whatever a schema's ``x-guidance`` says; a keyword it cannot enforce raises
:class:`~elelem.errors.UnsupportedSchemaError` naming it.  The one change
made to a schema is a tightening: objects that list ``properties`` get no
other keys unless the schema allows them (:func:`closed_objects`).
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from ..errors import GrammarError, UnsupportedSchemaError
from ..text.tokenizer.pieces import build_pieces
from ..text.tokenizer.vocab import ATTR_CONTROL, ATTR_UNKNOWN

log = logging.getLogger("elelem")

#: Whitespace allowed between JSON tokens: none, one space, or one or two
#: newlines and up to 20 spaces or tabs of indent (llama.cpp's JSON grammars
#: allow the same).  Bounded, so a model cannot pad the output forever.
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"

_JSON_DEFAULTS = {"whitespace_pattern": JSON_WHITESPACE}
# Overrides win over a schema's own "x-guidance" options.
_JSON_STRICT = {"lenient": False, "coerce_one_of": False}
# llguidance 1.9's messages for what it cannot enforce, and the keyword each is about.
_UNSUPPORTED = (
    (re.compile(r'Unimplemented keys: \[(.*?)\]'), None),
    (re.compile(r"Unknown format: (.*)"), "format"),
    (re.compile(r"oneOf constraints are not supported"), "oneOf"),
    (re.compile(r"look-around.*is not supported|backreferences are not supported"), "pattern"),
)
_CONTROL = b"\xff"  # llguidance's mark of a special token: no grammar text can produce it


def _llguidance():
    # Imported on first use: it costs ~50 ms, which programs that never constrain need not pay.
    import llguidance
    return llguidance


class GrammarTokenizer:
    """llguidance's view of a vocabulary: the bytes of each token id.

    Built from elelem's tokenizer (the pieces ``decode`` concatenates), so
    the constraint sees exactly the text the stream will show.  Control
    tokens are marked special, so no grammar lets one through; the
    end-of-generation ids end a grammar once it is complete.  ``n_vocab`` is
    the model's (its logits may be wider than the tokenizer's table).
    """

    def __init__(self, tokens: Sequence[bytes], special_ids: Iterable[int], eog_ids: Iterable[int],
                 encode: Callable[[str], list[int]], bos_id: Optional[int] = None):
        special = set(special_ids)
        self.pieces = tokens  # each id's bytes as the text shows them (a control token's own text)
        marked = [_CONTROL + t if i in special else bytes(t) for i, t in enumerate(tokens)]
        self.n_vocab = len(marked)
        self.eog_ids = frozenset(eog_ids)
        if not self.eog_ids:
            raise GrammarError("constrained decoding needs an end-of-generation token in the vocabulary")
        source = _Vocabulary(marked, sorted(special), min(self.eog_ids), bos_id, encode)
        llguidance = _llguidance()
        self.ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(source), n_vocab=self.n_vocab,
                                         eos_token=sorted(self.eog_ids))

    @classmethod
    def of(cls, tokenizer, n_vocab: int, encode: Callable[[str], list[int]]) -> "GrammarTokenizer":
        """The vocabulary of elelem's ``tokenizer``, for a model with ``n_vocab`` logits."""
        vocab = tokenizer._vocab
        plain, with_special = build_pieces(vocab)
        special = [i for i, attr in enumerate(vocab.attrs) if attr & (ATTR_CONTROL | ATTR_UNKNOWN)]
        tokens = list(plain)
        for i in special:
            tokens[i] = with_special[i]
        del tokens[n_vocab:]  # ids past the model's logits can never be sampled
        tokens += [b""] * (n_vocab - len(tokens))
        eos = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        return cls(tokens, (i for i in special if i < n_vocab),
                   [i for i in (*tokenizer.eog_ids, *eos) if i < n_vocab], encode, tokenizer.bos_id)


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads: token bytes, ids, and an encoder.

    llguidance calls the encoder itself, also while computing a mask (to
    tokenize text the grammar forces), in whichever thread runs the step:
    it must be thread-safe (ModelAssets passes one under its tokenizer lock)."""

    def __init__(self, tokens: list[bytes], special_ids: list[int], eos: int, bos: Optional[int],
                 encode: Callable[[str], list[int]]):
        self.tokens = tokens
        self.special_token_ids = special_ids
        self.eos_token_id = eos
        self.bos_token_id = bos
        self._encode = encode

    def __call__(self, text) -> list[int]:
        return self._encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


class Grammar:
    """A grammar in llguidance's serialized form; ``param`` names the request field it came from."""

    def __init__(self, serialized: str, param: Optional[str], description: str, *, schema: bool = False):
        self.serialized = serialized
        self.param = param
        self.description = description
        self.schema = schema  # from a JSON schema: refusals name the schema keyword

    def __repr__(self) -> str:
        return f"Grammar({self.description})"


def json_schema_grammar(schema: Any, *, param: Optional[str] = "response_format") -> Grammar:
    """JSON text that validates against ``schema`` (a JSON Schema, as a dict or JSON text)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as error:
            raise GrammarError(f"the JSON schema is not valid JSON: {error}", param=param) from None
    if schema is True:
        schema = {}
    if not isinstance(schema, Mapping):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}", param=param)
    try:
        schema = closed_objects(schema)
    except RecursionError:
        raise GrammarError("the JSON schema nests too deeply", param=param) from None
    try:
        serialized = _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS,
                                                                  overrides=_JSON_STRICT)
    except (ValueError, TypeError) as error:
        raise GrammarError(f"the JSON schema cannot be read: {error}", param=param) from None
    return Grammar(serialized, param, "json schema", schema=True)


# Where subschemas sit: maps of them, lists of them, and single ones (draft 2020-12, and draft 4-7 names).
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
                  "contains", "propertyNames", "not", "if", "then", "else")
_OPENS_OBJECT = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "$ref")


def closed_objects(schema: Mapping[str, Any], *, in_all_of: bool = False) -> dict:
    """``schema`` with ``"additionalProperties": false`` on every object schema that lists
    ``properties`` and says nothing about other keys, as llama.cpp's converter reads them.

    Only a tightening: whatever matches the result matches ``schema``.  Without
    it, a model may add keys of its own without end (small ones do).  Branches of
    an ``allOf``, and schemas with a ``$ref`` beside their ``properties``, are
    left open: closing them could forbid the keys the other part allows."""
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub, in_all_of=key == "allOf") for sub in out[key]]
    for key in _SUBSCHEMA_ONE:
        if isinstance(out.get(key), Mapping):
            out[key] = _closed(out[key])
    if "properties" in out and not in_all_of and not any(key in out for key in _OPENS_OBJECT):
        out["additionalProperties"] = False
    return out


def _closed(schema: Any, *, in_all_of: bool = False) -> Any:
    return closed_objects(schema, in_all_of=in_all_of) if isinstance(schema, Mapping) else schema


def json_object_grammar(*, param: Optional[str] = "response_format") -> Grammar:
    """Any JSON object (OpenAI's ``{"type": "json_object"}``)."""
    return json_schema_grammar({"type": "object"}, param=param)


def gbnf_grammar(text: Any, *, param: Optional[str] = "grammar") -> Grammar:
    """Text that a GBNF grammar (llama.cpp's format, start rule ``root``) accepts.

    llguidance's own Lark syntax (start rule ``start``) is accepted too."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("a grammar must be non-empty GBNF text", param=param)
    from llguidance.gbnf_to_lark import any_to_lark
    try:
        lark = any_to_lark(text)
    except Exception as error:  # its converter raises plain Exceptions for syntax errors
        raise GrammarError(f"the grammar is not valid GBNF: {error}", param=param) from None
    return Grammar(_llguidance().LLMatcher.grammar_from_lark(lark), param, "gbnf")


def tool_call_grammar(functions: Sequence[Mapping[str, Any]]) -> Grammar:
    """``{"name": <one of the functions>, "arguments": <its parameters' schema>}``.

    ``functions`` are OpenAI ``function`` dicts (``name``, ``parameters``)."""
    if not functions:
        raise GrammarError("a constrained tool call needs at least one function", param="tools")
    calls = []
    for function in functions:
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise GrammarError(f"a tool function needs a non-empty string name, got {name!r}", param="tools")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        calls.append({"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
                      "required": ["name", "arguments"], "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return json_schema_grammar(schema, param="tools")


class GrammarMatcher:
    """One generation's position in a grammar: the allowed-token mask, and each token taken."""

    def __init__(self, grammar: Grammar, tokenizer: GrammarTokenizer):
        self._matcher = _llguidance().LLMatcher(tokenizer.ll, grammar.serialized, log_level=0)
        if self._matcher.is_error():
            raise grammar_error(self._matcher.get_error(), grammar)
        for warning in self._matcher.get_grammar_warnings():
            log.warning("grammar (%s): %s", grammar.param or grammar.description, warning)
        self.n_vocab = tokenizer.n_vocab
        self._words = np.zeros((tokenizer.n_vocab + 31) // 32, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """A bool array over the vocabulary: the tokens that may come next."""
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        self._check()
        return np.unpackbits(words.view(np.uint8), bitorder="little", count=self.n_vocab).view(bool)

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(int(token)):
            self._check()

    def consume_all(self, tokens: Sequence[int]) -> bool:
        """Take ``tokens`` if the grammar allows every one of them (True), else take none (False)."""
        tokens = [int(t) for t in tokens]
        if self._matcher.validate_tokens(tokens) < len(tokens):
            return False
        self._matcher.consume_tokens(tokens)
        self._check()
        return True

    def copy(self) -> "GrammarMatcher":
        """An independent matcher at the same position."""
        twin = object.__new__(GrammarMatcher)
        twin._matcher = self._matcher.deep_copy()
        twin.n_vocab = self.n_vocab
        twin._words = np.zeros_like(self._words)
        return twin

    @property
    def done(self) -> bool:
        """No more text may follow (only an end-of-generation token)."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """What was generated is a whole sentence of the grammar."""
        return self._matcher.is_accepting()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise RuntimeError(f"the token constraint failed: {self._matcher.get_error()}")


def grammar_error(message: str, grammar: Grammar) -> GrammarError:
    """llguidance's message for a grammar it refused, as the elelem error it is."""
    flat = " ".join(message.split()) or "the grammar is invalid"
    if grammar.schema:
        for pattern, keyword in _UNSUPPORTED:
            found = pattern.search(message)
            if found is None:
                continue
            if keyword is None:  # the keys are listed in the message
                names = [n.strip().strip('"') for n in found.group(1).split(",") if n.strip()]
                keyword = names[0] if names else "?"
            return UnsupportedSchemaError(
                f"the JSON schema keyword {keyword!r} cannot be enforced by the constraint engine: {flat}",
                keyword=keyword, param=grammar.param)
    return GrammarError(f"invalid {grammar.param or 'grammar'}: {flat}", param=grammar.param)
