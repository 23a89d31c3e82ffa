"""elelem.text.chat_template: parity with transformers, the sandbox and its limits, validation."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from elelem.text.chat_template import (
    CHATML_TEMPLATE,
    MAX_TEMPLATE_CHARS,
    MAX_TEMPLATE_TOKENS,
    ChatTemplate,
    RenderLimits,
)
from elelem.errors import (
    GGUFError,
    InvalidArgumentError,
    InvalidTokenError,
    TemplateError,
    TemplateLimitError,
    UnsafeTemplateError,
)

FIXTURES = json.loads((Path(__file__).parent / "support" / "fixtures" / "chat_templates.json").read_text(encoding="utf-8"))
REPO = Path(__file__).resolve().parents[1]
HELLO = [{"role": "user", "content": "hi"}]


def render(source: str, messages=HELLO, limits: RenderLimits | None = None, **kwargs) -> str:
    return ChatTemplate(source, limits=limits).render(messages, **kwargs)


# --- parity with transformers -------------------------------------------------


@pytest.mark.parametrize("case", FIXTURES["cases"], ids=[case["id"] for case in FIXTURES["cases"]])
def test_renders_like_transformers(case):
    spec = FIXTURES["templates"][case["template"]]
    template = ChatTemplate(spec["source"], bos_token=spec["bos_token"], eos_token=spec["eos_token"])
    call = lambda: template.render(  # noqa: E731
        case["messages"], tools=case["tools"], add_generation_prompt=case["add_generation_prompt"]
    )
    if case["id"].startswith("smollm2/tool_call/"):
        # transformers fails on the tool-call turn whose content is None (UndefinedError); elelem
        # gives it content "", as llama.cpp does, so it renders as that turn with "" does.
        empty = [{**m, "content": "" if m["content"] is None else m["content"]} for m in case["messages"]]
        assert case["expected_error"] == "UndefinedError" and call() == template.render(
            empty, tools=case["tools"], add_generation_prompt=case["add_generation_prompt"])
        assert "<|im_start|>assistant\n<|im_end|>" in call()
    elif case["expected_error"] is not None:
        with pytest.raises(TemplateError):
            call()
    else:
        assert call() == case["expected"]


def test_fixtures_cover_what_they_claim():
    templates = FIXTURES["templates"]
    assert {"qwen2.5", "smollm2", "gemma3-chatml-fallback"} <= set(templates)
    assert templates["qwen2.5"]["has_template"] and templates["smollm2"]["has_template"]
    assert not templates["gemma3-chatml-fallback"]["has_template"]
    assert templates["gemma3-chatml-fallback"]["source"] == CHATML_TEMPLATE
    ids = {case["id"] for case in FIXTURES["cases"]}
    for template in ("qwen2.5", "smollm2", "gemma3-chatml-fallback"):
        for generation in (True, False):
            assert f"{template}/system_user_assistant/gen={generation}" in ids
            assert f"{template}/tool_call_empty_content/gen={generation}" in ids
    assert "qwen2.5/tool_call/gen=True/tools" in ids
    assert sum(case["expected_error"] is None for case in FIXTURES["cases"]) >= 40


# --- metadata and the ChatML fallback -----------------------------------------

TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def test_model_without_template_falls_back_to_chatml():
    metadata = {"tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    template = ChatTemplate.from_metadata(metadata)
    assert template.is_fallback and template.source == CHATML_TEMPLATE
    assert (template.bos_token, template.eos_token) == ("<s>", "</s>")
    assert template.render(HELLO) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(HELLO, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_chatml_fallback_writes_tool_calls():
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "tool_call_id": "1", "content": "21 °C"},
    ]
    assert ChatTemplate(CHATML_TEMPLATE).render(messages) == (
        "<|im_start|>user\nweather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n21 °C<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_empty_template_in_metadata_falls_back_too():
    assert ChatTemplate.from_metadata({"tokenizer.chat_template": "  "}).is_fallback


def test_metadata_template_and_special_tokens():
    metadata = {
        "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 4,
    }
    template = ChatTemplate.from_metadata(metadata)
    assert not template.is_fallback
    assert template.render(HELLO) == "<s>hi<|im_end|>"


def test_metadata_token_lookup_callable_and_bytes():
    metadata = {"tokenizer.chat_template": b"{{ bos_token }}|{{ eos_token }}", "tokenizer.ggml.bos_token_id": 7}
    template = ChatTemplate.from_metadata(metadata, token_text=lambda token: f"<tok{token}>")
    assert template.render(HELLO) == "<tok7>|"


def test_metadata_named_template():
    metadata = {
        "tokenizer.chat_template": "default",
        "tokenizer.chat_template.tool_use": "tools!",
        "tokenizer.chat_templates": ["tool_use"],
    }
    assert ChatTemplate.from_metadata(metadata, name="tool_use").render(HELLO) == "tools!"
    with pytest.raises(TemplateError, match="no chat template named 'rag'"):
        ChatTemplate.from_metadata(metadata, name="rag")


def test_metadata_errors():
    with pytest.raises(InvalidTokenError):
        ChatTemplate.from_metadata({"tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.bos_token_id": 99})
    with pytest.raises(GGUFError):
        ChatTemplate.from_metadata({"tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.eos_token_id": "2"})
    with pytest.raises(GGUFError):
        ChatTemplate.from_metadata({"tokenizer.chat_template": 5})


# --- custom templates and HF's template API -------------------------------------


def test_custom_template_and_extra_variables():
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}{{ greeting }}{{ documents | length }}",
        bos_token="<s>",
    )
    out = template.render(HELLO, greeting="!", documents=[{"title": "a", "text": "b"}])
    assert out == "<s>[user:hi]>!1"
    # Like transformers, extra variables override the special tokens.
    out = template.render(HELLO, add_generation_prompt=False, bos_token="<B>", greeting="", documents=[])
    assert out == "<B>[user:hi]0"


def test_tojson_has_transformers_semantics():
    data = {"b": "é<&>'", "a": [1, 2.5, None, True]}
    assert render("{{ data | tojson }}", data=data) == json.dumps(data, ensure_ascii=False)
    assert render("{{ data | tojson(indent=2) }}", data=data) == json.dumps(data, ensure_ascii=False, indent=2)
    assert render("{{ data | tojson(sort_keys=true, separators=(',', ':')) }}", data=data) == json.dumps(
        data, ensure_ascii=False, sort_keys=True, separators=(",", ":")
    )
    assert render("{{ data | tojson(ensure_ascii=true) }}", data=data) == json.dumps(data)


def test_raise_exception_becomes_template_error():
    with pytest.raises(TemplateError, match="^Conversation roles must alternate$") as caught:
        render("{{ raise_exception('Conversation roles must alternate') }}")
    assert type(caught.value) is TemplateError


def test_strftime_now_and_loop_controls_and_generation_tag():
    today = datetime.now().strftime("%Y-%m-%d")
    assert render("{{ strftime_now('%Y-%m-%d') }}") in {today, datetime.now().strftime("%Y-%m-%d")}
    loop_controls = (
        "{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}"
        "{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"
    )
    assert render(loop_controls) == "02"
    assert render("{% generation %}{{ messages[0].content }}{% endgeneration %}") == "hi"


def test_dict_and_namespace_work_for_templates():
    source = (
        "{% set ns = namespace(count=0) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% endfor %}"
        "{{ ns.count }}{{ dict(a=1) | tojson }}{{ dict.fromkeys(['x'], 0) | tojson }}"
    )
    assert render(source, messages=HELLO * 3) == '3{"a": 1}{"x": 0}'


def test_none_valued_keys_are_dropped_but_content_is_kept_as_llamacpp_gives_it():
    source = "{% for m in messages %}{{ 'name' in m }}/{{ m.content is defined }}/{{ m.content | tojson }};{% endfor %}"
    assert render(source, messages=[{"role": "user", "content": None, "name": None}]) == 'False/True/"";'
    calls = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]
    assert render(source, messages=calls) == 'False/True/"";'


def test_compiled_templates_are_cached_by_source():
    source = "{{ messages | length }} cached"
    assert ChatTemplate(source)._template is ChatTemplate(source, bos_token="x")._template


def test_renders_concurrently():
    template = ChatTemplate("{% for i in range(2000) %}{{ i }}{% endfor %}{{ messages[0].content }}")
    expected = "".join(str(i) for i in range(2000)) + "hi"
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                results.append(template.render(HELLO))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == [expected] * 20


# --- construction errors --------------------------------------------------------


def test_bad_template_sources():
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(TemplateError, match="empty"):
        ChatTemplate("   ")
    with pytest.raises(InvalidArgumentError):
        ChatTemplate(None)  # type: ignore[arg-type]
    with pytest.raises(TemplateLimitError):
        ChatTemplate("x" * (MAX_TEMPLATE_CHARS + 1))
    with pytest.raises(InvalidArgumentError):
        ChatTemplate("x", bos_token=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("unit", ["{{ a(1, 2, 3) }}", "{{ 1 + 1 + 1 }}", "{% if a %}x{% endif %}"])
def test_a_template_with_too_many_tokens_is_refused_before_it_is_parsed(unit):
    # Parsing and compiling cost ~20 us a token: a source at the size limit
    # made of these would take seconds to compile.
    source = unit * (MAX_TEMPLATE_CHARS // len(unit))
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match="tokens"):
        ChatTemplate(source)
    assert time.monotonic() - start < 1.0  # unchecked, these take 2-36 s; checked, milliseconds


def test_the_token_limit_leaves_real_templates_far_below_it():
    from elelem.text.template_sandbox import _ENVIRONMENT

    for name, source in FIXTURES["templates"].items():
        source = source if isinstance(source, str) else source["source"]
        count = sum(1 for _ in _ENVIRONMENT.lexer.tokeniter(source, None))
        assert count < MAX_TEMPLATE_TOKENS // 20, name
    just_under = "{{ a }}" * (MAX_TEMPLATE_TOKENS // 5 - 1)  # five lexer tokens each, spaces included
    assert ChatTemplate(just_under).render(HELLO, a="x") == "x" * (MAX_TEMPLATE_TOKENS // 5 - 1)


def test_template_errors_at_render_time_are_template_errors():
    with pytest.raises(TemplateError, match="undefined"):
        render("{{ nope() }}")
    with pytest.raises(TemplateError):
        render("{{ messages[0].content + 1 }}")
    with pytest.raises(TemplateError):
        render("{% include 'other' %}")


@pytest.mark.parametrize("bad", [dict(timeout_s=0), dict(max_output_chars=-1), dict(max_call_depth=True)])
def test_render_limits_are_validated(bad):
    with pytest.raises(InvalidArgumentError):
        RenderLimits(**bad)


# --- message validation ------------------------------------------------------------

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}


@pytest.mark.parametrize(
    "messages, complaint",
    [
        ("hello", "list"),
        ({"role": "user", "content": "hi"}, "list"),
        ([], "empty"),
        (["hi"], r"messages\[0\] must be a dict"),
        ([{"content": "hi"}], "role"),
        ([{"role": "", "content": "hi"}], "role"),
        ([{"role": 3, "content": "hi"}], "role"),
        ([{"role": "user"}], "content"),
        ([{"role": "user", "content": ["a", "b"]}], "content"),
        ([{"role": "user", "content": 5}], "content"),
        ([{"role": "user", "content": "x", "tool_calls": [CALL]}], "only assistant"),
        ([{"role": "assistant", "content": None, "tool_calls": "f()"}], "list of tool calls"),
        ([{"role": "assistant", "content": None, "tool_calls": ["f"]}], "must be a dict"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": {}}}]}], "name"),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}],
            "arguments",
        ),
        ([{"role": "user", "content": "x", "tool_call_id": "c1"}], "tool_call_id"),
        ([{"role": "tool", "content": "x", "tool_call_id": 7}], "tool_call_id"),
        ([{"role": "tool", "content": "x", "name": 7}], "name"),
        ([{"role": "user", "content": "x", "extra": object()}], "object"),
    ],
)
def test_bad_messages_are_rejected(messages, complaint):
    with pytest.raises(InvalidArgumentError, match=complaint):
        ChatTemplate(CHATML_TEMPLATE).render(messages)


def test_good_tool_conversation_shapes_are_accepted():
    messages = [
        {"role": "user", "content": "x", "name": "alice"},
        {"role": "assistant", "tool_calls": [CALL, {"name": "flat", "arguments": '{"y": 2}'}]},
        {"role": "tool", "content": "1", "tool_call_id": "c1", "name": "f"},
        {"role": "assistant", "content": None, "tool_calls": None},
    ]
    ChatTemplate(CHATML_TEMPLATE).render(messages)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(tools=[print]),
        dict(tools={"type": "function"}),
        dict(documents=["text"]),
        dict(custom=object()),
        dict(custom={1j: "complex key"}),
    ],
)
def test_template_data_must_be_plain(kwargs):
    with pytest.raises(InvalidArgumentError):
        ChatTemplate(CHATML_TEMPLATE).render(HELLO, **kwargs)


def test_deeply_nested_data_is_rejected():
    nested: list = []
    for _ in range(100):
        nested = [nested]
    with pytest.raises(InvalidArgumentError, match="nested"):
        ChatTemplate(CHATML_TEMPLATE).render(HELLO, data=nested)


# --- hostile templates ---------------------------------------------------------------

UNSAFE = {
    "cve_2024_34359": (
        "{% for c in [].__class__.__base__.__subclasses__() %}{% if c.__name__ == 'catch_warnings' %}"
        "{{ c()._module.__builtins__['__import__']('os').popen('touch /tmp/elelem-pwned').read() }}"
        "{% endif %}{% endfor %}"
    ),
    "mro_subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals_via_cycler": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "globals_via_self": "{{ self.__init__.__globals__ }}",
    "globals_via_namespace": "{{ namespace.__init__.__globals__ }}",
    "getitem_dunder": "{{ ''['__class__'] }}",
    "attr_filter": "{{ ''|attr('__class__') }}",
    "attr_filter_on_format": "{{ ('{0.__class__.__mro__}'|attr('format'))(1) }}",
    "format_field_dunder": "{{ '{0.__class__}'.format(1) }}",
    "format_map_dunder": "{{ '{x.__class__}'.format_map({'x': 1}) }}",
    "unused_dunder_probe": "{% set x = ''.__class__ %}ok",
    # A list the template built may take append and pop (Kimi's templates); the data
    # it was given may not change, nor may its own lists any other way.
    "mutating_method": "{{ messages.append(1) }}",
    "mutating_pop_on_given_data": "{{ messages.pop() }}",
    "mutating_nested_given_list": "{% set calls = [] %}{{ calls.append(messages) }}{{ calls[0].append(1) }}",
    "list_extend": "{% set items = [] %}{{ items.extend([1]) }}",
    "list_clear": "{% set items = [1] %}{{ items.clear() }}",
    "list_append_by_item": "{{ messages['append'](1) }}",
    "dict_update": "{% set d = {} %}{{ d.update(a=1) }}",
    "namespace_underscore": "{% set ns = namespace() %}{% set ns._secret = 1 %}",
}


@pytest.mark.parametrize("source", UNSAFE.values(), ids=UNSAFE.keys())
def test_sandbox_escapes_fail_fast(source):
    start = time.monotonic()
    with pytest.raises(UnsafeTemplateError):
        render(source)
    assert time.monotonic() - start < 1.0
    assert not Path("/tmp/elelem-pwned").exists()


def test_internals_are_not_reachable_by_name():
    # lipsum (a function whose globals reach os) is removed; dict is not the type.
    with pytest.raises(TemplateError, match="lipsum"):
        render("{{ lipsum.__globals__ }}")
    with pytest.raises(TemplateError):
        render("{{ dict.mro() }}")


EXPENSIVE = {
    "self_recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "mutually_recursive_macros": (
        "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}"
    ),
    "recursive_loop": "{% set t = [[1]] %}{% for x in t recursive %}{{ loop(t) }}{% endfor %}",
    "range_1e9": "{% for i in range(10**9) %}{{ i }}{% endfor %}",
    "range_1e30_length": "{{ range(10**30) | length }}",
    "megabytes_of_output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "string_times_1e9": "{{ 'x' * 10**9 }}",
    "list_times_1e9": "{{ ([0] * 10**9) | length }}",
    "huge_power": "{{ 7 ** (10 ** 9) }}",
    "center_filter": "{{ 'x' | center(10**9) }}",
    "center_method": "{{ 'x'.center(1000000000) }}",
    "zfill_method": "{{ '1'.zfill(10**9) }}",
    "int_to_bytes": "{{ (1).to_bytes(10**9, 'big') }}",
    "format_width": "{{ '{:>1000000000}'.format(1) }}",
    "format_dynamic_width": "{{ '{:>{w}}'.format(1, w=10**9) }}",
    "percent_width": "{{ '%1000000000d' % 1 }}",
    "percent_star_width": "{{ '%*d' % (10**9, 1) }}",
    "format_filter_width": "{{ '%.1000000000f' | format(1) }}",
    "replace_amplifies": "{% set s = 'x' * 5000 %}{{ s.replace('', s) }}",
    "replace_filter_amplifies": "{% set s = 'x' * 5000 %}{{ s | replace('', s) }}",
    "join_amplifies": "{% set s = 'x' * 100000 %}{{ [s, s, s, s, s, s, s, s, s, s, s, s] | join(s) }}",
    "doubling_with_tilde": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    ),
    "doubling_with_plus": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
    ),
    "nested_list_printed": (
        "{% set ns = namespace(l=['x' * 1000]) %}{% for i in range(64) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"
        "{{ ns.l }}"
    ),
    "nested_list_tojson": (
        "{% set ns = namespace(l=['x' * 1000]) %}{% for i in range(64) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"
        "{{ ns.l | tojson }}"
    ),
    "many_big_strings_held": "{{ range(100000) | map('center', 1000000) | list | length }}",
    "fromkeys_of_big_value": "{% set s = 'x' * 1000000 %}{{ dict.fromkeys(range(100000), s) | length }}",
    "macro_buffer": (
        "{% set s = 'x' * 1000000 %}{% macro m() %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endmacro %}"
        "{{ m() | length }}"
    ),
    "set_block_buffer": (
        "{% set x %}{% for i in range(100000) %}" + "y" * 5000 + "{% endfor %}{% endset %}{{ x | length }}"
    ),
    "wordwrap_separator": "{{ ('x ' * 100000) | wordwrap(1, wrapstring='y' * 1000) }}",
    "batch_padding": "{{ [1] | batch(10**9, fill_with=0) | list | length }}",  # took 36 s
    "slice_count": "{{ [1] | slice(10**9) | list | length }}",  # took 4.7 s
    "wordwrap_long_word": "{{ ('a' * 500000) | wordwrap(3) }}",
    "wordwrap_long_space_run": "{{ (' ' * 500000) | wordwrap(3) }}",
    "wordwrap_tabs": "{{ ('\t' * 32768) | wordwrap(1) }}",
    "indent_width": "{{ ('x\n' * 100000) | indent(1000) }}",
    "expandtabs": "{{ ('\t' * 100000).expandtabs(1000) }}",
    "translate": "{{ ('a' * 100000).translate({97: 'b' * 1000}) }}",
    "tojson_indent": "{{ [[[1]]] | tojson(indent=10**6) }}",
    "deeply_nested_source": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
}


@pytest.mark.parametrize("source", EXPENSIVE.values(), ids=EXPENSIVE.keys())
def test_expensive_templates_fail_fast(source):
    start = time.monotonic()
    with pytest.raises(TemplateLimitError):
        render(source)
    assert time.monotonic() - start < 2.0  # well before the 2 s deadline: the size checks come first


@pytest.mark.parametrize("text", ["a" * 500_000, " " * 500_000, "\t" * 32_768, "-" * 200_000])
def test_wordwrap_of_a_huge_run_is_refused_at_once(text):
    # textwrap is quadratic in the longest word or run of spaces; the limit
    # must come from the pre-check, not from the deadline after the fact.
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match="wordwrap"):
        render("{{ text | wordwrap(3) }}", text=text)
    assert time.monotonic() - start < 1.0  # unchecked, these take 2-36 s; checked, milliseconds


@pytest.mark.parametrize("source", [
    "{{ text | striptags }}", "{{ (text | safe).striptags() }}",
], ids=["filter", "Markup method"])
@pytest.mark.parametrize("text", ["<a>" * 300_000, "<!--x-->" * 100_000], ids=["tags", "comments"])
def test_striptags_on_many_tags_is_refused_at_once(source, text):
    # markupsafe rebuilds the whole string once per tag: 300k tags took 6 s.
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match="striptags"):
        render(source, text=text)
    assert time.monotonic() - start < 1.0  # unchecked, these take 2-36 s; checked, milliseconds


def test_striptags_within_its_bound_works():
    assert render("{{ text | striptags }}", text="<b>hi</b> &amp; <!-- c --> there " * 200) == \
        " ".join(["hi & there"] * 200)


@pytest.mark.parametrize(
    "text, width",
    [("hello world, " * 2000, 79), ("a" * 5000, 3), ("x-y " * 3000 + "\tend", 7), ("a" * 9999, 1)],
)
def test_wordwrap_within_its_bound_wraps_like_jinja(text, width):
    import jinja2

    expected = jinja2.Environment().from_string("{{ text | wordwrap(w) }}").render(text=text, w=width)
    assert render("{{ text | wordwrap(w) }}", text=text, w=width) == expected


SLOW = {
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop_over_a_long_string": "{% set s = 'x' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "busy_macro_calls": (
        "{% macro f() %}{% endmacro %}{% for i in range(100000) %}{% for j in range(100000) %}{{ f() }}"
        "{% endfor %}{% endfor %}"
    ),
    "sum_in_loops": (
        "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}"
        "{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}"
    ),
}


@pytest.mark.parametrize("source", SLOW.values(), ids=SLOW.keys())
def test_slow_templates_hit_the_deadline(source):
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match="longer than 0.3 s"):
        render(source, limits=RenderLimits(timeout_s=0.3))
    assert time.monotonic() - start < 1.5


def test_output_limit_is_exact():
    limits = RenderLimits(max_output_chars=100)
    assert len(render("{% for i in range(100) %}x{% endfor %}", limits=limits)) == 100
    with pytest.raises(TemplateLimitError, match="longer than 100"):
        render("{% for i in range(101) %}x{% endfor %}", limits=limits)


def test_range_limit_is_configurable():
    limits = RenderLimits(max_range_items=10)
    assert render("{{ range(10) | list | length }}", limits=limits) == "10"
    with pytest.raises(TemplateLimitError, match="range"):
        render("{{ range(11) | list | length }}", limits=limits)


def test_recursion_error_is_converted_even_without_the_depth_cap():
    # With the cap lifted, Python's own RecursionError must still come out as a TemplateError.
    with pytest.raises(TemplateLimitError, match="recursed too deeply"):
        render(EXPENSIVE["self_recursive_macro"], limits=RenderLimits(max_call_depth=10**9))
    assert render("{{ messages[0].content }}") == "hi"  # and the interpreter is fine afterwards


def test_runaway_recursion_cannot_crash_the_interpreter():
    # A process that raised the recursion limit is exactly where deep recursion
    # would overflow the C stack; the call-depth cap must stop it first.
    script = textwrap.dedent(
        """
        import sys
        sys.setrecursionlimit(1_000_000)
        from elelem.text.chat_template import ChatTemplate
        from elelem.errors import TemplateLimitError
        try:
            source = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
            ChatTemplate(source).render([{"role": "user", "content": "x"}])
        except TemplateLimitError:
            print("stopped")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "stopped"


def test_legitimate_heavy_template_still_renders():
    # A long conversation through the real Qwen template stays far inside the limits.
    spec = FIXTURES["templates"]["qwen2.5"]
    messages = [{"role": "system", "content": "s"}]
    for index in range(500):
        messages.append({"role": "user", "content": f"question {index} " + "lorem ipsum " * 40})
        messages.append({"role": "assistant", "content": f"answer {index} " + "dolor sit " * 40})
    text = ChatTemplate(spec["source"]).render(messages)
    assert text.count("<|im_start|>") == 1002


def test_a_template_past_pythons_block_nesting_is_a_limit_error():
    """Jinja compiles to Python, which refuses more than 20 nested blocks
    (found by the template fuzzer, seed 972165366): a clear limit error."""
    from elelem.errors import TemplateLimitError
    from elelem.text.template_sandbox import compile_template
    source = "{% for x in [1] %}" * 25 + "a" + "{% endfor %}" * 25
    with pytest.raises(TemplateLimitError, match="nested too deeply"):
        compile_template(source)
    assert compile_template("{% for x in [1] %}" * 5 + "a" + "{% endfor %}" * 5) is not None  # 5 deep: fine
