"""Tool-call formats: Hermes, Qwen3-Coder XML, gpt-oss harmony, Mistral, Llama 3 JSON, GLM.

Each format: model-like replies parsed whole and streamed at every split
(the same calls, content and reasoning, whatever the deltas), garbage from
the model given back as content, a round trip through its family's real
chat template (llama.cpp's corpus: the template writes a call, the parser
reads it back), and a constrained call on a tiny random model that speaks
the family's markup (tests/support/format_models.py).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from elelem.api import completions
from elelem.api.reasoning import ReplyParser, ThinkTags, reply_parser
from elelem.api.tools import (FORMATS, GLMParser, HarmonyParser, HermesParser, Llama3Parser, MistralParser,
                              Qwen3CoderParser, format_named, parser_for)
from elelem.api.tools.base import collect, typed_value
from elelem.api.tools.request import messages_for_template
from elelem.errors import InvalidArgumentError
from elelem.text.chat_template import ChatTemplate
from format_models import FAMILIES, family_models, template

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "metric": {"type": "boolean"}, "opts": {"type": "object"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
THINK = ThinkTags("<think>", "</think>")
MISTRAL_THINK = ThinkTags("[THINK]", "[/THINK]")
PARIS = ("get_weather", {"city": "Paris"})

# (id, format, reasoning tags, forced open, model-like reply, (content, reasoning, calls))
SAMPLES = [
    ("hermes-two-calls", HermesParser(), None, False,
     'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     ("Let me check.", None, [PARIS, ("get_time", {"tz": "CET"})])),
    ("hermes-qwen3-thinking", HermesParser(), THINK, False,
     '<think>\nThe user wants the weather.\n</think>\n\nSure.\n<tool_call>\n'
     '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     ("Sure.", "The user wants the weather.", [PARIS])),
    ("hermes-bare-json", HermesParser(), None, False, '  {"name": "get_weather", "arguments": {"city": "Paris"}}\n',
     (None, None, [PARIS])),
    ("qwen3-thinking-no-tools-needed", HermesParser(), THINK, False, "<think>\n\n</think>\n\nHello!",
     ("Hello!", None, [])),
    ("qwen3.5-forced-open", Qwen3CoderParser(), THINK, True,
     "Need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n2\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>",
     (None, "Need the weather.", [("get_weather", {"city": "Paris", "days": 2, "metric": True})])),
    ("qwen3-coder-text-and-two-calls", Qwen3CoderParser(), None, False,
     "Here:\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan <b>José</b>\nline 2\n</parameter>\n"
     '<parameter=opts>\n{"a": [1, 2]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n'
     "</function>\n</tool_call>",
     ("Here:", None, [("get_weather", {"city": "San <b>José</b>\nline 2", "opts": {"a": [1, 2]}}),
                      ("get_time", {})])),
    ("qwen3-coder-unclosed-thinking", Qwen3CoderParser(), THINK, True, "Thinking about it...",
     (None, "Thinking about it...", [])),
    ("harmony-analysis-then-call", HarmonyParser(), None, False,
     "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}',
     (None, "Need weather.", [("get_weather", {"city": "Paris", "days": 2})])),
    ("harmony-analysis-then-final", HarmonyParser(), None, False,
     "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!",
     ("Hello there!", "Simple.", [])),
    ("harmony-preamble-and-call", HarmonyParser(), None, False,
     "<|channel|>commentary<|message|>Checking...<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather<|constrain|>json<|message|>{"city":"Paris"}',
     ("Checking...", None, [PARIS])),
    ("harmony-recipient-in-role", HarmonyParser(), None, False,
     ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}', (None, None, [PARIS])),
    ("harmony-plain-text", HarmonyParser(), None, False, "A model that ignores the format.",
     ("A model that ignores the format.", None, [])),
    ("mistral-args", MistralParser(), MISTRAL_THINK, False,
     '[THINK]Hmm.[/THINK]Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}'
     '[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
     ("Sure.", "Hmm.", [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "CET"})])),
    ("mistral-nemo-array", MistralParser(), None, False,
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]',
     (None, None, [PARIS])),
    ("mistral-call-id", MistralParser(), None, False,
     '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Paris"}', (None, None, [PARIS])),
    ("mistral-text", MistralParser(), None, False, "Just text [with brackets].",
     ("Just text [with brackets].", None, [])),
    ("llama3-json", Llama3Parser(), None, False, '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     (None, None, [PARIS])),
    ("llama3-python-tag-two-calls", Llama3Parser(), None, False,
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}',
     (None, None, [PARIS, ("get_time", {})])),
    ("llama3-text", Llama3Parser(), None, False, "The answer is {x}.", ("The answer is {x}.", None, [])),
    ("glm-4.6", GLMParser(), THINK, False,
     "\n<think>Need weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
     (None, "Need weather.", [("get_weather", {"city": "Paris", "days": 2})])),
    ("glm-4.7", GLMParser(newlines=False), None, False,
     'Ok.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>opts</arg_key>'
     '<arg_value>{"a": 1}</arg_value></tool_call>',
     ("Ok.", None, [("get_weather", {"city": "Paris", "opts": {"a": 1}})])),
]
MARKERS = {"hermes": ["<tool_call>", "</tool_call>"], "qwen3_coder": ["<tool_call>", "<function=", "<parameter="],
           "harmony": ["<|channel|>", "<|message|>", "<|start|>", "<|end|>"], "mistral": ["[TOOL_CALLS]", "[ARGS]"],
           "llama3": ["<|python_tag|>", '"parameters"'], "glm": ["<tool_call>", "<arg_key>", "<arg_value>"]}


def reply(fmt, tags=None, forced_open=False, extract=True) -> ReplyParser:
    return ReplyParser(fmt, TOOLS, tags=tags, forced_open=forced_open, extract=extract)


def summary(parsed):
    return (parsed.content, parsed.reasoning,
            [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls])


def streamed(parser: ReplyParser, parts):
    return summary(collect(parser.stream(), parts))


@pytest.mark.parametrize("fmt, tags, forced, text, want", [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_model_like_replies_parse(fmt, tags, forced, text, want):
    parsed = reply(fmt, tags, forced).parse(text)
    assert summary(parsed) == want
    for call in parsed.tool_calls:
        assert call["type"] == "function" and call["id"] and isinstance(call["function"]["arguments"], str)


@pytest.mark.parametrize("fmt, tags, forced, text, want", [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_streamed_at_every_split_the_same(fmt, tags, forced, text, want):
    parser = reply(fmt, tags, forced)
    for i in range(len(text) + 1):
        assert streamed(parser, [text[:i], text[i:]]) == want, i
    assert streamed(parser, list(text)) == want  # one character at a time
    rng = random.Random(41)
    for _ in range(60):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(2, min(12, len(text) - 1))))
        parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert streamed(parser, parts) == want, cuts


@pytest.mark.parametrize("fmt, tags, forced, text, want", [s[1:] for s in SAMPLES if s[5][2]],
                         ids=[s[0] for s in SAMPLES if s[5][2]])
def test_markup_never_leaks_into_content_or_reasoning(fmt, tags, forced, text, want):
    stream = reply(fmt, tags, forced).stream()
    shown = ""
    for ch in text:
        shown += "".join(v for k, v in stream.feed(ch) if k != "tool_call")
        assert not any(marker in shown for marker in MARKERS[fmt.name]), shown
    shown += "".join(v for k, v in stream.finish() if k != "tool_call")
    assert not any(marker in shown for marker in MARKERS[fmt.name])


GARBAGE = {
    "hermes": ["<tool_ca", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
               '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "<tool_call>not json</tool_call> after",
               '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', "</tool_call><tool_call>"],
    "qwen3_coder": ["<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
                    "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=get_weather>\nstray text\n</function>\n</tool_call>",
                    "<tool_call>{\"name\": \"get_weather\"}</tool_call>", "<function=get_weather>"],
    "harmony": ["<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}",
                "<|channel|>commentary to=functions.get_weather<|message|>{not json",
                "<|channel|>commentary to=functions.get_weather<|message|>[1, 2]",
                "<|channel|>final", "<|chan", "<|channel|>" + "x" * 400],
    "mistral": ["[TOOL_CALLS]", "[TOOL_CALLS]nope[ARGS]{}", "[TOOL_CALLS]get_weather[ARGS]{\"city\": ",
                "[TOOL_CALLS]get_weather[ARGS]not json", "[TOOL_CALLS]a name\nwith a newline[ARGS]{}",
                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": 3}]", "[TOOL_CALLS]" + "n" * 600],
    "llama3": ['{"name": "nope", "parameters": {}}', '{"name": "get_weather", "parameters": ',
               "<|python_tag|>brave_search.call(query=\"x\")", '{"name": "get_weather"} trailing text', "{"],
    "glm": ["<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", "<tool_call>nope</tool_call>",
            "<tool_call>get weather</tool_call>", "<tool_call>get_weather\n<arg_key>city</arg_key></tool_call>",
            "<tool_call></tool_call>"],
}


@pytest.mark.parametrize("name, text", [(n, t) for n, texts in GARBAGE.items() for t in texts])
def test_garbage_from_the_model_is_content(name, text):
    parser = reply(FORMATS[name]())
    want = summary(parser.parse(text))
    content, reasoning, calls = want
    assert calls == [] and reasoning is None
    assert (content or "").strip() == text.strip()
    for i in range(len(text) + 1):
        assert streamed(parser, [text[:i], text[i:]]) == want, i


def test_typed_values_follow_the_schema():
    assert typed_value("2", {"type": "integer"}) == 2
    assert typed_value("2", {"type": "string"}) == "2"
    assert typed_value("True", {"type": "boolean"}) is True and typed_value("false", {"type": "boolean"}) is False
    assert typed_value('{"a": 1}', {"type": "object"}) == {"a": 1}
    assert typed_value("[1, 2]", {"type": "array", "items": {"type": "integer"}}) == [1, 2]
    assert typed_value("abc", {"type": "integer"}) == "abc"  # not what the schema says: kept as text
    assert typed_value("5", {"anyOf": [{"type": "string"}, {"type": "integer"}]}) == 5
    assert typed_value('"quoted"', {"type": ["string", "null"]}) == '"quoted"'
    assert typed_value("null", {"type": ["string", "null"]}) is None
    assert typed_value("1.5", None) == 1.5 and typed_value("Paris", None) == "Paris"
    assert typed_value("b", {"enum": ["a", "b"]}) == "b" and typed_value("3", {"enum": [1, 3]}) == 3


# -- choosing a format ---------------------------------------------------------------------

DETECTED = {
    "Qwen-Qwen2.5-7B-Instruct": "hermes", "Qwen-Qwen3-0.6B": "hermes",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes", "Qwen3-Coder": "qwen3_coder",
    "Qwen3.5-4B": "qwen3_coder", "openai-gpt-oss-120b": "harmony",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral", "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3", "meta-llama-Llama-3.2-3B-Instruct": "llama3", "GLM-4.6": "glm",
    "GLM-4.7-Flash": "glm",
}


@pytest.mark.parametrize("name, expected", DETECTED.items())
def test_the_format_is_read_from_the_template(name, expected):
    assert parser_for(template(name)).name == expected


def test_formats_by_name():
    assert format_named("gpt-oss") is HarmonyParser and format_named("Qwen3.5") is Qwen3CoderParser
    assert format_named("llama3") is Llama3Parser and format_named("hermes") is HermesParser
    assert isinstance(parser_for("{{ messages }} <tool_call>", "mistral"), MistralParser)
    assert not parser_for("", "glm").newlines and parser_for(template("GLM-4.6")).newlines
    assert not parser_for(template("mistralai-Mistral-Nemo-Instruct-2407")).args_form
    with pytest.raises(InvalidArgumentError, match="tool_call_format"):
        format_named("xml")


# -- a round trip through each family's real template ---------------------------------------

ARGS = {"city": "Paris", "days": 2, "metric": True}
ROUND_TRIPS = [n for n in DETECTED]
# The end of an assistant turn: its end-of-generation token, which a reply's text never holds.
TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<|call|>", "<|return|>", "<|user|>",
             "<|observation|>")


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_round_trip_through_the_real_template(name):
    # The template writes an assistant turn with a call (and its result, after it); the turn's text, as the
    # model would have written it after the generation prompt, parses back into the same call.
    source = template(name)
    chat = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    user = [{"role": "user", "content": "Weather in Paris?"}]
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps(ARGS)}}]}
    result = {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather", "content": "Sunny, 21 C"}
    prompt = chat.render(user, tools=TOOLS, add_generation_prompt=True)
    whole = chat.render(messages_for_template(user + [call, result]), tools=TOOLS, add_generation_prompt=True)
    assert "Sunny, 21 C" in whole
    turn = chat.render(messages_for_template(user + [call]), tools=TOOLS, add_generation_prompt=False)
    start = next(i for i in range(len(prompt) + 1) if i == len(prompt) or i == len(turn) or prompt[i] != turn[i])
    text = turn[start:]
    ends = [text.find(end) for end in TURN_ENDS if end in text]
    text = text[:min(ends)] if ends else text
    parser = reply_parser(parser_for(source), source, prompt, parse_calls=True, tools=TOOLS)
    parsed = parser.parse(text)
    assert summary(parsed)[2] == [("get_weather", ARGS)], text
    assert not (parsed.content or "").strip(), parsed.content
    # ... and the parsed call goes back through the template as the original did
    message = {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}
    again = chat.render(messages_for_template(user + [message]), tools=TOOLS, add_generation_prompt=False)
    if parser.format.name != "mistral":  # Mistral's templates write the call ids, which are new
        assert again == turn


def test_an_assistant_tool_call_turn_keeps_its_content_key():
    # Qwen3's and SmolLM2's templates read message.content of an assistant turn that only calls tools.
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    messages = [{"role": "user", "content": "Weather?"}, call, {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    smollm = json.loads((Path(__file__).parent / "support" / "fixtures" / "chat_templates.json")
                        .read_text(encoding="utf-8"))["templates"]["smollm2"]["source"]
    for source in (smollm, template("Qwen-Qwen3-0.6B"), template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")):
        ChatTemplate(source).render(messages)
        ChatTemplate(source).render([messages[0], {k: v for k, v in call.items() if k != "content"}, messages[2]])


# -- OpenAI's tool_calls deltas --------------------------------------------------------------

class FakeStream:
    """A finished generation's deltas, as a TextStream gives them."""

    def __init__(self, deltas, reply=None, finish_reason="stop"):
        self.deltas = list(deltas)
        self.reply = reply
        self.finish_reason = finish_reason
        self.logprobs = None
        self.prompt_tokens, self.completion_tokens = 3, len(self.deltas)

    def __iter__(self):
        return iter(self.deltas)

    def text(self):
        return "".join(self.deltas)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_streamed_chunks_carry_reasoning_content_then_calls():
    text = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}')
    parser = reply(HarmonyParser())
    chunks = list(completions.chat_completion_chunks(FakeStream([text[i:i + 5] for i in range(0, len(text), 5)],
                                                                parser), "m"))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"}
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need weather."
    assert not any(d.get("content") for d in deltas)
    parts = [tc for d in deltas for tc in d.get("tool_calls", ())]
    assert parts[0] == {"index": 0, "id": parts[0]["id"], "type": "function",
                        "function": {"name": "get_weather", "arguments": ""}}
    assert json.loads("".join(p["function"]["arguments"] for p in parts)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and deltas[-1] == {}
    whole = completions.chat_completion(FakeStream([text], parser), "m")
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] == "Need weather." and message["content"] is None
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and len(message["tool_calls"]) == 1


