"""Lazy tool-call constraints (sampling/lazy.py), in each of the six formats.

A call's grammar starts only at its format's marker, as llama.cpp's lazy
grammars do: free text before it is left alone, the call after it is
valid, a required call cannot be skipped by ending the reply, and under
"auto" a reply without a marker is sampled as if there were no constraint.

The model here is scripted: the tokenizer, vocabulary and template are a
family model's (tests/support/format_models.py), the logits random, and the
"sampler" writes a script token by token wherever the constraint leaves
that token possible (else the likeliest allowed token).  So each test says
exactly what the model tries to write, and checks what the constraint made
of it.
"""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

import elelem
from elelem.api.tools.request import plan_tools, tool_vocabulary
from elelem.errors import UnsupportedSchemaError
from elelem.sampling.lazy import FREE_TOKENS, ReasoningSpan
from format_models import FAMILIES, family_models, template

TOOLS = [  # every value bounded, so a call written by random logits always ends
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "metric": {"type": "boolean"}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "tz": {"type": "string", "enum": ["CET", "UTC"]}}, "required": ["tz"]}}},
]
NAMED = {"type": "function", "function": {"name": "get_time"}}
MODES = {"required": "required", "named": NAMED, "auto": "auto"}

#: What each family's model tries to write: free text, then its call marker (the rest is up to the logits).
PREAMBLE = "Let me check. "
MARKER = {"hermes": "<tool_call>", "qwen3_coder": "<tool_call>", "mistral": "[TOOL_CALLS]",
          "llama3": "<|python_tag|>", "glm": "<tool_call>"}
#: gpt-oss: free reasoning in the analysis channel, then a message to a function (the text a call starts with).
HARMONY_SCRIPT = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                  "<|channel|>commentary to=functions.")


class Scripted:
    """A sampler that writes ``script`` where the constraint allows each token, else the likeliest allowed one."""

    def __init__(self, script):
        self.script = list(script)
        self.refused: list[int] = []   # script tokens the constraint had banned
        self.seen: list[np.ndarray] = []

    def sample(self, logits, recent):
        self.seen.append(logits)
        while self.script:
            token = self.script.pop(0)
            if np.isfinite(logits[token]):
                return token
            self.refused.append(token)  # and the script goes on with its next token
        return int(np.argmax(logits))


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    with family_models(tmp_path_factory, lambda path: elelem.LLM(path, n_threads=1, n_ctx=512)) as get:
        yield lambda name: get(name)[1]


class Run:
    """One reply of a family's model under the lazy constraint of ``tool_choice``
    (one call, as with ``parallel_tool_calls=False``, unless ``parallel``)."""

    def __init__(self, llm, name, tool_choice, reasoning=None, parallel=False):
        self.llm, self.name = llm, name
        self.plan = plan_tools(TOOLS, tool_choice, template(FAMILIES[name][0]), parallel_tool_calls=parallel)
        self.constraint = self.plan.constraint(llm.assets, reasoning)
        self.vocab = tool_vocabulary(llm.assets)
        self.eog = llm.assets.grammar_tokenizer.eog_ids
        self.pieces = llm.assets.grammar_tokenizer.pieces
        self.rng = np.random.default_rng(0)
        self.tokens: list[int] = []
        self.ended = False

    def write(self, sampler, steps=300, until=None):
        """Sample up to ``steps`` tokens (or until ``until(self)``), from random logits."""
        for _ in range(steps):
            if self.ended or self.constraint.complete or (until is not None and until(self)):
                return self
            logits = self.rng.normal(size=self.llm.assets.n_vocab).astype(np.float32)
            sampler.last_given = logits
            token = self.constraint.sample(sampler, logits, self.tokens)
            if token in self.eog:
                self.ended = True
            else:
                self.tokens.append(token)
        return self

    @property
    def text(self) -> str:
        return b"".join(self.pieces[t] for t in self.tokens).decode("utf-8", "replace")

    def parsed(self):
        return self.plan.parser.parse(self.text, TOOLS)


def encode(run, text) -> list[int]:
    return run.vocab.encode(text)


def valid(call) -> str:
    name = call["function"]["name"]
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
    jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    return name


def script_of(run) -> list[int]:
    if run.name == "harmony":
        return encode(run, HARMONY_SCRIPT)
    return encode(run, PREAMBLE + MARKER[run.name])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_free_text_before_the_marker_survives_and_the_call_after_it_is_valid(family, name, mode):
    run = Run(family(name), name, MODES[mode])
    sampler = Scripted(script_of(run))
    run.write(sampler)
    assert run.constraint.complete and not sampler.refused, run.text
    reply = run.parsed()
    if name == "harmony":
        assert reply.reasoning == "Need the weather." and reply.content is None
    else:
        assert run.text.startswith(PREAMBLE + MARKER[name]) and reply.content == PREAMBLE.strip()
    (call,) = reply.tool_calls
    assert valid(call) == "get_time" if mode == "named" else valid(call) in ("get_weather", "get_time")


