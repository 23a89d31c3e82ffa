"""The template target: random and mutated Jinja chat templates through ChatTemplate.

A case is a JSON file: the template source, the conversation and the render
arguments.  Sources come from three generators: a small Jinja grammar (tags,
filters, tests, attribute chains, operators) biased towards what the sandbox
and the limits must stop; known hostile payloads; and the real templates of
the packaged models (``tests/support/fixtures/chat_templates.json``) mutated chunk by
chunk.  Messages are mostly valid and sometimes not.

A render passes when it returns text within its limits, or when it is
refused by one of the sandbox's own refusals: ``UnsafeTemplateError``,
``TemplateLimitError``, a ``TemplateError`` that elelem raised itself
(``raise_exception``, a limit) or made from a Jinja error (a syntax error,
an undefined name), or from an ordinary error of a template expression on
plain data (:data:`EXPRESSION_ERRORS`, raised inside Jinja, elelem or the
standard library's text helpers).  And ``InvalidArgumentError`` for bad
messages.  Everything else fails:

* any other cause behind the ``TemplateError`` (``OSError``, ``ImportError``,
  ``RuntimeError``... or an expression error raised from elsewhere, such
  as ``os.py``): the template reached code a chat template has no business in;
* a ``TemplateLimitError`` made from a ``MemoryError``: an allocation got past
  the budget and was only stopped by the runner's memory cap;
* a tripwire (:mod:`fuzzing.canary`): the render touched the planted canary
  object or raised an audit event such as ``open``, ``import`` or
  ``subprocess.Popen``, whatever it returned or raised;
* a render that returns or raises well after its own time limit
  (``RenderLimits.timeout_s`` plus :data:`SLACK_S`), which means some operation
  ran without checking the budget.  The limit itself is the module's: cases set
  ``timeout_s`` lower than the default to keep campaigns fast.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import time
import traceback
from pathlib import Path

from . import canary
from .outcomes import INVARIANT, PASS, REJECTED, UNEXPECTED, Outcome, from_exception

ROOT = Path(__file__).resolve().parents[3]
SLACK_S = 0.75
# Past its limit plus this, a render is stopped by SIGALRM and counted as slow
# (rather than left to the driver's hang timeout, which varies by machine).
HARD_STOP_S = 5.0
DEFAULT_CASE_TIMEOUT_S = 0.3


class _Overrun(BaseException):
    """Raised by SIGALRM in a render far past its limit.  A BaseException,
    because ChatTemplate turns every Exception a template raises into a
    TemplateError, which would hide the overrun."""


def _stop_render(signum, frame):
    raise _Overrun()


# Errors a template expression raises on plain data ('a' - 1, x[10], 1 / 0,
# 'x'|int(base=99)); elelem reports them as a TemplateError with the error as
# its cause.  UnicodeError and json's errors are ValueErrors.
EXPRESSION_ERRORS = (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError,
                     AttributeError, RecursionError)
# Where such an error may come from: the template's own code, Jinja and
# MarkupSafe, elelem, and the standard-library helpers Jinja's filters use.
_EXPRESSION_HOMES = (f"{os.sep}jinja2{os.sep}", f"{os.sep}markupsafe{os.sep}", f"{os.sep}elelem{os.sep}",
                     f"{os.sep}json{os.sep}", "textwrap.py", "string.py", "random.py", "pprint.py",
                     "urllib/parse.py", "_collections_abc.py")


def allowed_errors() -> tuple[type, ...]:
    from elelem.errors import InvalidArgumentError, TemplateError
    return (TemplateError, InvalidArgumentError)


def warm_up() -> None:
    import elelem.text.chat_template  # noqa: F401 -- jinja2 and the environment, before the first case's clock
    canary.plant()


def execute(path: Path) -> Outcome:
    from elelem.text.chat_template import ChatTemplate, RenderLimits

    case = json.loads(path.read_text(encoding="utf-8"))
    limits = RenderLimits(timeout_s=case.get("timeout_s", DEFAULT_CASE_TIMEOUT_S))
    started = time.perf_counter()
    stage = "compile"
    previous = signal.signal(signal.SIGALRM, _stop_render)
    signal.setitimer(signal.ITIMER_REAL, limits.timeout_s + HARD_STOP_S)
    touched: list[str] = []
    try:
        template = ChatTemplate(case["source"], bos_token=case.get("bos_token", "<s>"),
                                eos_token=case.get("eos_token", "</s>"), limits=limits)
        stage = "render"
        started = time.perf_counter()
        with canary.armed() as touched:
            text = template.render(case["messages"], add_generation_prompt=case.get("add_generation_prompt", True),
                                   tools=case.get("tools"), **case.get("extra", {}))
        outcome = Outcome(PASS, "render")
        if not isinstance(text, str) or len(text) > limits.max_output_chars:
            outcome = Outcome(INVARIANT, "render", "output", f"render returned {type(text).__name__} "
                                                             f"of {len(text)} characters")
    except _Overrun:
        return Outcome(INVARIANT, stage, "slow", f"{stage} still running after {time.perf_counter() - started:.2f} s "
                                                 f"with a {limits.timeout_s} s limit (stopped by the fuzzer)")
    except Exception as error:  # noqa: BLE001 -- classified, not swallowed
        outcome = judge_exception(error, stage)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    refused = outcome.status == REJECTED and outcome.error == "elelem.errors.UnsafeTemplateError"
    touched = [t for t in touched if not (refused and t.startswith(canary.PEEK))]
    if touched:
        return Outcome(INVARIANT, stage, "escape", f"the render reached outside the sandbox: {touched} "
                                                   f"(it ended as {outcome.status} {outcome.error})")
    elapsed = time.perf_counter() - started
    if elapsed > limits.timeout_s + SLACK_S and not outcome.failed:
        return Outcome(INVARIANT, stage, "slow", f"render took {elapsed:.2f} s with a {limits.timeout_s} s limit "
                                                 f"(ended as {outcome.status} {outcome.error})")
    return outcome


def judge_exception(error: Exception, stage: str) -> Outcome:
    """A pass (REJECTED) only for the sandbox's own refusals; see the module docstring."""
    import jinja2
    from elelem.errors import TemplateError, TemplateLimitError, UnsafeTemplateError
    outcome = from_exception(error, stage, allowed_errors())
    if outcome.failed or not isinstance(error, TemplateError) or isinstance(error, UnsafeTemplateError):
        return outcome
    cause = error.__cause__
    if cause is None or isinstance(cause, (jinja2.TemplateError, RecursionError)):
        return outcome
    name = f"{outcome.error}({type(cause).__qualname__})"
    if isinstance(cause, MemoryError) and isinstance(error, TemplateLimitError):
        return Outcome(INVARIANT, stage, "memory", "an allocation got past the render budget and was stopped only "
                                                   "by the runner's memory cap:\n" + _trace(error))
    if isinstance(cause, EXPRESSION_ERRORS) and _raised_at_home(cause):
        return Outcome(REJECTED, stage, name, outcome.detail)
    if type(cause) is RuntimeError and _raised_in(cause, (f"{os.sep}jinja2{os.sep}",)):
        return Outcome(REJECTED, stage, name, outcome.detail)  # Jinja refusing a call: cycler() with no items
    return Outcome(UNEXPECTED, stage, name, _trace(error))


