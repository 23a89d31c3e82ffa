"""llama.cpp's real chat templates (models/templates/ of the pinned sdist) in elelem's sandbox.

The mixture-of-experts models (Qwen3-MoE / Qwen3-Coder, gpt-oss's harmony format,
GLM-4.5/4.6/4.7, MiniMax-M2, Mistral 3 / Devstral / Magistral, Mistral Nemo)
and Gemma 4
must render their own templates exactly as llama-cpp-python does
(tests/support/fixtures/make_template_reference.py: Jinja2ChatFormatter; llama.cpp's C++
Jinja engine itself is the judge in tests/test_template_corpus.py) on the conversations of
tests/support/template_cases.py: a plain system / user / assistant / user chat with a
generation prompt, without one, with tools, a tool call and its result,
reasoning in the history, thinking switched off and on, a reasoning effort.  Every
other template of the sdist must give the same text or fail where the
reference fails.  The reference runs live when this machine has the llama.cpp
reference build (cached), else the stored
tests/support/fixtures/chat_templates_llamacpp.json is used if it was made from the
same templates and cases (or the test skips, and fails under CI=true).

Parsing the tool calls these formats produce is tests/test_tools_formats.py's.
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from elelem.errors import TemplateError
from elelem.text import template_sandbox
from elelem.text.chat_template import ChatTemplate

import llamacpp_sdist as sdist
import template_cases as cases
from llamacpp_reference import Reference, file_sha256, run_script, skip_or_fail

pytestmark = pytest.mark.real_model  # the sdist's templates are fetched with pip on first use

HERE = Path(__file__).resolve().parent
STORED = HERE / "support" / "fixtures" / "chat_templates_llamacpp.json"
_memo: dict = {}


def reference() -> dict:
    """make_template_reference.py's output: live (cached) or the stored fixture, if it was made from these cases."""
    if "templates" not in _memo:
        try:
            _memo["templates"] = _make_reference()
        except RuntimeError as e:
            _memo["templates"] = e
    if isinstance(_memo["templates"], RuntimeError):
        raise _memo["templates"]
    return _memo["templates"]


def _make_reference() -> dict:
    templates = sdist.templates_dir()
    name = STORED.name
    live = run_script("make_template_reference.py", ["--out", "{out}/" + name, "--templates-dir", str(templates)],
                      [], [*sorted(templates.glob("*.jinja")), HERE / "support" / "template_cases.py"], [name])
    if live is not None:
        return live[name]["templates"]
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    if stored["header"].get("cases_digest") != cases.digest():
        skip_or_fail(f"{Reference.not_built()}, and {name} was made from other cases (tests/support/template_cases.py changed)")
    return stored["templates"]


def expected_for(template: str) -> dict:
    ref = reference()
    path = sdist.templates_dir() / template
    if template not in ref or ref[template]["sha256"] != file_sha256(path):
        skip_or_fail(f"{Reference.not_built()}, and {STORED.name} has no rendering of this {template}")
    return ref[template]["renders"]


class _FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cases.FIXED_NOW


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch):
    """strftime_now() in elelem's sandbox returns template_cases.FIXED_NOW, as in the reference."""
    monkeypatch.setattr(template_sandbox, "datetime", _FixedDatetime)


def render(template: ChatTemplate, case: str) -> str:
    messages, add_generation_prompt, extra = cases.CASES[case]
    return template.render(messages, add_generation_prompt=add_generation_prompt, **extra)


def compiled(name: str) -> ChatTemplate:
    source = (sdist.templates_dir() / name).read_text(encoding="utf-8")
    return ChatTemplate(source, bos_token=cases.BOS, eos_token=cases.EOS)


@pytest.mark.parametrize("case", cases.CASES)
@pytest.mark.parametrize("name", cases.IN_SCOPE)
def test_model_template_renders_like_llama_cpp_python(name, case):
    expected = expected_for(name)[case]
    assert "error" not in expected, f"the reference fails: {expected['error']}"
    assert render(compiled(name), case) == expected["text"]


@pytest.mark.parametrize("name", cases.IN_SCOPE)
def test_model_template_prompt_ends_with_the_assistant_turn(name):
    """The plain conversation gives the model's own markup, ending with the header of its turn."""
    prompt = render(compiled(name), "plain")
    markers = cases.IN_SCOPE[name]
    assert prompt.endswith(markers["ends"])
    for marker in markers["has"]:
        assert marker in prompt
    assert "2 + 2" in prompt and "And times 3?" in prompt


