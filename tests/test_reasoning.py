"""Reasoning: ``reasoning_content`` apart from ``content``, ``reasoning_format``,
``chat_template_kwargs`` and the ``reasoning`` alias, on model-like text and through the library
on tiny models with real chat templates (Qwen3, Qwen3.5, gpt-oss; tests/support/format_models.py)."""
from __future__ import annotations

import json
import random

import pytest

from elelem.api.reasoning import (ReplyParser, ThinkTags, extracts_reasoning, reasoning_messages, template_kwargs,
                                  think_tags, thinking_forced_open)
from elelem.api.tools import HarmonyParser, HermesParser
from elelem.api.tools.base import collect
from elelem.errors import InvalidArgumentError
from elelem.text.chat_template import ChatTemplate
from format_models import family_models, template

THINK = ThinkTags("<think>", "</think>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
HI = [{"role": "user", "content": "What is the capital of France?"}]

# (id, parser, reply, (content, reasoning, calls))
CASES = [
    ("qwen3", ReplyParser(None, tags=THINK), "<think>\nThe capital.\n\nOf France.\n</think>\n\nParis.",
     ("Paris.", "The capital.\n\nOf France.", [])),
    ("forced-open", ReplyParser(None, tags=THINK, forced_open=True), "Let me think.\n</think>\n\nParis.",
     ("Paris.", "Let me think.", [])),
    ("deepseek-r1", ReplyParser(None, tags=THINK), "<think>\nokay, 2+2\n</think>\n\nThe answer is **4**.",
     ("The answer is **4**.", "okay, 2+2", [])),
    ("leading-space", ReplyParser(None, tags=THINK), "\n\n<think>x</think>y", ("y", "x", [])),
    ("no-reasoning", ReplyParser(None, tags=THINK), "Paris. <think> is a tag.", ("Paris. <think> is a tag.", None, [])),
    ("unclosed", ReplyParser(None, tags=THINK), "<think>\nstill thinking when max_tokens came",
     (None, "still thinking when max_tokens came", [])),
    ("empty-block", ReplyParser(None, tags=THINK), "<think>\n\n</think>\n\nParis.", ("Paris.", None, [])),
    ("magistral", ReplyParser(None, tags=ThinkTags("[THINK]", "[/THINK]")), "[THINK]Hmm[/THINK]Paris.",
     ("Paris.", "Hmm", [])),
    ("then-calls", ReplyParser(HermesParser(), TOOLS, tags=THINK),
     '<think>\nA tool knows.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Paris"}}\n</tool_call>', ("Let me check.", "A tool knows.", [("get_weather", {"city": "Paris"})])),
    ("call-ends-the-thinking", ReplyParser(HermesParser(), TOOLS, tags=THINK, forced_open=True),
     'I need the tool <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     (None, "I need the tool", [("get_weather", {"city": "Paris"})])),
    ("none", ReplyParser(None, tags=THINK, extract=False), "<think>\nHmm.\n</think>\n\nParis.",
     ("<think>\nHmm.\n</think>\n\nParis.", None, [])),
    ("gpt-oss", ReplyParser(HarmonyParser()),
     "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris.",
     ("Paris.", "Easy.", [])),
    ("gpt-oss-none", ReplyParser(HarmonyParser(), extract=False),
     "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris.",
     ("<|channel|>analysis<|message|>Easy.<|end|>Paris.", None, [])),
]


def summary(parsed):
    return (parsed.content, parsed.reasoning,
            [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls])


@pytest.mark.parametrize("parser, text, want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reasoning_is_read_whole_and_at_every_split(parser, text, want):
    assert summary(parser.parse(text)) == want
    for i in range(len(text) + 1):
        assert summary(collect(parser.stream(), [text[:i], text[i:]])) == want, i
    assert summary(collect(parser.stream(), list(text))) == want
    rng = random.Random(2)
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(2, 10))))
        assert summary(collect(parser.stream(), [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])) == want


