"""elelem's template sandbox against llama.cpp's own template engine.

llama.cpp renders chat templates with its C++ Jinja engine (common/jinja/)
behind its chat-format code (common/chat.cpp); scripts/reference_chat_templates.py
builds both from the pinned sdist into a command (scripts/chat_template_driver.cpp)
that tests/support/llamacpp_templates.py runs.  Every template of llama.cpp's corpus
(models/templates/*.jinja of the sdist) is rendered there for the three
conversations of tests/support/template_corpus_cases.py -- a plain chat, a tool
definition with a tool-call round trip, reasoning in the history -- and here:

* **the engine**: elelem's sandbox, given the very variables llama.cpp's engine
  rendered from (the driver reports them), must give the same text, for every
  template and conversation;
* **the chat path**: ``ChatTemplate.render`` given the conversation as elelem's
  server gives it (tool call arguments decoded, as api/tools/request.py does) must
  give llama.cpp's prompt too, except where llama.cpp's chat-format code rewrites
  the conversation for one model family (KNOWN_CHAT_LAYER_DIFFERENCES).

Live when the driver is built (CI builds it), else from the stored
tests/support/fixtures/chat_templates_llamacpp_engine.json (prompts as sha256) if it was
made from the same templates and conversations; otherwise the corpus tests skip,
and fail under CI=true.  The unit tests below pin each behaviour the sandbox must share with it,
with the expected text written out, and check it against llama.cpp's engine
when the driver is built.
"""
from __future__ import annotations

import datetime
import json

import pytest

from elelem.errors import TemplateError, UnsafeTemplateError
from elelem.text import template_sandbox
from elelem.text.chat_template import ChatTemplate

import llamacpp_templates as engine
import template_corpus_cases as cases
from llamacpp_reference import skip_or_fail

#: Renderings where llama.cpp's chat-format code hands the template something else than the
#: conversation elelem's chat path gives it (the engines agree on both: see the engine test).
KNOWN_CHAT_LAYER_DIFFERENCES = {
    ("google-gemma-2-2b-it.jinja", "plain"):
        "Gemma 2's template refuses a system message; llama.cpp merges it into the first user message "
        "(chat.cpp workaround::system_message_not_supported), elelem hands it over as it is (TemplateError)",
    ("google-gemma-4-31B-it-interleaved.jinja", "tool_round_trip"):
        "for this older Gemma 4 template llama.cpp moves tool results into the assistant turn's "
        "tool_responses (workaround::convert_tool_responses_gemma4)",
    ("meetkai-functionary-medium-v3.2.jinja", "tool_round_trip"):
        "elelem's server decodes every call's arguments into a dict (api/tools/request.py); llama.cpp only "
        "for templates that take them as objects (caps.supports_object_arguments), and this one adds them "
        "to a string",
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "reasoning"):
        "llama.cpp's Ministral 3 handler (parsers/ministral3.cpp) turns reasoning_content into a thinking "
        "content block, which the template writes as [THINK]...[/THINK]; it does not read reasoning_content",
    ("unsloth-mistral-Devstral-Small-2507.jinja", "reasoning"):
        "the same Ministral 3 handler makes the content a list of blocks, which Devstral's template does not "
        "print: llama.cpp drops the assistant's answer from the prompt (llama.cpp is the odd one here)",
}
#: Renderings llama.cpp refuses (elelem must refuse them too).
KNOWN_LLAMA_CPP_REFUSALS = {
    ("google-gemma-2-2b-it.jinja", "tool_round_trip"):
        "Gemma 2's template raises on the tool role (roles must alternate user/assistant)",
}


class _FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cases.FIXED_NOW


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch):
    """strftime_now() returns template_corpus_cases.FIXED_NOW, as in the driver (UTC)."""
    monkeypatch.setattr(template_sandbox, "datetime", _FixedDatetime)


# --- the corpus ---------------------------------------------------------------------------

_memo: dict = {}