def _raised_at_home(error: BaseException) -> bool:
    """Was ``error`` raised by the template's code, or by a library a filter uses (not, say, os.py)?"""
    return _raised_in(error, _EXPRESSION_HOMES, template_code=True)


def _raised_in(error: BaseException, homes: tuple[str, ...], *, template_code: bool = False) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return template_code  # raised by a builtin called straight from the render loop
    filename = frames[-1].filename
    return (template_code and filename.startswith("<")) or any(home in filename for home in homes)


def _trace(error: BaseException) -> str:
    text = "".join(traceback.format_exception(error))
    return text if len(text) <= 4000 else text[:2000] + "\n...\n" + text[-2000:]


# ----------------------------------------------------------------------------- generation

_NAMES = ("messages", "message", "m", "loop", "bos_token", "eos_token", "add_generation_prompt", "tools",
          "documents", "ns", "x", "i", "range", "namespace", "raise_exception", "strftime_now", "cycler",
          "joiner", "dict", "self", "caller", "varargs", "kwargs", "undefined_name", "lipsum", "enable_thinking",
          "elelem_fuzz_canary", "__builtins__")
_ATTRS = ("role", "content", "tool_calls", "name", "function", "arguments", "index", "first", "last", "length",
          "__class__", "__mro__", "__subclasses__", "__globals__", "__init__", "__dict__", "__base__",
          "__builtins__", "__import__", "__code__", "__func__", "__self__", "gi_frame", "f_globals", "mro",
          "_TemplateReference__context", "append", "pop", "update", "clear", "format", "format_map", "join",
          "split", "replace", "ljust", "rjust", "center", "zfill", "expandtabs", "encode", "to_bytes",
          "translate", "items", "keys", "values", "get", "startswith", "strip", "upper", "title", "count",
          "os", "popen", "read", "environment", "module", "eval_ctx", "cycle", "next", "revindex0", "depth")
