"""response_format and grammar=: outputs parse and validate, on a tiny random model
(whose preferences are arbitrary) and on SmolLM2-135M; what cannot be enforced is refused by name."""
from __future__ import annotations

import datetime
import json
import re
import uuid
from typing import Literal, Optional, Union

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field

import elelem
from elelem.errors import GrammarError, InvalidArgumentError, UnsupportedSchemaError
from structured_models import write_structured_model

CHAT = [{"role": "user", "content": "Describe a person as JSON."}]


class Strict(BaseModel):
    # additionalProperties: false, as OpenAI's strict mode writes it.  Person leaves it out: the
    # engine then closes the object itself (else a random model would add keys without end).
    model_config = ConfigDict(extra="forbid")


class Address(Strict):
    city: str = Field(pattern=r"^[A-Z][a-z]{1,8}$")
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Cat(Strict):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(Strict):
    kind: Literal["dog"]
    good: bool


class Person(BaseModel):
    """What pydantic's model_json_schema() emits: $defs/$ref, anyOf (Optional, unions), a discriminated
    oneOf, const, enum, bounds, lengths, patterns and formats."""
    id: uuid.UUID
    name: str = Field(min_length=2, max_length=12)
    age: int = Field(ge=0, le=120)
    height: float = Field(gt=0.5, lt=2.5)
    born: datetime.date
    wakes: datetime.time
    role: Literal["admin", "user", "guest"]
    nickname: Optional[str] = Field(default=None, max_length=6)
    home: Address
    pet: Union[Cat, Dog] = Field(discriminator="kind")
    tags: list[Literal["a", "b", "c"]] = Field(min_length=1, max_length=3)


PERSON_SCHEMA = Person.model_json_schema()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_structured_model(tmp_path_factory.mktemp("structured") / "tiny.gguf")
    with elelem.LLM(path, n_threads=1, n_ctx=1024) as llm:
        yield llm


def content(response) -> str:
    choice = response["choices"][0]
    assert choice["finish_reason"] == "stop", choice  # the constraint closed the JSON, not max_tokens
    return choice["message"]["content"]


def test_the_schema_keywords_pydantic_emits_are_all_used():
    # The model above must exercise every keyword the issue lists, or the tests below prove less.
    text = json.dumps(PERSON_SCHEMA)
    for keyword in ("$defs", "$ref", "anyOf", "oneOf", "const", "enum", "minimum", "maximum", "exclusiveMinimum",
                    "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", '"uuid"',
                    '"date"', '"time"', '"null"', "additionalProperties"):
        assert keyword in text, keyword


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_pydantic_schema_output_validates_on_a_random_model(tiny, seed):
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed, "top_k": 0,
                                                        "top_p": 1.0, "min_p": 0.0}
    response = tiny.create_chat_completion(CHAT, max_tokens=600, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}},
        **sampling)
    text = content(response)
    jsonschema.validate(json.loads(text), PERSON_SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    Person.model_validate_json(text)


def test_each_response_format_shape(tiny):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    shaped = [{"type": "json_object", "schema": schema},  # llama-cpp-python's
              {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}]
    for response_format in shaped:
        value = json.loads(content(tiny.create_chat_completion(CHAT, response_format=response_format,
                                                               max_tokens=100, temperature=0)))
        assert set(value) == {"n"} and 10 <= value["n"] <= 99
    for seed in range(3):  # any JSON object: the random model writes unbounded strings, so give it room
        free = tiny.create_chat_completion(CHAT, response_format={"type": "json_object"}, max_tokens=400,
                                           temperature=1.0, seed=seed)
        assert isinstance(json.loads(content(free)), dict)
    text = tiny.create_chat_completion(CHAT, response_format={"type": "text"}, max_tokens=30, temperature=0)
    plain = tiny.create_chat_completion(CHAT, max_tokens=30, temperature=0)
    assert text["choices"][0]["message"] == plain["choices"][0]["message"]


def test_streamed_json_is_the_same_json(tiny):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    whole = content(tiny.create_chat_completion(CHAT, response_format=response_format, max_tokens=600,
                                                temperature=0))
    chunks = list(tiny.create_chat_completion(CHAT, response_format=response_format, max_tokens=600,
                                              temperature=0, stream=True))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_batched_requests_keep_their_own_constraints(tiny):
    # Sessions step together in the engine: each request's mask must follow its own grammar.
    digits = tiny.new_session().stream("Q:", grammar='root ::= [0-9]{3,6} "."', max_tokens=20, temperature=1.0,
                                       seed=1)
    words = tiny.new_session().stream("Q:", grammar='root ::= ("ab" | "cd"){2,4} "!"', max_tokens=20,
                                      temperature=1.0, seed=2)
    texts = {"digits": [], "words": []}
    for pair in zip(digits, words):  # interleaved: both are running in the same steps
        texts["digits"].append(pair[0])
        texts["words"].append(pair[1])
    texts["digits"] += list(digits)
    texts["words"] += list(words)
    assert re.fullmatch(r"[0-9]{3,6}\.", "".join(texts["digits"])), texts
    assert re.fullmatch(r"(ab|cd){2,4}!", "".join(texts["words"])), texts


def test_gbnf_grammar_in_completions_and_chat(tiny):
    grammar = r'''root ::= answer " (" [0-9]{1,3} "%)"
answer ::= "yes" | "no" | "maybe"
'''
    shape = re.compile(r"(yes|no|maybe) \([0-9]{1,3}%\)")
    for seed in range(4):
        completion = tiny.create_completion("Q: is it? A:", grammar=grammar, max_tokens=20, temperature=1.0,
                                            seed=seed)
        assert shape.fullmatch(completion["choices"][0]["text"]), completion["choices"][0]
        assert completion["choices"][0]["finish_reason"] == "stop"
    assert shape.fullmatch(tiny.chat(CHAT, grammar=grammar, max_tokens=20, temperature=0))
    assert shape.fullmatch(tiny.generate("Q:", grammar=grammar, max_tokens=20, temperature=0))


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "hostname-ish"}}}, "format"),
    ({"anyOf": [{"type": "string"}], "not": {"const": "x"}}, "not"),
    ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}, "oneOf"),
])
def test_unenforceable_keywords_are_refused_before_any_compute(tiny, schema, keyword):
    session = tiny.new_session()
    with pytest.raises(UnsupportedSchemaError) as raised:
        session.create_chat_completion(CHAT, response_format={"type": "json_object", "schema": schema})
    assert raised.value.keyword == keyword and repr(keyword) in str(raised.value)
    assert raised.value.param == "response_format"
    assert isinstance(raised.value, InvalidArgumentError) and session.n_evaluated == 0


