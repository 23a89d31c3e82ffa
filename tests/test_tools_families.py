"""Chat and tools of the 2026 agent families: GLM-4.7, MiniMax-M2, Seed-OSS, LFM2/LFM2.5,
NVIDIA Nemotron (Nano 2 and 3), Granite 4, SmolLM3, DeepSeek V3.1, Kimi K2, Laguna.

For each family's real template (llama.cpp's corpus, models/templates/ of the pinned sdist):

* the format elelem picks, and, where it is derived from the template (api/tools/template_markers.py),
  that its markers are the ones llama.cpp's own analysis finds (its grammar trigger and preserved
  tokens, from scripts/chat_template_driver.cpp, live when it is built);
* model-like replies parsed whole and streamed at every split (several calls, arguments split across
  deltas), with the reasoning the family writes, read after the prompt the template renders;
* broken replies given back as content, never an exception;
* a conversation with two calls, reasoning and tool results rendered as llama.cpp renders it;
* the same replies read by llama.cpp's own parser (tests/support/chat_parse_driver.cpp, built by
  tests/support/llamacpp_chat_parse.py), which must read them as elelem does, but where
  LLAMA_CPP_DIFFERS says why not;
* constrained calls in each new format on tiny models that speak it (tests/support/agent_format_models.py).
"""
from __future__ import annotations

import random

import pytest

from elelem.api.reasoning import reasoning_messages, reply_parser, think_tags
from elelem.api.tools import (GLMParser, HermesParser, KimiK2Parser, LFM2Parser, Qwen3CoderParser, TemplateFormatParser,
                              parser_for)
from elelem.api.tools.base import collect
from elelem.api.tools.lfm2 import python_calls
from elelem.api.tools.base import ToolSpecs
from elelem.api.tools.template_markers import NAMED_JSON, OBJECT_JSON, TAGGED, derive
from elelem.text.chat_template import ChatTemplate