def test_the_markup_is_read_from_the_template_and_the_prompt():
    for name in ("Qwen-Qwen3-0.6B", "Qwen3.5-4B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "GLM-4.6"):
        assert think_tags(template(name)) == THINK, name
    assert think_tags(template("mistralai-Ministral-3-14B-Reasoning-2512")) == ThinkTags("[THINK]", "[/THINK]")
    assert think_tags(template("Qwen-Qwen2.5-7B-Instruct")) is None
    qwen35 = ChatTemplate(template("Qwen3.5-4B"))
    assert thinking_forced_open(THINK, qwen35.render(HI))  # "<|im_start|>assistant\n<think>\n"
    assert not thinking_forced_open(THINK, qwen35.render(HI, enable_thinking=False))
    assert not thinking_forced_open(THINK, ChatTemplate(template("Qwen-Qwen3-0.6B")).render(HI))


def test_options_are_checked():
    assert extracts_reasoning(None) and extracts_reasoning("auto") and extracts_reasoning("deepseek")
    assert not extracts_reasoning("none")
    for bad in ("raw", 1, True):
        with pytest.raises(InvalidArgumentError, match="reasoning_format"):
            extracts_reasoning(bad)
    assert template_kwargs({"enable_thinking": False, "reasoning_effort": "low"}) == {
        "enable_thinking": False, "reasoning_effort": "low"}
    for bad in ([("enable_thinking", False)], {"messages": []}, {"tools": []}, {"not a name": 1}, {1: 2}):
        with pytest.raises(InvalidArgumentError, match="chat_template_kwargs"):
            template_kwargs(bad)


def test_the_reasoning_alias_and_gpt_oss_thinking():
    call = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    sent = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "reasoning": "I should call it.", "tool_calls": call},
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]
    read = reasoning_messages(sent)
    assert read[1]["reasoning_content"] == "I should call it." and "reasoning" not in read[1]
    assert sent[1]["reasoning"] == "I should call it."  # not changed in place
    both = reasoning_messages([{**sent[1], "reasoning_content": "kept"}])
    assert both[0]["reasoning_content"] == "kept"
    assert reasoning_messages(sent, thinking_key=True)[1]["thinking"] == "I should call it."
    # Qwen3's template shows the reasoning of the turn that called the tool.
    rendered = ChatTemplate(template("Qwen-Qwen3-0.6B")).render(read)
    assert "<think>\nI should call it.\n</think>" in rendered


# -- through the library, on tiny models with the real templates --------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    with family_models(tmp_path_factory) as get:
        yield get


def forced(text: str) -> str:
    """A GBNF grammar whose only sentence is ``text``: the tiny model writes it."""
    return "root ::= " + json.dumps(text)