@pytest.mark.parametrize("kwargs", [
    {"response_format": {"type": "json"}},
    {"response_format": "json_object"},
    {"response_format": {"type": "json_schema"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}},
    {"response_format": {"type": "json_object", "schema": {"type": "objekt"}}},
    {"grammar": "root ::= missing_rule"},
    {"grammar": ""},
    {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_object"}, "tools": [{"type": "function", "function": {"name": "f"}}]},
])
def test_bad_requests_are_refused_with_the_field_named(tiny, kwargs):
    with pytest.raises(GrammarError) as raised:
        tiny.create_chat_completion(CHAT, **kwargs)
    assert raised.value.param in ("response_format", "grammar")


def test_forced_tool_call_on_a_random_model_follows_the_schema(tiny):
    tools = [{"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["hour", "minute", "days"],
        "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                       "minute": {"type": "integer", "minimum": 0, "maximum": 59},
                       "days": {"type": "array", "items": {"enum": ["mon", "tue", "sun"]}, "maxItems": 3}}}}}]
    for seed in range(3):
        response = tiny.create_chat_completion(CHAT, tools=tools, tool_choice="required", max_tokens=200,
                                               temperature=1.0, seed=seed)
        choice = response["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "set_alarm"
        jsonschema.validate(json.loads(call["function"]["arguments"]), tools[0]["function"]["parameters"])


# -- SmolLM2-135M: a real model's own preferences, under the constraint ------------------------

class Node(Strict):
    """A recursive schema ($ref to itself through $defs)."""
    label: str = Field(max_length=20)
    children: list["Node"] = Field(default_factory=list, max_length=2)


class Contact(Strict):
    name: str = Field(max_length=30)
    email: str = Field(json_schema_extra={"format": "email"}, max_length=40)
    age: int = Field(ge=18, le=99)
    nickname: Optional[str] = Field(default=None, max_length=10)


@pytest.fixture(scope="module")
def smollm(smollm_path):
    with elelem.LLM(smollm_path, n_threads=1, n_ctx=1024) as llm:
        yield llm


def json_reply(llm, prompt: str, schema: dict, **sampling) -> str:
    response = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=200, **sampling,
                                          response_format={"type": "json_schema", "json_schema": {
                                              "name": "answer", "schema": schema, "strict": True}})
    return content(response)


@pytest.mark.real_model
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 5}])
def test_real_model_pydantic_schema_with_email_and_bounds(smollm, sampling):
    schema = Contact.model_json_schema()
    text = json_reply(smollm, "Give me a contact for Ada Lovelace, 36, as JSON.", schema, **sampling)
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", value["email"]), value
    Contact.model_validate_json(text)


@pytest.mark.real_model
def test_real_model_recursive_schema(smollm):
    schema = Node.model_json_schema()
    assert "#/$defs/Node" in json.dumps(schema["$defs"]["Node"]["properties"]["children"])  # it is recursive
    tree = '{"label": "a", "children": [{"label": "b", "children": []}]}'
    value = json.loads(json_reply(smollm, f"Copy this JSON exactly: {tree}", schema, temperature=0))
    jsonschema.validate(value, schema)
    assert value == json.loads(tree)  # a value two levels deep, through the $ref


@pytest.mark.real_model
def test_real_model_json_object_and_grammar(smollm):
    # The system message keeps SmolLM2 to the object asked for (16 tokens): without it,
    # greedy decoding on some CPUs writes an endless description of itself, inside JSON.
    ask = [{"role": "system", "content": "You reply with JSON only."},
           {"role": "user", "content": 'Return {"colors": ["red", "green", "blue"]} as JSON.'}]
    reply = smollm.create_chat_completion(ask,
                                          response_format={"type": "json_object"}, max_tokens=120, temperature=0)
    assert isinstance(json.loads(content(reply)), dict)
    completion = smollm.create_completion("The capital of France is", grammar='root ::= " " [A-Z][a-z]+ "."',
                                          max_tokens=12, temperature=0)
    assert completion["choices"][0]["text"] == " Paris."