def corpus() -> dict:
    """Every template of the corpus with each conversation, through llama.cpp: live, or stored."""
    if "corpus" not in _memo:
        import llamacpp_sdist

        templates_dir = llamacpp_sdist.templates_dir()
        live = engine.corpus(templates_dir)
        if live is not None:
            _memo["corpus"] = live
        else:
            stored, why = engine.stored()
            if stored is None:
                skip_or_fail(f"{engine.not_built()}, and {why}")
            _memo["corpus"] = stored
        _memo["sources"] = {p.name: p.read_text(encoding="utf-8") for p in sorted(templates_dir.glob("*.jinja"))}
    return _memo["corpus"]


def sources() -> dict[str, str]:
    corpus()
    return _memo["sources"]


def same_text(text: str, expected: dict) -> bool:
    if "prompt" in expected:
        return text == expected["prompt"]
    return engine.sha256(text) == expected["prompt_sha256"] and len(text) == expected["chars"]


def first_difference(text: str, expected: dict) -> str:
    if "prompt" not in expected:
        return f"{len(text)} chars, llama.cpp {expected['chars']}"
    want = expected["prompt"]
    at = next((i for i, (a, b) in enumerate(zip(text, want)) if a != b), min(len(text), len(want)))
    return f"at {at}: elelem {text[max(0, at - 40):at + 40]!r}, llama.cpp {want[max(0, at - 40):at + 40]!r}"


def renderings(conversation: str):
    """(template name, its source as llama.cpp renders it, llama.cpp's result) for one conversation."""
    for name, entry in corpus().items():
        source = sources().get(name)
        if source is None or engine.sha256(source) != entry["sha256"]:
            skip_or_fail(f"{engine.not_built()}, and {engine.STORED.name} has another {name}")
        yield name, entry.get("patched_template", source), entry["renders"][conversation]


@pytest.mark.real_model  # the sdist's templates are fetched with pip on first use
def test_llama_cpp_renders_the_corpus():
    """The reference itself: every template renders every conversation, but the known refusals."""
    refused = {(name, conversation) for name, entry in corpus().items()
               for conversation, result in entry["renders"].items() if "error" in result}
    assert len(corpus()) >= 60 and all(set(e["renders"]) == set(cases.CONVERSATIONS) for e in corpus().values())
    assert refused == set(KNOWN_LLAMA_CPP_REFUSALS)
    assert all(result.get("context") for entry in corpus().values() for result in entry["renders"].values()
               if "error" not in result), "the driver found the variables of every rendering"


@pytest.mark.real_model
@pytest.mark.parametrize("conversation", cases.CONVERSATIONS)
def test_sandbox_renders_as_llama_cpps_engine(conversation):
    """elelem's sandbox, given the variables llama.cpp's engine rendered from, gives its text: every template."""
    problems, compared = [], 0
    for name, source, expected in renderings(conversation):
        if "error" in expected:
            continue
        try:
            text = template_sandbox.render_template(template_sandbox.compile_template(source),
                                                    dict(expected["context"]), template_sandbox.RenderLimits())
        except TemplateError as e:
            problems.append(f"{name}: elelem fails ({e})")
            continue
        compared += 1
        if not same_text(text, expected):
            problems.append(f"{name}: {first_difference(text, expected)}")
    assert not problems, f"{len(problems)} of {compared + len(problems)} differ: {problems}"
    assert compared >= 60


def elelem_prompt(source: str, conversation: str) -> str:
    """The prompt elelem's chat path renders for one conversation (api/prompts.py's render_chat, as
    api/text_api.py calls it): with the variables llama.cpp always sets (enable_thinking, and today's
    datetime and date_string: FIXED_NOW here), the request's chat_template_kwargs over them."""
    from elelem.api.prompts import render_chat
    from elelem.api.tools.request import messages_for_template

    body = cases.CONVERSATIONS[conversation]
    template = ChatTemplate(source, bos_token=cases.BOS, eos_token=cases.EOS)
    return render_chat(template, messages_for_template(body["messages"]), tools=body.get("tools"),
                       add_generation_prompt=body["add_generation_prompt"], **body.get("chat_template_kwargs", {}))