@pytest.mark.parametrize("mode", ["required", "named"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_required_call_cannot_be_skipped_by_ending_the_reply(family, name, mode):
    run = Run(family(name), name, MODES[mode])
    eog = min(run.eog)
    if name == "harmony":  # gpt-oss's text is its channels: it tries to end its analysis message
        before, after = "<|channel|>analysis<|message|>Done.", HARMONY_SCRIPT[HARMONY_SCRIPT.index("<|end|>"):]
    else:
        before, after = "Done.", PREAMBLE + MARKER[name]
    sampler = Scripted(encode(run, before) + [eog] + encode(run, after))
    run.write(sampler)
    assert sampler.refused == [eog] and not run.ended  # the end was banned: the script went on
    assert run.constraint.complete and run.text.startswith(before + after), run.text
    assert len(run.parsed().tool_calls) == 1


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_required_call_is_forced_after_free_tokens(family, name):
    run = Run(family(name), name, "required")
    rambling = encode(run, "so " * 40)
    # then (gpt-oss) a message to a function rather than an analysis message, which the forced grammar allows too
    sampler = Scripted(rambling[:FREE_TOKENS] + (encode(run, "commentary to=functions.") if name == "harmony" else []))
    run.write(sampler)
    assert run.tokens[:FREE_TOKENS] == rambling[:FREE_TOKENS] and run.constraint.complete
    marker = "<|channel|>" if name == "harmony" else MARKER[name]
    assert run.text.startswith("so " * (FREE_TOKENS // 3) + marker), run.text  # "so " is 3 tokens here
    (call,) = run.parsed().tool_calls
    assert valid(call)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_auto_without_a_marker_is_untouched(family, name):
    run = Run(family(name), name, "auto")
    answer = "<|channel|>final<|message|>It is sunny." if name == "harmony" else "It is sunny in Paris."
    script = encode(run, answer) + [min(run.eog)]
    sampler = Scripted(script)
    given = []
    sampler.sample = (lambda inner: lambda logits, recent: (given.append(logits is sampler.last_given),
                                                            inner(logits, recent))[1])(sampler.sample)
    run.write(sampler)
    assert run.ended and run.tokens == script[:-1] and not run.constraint.triggered
    assert all(given)  # the sampler got the model's own logits, not a masked copy
    if name != "harmony":
        assert run.parsed().content == answer and not run.parsed().tool_calls


def test_a_marker_inside_the_reasoning_starts_nothing(family):
    # Qwen3 with <think> opened by the prompt: a bare JSON call while thinking is reasoning, not a call.
    run = Run(family("hermes"), "hermes", "required", ReasoningSpan("<think>", "</think>", open=True))
    thought = encode(run, '{"name": "get_time"} could do.')
    sampler = Scripted(thought + encode(run, "</think>\n\n") + encode(run, '{"name": "'))
    run.write(sampler, steps=len(thought))
    assert not run.constraint.triggered
    run.write(sampler)
    assert run.constraint.complete
    reply = run.plan.parser.parse(run.text.split("</think>", 1)[1], TOOLS)
    (call,) = reply.tool_calls
    assert valid(call) == "get_time" or valid(call) == "get_weather"


def test_a_marker_spelled_over_several_tokens_starts_the_call(family):
    run = Run(family("qwen3_coder"), "qwen3_coder", "required")
    spelled = [token for char in "<tool_call>" for token in encode(run, char)]  # byte tokens, not <tool_call>'s
    assert len(spelled) == len("<tool_call>")
    run.write(Scripted(spelled))
    assert run.text.startswith("<tool_call>\n<function=")
    (call,) = run.parsed().tool_calls
    assert valid(call)


def test_a_token_that_starts_a_call_the_grammar_cannot_continue_is_redrawn(family):
    # '{"name":  "' matches the bare-call trigger, but the call's JSON allows one space there, not two:
    # the token that completes the trigger is banned, and another drawn.
    run = Run(family("llama3"), "llama3", "auto")
    start = encode(run, '{"name":  ')
    quote = encode(run, '"')
    sampler = Scripted(start + quote)
    run.write(sampler, steps=len(start) + 1)
    assert run.tokens[:len(start)] == start and run.tokens[len(start)] != quote[0]
    assert len(sampler.seen) == len(start) + 2 and sampler.seen[-1][quote[0]] == -np.inf  # drawn again without it


def test_auto_with_a_schema_the_engine_cannot_enforce_stays_unconstrained(family, caplog):
    # Under "auto" the request still runs, its calls only parsed (logged); a forced call is refused by name.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}}}]
    llm = family("hermes")
    source = template(FAMILIES["hermes"][0])
    with caplog.at_level("WARNING", logger="elelem"):
        assert plan_tools(tools, "auto", source).constraint(llm.assets) is None
    assert "unconstrained" in caplog.text and "uniqueItems" in caplog.text
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        plan_tools(tools, "required", source).constraint(llm.assets)


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_parallel_calls_are_each_held_valid_and_only_a_call_or_the_end_follows_one(family, mode):
    # parallel_tool_calls (OpenAI's default): after a call, another call (its
    # marker, then its grammar) or the end, nothing else: llama.cpp's tool_call+.
    name = "hermes"
    run = Run(family(name), name, mode, parallel=True)
    first = Scripted(script_of(run))
    marker = encode(run, MARKER[name])
    seen_between = []

    class TwoCalls:
        def sample(self, logits, recent):
            if run.constraint.calls == 1 and not run.constraint.triggered and marker:
                seen_between.append(logits)
                return marker.pop(0)
            return first.sample(logits, recent)

    run.write(TwoCalls(), steps=600, until=lambda r: r.constraint.calls == 2)
    assert run.constraint.calls == 2 and not run.constraint.complete, run.text
    allowed = {int(t) for t in np.flatnonzero(np.isfinite(seen_between[0]))}
    assert allowed == {t for t in run.eog if t < seen_between[0].size} | {encode(run, MARKER[name])[0]}
    calls = run.parsed().tool_calls
    assert len(calls) == 2 and all(valid(call) in ("get_weather", "get_time") for call in calls), run.text
    run.write(Scripted([min(run.eog)]))
    assert run.ended