import llamacpp_templates as engine

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "metric": {"type": "boolean"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
PARIS2 = ("get_weather", {"city": "Paris", "days": 2})
UTC = ("get_time", {"tz": "UTC"})

#: family -> (template, parser class, derived shape or None, reasoning start tag or None, reply, expected)
#: The reply is what the model writes after the prompt (reasoning opened there when the template opens it);
#: expected is (content, reasoning, calls).
FAMILIES = {
    "minimax-m2": ("MiniMax-M2.jinja", TemplateFormatParser, TAGGED, "<think>",
                   "The user wants two things.\n</think>\n\nChecking.\n<minimax:tool_call>\n"
                   '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                   '<parameter name="days">2</parameter>\n</invoke>\n<invoke name="get_time">\n'
                   '<parameter name="tz">UTC</parameter>\n</invoke>\n</minimax:tool_call>',
                   ("Checking.", "The user wants two things.", [PARIS2, UTC])),
    "seed-oss": ("ByteDance-Seed-OSS.jinja", TemplateFormatParser, TAGGED, "<seed:think>",
                 "<seed:think>Weather, then time.</seed:think>\n<seed:tool_call>\n<function=get_weather>\n"
                 "<parameter=city>Paris</parameter>\n<parameter=days>2</parameter>\n</function>\n"
                 "</seed:tool_call>\n<seed:tool_call>\n<function=get_time>\n<parameter=tz>UTC</parameter>\n"
                 "</function>\n</seed:tool_call>",
                 (None, "Weather, then time.", [PARIS2, UTC])),
    "glm-4.7": ("GLM-4.7-Flash.jinja", GLMParser, None, "<think>",
                "Two calls.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><tool_call>get_time<arg_key>tz"
                "</arg_key><arg_value>UTC</arg_value></tool_call>",
                (None, "Two calls.", [PARIS2, UTC])),
    "nemotron-nano-2": ("NVIDIA-Nemotron-Nano-v2.jinja", TemplateFormatParser, OBJECT_JSON, "<think>",
                        "Use the tools.\n</think>\n\n<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Paris\", \"days\": 2}}, {\"name\": \"get_time\", \"arguments\": "
                        "{\"tz\": \"UTC\"}}]</TOOLCALL>",
                        (None, "Use the tools.", [PARIS2, UTC])),
    "nemotron-3-nano": ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", Qwen3CoderParser, None, "<think>",
                        "Use the tools.\n</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                        "<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>",
                        (None, "Use the tools.", [PARIS2, UTC])),
    "lfm2": ("LFM2-8B-A1B.jinja", LFM2Parser, None, None,
             "Sure.<|tool_call_start|>[get_weather(city=\"Paris\", days=2), get_time(tz='UTC')]<|tool_call_end|>",
             ("Sure.", None, [PARIS2, UTC])),
    "lfm2.5-thinking": ("LFM2.5-8B-A1B.jinja", LFM2Parser, None, "<think>",
                        "<think>Both.</think><|tool_call_start|>[get_weather(city=\"Paris\", days=2), "
                        "get_time(tz=\"UTC\")]<|tool_call_end|>",
                        (None, "Both.", [PARIS2, UTC])),
    "granite-4": ("ibm-granite-granite-4.0.jinja", HermesParser, None, None,
                  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
                  '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
                  (None, None, [PARIS2, UTC])),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B.jinja", HermesParser, None, "<think>",
                '<think>\nOK.\n</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
                '</tool_call>',
                (None, "OK.", [PARIS2, UTC])),
    "deepseek-v3.1": ("deepseek-ai-DeepSeek-V3.1.jinja", TemplateFormatParser, NAMED_JSON, "<think>",
                      "Both.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                      "{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time"
                      "<｜tool▁sep｜>{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                      (None, "Both.", [PARIS2, UTC])),
    # Laguna XS.2 writes GLM-4.5's calls (a newline after the name and each value); S-2.1 GLM-4.7's (none)
    "laguna-xs.2": ("poolside-Laguna-XS.2.jinja", GLMParser, None, "<think>",
                    "Weather, then time.\n</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                    "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n"
                    "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>UTC</arg_value>\n</tool_call>\n",
                    (None, "Weather, then time.", [PARIS2, UTC])),
    "laguna-s-2.1": ("poolside-Laguna-S-2.1.jinja", GLMParser, None, "<think>",
                     "Both.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                     "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><tool_call>get_time<arg_key>tz"
                     "</arg_key><arg_value>UTC</arg_value></tool_call>",
                     ("Checking.", "Both.", [PARIS2, UTC])),
    "kimi-k2-thinking": ("Kimi-K2-Thinking.jinja", KimiK2Parser, None, "<think>",
                         "<think>Both at once.</think>Checking.<|tool_calls_section_begin|><|tool_call_begin|>"
                         "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 2}"
                         "<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>"
                         "{\"tz\": \"UTC\"}<|tool_call_end|><|tool_calls_section_end|>",
                         ("Checking.", "Both at once.", [PARIS2, UTC])),
}

#: family -> replies that must come back as content (markup included), without calls or an exception
BROKEN = {
    "minimax-m2": ['<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris',
                   '<minimax:tool_call>\n<invoke name="launch_rockets">\n<parameter name="n">3</parameter>\n'
                   '</invoke>\n</minimax:tool_call>',
                   '<minimax:tool_call>\nnot a call at all\n</minimax:tool_call>'],
    "seed-oss": ["<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris\n</function>\n</seed:tool_call>",
                 "<seed:tool_call><function=></function></seed:tool_call>"],
    "nemotron-nano-2": ['<TOOLCALL>[{"name": "get_weather", "arguments": {"city": </TOOLCALL>',
                        '<TOOLCALL>[{"nom": "get_weather"}]</TOOLCALL>'],
    "lfm2": ["<|tool_call_start|>[get_weather(city=)]<|tool_call_end|>",
             "<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>",
             "<|tool_call_start|>[__import__('os').system('x')]<|tool_call_end|>",
             "<|tool_call_start|>get_weather(city=\"Paris\")<|tool_call_end|>"],
    "kimi-k2-thinking": ["<|tool_calls_section_begin|><|tool_call_begin|>get_weather<|tool_call_argument_begin|>"
                         "{}<|tool_call_end|><|tool_calls_section_end|>",
                         "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                         "<|tool_call_argument_begin|>{\"city\": <|tool_call_end|><|tool_calls_section_end|>"],
    "deepseek-v3.1": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
}


@pytest.fixture(scope="module")
def sources() -> dict:
    import llamacpp_sdist

    try:
        directory = llamacpp_sdist.templates_dir()
    except Exception as error:  # no sdist here and no network to fetch it
        pytest.skip(f"llama.cpp's template corpus is not available: {error}")
    return {name: (directory / name).read_text(encoding="utf-8") for name, *_ in FAMILIES.values()}


def summary(reply) -> tuple:
    calls = [(c["function"]["name"], __import__("json").loads(c["function"]["arguments"])) for c in reply.tool_calls]
    return reply.content, reply.reasoning, calls


def prompt_of(source: str) -> str:
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    return template.render([{"role": "user", "content": "Weather in Paris for 2 days, and the time?"}],
                           tools=TOOLS, enable_thinking=True)


def reader(source: str):
    fmt = parser_for(source)
    return fmt, reply_parser(fmt, source, prompt_of(source), parse_calls=True, tools=TOOLS)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_format_is_read_from_its_template(family, sources):
    name, cls, shape, think, *_ = FAMILIES[family]
    fmt = parser_for(sources[name])
    assert type(fmt) is cls
    if shape is not None:
        assert fmt.markers.shape == shape
    tags = think_tags(sources[name])
    assert (tags.start if tags else None) == think


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_reply_parses_whole_and_streamed_at_every_split(family, sources):
    name, _, _, _, reply, expected = FAMILIES[family]
    fmt, parser = reader(sources[name])
    assert summary(parser.parse(reply)) == expected
    for size in range(1, 9):
        deltas = [reply[i:i + size] for i in range(0, len(reply), size)]
        assert summary(collect(parser.stream(), deltas)) == expected, size
    rng = random.Random(family)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(reply)), 6))
        deltas = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)])]
        assert summary(collect(parser.stream(), deltas)) == expected
    # no markup ever shows as content, even held at a split inside a marker
    stream = parser.stream()
    shown = "".join(v for d in reply for k, v in stream.feed(d) if k == "content")
    assert "<" not in shown.replace(expected[0] or "", "")