_FILTERS = ("e", "trim", "tojson", "tojson(indent=4)", "tojson(indent=1000)", "join", "join(', ')", "first",
            "last", "length", "list", "sort", "unique", "reverse", "string", "int", "float", "abs", "round",
            "replace('a', 'bb')", "replace('', 'x')", "center(100000)", "center(10**9)", "indent(10**9)",
            "indent(4, true)", "wordwrap(1)", "wordwrap(0)", "format(1, 2)", "batch(3)", "batch(0)", "slice(3)",
            "sum", "min", "max", "selectattr('role', 'equalto', 'user')", "rejectattr('content')",
            "map(attribute='content')", "map('upper')", "map('attr', '__class__')", "attr('__class__')",
            "attr('role')", "groupby('role')", "dictsort", "items", "default('d')", "capitalize", "title",
            "upper", "lower", "truncate(5)", "urlencode", "xmlattr", "pprint", "safe", "striptags",
            "filesizeformat", "count", "wordcount", "select('defined')", "random", "forceescape", "urlize",
            "string * 3", "list | length", "format('%s' * 10)")
_TESTS = ("defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer",
          "divisibleby(0)", "divisibleby(3)", "equalto('user')", "in(['a'])", "sameas(none)", "callable",
          "escaped", "lower", "true", "false", "boolean", "filter", "test")
_LITERALS = ("0", "1", "-1", "2", "10", "1000", "10**9", "2**63", "9**9**9", "1.5", "1e308", "-0.0", "'a'",
             "''", "'x' * 1000", "\"%s%s\"", "'{}'", "'{0:>1000000}'", "'%*d'", "[]", "[1, 2, 3]", "[none]",
             "{}", "{'a': 1}", "(1, 2)", "none", "true", "false", "range(10)", "range(10**6)", "range(2**63)",
             "namespace(a=1)", "dict(a=1)", "'\\u2581'", "'\\x00'", "'<|im_start|>'", "messages[0]")
_BINOPS = ("+", "-", "*", "/", "//", "%", "**", "~", "and", "or", "in", "not in", "==", "!=", "<", ">=", "is not")
_PAYLOADS = (
    # Escapes aimed at the planted canary (fuzzing.canary): each one that works fails the case.
    "{{ cycler.__init__.__globals__.__builtins__.elelem_fuzz_canary() }}",
    "{{ joiner.__init__.__globals__.os.elelem_fuzz_canary }}",
    "{{ namespace.__init__.__globals__.__builtins__.elelem_fuzz_canary.__class__ }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'ElelemFuzzCanary' %}"
    "{{ c() }}{% endif %}{% endfor %}",
    "{{ (''|attr('__class__')|attr('__mro__')|last|attr('__subclasses__'))()|map(attribute='__name__')|list }}",
    "{{ self.__init__.__globals__.__builtins__.open('/etc/hostname').read() }}",
    "{{ raise_exception.__globals__.__builtins__.__import__('os').system('true') }}",
    "{{ strftime_now.__globals__.datetime.__init__.__globals__ }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__['os'] }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ ''|attr('__class__')|attr('__mro__') }}",
    "{{ (1, 2)|map('attr', '__class__')|list }}",
    "{{ messages.append(1) }}{{ messages }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{% for i in range(10**9) %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}",
    "{% macro r(n) %}{{ r(n) ~ r(n) }}{% endmacro %}{{ r(0) }}",
    "{{ 'a' * 10**9 }}", "{{ [1] * 10**9 }}", "{{ 'x'.ljust(10**9) }}", "{{ '%*d' % (10**9, 1) }}",
    "{{ '{:>1000000000}'.format(1) }}", "{{ 10**100000 }}", "{{ (10**4000)|string }}",
    "{{ (1).to_bytes(10**9, 'big') }}", "{{ 'abc'.translate({97: 'x' * 10**8}) }}", "{{ 'x'|indent(10**9) }}",
    "{{ strftime_now('%Y' * 10**6) }}", "{{ strftime_now('%Q') }}", "{{ 'a\\tb'.expandtabs(10**9) }}",
    "{{ dict.fromkeys(range(10**6)) }}", "{{ range(10**5)|list|join('x' * 1000) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% set x %}{% for i in range(10**5) %}{{ 'y' * 1000 }}{% endfor %}{% endset %}{{ x|length }}",
    "{{ ('a' * 500000)|wordwrap(3) }}", "{{ ('a ' * 500000)|striptags }}", "{{ ('<' * 500000)|striptags }}",
    "{{ ('x' * 500000)|urlencode }}", "{{ messages|tojson(indent=10**6) }}", "{% include 'other' %}",
    "{% extends 'base' %}", "{% import 'x' as y %}", "{{ raise_exception('boom') }}",
    "{{ loop }}", "{{ caller() }}", "{{ varargs }}", "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "{{ " + "[" * 3000 + "]" * 3000 + " }}",
    "{% if true %}" * 3000 + "{% endif %}" * 3000, "{{ 1 " + "+ 1 " * 20000 + "}}",
    "{{ " + "a." * 5000 + "b }}", "{{ x" + "|e" * 5000 + " }}",
)