@pytest.mark.real_model
@pytest.mark.parametrize("conversation", cases.CONVERSATIONS)
def test_chat_path_renders_the_conversation_as_llama_cpp(conversation):
    """elelem's chat path gives llama.cpp's prompt for every template, but where llama.cpp's chat-format
    code rewrites the conversation for one model family: KNOWN_CHAT_LAYER_DIFFERENCES names each of those,
    and each must still differ (else it leaves the list).  llama.cpp's refusals are elelem's."""
    problems, same, refused, known_seen = [], 0, 0, set()
    for name, _, expected in renderings(conversation):
        source = sources()[name]  # elelem renders the model's own template (llama.cpp's patches are its own)
        known = (name, conversation) in KNOWN_CHAT_LAYER_DIFFERENCES
        if "error" in expected:
            with pytest.raises(TemplateError):
                elelem_prompt(source, conversation)
            refused += 1
            continue
        try:
            text = elelem_prompt(source, conversation)
        except TemplateError as e:
            if not known:
                problems.append(f"{name}: elelem fails ({e})")
            known_seen.add(name)
            continue
        if same_text(text, expected):
            same += 1
            if known:
                problems.append(f"{name}: listed in KNOWN_CHAT_LAYER_DIFFERENCES, but the same as llama.cpp's now")
        elif known:
            known_seen.add(name)
        else:
            problems.append(f"{name}: {first_difference(text, expected)}")
    assert not problems, f"{len(problems)} differ: {problems}"
    listed = {name for name, c in KNOWN_CHAT_LAYER_DIFFERENCES if c == conversation}
    assert known_seen == listed
    # The full count: every rendering llama.cpp makes is elelem's too, but the ones named above.
    total = len(corpus())
    assert same == total - refused - len(listed) and total >= 69


def test_the_chat_path_matches_llama_cpp_on_all_but_the_named_renderings():
    """Over the three conversations: 204 of llama.cpp's 209 prompts are elelem's, the other 5 are
    KNOWN_CHAT_LAYER_DIFFERENCES (with the one rendering both refuse, 210 in all)."""
    renders = [entry["renders"][c] for entry in corpus().values() for c in cases.CONVERSATIONS]
    made = [r for r in renders if "error" not in r]
    assert (len(renders), len(made), len(KNOWN_CHAT_LAYER_DIFFERENCES)) == (210, 209, 5)


# --- each behaviour, with llama.cpp's engine as the judge when it is built ------------------------

CONTEXT = {
    "messages": [{"role": "user", "content": "hi"}],
    "d": {"b": 1, "a": [1.5, "x"]},
    "text": "Zürich ☕ 🎉",
    "nothing": None,
}

#: name -> (template, what elelem renders from CONTEXT; llama.cpp's engine gives the same).
SAME_AS_LLAMA_CPP = {
    "absent_tools_are_undefined": ("{{ tools is defined }}/{{ tools is none }}/{{ tools | default('-') }}",
                                   "False/False/-"),
    "template_list_append_and_pop": (
        "{%- set ns = namespace(ids=[]) -%}{%- set _ = ns.ids.append('a') -%}{%- set _ = ns.ids.append('b') -%}"
        "{{ ns.ids.pop(0) }}{{ ns.ids | tojson }}{%- set q = [] -%}{%- set _ = q.append(d) -%}{{ q | length }}",
        'a["b"]1'),
    "tojson_default": ("{{ d | tojson }}", '{"b": 1, "a": [1.5, "x"]}'),
    "tojson_indent": ("{{ d | tojson(indent=2) }}", '{\n  "b": 1,\n  "a": [\n    1.5,\n    "x"\n  ]\n}'),
    "tojson_indent_0": ("{{ d | tojson(indent=0) }}", '{\n"b": 1,\n"a": [\n1.5,\n"x"\n]\n}'),
    "tojson_separators": ("{{ d | tojson(separators=(',', ':')) }}", '{"b":1,"a":[1.5,"x"]}'),
    "tojson_ensure_ascii": ("{{ text | tojson(ensure_ascii=True) }}", '"Z\\u00fcrich \\u2615 \\ud83c\\udf89"'),
    "tojson_keeps_unicode": ("{{ text | tojson }}", '"Zürich ☕ 🎉"'),
    "tojson_positional": ("{{ d | tojson(false, 1) }}", '{\n "b": 1,\n "a": [\n  1.5,\n  "x"\n ]\n}'),
    "tojson_of_map": ("{{ messages | map(attribute='role') | tojson }}", '["user"]'),
    "tojson_of_undefined_items": ("{{ [missing, d.nope] | tojson }}", "[null, null]"),
    "strftime_now": ("{{ strftime_now('%Y-%m-%d %H:%M:%S %A %d %B %b %j') }}",
                     "2026-01-15 09:30:00 Thursday 15 January Jan 015"),
    "string_plus_none": ("{{ 'a' + nothing + 'b' }}|{{ nothing + 'c' }}", "ab|c"),
    "string_plus_undefined": ("{{ 'a' + missing.description + 'b' }}|{{ d.nope + 'c' }}", "ab|c"),
    "undefined_chains": ("[{{ missing.a.b }}{{ missing['x'] }}{{ d.zz.yy }}{{ nothing.x }}]", "[]"),
    "tilde_with_none": ("{{ 'a' ~ nothing ~ 'b' }}", "ab"),
    "none_prints_empty": ("[{{ nothing }}]", "[]"),
    "safe_plus_string_is_not_escaped": ("{{ 'say '|safe + '\"<hi>\"' }}", 'say "<hi>"'),
    "in_undefined_is_false": ("{{ 'a' in missing }}", "False"),
    "list_string": ("{{ [1, 'a', none, true] | string }}", "[1, 'a', None, True]"),
}