@pytest.mark.parametrize("family", BROKEN)
def test_broken_family_replies_come_back_as_content(family, sources):
    name = FAMILIES[family][0]
    fmt = parser_for(sources[name])
    for reply in BROKEN[family]:
        for deltas in ([reply], list(reply)):
            got = collect(fmt.stream(TOOLS), deltas)
            assert got.tool_calls == [] and got.content == reply, (reply, got)


def test_a_reply_that_stops_inside_the_closing_markup_keeps_its_calls(sources):
    fmt = parser_for(sources["MiniMax-M2.jinja"])
    reply = '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="tz">UTC</parameter>\n</invoke>\n'
    assert summary(fmt.parse(reply, TOOLS)) == (None, None, [UTC])


def test_values_are_typed_by_the_schema_and_keep_their_text(sources):
    fmt = parser_for(sources["ByteDance-Seed-OSS.jinja"])
    reply = ("<seed:tool_call>\n<function=get_weather>\n<parameter=city>  New\nYork </parameter>\n"
             "<parameter=days>3</parameter>\n<parameter=metric>true</parameter>\n</function>\n</seed:tool_call>")
    assert summary(fmt.parse(reply, TOOLS))[2] == [("get_weather", {"city": "  New\nYork ", "days": 3,
                                                                    "metric": True})]


# -- the derived markers against llama.cpp's analysis of the same template ----------

DERIVED = ["MiniMax-M2.jinja", "ByteDance-Seed-OSS.jinja", "NVIDIA-Nemotron-Nano-v2.jinja",
           "deepseek-ai-DeepSeek-V3.1.jinja", "MiniMax-M1.jinja", "GLM-4.7-Flash.jinja"]