def test_model_templates_see_tools_and_thinking_switches():
    """What the extra variables change: the tool list is shown, enable_thinking=False closes the
    thinking block (Gemma 4: enable_thinking=True opens it), reasoning_effort reaches gpt-oss's
    system message."""
    qwen3, gpt_oss, glm = compiled("Qwen-Qwen3-0.6B.jinja"), compiled("openai-gpt-oss-120b.jinja"), \
        compiled("GLM-4.6.jinja")
    assert render(qwen3, "thinking_off").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    gemma4 = compiled("google-gemma-4-31B-it.jinja")
    on, off = render(gemma4, "thinking_on"), render(gemma4, "thinking_off")
    assert on.startswith("<s><|turn>system\n<|think|>\nYou are a terse") and on.endswith("<|turn>model\n")
    assert "<|think|>" not in off and off.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert off == render(gemma4, "plain")   # off unless asked for
    assert "Reasoning: high" in render(gpt_oss, "reasoning_effort_high")
    for template in (qwen3, gpt_oss, glm, gemma4, compiled("Qwen3-Coder.jinja"),
                     compiled("Mistral-Small-3.2-24B-Instruct-2506.jinja")):
        assert "get_weather" in render(template, "with_tools")
        assert "get_weather" not in render(template, "plain")


#: Where llama-cpp-python's Python path (jinja2, tools=None) and llama.cpp's own C++ Jinja engine
#: part ways, elelem renders as the engine does (tests/test_template_corpus.py checks it
#: against the engine): these templates fail in jinja2, or escape, on the cases where they differ.
ENGINE_NOT_JINJA2 = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "adds a tool's missing description to a string "
                                                      "(jinja2 raises; llama.cpp reads undefined as '')",
    "Kimi-K2-Instruct.jinja": "appends to a list it built (jinja2's immutable sandbox refuses)",
    "Kimi-K2-Thinking.jinja": "appends to a list it built (jinja2's immutable sandbox refuses)",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "adds `functions` (None from llama-cpp-python) to a string",
    "llama-cpp-deepseek-r1.jinja": "tojson of a map() result (a generator in jinja2, a list in llama.cpp)",
    "meetkai-functionary-medium-v3.1.jinja": "'...'|safe + name (jinja2's Markup HTML-escapes name)",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "without tools, llama-cpp-python passes tools=None, "
                                                           "which it loops over; llama.cpp leaves tools undefined",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "without tools, llama-cpp-python passes tools=None, "
                                                         "which it loops over; llama.cpp leaves tools undefined",
}


def test_every_sdist_template_renders_like_llama_cpp_python():
    """All of models/templates/: the same text (by sha256), or a TemplateError where the reference fails
    (except where llama.cpp's engine renders and elelem with it: ENGINE_NOT_JINJA2)."""
    names = sorted(p.name for p in sdist.templates_dir().glob("*.jinja"))
    assert len(names) >= 60 and set(cases.IN_SCOPE) <= set(names)
    problems, rendered, engine_cases = [], 0, 0
    for name in names:
        expected = expected_for(name)
        template = compiled(name)
        for case, want in expected.items():
            try:
                text = render(template, case)
            except TemplateError as e:
                if "error" not in want:
                    problems.append(f"{name} / {case}: elelem fails ({e}), the reference renders")
                continue
            same = "error" not in want and (
                text == want["text"] if "text" in want else cases.text_digest(text) == want["sha256"])
            if same:
                rendered += 1
            elif name in ENGINE_NOT_JINJA2:
                engine_cases += 1  # rendered as llama.cpp renders it; compared in tests/test_template_corpus.py
            elif "error" in want:
                problems.append(f"{name} / {case}: elelem renders, the reference fails ({want['error']})")
            else:
                problems.append(f"{name} / {case}: other text ({len(text)} chars, reference "
                                f"{want.get('chars', len(want.get('text', '')))})")
    assert not problems, f"{len(problems)} differ, first: {problems[:5]}"
    assert rendered >= 500 and engine_cases <= len(ENGINE_NOT_JINJA2) * len(cases.CASES)