#: name -> (template, what elelem renders (as jinja2 does), why llama.cpp's engine differs, what it gives
#: (a prefix of its error message for an error)).
JINJA2_NOT_LLAMA_CPP = {
    "tojson_sort_keys": ("{{ d | tojson(sort_keys=True) }}", '{"a": [1.5, "x"], "b": 1}',
                         "llama.cpp has not implemented sort_keys", "error: NotImplemented"),
    "tojson_string_indent": ("{{ [1] | tojson(indent='  ') }}", "[\n  1\n]",
                             "llama.cpp takes only an integer indent", "[1]"),
    "tojson_float": ("{{ [2.0, 3.14159265358] | tojson }}", "[2.0, 3.14159265358]",
                     "llama.cpp writes floats with C++ stream defaults (6 significant digits)", "[2, 3.14159]"),
    "print_list": ("{{ [1, 'a'] }}", "[1, 'a']", "llama.cpp prints a list's items run together", "1a"),
    "print_dict": ("{{ d }}", "{'b': 1, 'a': [1.5, 'x']}", "llama.cpp prints nothing for a dict", ""),
    "upper_non_ascii": ("{{ text | upper }}", "ZÜRICH ☕ 🎉", "llama.cpp upper-cases ASCII only", "ZüRICH ☕ 🎉"),
    "floor_division": ("{{ 7 // 2 }}", "3", "llama.cpp's parser has no //", "error: "),
    "power": ("{{ 2 ** 10 }}", "1024", "llama.cpp's parser has no **", "error: "),
}


def sandbox(source: str, context: dict | None = None) -> str:
    variables = json.loads(json.dumps(CONTEXT if context is None else context))
    return template_sandbox.render_template(template_sandbox.compile_template(source), variables,
                                            template_sandbox.RenderLimits())


def llama_cpp_engine(source: str, context: dict | None = None) -> str | None:
    """llama.cpp's engine on the same variables: its text, "error: ..." or None when it is not built."""
    result = engine.render(source, CONTEXT if context is None else context)
    if result is None:
        return None
    return result["prompt"] if "prompt" in result else "error: " + result["error"].strip()


@pytest.mark.parametrize("name", SAME_AS_LLAMA_CPP)
def test_sandbox_behaves_as_llama_cpps_engine(name):
    source, expected = SAME_AS_LLAMA_CPP[name]
    assert sandbox(source) == expected
    theirs = llama_cpp_engine(source)
    if theirs is not None:
        assert theirs == expected


@pytest.mark.parametrize("name", JINJA2_NOT_LLAMA_CPP)
def test_where_llama_cpps_engine_is_the_odd_one_elelem_renders_as_jinja2(name):
    source, expected, why, theirs_expected = JINJA2_NOT_LLAMA_CPP[name]
    assert sandbox(source) == expected
    theirs = llama_cpp_engine(source)
    if theirs is not None:
        assert theirs.startswith(theirs_expected) if theirs_expected.startswith("error: ") else \
            theirs == theirs_expected, why