def test_qwen3_reasoning_whole_and_streamed(models):
    _, llm = models("hermes")  # Qwen3-0.6B's template: the model opens <think> itself
    grammar = forced("<think>\nThe capital of France.\n</think>\n\nParis.")
    message = llm.create_chat_completion(HI, grammar=grammar, max_tokens=60, temperature=0)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital of France."}
    chunks = list(llm.create_chat_completion(HI, grammar=grammar, max_tokens=60, temperature=0, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    kinds = [k for d in deltas for k in d if k in ("reasoning_content", "content")]
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning_content")  # all the reasoning, then the content
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The capital of France."
    assert "".join(d.get("content", "") for d in deltas) == "Paris."
    raw = llm.create_chat_completion(HI, grammar=grammar, max_tokens=60, temperature=0, reasoning_format="none")
    assert raw["choices"][0]["message"] == {"role": "assistant",
                                            "content": "<think>\nThe capital of France.\n</think>\n\nParis."}
    assert llm.chat(HI, grammar=grammar, max_tokens=60, temperature=0) == raw["choices"][0]["message"]["content"]
    with pytest.raises(InvalidArgumentError, match="reasoning_format"):
        llm.create_chat_completion(HI, reasoning_format="hidden")


def test_enable_thinking_reaches_the_template(models):
    # Qwen3.5's template opens <think> in the prompt unless enable_thinking is false: the same text is
    # reasoning in the first case and content in the second.
    _, llm = models("qwen3_coder")
    grammar = forced("Paris.")
    thinking = llm.create_chat_completion(HI, grammar=grammar, max_tokens=20, temperature=0)
    plain = llm.create_chat_completion(HI, grammar=grammar, max_tokens=20, temperature=0,
                                       chat_template_kwargs={"enable_thinking": False})
    assert thinking["choices"][0]["message"] == {"role": "assistant", "content": "", "reasoning_content": "Paris."}
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}
    assert plain["usage"]["prompt_tokens"] > thinking["usage"]["prompt_tokens"]  # "\n\n</think>\n\n" more
    closed = llm.create_chat_completion(HI, grammar=forced("Hm.\n</think>\n\nParis."), max_tokens=20, temperature=0)
    assert closed["choices"][0]["message"] == {"role": "assistant", "content": "Paris.", "reasoning_content": "Hm."}
    with pytest.raises(InvalidArgumentError, match="chat_template_kwargs"):
        llm.create_chat_completion(HI, chat_template_kwargs={"messages": []})


def test_a_forced_call_after_the_reasoning_the_prompt_opened(models):
    model, llm = models("qwen3_coder")
    # The reply is free until <tool_call> (made likely here, as the end of the reasoning and of a raw string).
    bias = {model.ids["</think>"]: 9.0, model.ids["\n</parameter>\n"]: 8.0, model.ids["<tool_call>"]: 7.0}
    response = llm.create_chat_completion(HI, tools=TOOLS, tool_choice="required", max_tokens=300, temperature=1.0,
                                          seed=5, logit_bias=bias)
    message = response["choices"][0]["message"]
    assert response["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    raw = llm.chat(HI, tools=TOOLS, tool_choice="required", max_tokens=300, temperature=1.0, seed=5, logit_bias=bias)
    assert "</think>" in raw and raw.index("</think>") < raw.index("<tool_call>")  # thought first, then the call


def test_gpt_oss_channels_and_reasoning_effort(models):
    model, llm = models("harmony")
    token = {t: f"<[{model.ids[t]}]>" for t in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")}
    grammar = (f'start: {token["<|channel|>"]} "analysis" {token["<|message|>"]} "Easy." {token["<|end|>"]} '
               f'{token["<|start|>"]} "assistant" {token["<|channel|>"]} "final" {token["<|message|>"]} "Paris."')
    default = llm.create_chat_completion(HI, grammar=grammar, max_tokens=80, temperature=0)
    assert default["choices"][0]["message"] == {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy."}
    # The control tokens are shown in the raw text, so the reply can be read at all.
    assert llm.chat(HI, grammar=grammar, max_tokens=80, temperature=0) == (
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris.")
    # reasoning_effort reaches the template: "Reasoning: low" instead of its default "Reasoning: medium"
    # (one byte-level token per character here).
    low = llm.create_chat_completion(HI, grammar=grammar, max_tokens=80, temperature=0,
                                     chat_template_kwargs={"reasoning_effort": "low"})
    assert low["usage"]["prompt_tokens"] == default["usage"]["prompt_tokens"] - len("medium") + len("low")
    assert "Reasoning: low" in ChatTemplate(template("openai-gpt-oss-120b")).render(HI, reasoning_effort="low")
    # Reasoning sent back is shown to gpt-oss's template as its "thinking" (either name).
    call = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    turn = {"role": "assistant", "content": "", "tool_calls": call}
    result = {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}

    def prompt_tokens(assistant):
        return llm.create_chat_completion(HI + [assistant, result], tools=TOOLS, tool_choice="none", max_tokens=1,
                                          temperature=0)["usage"]["prompt_tokens"]
    without = prompt_tokens(turn)
    shown = prompt_tokens({**turn, "reasoning_content": "Use the tool."})
    assert shown > without + len("Use the tool.")  # its text, in an analysis message
    assert prompt_tokens({**turn, "reasoning": "Use the tool."}) == shown