class TemplateCases:
    """Writes template case files."""

    target = "template"
    suffix = ".json"

    def __init__(self, *, timeout_s: float = DEFAULT_CASE_TIMEOUT_S):
        self.timeout_s = timeout_s
        self.real = _real_templates()

    def write(self, seed: int, index: int, directory: Path) -> tuple[Path, dict]:
        case = self.make(seed, index)
        path = directory / f"template-{seed}-{index}{self.suffix}"
        path.write_text(json.dumps(case), encoding="utf-8")
        return path, {"input": case}

    def make(self, seed: int, index: int) -> dict:
        rng = random.Random(f"template:{seed}:{index}")
        roll = rng.random()
        if roll < 0.45:
            source = Grammar(rng).template()
        elif roll < 0.6:
            source = rng.choice(_PAYLOADS)
            if rng.random() < 0.5:
                source = _mutate(rng, rng.choice(self.real), insert=source)
        elif roll < 0.95:
            source = _mutate(rng, rng.choice(self.real), insert=Grammar(rng).statement())
        else:
            source = "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 200)))
        return {"source": source, "messages": _messages(rng), "tools": _tools(rng),
                "add_generation_prompt": rng.random() < 0.7, "timeout_s": self.timeout_s,
                "bos_token": rng.choice(("<s>", "", "<|endoftext|>", "{{ 1 }}")),
                "eos_token": rng.choice(("</s>", "", "<|im_end|>")),
                "extra": rng.choice(({}, {}, {"enable_thinking": False}, {"x": [1, {"y": "z"}]}))}


