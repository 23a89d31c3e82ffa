"""Constrained decoding: whatever the logits, the output parses and validates."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from elelem.errors import InvalidArgumentError
from elelem.sampling.sampler import Sampler, SamplingParams
from elelem.api.tools import Forced, JsonAutomaton, Limits, TokenConstraint, TokenTexts

SMALL = Limits(max_string_chars=6, max_array_items=3, max_number_digits=4)


def valid(value, schema) -> bool:
    """A tiny validator for the supported subset."""
    if "const" in schema:
        return value == schema["const"] and type(value) is type(schema["const"])
    if "enum" in schema:
        return any(value == v and type(value) is type(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return any(valid(value, {**schema, "type": k}) for k in kind)
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and set(schema.get("required", ())) <= set(value)
                and set(value) <= set(props) and all(valid(v, props[k]) for k, v in value.items()))
    if kind == "array":
        return (isinstance(value, list) and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1e9)
                and all(valid(v, schema.get("items", {})) for v in value))
    if kind == "string":
        return isinstance(value, str) and schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 1e9)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    return isinstance(value, (str, int, float, bool, type(None)))  # {}: any scalar


# -- random schemas in the supported subset ------------------------------------------

names = st.text("abcxyz_é\"\\", min_size=1, max_size=5)
scalars = st.one_of(
    st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null")]),
    st.builds(lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
              st.integers(0, 3), st.integers(0, 3)),
    st.lists(st.one_of(st.text("ab\"é", max_size=3), st.integers(-20, 20), st.booleans(), st.none()),
             min_size=1, max_size=4, unique_by=json.dumps).map(lambda values: {"enum": values}),
    st.just({"type": ["string", "null"]}), st.just({}), st.just({"const": "fixed"}),
)


def objects(children):
    return st.dictionaries(names, children, max_size=4).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props)) if props else st.nothing()).map(
            lambda req: {"type": "object", "properties": props, "required": sorted(req)}))


schemas = st.recursive(scalars, lambda children: st.one_of(
    objects(children),
    st.builds(lambda item, lo: {"type": "array", "items": item, "minItems": lo}, children, st.integers(0, 2)),
), max_leaves=8)
parameters = objects(schemas)

# A toy vocabulary: every character the automaton can need, plus multi-character
# pieces that are valid in some places and invalid in most.
VOCAB = ([None] + list('{}[]":, -.0123456789abcdefghijklmnopqrstuvwxyz_é\\') +
         ['{"', '":', '": ', '", "', '"}', '}}', '"]', 'true', 'false', 'null', 'fixed', '"fixed"',
          '{"name": "', '", "arguments": ', 'get', '_weather', 'abc', '12', '-0', '0.5', '\\u00e9',
          ', ', '},', '"a"', '1}', ']}', '}\n', 'é"'])
TEXTS = TokenTexts(VOCAB)


def run(constraint, seed: int, params: SamplingParams, mode: str) -> str:
    rng = np.random.default_rng(seed)
    sampler = Sampler(params)
    out = []
    for _ in range(5000):
        if constraint.complete:
            return "".join(out)
        logits = rng.normal(size=len(VOCAB)).astype(np.float32) * 5
        if mode == "adversarial-close":  # the model keeps trying to end the JSON early
            logits[[VOCAB.index(t) for t in ('}', ']', '"}', '}}')]] += 50
        elif mode == "adversarial-long":  # ... or to never end it
            logits[[VOCAB.index(t) for t in ('a', '0', ', ', '",')[:3]]] += 50
        elif mode == "banned-right":  # the only valid tokens are very unlikely
            logits[0] = 100  # a control token (no text) as the argmax
        token = constraint.sample(sampler, logits, out and [0])
        out.append(VOCAB[token] or "")
    raise AssertionError("the constrained output did not end")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.lists(parameters, min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1),
       greedy=st.booleans(), mode=st.sampled_from(["random", "adversarial-close", "adversarial-long",
                                                   "banned-right"]))
def test_constrained_tool_call_always_parses_and_validates(params, seed, greedy, mode):
    functions = [{"name": f"fn{i}", "parameters": p} for i, p in enumerate(params)]
    automaton = JsonAutomaton.for_tool_call(functions, SMALL)
    constraint = TokenConstraint([automaton], TEXTS)
    text = run(constraint, seed, SamplingParams(temperature=0 if greedy else 1.0, top_k=0, top_p=1.0, min_p=0.0),
               mode)
    call = json.loads(text)
    assert set(call) == {"name", "arguments"}
    schema = next(f["parameters"] for f in functions if f["name"] == call["name"])
    assert valid(call["arguments"], schema), (text, schema)


@settings(max_examples=150, deadline=None)
@given(schema=schemas, data=st.data())
def test_automaton_accepts_what_json_dumps_writes(schema, data):
    # Every value the schema allows (within the caps), written as json.dumps writes it, is accepted.
    value = data.draw(values_of(schema))
    automaton = JsonAutomaton.for_schema({"type": "object", "properties": {"v": schema}, "required": ["v"]}, SMALL)
    assert automaton.accepts(json.dumps({"v": value}, ensure_ascii=False)), (schema, value)
    assert automaton.accepts(json.dumps({"v": value}, ensure_ascii=False, separators=(",", ":")))


def values_of(schema):
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([values_of({**schema, "type": k}) for k in kind])
    if kind == "object":
        props, required = schema["properties"], schema["required"]
        return st.fixed_dictionaries({k: values_of(props[k]) for k in props if k in required},
                                     optional={k: values_of(props[k]) for k in props if k not in required}
                                     ).map(lambda d: {k: d[k] for k in props if k in d})  # schema order
    if kind == "array":
        return st.lists(values_of(schema["items"]), min_size=schema["minItems"], max_size=SMALL.max_array_items)
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 6), 6))
    if kind == "integer":
        return st.integers(-9999, 9999)
    if kind == "number":
        return st.one_of(st.integers(-9999, 9999), st.decimals(-999, 999, places=2).map(
            lambda d: float(d)).filter(lambda f: "e" not in repr(f)))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.one_of(st.text(max_size=6), st.integers(-99, 99), st.booleans(), st.none())


def test_rejects_what_the_schema_does_not_allow():
    automaton = JsonAutomaton.for_schema({"type": "object", "properties": {
        "city": {"type": "string"}, "n": {"type": "integer"}}, "required": ["city"]})
    for text in ['{}', '{"n": 1}', '{"city": 1}', '{"city": "x", "n": 1.5}', '{"city": "x",}',
                 '{"city": "x", "extra": 1}', '{"city": "x"} ', '{"city": "a\nb"}', '{"city": "x", "n": 01}']:
        assert not automaton.accepts(text), text
    assert automaton.accepts('{"city": "x", "n": -10}')


def test_forced_phases_wrap_the_json():
    start, end = VOCAB.index("{"), VOCAB.index("}")
    automaton = JsonAutomaton.for_schema({"type": "object", "properties": {}})
    constraint = TokenConstraint([Forced([3, 4]), automaton, Forced([5])], TEXTS)
    sampler = Sampler(SamplingParams(temperature=0))
    logits = np.zeros(len(VOCAB), dtype=np.float32)
    logits[end] = 1
    picked = [constraint.sample(sampler, logits, []) for _ in range(5)]
    assert picked == [3, 4, start, end, 5] and constraint.complete


@pytest.mark.parametrize("schema", [{"type": "date"}, {"anyOf": []} | {"type": ["integer", "number"]},
                                    {"type": "object", "properties": {}, "required": ["x"]},
                                    {"type": "string", "minLength": 10_000},
                                    {"type": "object", "properties": [1, 2]},
                                    {"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"}])
def test_unsupported_schemas_are_refused(schema):
    with pytest.raises(InvalidArgumentError):
        JsonAutomaton.for_schema(schema)