def test_derived_markers_are_llama_cpps(sources):
    """llama.cpp's autoparser (common/chat-diff-analyzer.cpp) finds its grammar trigger and preserved
    tokens in the same templates: the derived start marker is its trigger, and every tag the derived
    markup holds is one of its preserved tokens."""
    import llamacpp_sdist

    directory = llamacpp_sdist.templates_dir()
    texts = {name: (directory / name).read_text(encoding="utf-8") for name in DERIVED}
    results = engine.run([dict(engine.request(texts[name], "tool_round_trip")) for name in DERIVED])
    if results is None:
        pytest.skip(engine.not_built())
    for name, result in zip(DERIVED, results):
        markers = derive(texts[name])
        assert markers is not None, name
        triggers = {t["value"].strip() for t in result["grammar_triggers"]}
        assert markers.start in triggers, (name, markers.start, triggers)
        assert set(markers.tokens) <= set(result["preserved_tokens"]) | {"<function=", "<parameter="}, name


# -- the family's prompts as llama.cpp renders them -----------------------------------

AGENT_TURNS = {
    "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Weather in Paris for 2 days, and the time?"},
        {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two tools, one turn.",
         "tool_calls": [
             {"id": "call00001", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
             {"id": "call00002", "type": "function",
              "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call00002", "content": "09:30"},
    ],
    "tools": TOOLS,
    "chat_template_kwargs": {"enable_thinking": True},
    "add_generation_prompt": True,
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_agent_turn_renders_as_llama_cpp(family, sources):
    """Two calls with reasoning and their results, as each family's template renders them in llama.cpp."""
    from elelem.api.prompts import render_chat
    from elelem.api.tools.request import messages_for_template
    import template_corpus_cases as cases

    source = sources[FAMILIES[family][0]]
    request = dict(AGENT_TURNS, mode="apply", template=source, bos_token=cases.BOS, eos_token=cases.EOS)
    results = engine.run([request])
    if results is None:
        pytest.skip(engine.not_built())
    expected = results[0]
    template = ChatTemplate(source, bos_token=cases.BOS, eos_token=cases.EOS)
    kwargs = {"enable_thinking": True, "datetime": cases.FIXED_NOW.strftime("%b %d %Y"),
              "date_string": cases.FIXED_NOW.strftime("%d %b %Y")}
    # As a session renders them (api/text_api.py): a template that prints an earlier turn's reasoning
    # as message.thinking (LFM2.5's, as llama.cpp's parsers/lfm2.cpp gives it) gets it under that name.
    messages = reasoning_messages(AGENT_TURNS["messages"], thinking_key=parser_for(source).reasoning_as_thinking)
    got = render_chat(template, messages_for_template(messages), tools=TOOLS, add_generation_prompt=True, **kwargs)
    assert "error" not in expected, expected
    assert got == expected["prompt"]


# -- LFM2's Python-style calls --------------------------------------------------------

@pytest.mark.parametrize("text, calls", [
    ('[get_weather(city="Paris")]', [("get_weather", {"city": "Paris"})]),
    ("[get_weather(city='Zürich', days=3, metric=True)]", [("get_weather", {"city": "Zürich", "days": 3,
                                                                            "metric": True})]),
    ('[get_weather(city="a\\"b", metric=false), get_time()]', [("get_weather", {"city": 'a"b', "metric": False}),
                                                               ("get_time", {})]),
    ('[ get_time(tz=None) , get_time(tz=null) ]', [("get_time", {"tz": None}), ("get_time", {"tz": None})]),
    ('[get_weather(city="x", opts={"a": [1, 2.5]})]', [("get_weather", {"city": "x", "opts": {"a": [1, 2.5]}})]),
    ("[get_weather(city=\"(paren]\")]", [("get_weather", {"city": "(paren]"})]),
])
def test_lfm2_python_calls(text, calls):
    got = python_calls(text, ToolSpecs())
    assert [(c["function"]["name"], __import__("json").loads(c["function"]["arguments"])) for c in got] == calls


@pytest.mark.parametrize("text", ["", "[]", "[get_weather(1)]", "[get_weather(**x)]", "[f(a=b)]", "[f(a=1)",
                                  "[f(a=1) g(b=2)]", "[f(a=1)]]", "[f.g(a=1)]", "[f(a=1 + 2)]"])
def test_lfm2_not_calls(text):
    assert python_calls(text, ToolSpecs.of(["get_weather", "f"])) is None


# -- constrained calls in the derived formats and LFM2's, on tiny models that speak them ----

BOUNDED = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "tz": {"type": "string", "enum": ["CET", "UTC"]}}, "required": ["tz"]}}},
]