def test_the_chat_path_gives_templates_llama_cpps_default_variables():
    """enable_thinking (true) and today's date, as llama.cpp's server gives them; chat_template_kwargs win."""
    from elelem.api.prompts import render_chat

    source = "{{ enable_thinking }}|{{ date_string }}|{{ datetime }}|{{ strftime_now('%d %b %Y') }}"
    hi = [{"role": "user", "content": "hi"}]
    assert render_chat(ChatTemplate(source), hi) == "True|15 Jan 2026|Jan 15 2026|15 Jan 2026"
    assert render_chat(ChatTemplate(source), hi, enable_thinking=False, date_string="1 Apr 2030") == (
        "False|1 Apr 2030|Jan 15 2026|15 Jan 2026")
    # Llama 3.1's template prints the date it is given (its own default is "26 Jul 2024"), as llama.cpp's.
    llama31 = ChatTemplate(sources()["meta-llama-Llama-3.1-8B-Instruct.jinja"])
    assert "Today Date: 15 Jan 2026" in render_chat(llama31, hi)
    assert "Today Date: 26 Jul 2024" in llama31.render(hi)  # the template alone, without the chat path's variables


def test_absent_or_empty_tools_are_undefined_in_chat_template_render():
    template = ChatTemplate("{{ tools is defined }}{% if tools is defined %}{{ tools | length }}{% endif %}")
    hello = [{"role": "user", "content": "hi"}]
    assert template.render(hello) == "False"
    assert template.render(hello, tools=None) == "False"
    assert template.render(hello, tools=[]) == "False"  # llama.cpp leaves an empty list undefined too
    assert template.render(hello, tools=cases.TOOLS) == "True2"


MESSAGE_KEYS = ("{% for m in messages %}{{ m.role }}|{{ m.content | tojson }}|{{ m.reasoning_content }}|"
                "{{ m.tool_call_id }}|{{ m.name }}|{{ 'content' in m }}|{{ 'tool_calls' in m }};{% endfor %}")


def test_message_keys_pass_through_as_llama_cpp_gives_them():
    """reasoning_content, tool_call_id and name reach the template; an assistant message with tool
    calls keeps its content key, None being "" as llama.cpp gives it."""
    messages = cases.CONVERSATIONS["tool_round_trip"]["messages"] + cases.CONVERSATIONS["reasoning"]["messages"]
    expected = ('system|"You can check the weather."||||True|False;user|"Weather in Zürich?"||||True|False;'
                'assistant|""||||True|True;tool|"{\\"temp\\": 21, \\"sky\\": \\"clear\\"}"||call00001|get_weather|'
                'True|False;user|"What is 2 + 2?"||||True|False;assistant|"4."|Two plus two is four.|||True|False;'
                'user|"And times 3?"||||True|False;')
    ours = ChatTemplate(MESSAGE_KEYS).render(messages, add_generation_prompt=False)
    assert ours == expected
    theirs = engine.run([{"mode": "apply", "template": MESSAGE_KEYS, "messages": messages,
                          "add_generation_prompt": False}])
    if theirs is not None:
        assert theirs[0]["prompt"] == expected


def test_unknown_message_keys_pass_through():
    source = "{% for m in messages %}{{ m.thinking }}|{{ m.custom | tojson }}{% endfor %}"
    messages = [{"role": "assistant", "content": "x", "thinking": "hmm", "custom": {"k": [1]}}]
    assert ChatTemplate(source).render(messages) == 'hmm|{"k": [1]}'


def test_tojson_of_an_undefined_value_fails_as_in_jinja2_and_llama_cpp():
    with pytest.raises(TemplateError, match="undefined"):
        sandbox("{{ missing | tojson }}")
    theirs = llama_cpp_engine("{{ missing | tojson }}")
    assert theirs is None or theirs.startswith("error: ")


def test_given_data_stays_immutable_while_template_lists_grow():
    source = "{% set q = [] %}{% set _ = q.append(messages[0]) %}{{ q | length }}{{ messages.append(1) }}"
    with pytest.raises(UnsafeTemplateError, match="append"):
        sandbox(source)
    with pytest.raises(UnsafeTemplateError):
        sandbox("{% set q = namespace(items=[1]) %}{{ q.items.clear() }}")