# -- constrained calls on tiny models of each family --------------------------------------

BOUNDED = [  # every value bounded, so a random model's constrained call always ends
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "metric": {"type": "boolean"}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "tz": {"type": "string", "enum": ["CET", "UTC"]}}, "required": ["tz"]}}},
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def family_model(tmp_path_factory):
    with family_models(tmp_path_factory) as get:
        yield get


#: The token that starts a call in each family (a required call is free text until one comes).
CALL_MARKER = {"hermes": "<tool_call>", "qwen3_coder": "<tool_call>", "harmony": "<|channel|>",
               "mistral": "[TOOL_CALLS]", "llama3": "<|python_tag|>", "glm": "<tool_call>"}


def steering(model, family=None) -> dict:
    # Free text (reasoning, an analysis message, a raw string parameter) ends at these tokens: make them
    # likely; so is the family's call marker, else a random model would write free text to max_tokens.
    bias = {model.ids[t]: 8.0 for t in ("</think>", "<|end|>", "\n</parameter>\n") if t in model.ids}
    if family is not None:
        bias[model.ids[CALL_MARKER[family]]] = 10.0
    return bias


def valid_call(call, tools=BOUNDED):
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call["function"]["name"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    return call["function"]["name"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_constrained_call_in_each_format(family_model, family):
    model, llm = family_model(family)
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed, choice in ((0, "required"), (1, "required"), (2, named)):
        response = llm.create_chat_completion(QUESTION, tools=BOUNDED, tool_choice=choice, max_tokens=400,
                                              temperature=1.0, seed=seed, logit_bias=steering(model, family))
        choice_out = response["choices"][0]
        assert choice_out["finish_reason"] == "tool_calls", choice_out
        (call,) = choice_out["message"]["tool_calls"]
        name = valid_call(call)
        assert name == "get_time" if choice == named else name in ("get_weather", "get_time")
        # Free text may come before the call (the constraint is lazy), but none of the call's markup.
        content = choice_out["message"]["content"] or ""
        assert not any(marker in content for marker in MARKERS[family] if marker != "<|end|>"), content
    # The raw reply is in the family's markup (its control tokens shown), and parses to the same call.
    text = llm.chat(QUESTION, tools=BOUNDED, tool_choice="required", max_tokens=400, temperature=1.0, seed=0,
                    logit_bias=steering(model, family))
    assert any(marker in text for marker in MARKERS[family]) or family == "llama3", text
    streamed_chunks = list(llm.create_chat_completion(QUESTION, tools=BOUNDED, tool_choice="required", max_tokens=400,
                                                      temperature=1.0, seed=0, logit_bias=steering(model, family),
                                                      stream=True))
    deltas = [c["choices"][0]["delta"] for c in streamed_chunks]
    streamed_content = "".join(d.get("content") or "" for d in deltas)
    assert not any(marker in streamed_content for marker in MARKERS[family] if marker != "<|end|>")
    parts = [tc for d in deltas for tc in d.get("tool_calls", ())]
    assert parts and parts[0]["function"]["name"] in ("get_weather", "get_time")
    assert streamed_chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_raw_string_parameter_is_constrained_up_to_its_closing_tag(family_model):
    model, llm = family_model("qwen3_coder")
    tools = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
        "text": {"type": "string"}, "n": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["text", "n"]}}}]
    response = llm.create_chat_completion(QUESTION, tools=tools, tool_choice="required", max_tokens=400,
                                          temperature=1.0, seed=3, logit_bias=steering(model, "qwen3_coder"))
    (call,) = response["choices"][0]["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == {"text", "n"} and isinstance(arguments["text"], str) and 0 <= arguments["n"] <= 5


def test_a_named_format_overrides_the_template(family_model):
    # GLM's template, Hermes's markup: <tool_call> then JSON, not GLM's <arg_key> pairs.
    model, llm = family_model("glm")
    bias = steering(model, "glm")
    text = llm.chat(QUESTION, tools=BOUNDED, tool_choice="required", tool_call_format="hermes", max_tokens=200,
                    temperature=0, logit_bias=bias)
    body = text[text.index("<tool_call>\n") + len("<tool_call>\n"):text.index("\n</tool_call>")]
    assert json.loads(body)["name"] in ("get_weather", "get_time") and "<arg_key>" not in text
    response = llm.create_chat_completion(QUESTION, tools=BOUNDED, tool_choice="required", tool_call_format="hermes",
                                          max_tokens=200, temperature=0, logit_bias=bias)
    assert valid_call(response["choices"][0]["message"]["tool_calls"][0])
    with pytest.raises(InvalidArgumentError, match="tool_call_format"):
        llm.create_chat_completion(QUESTION, tools=BOUNDED, tool_call_format="nope")


def test_a_family_model_without_tools_answers_in_text(family_model):
    # No tools: nothing is constrained or parsed as calls (gpt-oss's channels are still read).
    model, llm = family_model("harmony")
    response = llm.create_chat_completion(QUESTION, max_tokens=20, temperature=0)
    assert "tool_calls" not in response["choices"][0]["message"]
