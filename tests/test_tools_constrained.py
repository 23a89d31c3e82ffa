"""Constrained decoding (llguidance) on a toy vocabulary: whatever the logits, the output parses and validates."""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from elelem.api.tools import Forced, TokenConstraint, tool_call_grammar
from elelem.errors import GrammarError, UnsupportedSchemaError
from elelem.sampling.grammar import GrammarMatcher, GrammarTokenizer, gbnf_grammar, json_schema_grammar
from elelem.sampling.sampler import Sampler, SamplingParams

# A toy vocabulary: id 0 is the end-of-generation control token; then every character the
# schemas below need, plus multi-character pieces that are valid in some places and invalid in most.
VOCAB = ([b"</s>"] + [c.encode() for c in '{}[]":, -.@0123456789abcdefghijklmnopqrstuvwxyz_é\\\n'] +
         [t.encode() for t in ('{"', '":', '": ', '", "', '"}', '}}', '"]', 'true', 'false', 'null', 'fixed',
                               '"fixed"', '{"name": "', '", "arguments": ', 'get', '_weather', 'abc', '12',
                               '-0', '0.5', '\\u00e9', ', ', '},', '"a"', '1}', ']}', '}\n', 'é"', '\n  ')])
EOS = 0
CHAR_ID = {t.decode(): i for i, t in enumerate(VOCAB) if len(t.decode()) == 1}
TOKENIZER = GrammarTokenizer(VOCAB, special_ids=[EOS], eog_ids=[EOS],
                             encode=lambda text: [CHAR_ID[c] for c in text])

# -- random schemas whose every value is bounded, so every constrained output ends ---------

names = st.text("abcxyz_é\"\\", min_size=1, max_size=5)
scalars = st.one_of(
    st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": "integer", "minimum": -50, "maximum": 999},
                     {"type": "number", "minimum": -2, "exclusiveMaximum": 10}]),
    st.builds(lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
              st.integers(0, 3), st.integers(0, 3)),
    st.lists(st.one_of(st.text("ab\"é", max_size=3), st.integers(-20, 20), st.booleans(), st.none()),
             min_size=1, max_size=4, unique_by=json.dumps).map(lambda values: {"enum": values}),
    st.just({"type": ["string", "null"], "maxLength": 4}), st.just({"const": "fixed"}),
    st.just({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 2}]}),
)


def objects(children):
    return st.dictionaries(names, children, max_size=4).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props)) if props else st.nothing()).map(
            lambda req: {"type": "object", "properties": props, "required": sorted(req),
                         "additionalProperties": False}))


schemas = st.recursive(scalars, lambda children: st.one_of(
    objects(children),
    st.builds(lambda item, lo: {"type": "array", "items": item, "minItems": lo, "maxItems": lo + 2},
              children, st.integers(0, 2)),
), max_leaves=8)
parameters = objects(schemas)


def run(constraint, seed: int, params: SamplingParams, mode: str) -> str:
    rng = np.random.default_rng(seed)
    sampler = Sampler(params)
    out = []
    for _ in range(2000):
        if constraint.complete:
            return b"".join(out).decode()
        logits = rng.normal(size=len(VOCAB)).astype(np.float32) * 5
        if mode == "adversarial-close":  # the model keeps trying to end the JSON early
            logits[[VOCAB.index(t) for t in (b'}', b']', b'"}', b'}}')]] += 50
        elif mode == "adversarial-long":  # ... or to never end it
            logits[[VOCAB.index(t) for t in (b'a', b', ', b'\n  ')]] += 50
        elif mode == "banned-right":  # the control token is the argmax, all along
            logits[EOS] = 100
        token = constraint.sample(sampler, logits, [0])
        if token == EOS:
            return b"".join(out).decode()
        out.append(VOCAB[token])
    raise AssertionError("the constrained output did not end")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.lists(parameters, min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1),
       greedy=st.booleans(), mode=st.sampled_from(["random", "adversarial-close", "adversarial-long",
                                                   "banned-right"]))
def test_constrained_tool_call_always_parses_and_validates(params, seed, greedy, mode):
    functions = [{"name": f"fn{i}", "parameters": p} for i, p in enumerate(params)]
    constraint = TokenConstraint([tool_call_grammar(functions)], TOKENIZER)
    text = run(constraint, seed, SamplingParams(temperature=0 if greedy else 1.0, top_k=0, top_p=1.0, min_p=0.0),
               mode)
    call = json.loads(text)
    assert set(call) == {"name", "arguments"}
    schema = next(f["parameters"] for f in functions if f["name"] == call["name"])
    jsonschema.validate(call["arguments"], schema)


def accepts(schema, text: str) -> bool:
    matcher = GrammarMatcher(json_schema_grammar(schema), TOKENIZER)
    for ch in text:
        if not matcher.allowed()[CHAR_ID[ch]]:
            return False
        matcher.consume(CHAR_ID[ch])
    return matcher.accepting


