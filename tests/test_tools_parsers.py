"""Tool-call parsing over recorded replies: whole, and streamed at every split point."""
from __future__ import annotations

import json
import logging

import pytest

from elelem.text.chat_template import CHATML_TEMPLATE
from elelem.api.tools import HermesParser, ToolCallParser, parser_for, register_parser
from elelem.api.tools.parsers import PARSERS
from elelem.api.tools.request import messages_for_template, plan_tools
from elelem.api.tools.streaming import StreamingToolCallParser, parse_stream
from elelem.errors import InvalidArgumentError

NAMES = ("get_weather", "get_time")

# Recorded from Qwen2.5 models (the first one is Qwen2.5-Coder-0.5B-Instruct's "auto" reply).
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
       '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>')
TEXT_FIRST = 'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
MALFORMED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>'
PLAIN = "It is sunny in Paris, 18 degrees. A < b and <tool is not a tag."


def calls(reply):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply]


def test_one_call():
    reply = HermesParser().parse(ONE, NAMES)
    assert reply.content is None
    assert calls(reply.tool_calls) == [("get_weather", {"city": "Paris"})]
    call = reply.tool_calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert isinstance(call["function"]["arguments"], str)


def test_several_calls_get_distinct_ids():
    reply = HermesParser().parse(TWO, NAMES)
    assert calls(reply.tool_calls) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]
    assert reply.content is None
    assert len({c["id"] for c in reply.tool_calls}) == 2


def test_text_before_a_call_is_content():
    reply = HermesParser().parse(TEXT_FIRST, NAMES)
    assert reply.content == "Let me look that up."
    assert calls(reply.tool_calls) == [("get_weather", {"city": "Paris"})]


def test_malformed_json_stays_content_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="elelem"):
        reply = HermesParser().parse(MALFORMED, NAMES)
    assert reply.tool_calls == [] and reply.content == MALFORMED
    assert "malformed" in caplog.text


@pytest.mark.parametrize("body", ['[1, 2]', '{"arguments": {}}', '{"name": "", "arguments": {}}',
                                  '{"name": "f", "arguments": [1]}', '{"name": "f", "arguments": "{bad"}',
                                  "[" * 5000, ""])
def test_odd_bodies_never_raise(body):
    reply = HermesParser().parse(f"<tool_call>{body}</tool_call>", NAMES)
    assert reply.tool_calls == []


def test_unterminated_call_is_parsed_when_its_json_is_whole():
    reply = HermesParser().parse('<tool_call>\n{"name": "get_time", "arguments": {}}', NAMES)
    assert calls(reply.tool_calls) == [("get_time", {})]


def test_arguments_given_as_a_json_string_are_decoded():
    reply = HermesParser().parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', ["f"])
    assert calls(reply.tool_calls) == [("f", {"x": 1})]


def test_bare_call_only_for_known_tools():
    assert calls(HermesParser().parse(BARE, NAMES).tool_calls) == [("get_weather", {"city": "Paris"})]
    assert HermesParser().parse(BARE, ["other"]).content == BARE
    assert HermesParser().parse('{"a": 1}', NAMES).content == '{"a": 1}'


def test_plain_text():
    reply = HermesParser().parse(PLAIN, NAMES)
    assert reply.content == PLAIN and reply.tool_calls == []


# -- streaming -------------------------------------------------------------------

def expected(text):
    reply = HermesParser().parse(text, NAMES)
    return (reply.content or "").strip(), calls(reply.tool_calls)


@pytest.mark.parametrize("text", [ONE, TWO, TEXT_FIRST, MALFORMED, PLAIN, BARE, "  " + BARE + "\n"])
def test_streaming_matches_whole_parse_at_every_split_point(text):
    want = expected(text)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 7):  # two cuts: every i, a spread of j
            content, got = parse_stream(HermesParser(), [text[:i], text[i:j], text[j:]], NAMES)
            assert ((content or "").strip(), calls(got)) == want, (i, j)


@pytest.mark.parametrize("text", [ONE, TWO, TEXT_FIRST])
def test_markup_never_leaks_into_content_character_by_character(text):
    stream = StreamingToolCallParser(HermesParser(), NAMES)
    content = ""
    for ch in text:
        for kind, value in stream.feed(ch):
            if kind == "content":
                content += value
        assert "<tool" not in content and "<" not in content.replace("<tool_call>", "")
    for kind, value in stream.finish():
        content += value if kind == "content" else ""
    assert "tool_call" not in content


def test_calls_are_emitted_as_soon_as_they_close():
    stream = StreamingToolCallParser(HermesParser(), NAMES)
    first, second = TWO.split("</tool_call>\n", 1)
    events = stream.feed(first + "</tool_call>\n")
    assert [e[0] for e in events] == ["tool_call"]
    assert [e[0] for e in stream.feed(second)] == ["tool_call"]


# -- choosing the parser, and the request plan ---------------------------------------

def test_parser_is_chosen_by_template():
    assert isinstance(parser_for(CHATML_TEMPLATE), HermesParser)
    assert isinstance(parser_for("{{ messages }} <tool_call>"), HermesParser)

    class Custom(ToolCallParser):
        name = "custom"

    register_parser(Custom, lambda source: "[TOOL_CALLS]" in source)
    try:
        assert isinstance(parser_for("... [TOOL_CALLS] ..."), Custom)
        assert isinstance(parser_for("<tool_call>"), HermesParser)
    finally:
        PARSERS[:] = [p for p in PARSERS if p[0] is not Custom]


TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
         for n in NAMES]


def test_tool_choice_plans():
    assert plan_tools(TOOLS, None, "").forced_functions is None and plan_tools(TOOLS, None, "").parses_calls
    none = plan_tools(TOOLS, "none", "")
    assert none.template_tools is None and not none.parses_calls
    assert [f["name"] for f in plan_tools(TOOLS, "required", "").forced_functions] == list(NAMES)
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}}, "")
    assert [f["name"] for f in named.forced_functions] == ["get_time"]
    assert not plan_tools(None, None, "").parses_calls


@pytest.mark.parametrize("tools, choice", [
    (TOOLS, "sometimes"), (TOOLS, {"type": "function", "function": {"name": "nope"}}),
    (None, "required"), ("get_weather", "auto"), ([{"type": "function", "function": {}}], "auto"),
])
def test_bad_tool_arguments_raise(tools, choice):
    with pytest.raises(InvalidArgumentError):
        plan_tools(tools, choice, "")


def test_string_arguments_are_decoded_for_the_template():
    messages = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}]
    out = messages_for_template(messages)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'  # not modified in place