@pytest.mark.parametrize("family", ["minimax-m2", "seed-oss", "nemotron-nano-2", "deepseek-v3.1", "kimi-k2", "lfm2"])
def test_a_constrained_call_in_each_agent_format(family, tmp_path):
    import json

    import elelem
    import jsonschema
    import llamacpp_sdist
    from agent_format_models import AGENT_FAMILIES, write_agent_model

    try:
        directory = llamacpp_sdist.templates_dir()
    except Exception as error:
        pytest.skip(f"llama.cpp's template corpus is not available: {error}")
    name, _, _, marker = AGENT_FAMILIES[family]
    model = write_agent_model(tmp_path / f"{family}.gguf", family, (directory / name).read_text(encoding="utf-8"))
    bias = {model.ids[t]: 8.0 for t in ("</think>", "</seed:think>") if t in model.ids}
    bias[model.ids[marker]] = 10.0
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    with elelem.LLM(model.path, n_threads=1, n_ctx=2048) as llm:
        for seed, choice in ((0, "required"), (1, {"type": "function", "function": {"name": "get_time"}})):
            response = llm.create_chat_completion(question, tools=BOUNDED, tool_choice=choice, max_tokens=300,
                                                  temperature=1.0, seed=seed, logit_bias=bias)
            out = response["choices"][0]
            assert out["finish_reason"] == "tool_calls", out
            (call,) = out["message"]["tool_calls"]
            schema = next(t["function"]["parameters"] for t in BOUNDED
                          if t["function"]["name"] == call["function"]["name"])
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
            assert marker not in (out["message"]["content"] or "")
        text = llm.chat(question, tools=BOUNDED, tool_choice="required", max_tokens=300, temperature=1.0, seed=0,
                        logit_bias=bias)
        assert marker in text


# -- reasoning markup derived from the template ------------------------------------------

@pytest.mark.parametrize("name, start, end", [
    ("Cohere2MoE.jinja", "<|START_THINKING|>", "<|END_THINKING|>"),
    ("MiniMax-M3.jinja", "<mm:think>", "</mm:think>"),
    ("tencent-Hy3.jinja", "<think:opensource>", "</think:opensource>"),
    ("ByteDance-Seed-OSS.jinja", "<seed:think>", "</seed:think>"),
    ("MiniMax-M2.jinja", "<think>", "</think>"),
])
def test_reasoning_markup_is_read_off_the_template_as_llama_cpp_reads_it(name, start, end):
    """Where no known markup is in the source, the markers around a turn's reasoning_content in a render;
    llama.cpp's analysis (its thinking_start_tag and thinking_end_tags) finds the same."""
    import llamacpp_sdist
    from elelem.api.tools.template_markers import derive_reasoning

    try:
        source = (llamacpp_sdist.templates_dir() / name).read_text(encoding="utf-8")
    except Exception as error:
        pytest.skip(f"llama.cpp's template corpus is not available: {error}")
    assert derive_reasoning(source) == (start, end)
    tags = think_tags(source)
    assert (tags.start, tags.end) == (start, end)
    results = engine.run([dict(engine.request(source, "reasoning"))])
    if results is None:
        pytest.skip(engine.not_built())
    assert results[0]["thinking_start_tag"].strip() == start
    assert end in [t.strip() for t in results[0]["thinking_end_tags"]]
    parser = reply_parser(parser_for(source), source, "", parse_calls=False)
    got = parser.parse(f"{start}Plan it.{end}Done.")
    assert (got.reasoning, got.content) == ("Plan it.", "Done.")