def values_of(schema):
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([values_of(s) for s in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([values_of({**schema, "type": k}) for k in kind])
    if kind == "object":
        props, required = schema["properties"], schema["required"]
        return st.fixed_dictionaries({k: values_of(props[k]) for k in props if k in required},
                                     optional={k: values_of(props[k]) for k in props if k not in required}
                                     ).map(lambda d: {k: d[k] for k in props if k in d})  # schema order
    if kind == "array":
        return st.lists(values_of(schema["items"]), min_size=schema["minItems"], max_size=schema["maxItems"])
    if kind == "string":
        return st.text("abcxyz_é", min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 6))
    if kind == "integer":
        return st.integers(schema["minimum"], schema["maximum"])
    if kind == "number":
        return st.decimals(-2, 9, places=2).map(float).filter(lambda f: "e" not in repr(f))
    if kind == "boolean":
        return st.booleans()
    return st.none()


@settings(max_examples=60, deadline=None)
@given(schema=schemas, data=st.data())
def test_grammar_accepts_what_json_dumps_writes(schema, data):
    # Every value the schema allows, written as json.dumps writes it (pretty or compact), is accepted.
    value = data.draw(values_of(schema))
    wrapped = {"type": "object", "properties": {"v": schema}, "required": ["v"]}
    assert accepts(wrapped, json.dumps({"v": value}, ensure_ascii=False)), (schema, value)
    assert accepts(wrapped, json.dumps({"v": value}, ensure_ascii=False, separators=(",", ":")))


def test_rejects_what_the_schema_does_not_allow():
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer", "minimum": 0}},
              "required": ["city"], "additionalProperties": False}
    for text in ['{}', '{"n": 1}', '{"city": 1}', '{"city": "x", "n": 1.5}', '{"city": "x",}', '{"city": "x", "n": -1}',
                 '{"city": "x", "extra": 1}', '{"city": "x"} ', '{"city": "a\nb"}', '{"city": "x", "n": 01}']:
        assert not accepts(schema, text), text
    assert accepts(schema, '{"city": "x", "n": 10}')


def test_objects_are_closed_unless_the_schema_opens_them():
    listed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(listed, '{"a": 1}') and not accepts(listed, '{"a": 1, "b": 2}')  # as llama.cpp reads it
    assert accepts({**listed, "additionalProperties": True}, '{"a": 1, "b": 2}')
    assert not accepts({**listed, "additionalProperties": {"type": "string"}}, '{"a": 1, "b": 2}')
    assert accepts({"type": "object"}, '{"b": 2}')  # no properties listed: any keys
    both = {"allOf": [listed, {"properties": {"b": {"type": "integer"}}}]}  # closing a branch would forbid b
    assert accepts(both, '{"a": 1, "b": 2}')


def test_forced_phases_wrap_the_json():
    start, end = VOCAB.index(b"{"), VOCAB.index(b"}")
    grammar = json_schema_grammar({"type": "object", "properties": {}, "additionalProperties": False})
    constraint = TokenConstraint([Forced([3, 4]), grammar, Forced([5])], TOKENIZER)
    sampler = Sampler(SamplingParams(temperature=0))
    logits = np.zeros(len(VOCAB), dtype=np.float32)
    logits[end] = 1
    picked = [constraint.sample(sampler, logits, []) for _ in range(5)]
    assert picked == [3, 4, start, end, 5] and constraint.complete


def greedy_text(grammar, logits) -> tuple[str, bool]:
    """The greedy output under ``grammar``, and whether it ended with the end-of-generation token."""
    constraint = TokenConstraint([grammar], TOKENIZER)
    sampler = Sampler(SamplingParams(temperature=0))
    text = []
    while not constraint.complete:
        token = constraint.sample(sampler, logits, [])
        if token == EOS:
            return "".join(text), True
        text.append(VOCAB[token].decode())
    return "".join(text), False


def test_end_of_generation_only_where_the_grammar_is_complete():
    # The model wants to stop at every step; the constraint lets it only once the output is whole.
    logits = np.zeros(len(VOCAB), dtype=np.float32)
    logits[EOS] = 10
    logits[[VOCAB.index(b"7"), VOCAB.index(b"]"), VOCAB.index(b","), VOCAB.index(b"[")]] = [3, 2.5, 2, 1]
    array = json_schema_grammar({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                 "minItems": 2, "maxItems": 5})
    # The shortest array allowed; after its "]" nothing may follow, so the constraint ends there.
    assert greedy_text(array, logits) == ("[7,7]", False)
    # A grammar that may go on: the end token is taken as soon as it is allowed.
    assert greedy_text(gbnf_grammar('root ::= [0-9]{2,4} ("," [0-9])*'), logits) == ("77", True)


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not"),
    ({"if": {"type": "string"}, "then": {"maxLength": 3}}, "if"),
    ({"type": "string", "format": "ipv5"}, "format"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),  # overlapping: anyOf would be looser
    ({"type": "string", "pattern": "(?=a)b"}, "pattern"),  # look-ahead
    ({"type": "object", "properties": {"x": {"type": "integer"}}, "x-guidance": {"lenient": True},
      "dependentRequired": {"x": ["y"]}}, "dependentRequired"),  # a schema cannot switch strictness off
])
def test_keywords_the_engine_cannot_enforce_are_refused_by_name(schema, keyword):
    with pytest.raises(UnsupportedSchemaError) as raised:
        TokenConstraint([json_schema_grammar(schema)], TOKENIZER)
    assert raised.value.keyword == keyword and keyword in str(raised.value)


@pytest.mark.parametrize("schema", [
    {"type": "strin"}, {"$ref": "#/$defs/missing"}, {"type": "object", "required": "a"}, [1, 2], "{not json",
    {"type": "string", "minLength": 5, "maxLength": 2},
])
def test_bad_schemas_are_refused(schema):
    with pytest.raises(GrammarError):
        TokenConstraint([json_schema_grammar(schema)], TOKENIZER)


def test_tool_call_grammar_needs_named_functions():
    with pytest.raises(GrammarError):
        tool_call_grammar([])
    with pytest.raises(GrammarError):
        tool_call_grammar([{"name": "", "parameters": {}}])