class Grammar:
    """A small random Jinja generator; ``depth`` keeps expressions finite."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def template(self) -> str:
        return "".join(self.statement() for _ in range(self.rng.randint(1, 6)))

    def statement(self, depth: int = 0) -> str:
        r = self.rng
        kind = r.randrange(12) if depth < 3 else 0
        body = (lambda: "".join(self.statement(depth + 1) for _ in range(r.randint(0, 3))))
        dash = r.choice(("", "-"))
        if kind <= 2:
            return f"{{{{{dash} {self.expr()} {dash}}}}}"
        if kind == 3:
            return f"{{% if {self.expr()} %}}{body()}{{% elif {self.expr()} %}}{body()}{{% else %}}{body()}{{% endif %}}"
        if kind == 4:
            control = r.choice(("", "{% break %}", "{% continue %}", "{{ loop.index }}", "{{ loop.cycle('a', 'b') }}"))
            return f"{{% for x in {self.expr()} %}}{body()}{control}{{% else %}}{body()}{{% endfor %}}"
        if kind == 5:
            return r.choice((f"{{% set x = {self.expr()} %}}", "{% set ns = namespace(a=0, s='') %}",
                             f"{{% set ns.a = {self.expr()} %}}", f"{{% set x %}}{body()}{{% endset %}}"))
        if kind == 6:
            return (f"{{% macro m(a, b=1) %}}{body()}{{{{ {self.expr()} }}}}{{% endmacro %}}"
                    f"{{{{ m({self.expr()}) }}}}")
        if kind == 7:
            return f"{{% filter {r.choice(('upper', 'trim', 'indent(2)', 'e', 'center(50)'))} %}}{body()}{{% endfilter %}}"
        if kind == 8:
            return r.choice(("{% raw %}{{ x }}{% endraw %}", "{# comment #}", "{% generation %}x{% endgeneration %}",
                             "{% with y = 1 %}{{ y }}{% endwith %}", "{% autoescape true %}<{% endautoescape %}",
                             "{% do x %}", "{% call m() %}c{% endcall %}", "{{", "{% if %}", "{% endfor %}"))
        if kind == 9:
            return r.choice(_PAYLOADS)
        return r.choice(("text ", "\n", "<|im_start|>", " ", "{{ bos_token }}", "{{ messages[0]['content'] }}"))

    def expr(self, depth: int = 0) -> str:
        r = self.rng
        kind = r.randrange(9) if depth < 3 else r.randrange(2)
        if kind == 0:
            return r.choice(_LITERALS)
        if kind == 1:
            return r.choice(_NAMES)
        # Compound expressions are parenthesized so that most of them parse:
        # the point is to reach rendering, not to test Jinja's parser.
        if kind == 2:
            return f"({self.expr(depth + 1)}).{r.choice(_ATTRS)}"
        if kind == 3:
            key = r.choice(("0", "-1", "'role'", "'content'", "1:", "::-1", "'__class__'", "10**9", "none"))
            return f"({self.expr(depth + 1)})[{key}]"
        if kind == 4:
            return f"({self.expr(depth + 1)} | {r.choice(_FILTERS)})"
        if kind == 5:
            return f"({self.expr(depth + 1)} {r.choice(_BINOPS)} {self.expr(depth + 1)})"
        if kind == 6:
            return f"({self.expr(depth + 1)} is {r.choice(_TESTS)})"
        if kind == 7:
            args = ", ".join(self.expr(depth + 1) for _ in range(r.randint(0, 2)))
            return f"({self.expr(depth + 1)})({args})"
        return f"({self.expr(depth + 1)} if {self.expr(depth + 1)} else {self.expr(depth + 1)})"


_CHUNK = re.compile(r"({%.*?%}|{{.*?}}|{#.*?#})", re.S)


def _mutate(rng: random.Random, source: str, *, insert: str) -> str:
    """Edit a real template chunk by chunk (tags, outputs, text) and character by character."""
    chunks = [c for c in _CHUNK.split(source) if c]
    for _ in range(rng.randint(1, 4)):
        # Mostly edits that keep the template parseable (deleting or swapping a
        # tag usually unbalances it, which only tests Jinja's parser).
        op = rng.choices(range(6), weights=(1, 3, 1, 5, 2, 4))[0]
        i = rng.randrange(len(chunks)) if chunks else 0
        if op == 0 and chunks:
            del chunks[i]
        elif op == 1 and chunks:
            chunks.insert(i, chunks[i] * rng.choice((1, 2, 50)))
        elif op == 2 and len(chunks) > 1:
            j = rng.randrange(len(chunks))
            chunks[i], chunks[j] = chunks[j], chunks[i]
        elif op == 3:
            chunks.insert(i, insert)
        elif op == 4 and chunks:
            text = chunks[i]
            pos = rng.randint(0, len(text))
            chunks[i] = text[:pos] + rng.choice("{}%#-()[]'\"|.~+*!=<> \n") + text[pos + rng.randint(0, 2):]
        elif chunks:
            chunks[i] = chunks[i].replace("messages", rng.choice(("messages * 1000", "range(10**6)", "message",
                                                                 "messages|reverse", "tools")))
    return "".join(chunks)


def _messages(rng: random.Random):
    """A conversation: valid (odd text included) most of the time, so templates get rendered."""
    if rng.random() < 0.03:
        return rng.choice(([], "hi", [{"role": "user"}], [None], {"role": "user", "content": "x"}))
    roles = ("user", "assistant", "system", "tool", "ipython", "x" * 100, "\u2581")
    contents = ("hi", "", "What is 2 + 2?", "<|im_end|>", "{{ 7 * 7 }}", "x" * rng.choice((10, 5000)), None,
                "\ud800", "line\nline", "\x00")
    messages = []
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(roles[:3]) if rng.random() < 0.8 else rng.choice(roles)
        message = {"role": role, "content": rng.choice(contents)}
        if role == "assistant" and rng.random() < 0.2:
            message["tool_calls"] = [{"function": {"name": "f", "arguments": rng.choice(({"a": 1}, "{\"a\": 1}"))}}]
        if role == "tool" and rng.random() < 0.5:
            message["tool_call_id"] = "call_1"
        messages.append(message)
    if rng.random() < 0.1:  # one bad message: the validation must name it
        messages.insert(rng.randint(0, len(messages)), rng.choice((
            {"role": "", "content": "x"}, {"role": "user", "content": 42}, {"role": "user", "tool_calls": []},
            {"role": "tool", "content": "x", "tool_call_id": 2}, {"role": "assistant", "tool_calls": [{"x": 1}]})))
    return messages


def _tools(rng: random.Random):
    if rng.random() < 0.8:
        return None
    return rng.choice(([{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
                       [], ["not a dict"], [{"deep": [[[[[[[[[]]]]]]]]]}]))


def _real_templates() -> list[str]:
    fixtures = ROOT / "tests" / "support" / "fixtures" / "chat_templates.json"
    templates = [t["source"] for t in json.loads(fixtures.read_text(encoding="utf-8"))["templates"].values()]
    return templates or ["{{ messages }}"]