# -- the same replies through llama.cpp's own parser -----------------------------------------

def _calls_of(message: dict) -> list:
    import json

    return [(c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
            for c in message.get("tool_calls") or ()]


#: Where llama.cpp's parser reads a family's reply otherwise, and why elelem keeps its reading.
LLAMA_CPP_DIFFERS = {
    "minimax-m2": "llama.cpp's autoparser refuses several <invoke> in one <minimax:tool_call> block (its tests "
                  "cover one call), though the template writes a turn's calls so; one call is compared instead",
    "smollm3": "llama.cpp finds no call markup in SmolLM3's template (it does not write calls back) and reads the "
               "reply as content; elelem reads the <tool_call> JSON the template's system prompt asks for",
}
ONE_MINIMAX_CALL = ("Weather first.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
                    "<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n"
                    "</invoke>\n</minimax:tool_call>")


@pytest.mark.parametrize("family", FAMILIES)
def test_replies_parse_as_llama_cpps_parser_reads_them(family, sources):
    """llama.cpp's parser for the template and the request (tests/support/chat_parse_driver.cpp:
    common_chat_templates_apply, then common_chat_peg_parse) reads each family's reply to the content,
    reasoning and calls elelem reads (whitespace around the reasoning and the content aside: elelem
    drops it); broken replies are content in elelem, whatever llama.cpp makes of them (it refuses most,
    reads Seed-OSS's unclosed parameter up to the end)."""
    import llamacpp_chat_parse

    name, _, _, _, reply, expected = FAMILIES[family]
    source = sources[name]
    broken = BROKEN.get(family, [])
    replies = [reply, ONE_MINIMAX_CALL] if family == "minimax-m2" else [reply]
    request = {"template": source, "bos_token": "<s>", "eos_token": "</s>", "tools": TOOLS,
               "parallel_tool_calls": True,
               "messages": [{"role": "user", "content": "Weather in Paris for 2 days, and the time?"}],
               "replies": [*replies, *broken]}
    results = llamacpp_chat_parse.run([request])
    if results is None:
        pytest.skip("llama.cpp's chat parser is not built (python tests/support/llamacpp_chat_parse.py)")
    result = results[0]
    assert "error" not in result, result
    _, tools_reader = reader(source)
    for text, theirs in zip(replies, result["parsed"]):
        ours = summary(tools_reader.parse(text))
        got = (((theirs.get("content") or "").strip() or None), (theirs.get("reasoning_content") or "").strip()
               or None, _calls_of(theirs)) if "error" not in theirs else theirs
        if family in LLAMA_CPP_DIFFERS and text == reply:
            assert got != ours, f"llama.cpp now reads {family}'s reply as elelem does: drop LLAMA_CPP_DIFFERS' entry"
            continue
        assert got == ours, (text, theirs)
    fmt = parser_for(source)
    for text in broken:
        assert collect(fmt.stream(TOOLS), [text]).tool_calls == []


def test_kimi_k2_call_ids_are_kept_and_a_bare_call_is_read(sources):
    """The id (functions.NAME:INDEX) is the call's id, which the template writes back; a call may come
    without its section markers, and its end marker may be missing at the end (kimi-k2.cpp)."""
    fmt = parser_for(sources["Kimi-K2-Thinking.jinja"])
    reply = ("<|tool_call_begin|>functions.get_time:3<|tool_call_argument_begin|>{\"tz\": \"UTC\"}<|tool_call_end|>"
             "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:4<|tool_call_argument_begin|>{}")
    got = fmt.parse(reply, TOOLS)
    assert [c["id"] for c in got.tool_calls] == ["functions.get_time:3", "functions.get_time:4"]
    assert summary(got)[2] == [UTC, ("get_time", {})]
