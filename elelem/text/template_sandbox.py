"""The sandbox that chat templates render in, and the budget of each render.

The template comes from a model file, so it is untrusted code. Jinja's sandbox
stops it from reaching Python internals (the CVE-2024-34359 class of escapes);
on top of that every render runs under a budget (:class:`RenderLimits`) so a
hostile template fails fast with :class:`~elelem.errors.TemplateError` instead
of hanging the process or exhausting its memory:

* :data:`RENDER_TIMEOUT_S` -- a wall-clock deadline, checked on every loop
  iteration, every call (macros, methods, globals), every output chunk and
  every guarded operation below.
* :data:`MAX_OUTPUT_CHARS` -- the rendered text is streamed through
  ``Template.generate`` and counted, so it never exceeds this; no single value
  the template builds (a string, or a list or dict counted by the characters
  it holds) may exceed it either.
* :data:`MAX_WORK_CHARS` -- the total characters that one render may produce
  across all its string-building steps, bounding what a template can hold in
  memory at once (for example a list of many large strings).
* :data:`MAX_RANGE_ITEMS` -- ``range()`` refuses longer ranges.
* :data:`MAX_CALL_DEPTH` -- nesting of calls, so self-recursive macros stop
  long before Python's own recursion limit (a ``RecursionError`` that still
  happens is caught and reported the same way).
* :data:`MAX_TEMPLATE_CHARS` and :data:`MAX_TEMPLATE_TOKENS` -- the size of
  the template source, which bounds the time to compile it.

The size checks run *before* the operations that can multiply a string's size
(``*``, ``**``, ``+``, ``%``, ``~``, ``center``/``ljust``/``rjust``/``zfill``,
``expandtabs``, ``replace``, ``join``, ``translate``, ``to_bytes``, format
widths and the ``center``, ``indent``, ``wordwrap``, ``replace``, ``join``,
``batch``, ``slice``, ``format`` and ``tojson`` filters), so the limits hold without first
allocating the oversized value. The library code that is quadratic in its
input (``wordwrap``, ``striptags``) is refused inputs it would be slow on.
Touching an unsafe attribute raises at once,
where plain Jinja would return an undefined value and carry on.

Where llama.cpp's own Jinja engine (common/jinja/ of llama.cpp) renders what
jinja2 refuses, the sandbox renders as llama.cpp does (checked
against llama.cpp's engine in tests/test_template_corpus.py): a string plus
none or an undefined value is the string, none prints (and joins with ``~``)
as nothing, an attribute or item of an undefined value is undefined,
``'...'|safe + text`` does not HTML-escape text, ``tojson`` writes lazy
sequences (``map``) as lists and undefined items as null, and a list the
template built itself takes ``append`` and ``pop`` (the data given to the
template stays immutable). Where llama.cpp's engine is the odd one (floats in
``tojson``, printing a list or dict, ``sort_keys``), it renders as jinja2 does.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import numbers
import re
import string
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from ..errors import ElelemError, InvalidArgumentError, TemplateError, TemplateLimitError, UnsafeTemplateError

#: Wall-clock seconds one render may take. Real templates need milliseconds.
RENDER_TIMEOUT_S = 2.0
#: Most characters a render may return, and the most any single value built
#: while rendering may hold (1 MiB; about 250k tokens of text).
MAX_OUTPUT_CHARS = 1 << 20
#: Most characters one render may produce in total across all its
#: string-building steps and outputs, including intermediate values (64 MiB).
MAX_WORK_CHARS = 64 << 20
#: Longest ``range()`` a template may ask for.
MAX_RANGE_ITEMS = 100_000
#: Deepest nesting of calls (macros calling macros, recursive loops). Each
#: level costs several Python frames, so this stays well below Python's limit.
MAX_CALL_DEPTH = 64
#: Longest template source accepted (256 KiB; real templates are under 20 KiB).
MAX_TEMPLATE_CHARS = 256 << 10
#: Most Jinja lexer tokens (whitespace runs included) a template source may
#: have. Compiling costs about 20 µs a token, so this keeps a hostile
#: template's one-off compile under a second; real templates have a few
#: thousand (Qwen2.5's: 530).
MAX_TEMPLATE_TOKENS = 32_768


# Width of a tojson indent. Each line of output repeats it once per nesting level.
_MAX_JSON_INDENT = 64
# Longest strftime_now() format string.
_MAX_STRFTIME_FORMAT = 1024
# Character copies allowed to the library code that is quadratic in its
# input: textwrap (wordwrap) re-slices an over-long word or run of spaces once
# per line, about text length x longest run / width copies; markupsafe's
# striptags rebuilds the whole string once per tag, about length x tags.
# This bound keeps either under ~50 ms.
_MAX_QUADRATIC_WORK = 100_000_000
_WORDWRAP_RUN = re.compile(r"\S+|\s+")



@dataclass(frozen=True)
class RenderLimits:
    """The budget of one render; the defaults are the module constants."""

    timeout_s: float = RENDER_TIMEOUT_S
    max_output_chars: int = MAX_OUTPUT_CHARS
    max_work_chars: int = MAX_WORK_CHARS
    max_range_items: int = MAX_RANGE_ITEMS
    max_call_depth: int = MAX_CALL_DEPTH

    def __post_init__(self) -> None:
        for name in ("timeout_s", "max_output_chars", "max_work_chars", "max_range_items", "max_call_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise InvalidArgumentError(f"RenderLimits.{name} must be a positive number, got {value!r}")


# --- the per-render budget -----------------------------------------------------


class _Budget:
    """What one render may still spend. Lives in a ContextVar, so concurrent
    renders (threads, asyncio tasks) each have their own."""

    __slots__ = ("limits", "deadline", "work", "depth", "known_weights")

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout_s
        self.work = 0
        self.depth = 0
        # id -> (container, weight) for the render's input data, which the
        # immutable sandbox cannot change; holding the container keeps its id
        # from being reused. Saves re-walking the whole conversation each time
        # a template passes `messages` through a filter inside a loop.
        self.known_weights: dict[int, tuple[Any, int]] = {}

    def remember_weights(self, value: Any) -> int:
        """Record the weight of every list and dict in ``value`` (plain input data)."""
        if isinstance(value, (str, bytes)):
            return len(value)
        if isinstance(value, Mapping):
            parts = (self.remember_weights(key) + self.remember_weights(item) for key, item in value.items())
            weight = 1 + len(value) + sum(parts)
        elif isinstance(value, (list, tuple)):
            weight = 1 + len(value) + sum(self.remember_weights(item) for item in value)
        else:
            return 1
        self.known_weights[id(value)] = (value, weight)
        return weight

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"chat template took longer than {self.limits.timeout_s:g} s to render")

    def check_size(self, size: int, what: str) -> None:
        if size > self.limits.max_output_chars:
            raise TemplateLimitError(
                f"chat template went over its size limit: {what} of {size:,} characters "
                f"(the limit is {self.limits.max_output_chars:,})"
            )

    def spend(self, size: int) -> None:
        self.work += size
        if self.work > self.limits.max_work_chars:
            raise TemplateLimitError(
                f"chat template produced more than {self.limits.max_work_chars:,} characters "
                "of intermediate text while rendering"
            )


_BUDGET: ContextVar[_Budget | None] = ContextVar("elelem_chat_template_budget", default=None)


class _NotRendering(RuntimeError):
    """A guard ran outside a render. That only happens when Jinja tries to fold
    constants at compile time; raising makes it leave the expression for
    render time, where the guard is in force."""


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:
        raise _NotRendering("chat template guards run only while rendering")
    return budget


def _weight(value: Any, budget: _Budget) -> int:
    """Characters ``value`` holds, counting every shared reference again (as
    ``str()`` or ``tojson`` would print it again). Stops counting once past the
    size limit, so it costs at most that many steps."""
    limit = budget.limits.max_output_chars
    known = budget.known_weights
    total = 0
    stack = [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
            continue
        entry = known.get(id(item))
        if entry is not None and entry[0] is item:
            total += entry[1]
        elif isinstance(item, Mapping):
            total += 1 + len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 1 + len(item)
            stack.extend(item)
        elif isinstance(item, Namespace):
            # Jinja keeps a namespace's attributes in a private dict; its repr prints them.
            attributes = getattr(item, "_Namespace__attrs", {})
            total += 1 + len(attributes)
            stack.extend(attributes.values())
        else:
            total += 1
    return total


def _check_weight(value: Any, what: str) -> None:
    budget = _budget()
    if isinstance(value, (str, bytes)):
        budget.check_size(len(value), what)
    elif isinstance(value, (Mapping, list, tuple, set, frozenset, Namespace)):
        budget.check_size(_weight(value, budget), what)


def _account(value: Any) -> Any:
    """Check a freshly built value against the budget and pass it through.
    Generators are wrapped so each item is checked as it is produced."""
    budget = _budget()
    if isinstance(value, (str, bytes)):
        budget.check_size(len(value), "a string")
        budget.spend(len(value))
    elif isinstance(value, types.GeneratorType):
        return _accounted_items(value, budget)
    else:
        _check_weight(value, "a value")
    return value


def _accounted_items(items: Iterator[Any], budget: _Budget) -> Iterator[Any]:
    for item in items:
        budget.tick()
        if isinstance(item, (str, bytes)):
            budget.check_size(len(item), "a string")
            budget.spend(len(item))
        else:
            _check_weight(item, "a value")
        yield item


# --- size pre-checks for operations that can multiply a value -------------------

_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?")
_NUMBER = re.compile(r"\d+")


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, numbers.Integral):
        _budget().check_size(int(width), what)


def _check_percent_format(template: str) -> None:
    # printf-style widths and precisions pad the result; '*' takes them from the arguments.
    for match in _PERCENT_FIELD.finditer(template):
        for number in match.groups():
            if number == "*":
                raise TemplateLimitError("chat template used a '*' width in a % format; give the width literally")
            if number is not None:
                _budget().check_size(_format_number(number), "a formatted field")


def _format_number(digits: str) -> int:
    # Width or precision in a format spec; absurdly long ones need no exact value.
    return int(digits) if len(digits) < 19 else 10**18


def _check_brace_format(template: str) -> None:
    for _literal, _field, spec, _conversion in string.Formatter().parse(template):
        if not spec:
            continue
        if "{" in spec:
            raise TemplateLimitError("chat template used a nested {} width in str.format; give the width literally")
        for number in _NUMBER.findall(spec):
            _budget().check_size(_format_number(number), "a formatted field")


def _check_repeat(sequence: Any, count: Any) -> None:
    if isinstance(count, numbers.Integral) and isinstance(sequence, (str, bytes, list, tuple)):
        budget = _budget()
        budget.check_size(_weight(sequence, budget) * max(int(count), 0), "a repeated value")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    budget = _budget()
    if operator == "*":
        _check_repeat(left, right)
        _check_repeat(right, left)
        if isinstance(left, numbers.Integral) and isinstance(right, numbers.Integral):
            _check_int_bits(int(left).bit_length() + int(right).bit_length())
    elif operator == "**":
        if isinstance(left, numbers.Integral) and isinstance(right, numbers.Integral) and abs(int(left)) > 1:
            _check_int_bits(int(left).bit_length() * max(int(right), 0))
    elif operator == "+":
        if isinstance(left, (str, bytes, list, tuple)) and isinstance(right, (str, bytes, list, tuple)):
            budget.check_size(_weight(left, budget) + _weight(right, budget), "a concatenated value")
    elif operator == "%" and isinstance(left, str):
        _check_percent_format(left)
        _check_weight(right, "a format argument")


def _check_int_bits(bits: int) -> None:
    # Nothing a prompt needs comes near this; huge integers cost CPU and memory.
    if bits > 4096:
        raise TemplateLimitError("chat template tried to build an integer of more than 4096 bits")


def _checked_method_args(owner: Any, name: str, args: tuple, kwargs: dict) -> tuple:
    """Pre-check calls of the str/bytes/int methods that can build huge values.
    Returns the positional arguments to call with (``join`` materializes its input)."""
    budget = _budget()
    if isinstance(owner, (str, bytes)):
        if name in ("center", "ljust", "rjust", "zfill"):
            _check_width(args[0] if args else kwargs.get("width"), "a padded string")
        elif name == "expandtabs":
            tab_size = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab_size, numbers.Integral):
                budget.check_size(len(owner) * max(int(tab_size), 1), "a string with expanded tabs")
        elif name == "replace" and len(args) >= 2:
            count = args[2] if len(args) > 2 else kwargs.get("count", -1)
            _check_replace(owner, args[0], args[1], count)
        elif name == "join" and args:
            items = list(args[0])
            budget.check_size(_weight(items, budget) + len(owner) * len(items), "a joined string")
            return (items, *args[1:])
        elif name == "striptags":  # a Markup method
            _check_striptags(str(owner))
        elif name == "translate" and args and isinstance(args[0], Mapping):
            longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))), default=1)
            budget.check_size(len(owner) * max(longest, 1), "a translated string")
    elif isinstance(owner, int) and name == "to_bytes":
        _check_width(args[0] if args else kwargs.get("length", 1), "a byte string")
    elif type(owner) is list and name == "append":
        budget.check_size(len(owner) + 1, "a list")  # its items are counted when it is printed or joined
    return args


def _check_replace(text: Any, old: Any, new: Any, count: Any) -> None:
    if not (isinstance(text, (str, bytes)) and isinstance(old, type(text)) and isinstance(new, type(text))):
        return
    occurrences = len(text) + 1 if not old else text.count(old)
    if isinstance(count, numbers.Integral) and count >= 0:
        occurrences = min(occurrences, int(count))
    growth = max(len(new) - len(old), 0)
    _budget().check_size(len(text) + occurrences * growth, "a string with replacements")


# --- llama.cpp's leniencies -------------------------------------------------------

# The list methods of llama.cpp's engine (common/jinja/value.cpp), allowed on lists the template built.
_TEMPLATE_LIST_METHODS = frozenset({"append", "pop"})


def _is_nothing(value: Any) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


class _ChainableUndefined(jinja2.ChainableUndefined):
    """An attribute or item of an undefined value is undefined too, as in llama.cpp's
    engine, but not a private one: probing ``missing.__globals__`` still fails."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if isinstance(name, str) and name.startswith("_"):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)  # Python's own protocol lookups (copy, pickle, ...)
            self._fail_with_undefined_error()
        return self

    def __getitem__(self, name: Any) -> Any:
        if isinstance(name, str) and name.startswith("_"):
            self._fail_with_undefined_error()
        return self


def _unmarked(value: Any) -> Any:
    return str.__str__(value) if isinstance(value, Markup) else value


def _made_by_template(value: Any) -> bool:
    """True for a container the template built, False for the data it was given (and
    outside a render). Every list and dict of that data is in the budget's known weights."""
    budget = _BUDGET.get()
    if budget is None:
        return False
    entry = budget.known_weights.get(id(value))
    return entry is None or entry[0] is not value


# --- the sandboxed environment --------------------------------------------------

# Filter names the compiler inserts into every template (see _GuardInserter).
_LOOP_GUARD = "elelem_loop_guard"
_CONCAT_GUARD = "elelem_concat_guard"
_OUTPUT_GUARD = "elelem_output_guard"


class _GuardInserter(NodeTransformer):
    """Rewrites a parsed template so the budget sees what Jinja does not route
    through the environment: every loop iterates through the loop guard, every
    ``~`` goes through the concat guard, and every piece of output (also into
    macro and ``set`` block buffers) passes the output guard."""

    def __init__(self, environment: jinja2.Environment) -> None:
        self.environment = environment

    def _guard(self, node: nodes.Expr, name: str) -> nodes.Expr:
        guarded = nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)
        guarded.set_environment(self.environment)
        return guarded

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = self._guard(node.iter, _LOOP_GUARD)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        parts = nodes.List(node.nodes, lineno=node.lineno)
        parts.set_environment(self.environment)
        return self._guard(parts, _CONCAT_GUARD)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        node = self.generic_visit(node)
        node.nodes = [self._guard(child, _OUTPUT_GUARD) for child in node.nodes]
        return node


class _GuardingCodeGenerator(CodeGenerator):
    def visit_Template(self, node: nodes.Template, frame: Any = None) -> None:
        _GuardInserter(self.environment).visit(node)
        super().visit_Template(node, frame)


class _ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with every call, operator and unsafe access
    checked against the render budget."""

    code_generator_class = _GuardingCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _budget().tick()
        if operator == "+" and (_is_nothing(left) and isinstance(right, str) or
                                _is_nothing(right) and isinstance(left, str)):
            # llama.cpp's engine adds a string and none or an undefined value as if the
            # latter were "" (templates do `'...' + tool.description` on tools without one).
            return str(left if isinstance(left, str) else right)
        if isinstance(left, Markup) or isinstance(right, Markup):
            # `'...'|safe + name` would HTML-escape name (Markup's own + and %); llama.cpp's
            # engine escapes nothing, and no autoescaping is on here.
            left, right = _unmarked(left), _unmarked(right)
        _check_binop(operator, left, right)
        return _account(super().call_binop(context, operator, left, right))

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        # A list the template built itself may grow and shrink (Kimi's templates queue
        # tool call ids with append and pop, the two list methods llama.cpp's engine has);
        # the data the template was given stays immutable, and every other mutation is refused.
        if type(obj) is list and attr in _TEMPLATE_LIST_METHODS and _made_by_template(obj):
            return True
        return super().is_safe_attribute(obj, attr, value)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        if budget.depth >= budget.limits.max_call_depth:
            raise TemplateLimitError(
                f"chat template nested calls more than {budget.limits.max_call_depth} deep (runaway recursion?)"
            )
        owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
        if owner is not None and isinstance(obj, (types.BuiltinMethodType, types.MethodType)):
            args = _checked_method_args(owner, name, args, kwargs)
            if type(owner) is list and name in _TEMPLATE_LIST_METHODS and not _made_by_template(owner):
                raise SecurityError(f"a chat template cannot change the data it was given (list.{name})")
        budget.depth += 1
        try:
            result = SandboxedEnvironment.call(self, context, obj, *args, **kwargs)
        finally:
            budget.depth -= 1
        return _account(result)

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # Plain Jinja returns an undefined value here and only fails if it is used;
        # a template that probes internals at all is hostile, so stop at once.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        sandboxed_format = super().wrap_str_format(value)
        if sandboxed_format is None:
            return None
        template = value.__self__

        @functools.wraps(sandboxed_format)
        def checked_format(*args: Any, **kwargs: Any) -> str:
            _check_brace_format(template)
            _check_weight(list(args) + list(kwargs.values()), "format arguments")
            return sandboxed_format(*args, **kwargs)

        return checked_format


class _GenerationTag(jinja2.ext.Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text for
    training masks; here it only renders its body, so such templates compile."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)  # the tag name itself
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# --- what templates can call ------------------------------------------------------


def _raise_exception(message: Any) -> None:
    _check_weight(message, "an error message")
    raise TemplateError(str(message))


def now() -> datetime:
    """The templates' clock (``strftime_now``, and the date llama.cpp hands every chat template): local time."""
    return datetime.now()


def _strftime_now(date_format: str) -> str:
    if not isinstance(date_format, str) or len(date_format) > _MAX_STRFTIME_FORMAT:
        raise TemplateError(f"strftime_now() takes a format string of at most {_MAX_STRFTIME_FORMAT} characters")
    return now().strftime(date_format)


def _capped_range(*args: Any) -> range:
    budget = _budget()
    try:
        span = range(*args)
        length = len(span)
    except OverflowError:
        length = math.inf
    if length > budget.limits.max_range_items:
        raise TemplateLimitError(
            f"chat template asked for a range of more than {budget.limits.max_range_items:,} items"
        )
    return span


class _DictBuiltin:
    """The template's ``dict``: builds plain dicts without exposing the ``dict``
    type itself (whose class attributes are a foothold for type tricks)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Iterable[Any], value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


class _GuardedNamespace(Namespace):
    """``namespace()`` that refuses underscore names, which could otherwise
    shadow the object's own private state."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 -- mirrors Namespace's signature trick
        self, rest = args[0], args[1:]
        attributes = dict(*rest, **kwargs)
        for name in attributes:
            _GuardedNamespace._check_name(name)
        Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _GuardedNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if not isinstance(name, str) or name.startswith("_"):
            raise SecurityError(f"a chat template namespace cannot hold the attribute {name!r}")


# --- filters ----------------------------------------------------------------------


@jinja2.pass_context
def _loop_guard(context: Any, iterable: Any) -> Iterator[Any]:
    budget = _budget()
    for item in iterable:
        budget.tick()
        yield item


@jinja2.pass_context
def _concat_guard(context: Any, parts: list[Any]) -> str:
    budget = _budget()
    texts = []
    size = 0
    # llama.cpp's engine joins none to a string as "" (jinja2 would write "None").
    beside_text = any(isinstance(part, str) for part in parts)
    for part in parts:
        _check_weight(part, "a concatenated value")
        text = "" if part is None and beside_text else str(part)
        size += len(text)
        budget.check_size(size, "a concatenated string")
        texts.append(text)
    budget.spend(size)
    return "".join(texts)


@jinja2.pass_context
def _output_guard(context: Any, value: Any) -> Any:
    budget = _budget()
    budget.tick()
    if value is None:
        return ""  # as llama.cpp's engine prints none (jinja2 would write "None")
    if isinstance(value, (str, bytes)):
        budget.check_size(len(value), "a string")
        budget.spend(len(value))
    elif not isinstance(value, jinja2.Undefined):
        weight = _weight(value, budget)
        budget.check_size(weight, "printed output")
        budget.spend(weight)
    return value


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # HF's tojson: plain json.dumps, without Jinja's HTML escaping, with its
    # options exposed. Encoded piece by piece so oversized output stops early.
    budget = _budget()
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()  # jinja2 and llama.cpp's engine both refuse it (inside a list: null)
    indent_width = len(indent) if isinstance(indent, str) else indent
    if isinstance(indent_width, numbers.Integral) and indent_width > _MAX_JSON_INDENT:
        raise TemplateLimitError(f"tojson indent is limited to {_MAX_JSON_INDENT}")
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                               default=_json_default)
    pieces = []
    size = 0
    for piece in encoder.iterencode(value):
        size += len(piece)
        budget.check_size(size, "a tojson result")
        pieces.append(piece)
    return "".join(pieces)


def _json_default(value: Any) -> Any:
    # What llama.cpp's engine also writes: an undefined value as null, and the lazy
    # sequences of jinja2's filters (map, select, ...) and dict views as lists.
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        items = []
        budget = _budget()
        for item in value:
            budget.tick()
            items.append(item)
            budget.check_size(len(items), "a tojson result")
        return items
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _pass_arg_count(function: Callable[..., Any]) -> int:
    # Filters marked pass_context / pass_eval_context / pass_environment take
    # that object before the value.
    return 1 if getattr(function, "jinja_pass_arg", None) is not None else 0


# Filters that never turn their whole input into one string; the others
# (upper, trim, center, string, ...) call str() on it, so a huge list or
# dict must be refused before they do.
_STRUCTURAL_FILTERS = frozenset(
    {
        "abs", "attr", "batch", "count", "d", "default", "dictsort", "first", "float", "groupby", "int",
        "items", "last", "length", "list", "map", "max", "min", "random", "reject", "rejectattr",
        "reverse", "round", "select", "selectattr", "slice", "sort", "sum", "tojson", "unique",
    }
)


def _guarded_filter(
    name: str, function: Callable[..., Any], precheck: Callable[..., None] | None = None
) -> Callable[..., Any]:
    """Wrap a filter so its input is weighed (unless it is structural), an
    optional precheck sees the arguments, and its result is accounted."""
    skip = _pass_arg_count(function)
    weigh_input = name not in _STRUCTURAL_FILTERS

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _budget().tick()
        if weigh_input and len(args) > skip:
            _check_weight(args[skip], "a filter input")
        if precheck is not None:
            precheck(*args[skip:], **kwargs)
        return _account(function(*args, **kwargs))

    return guarded


def _precheck_center(value: Any, width: Any = 80, *_: Any, **__: Any) -> None:
    _check_width(width, "a centered string")


def _precheck_indent(value: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    text = str(value)
    unit = len(width) if isinstance(width, str) else width
    if isinstance(unit, numbers.Integral):
        _budget().check_size(len(text) + (text.count("\n") + 1) * max(int(unit), 0), "an indented string")


def _precheck_wordwrap(
    value: Any, width: Any = 79, break_long_words: Any = True, wrapstring: Any = None, *_: Any, **__: Any
) -> None:
    budget = _budget()
    text = str(value)
    # At worst every character starts a new line, each joined by wrapstring;
    # jinja's wordwrap lets textwrap expand each tab to up to 8 spaces first.
    separator = len(wrapstring) if isinstance(wrapstring, str) else 1
    expanded_bound = len(text) + 7 * text.count("\t")
    budget.check_size(expanded_bound * (1 + separator), "a wrapped string")
    if not isinstance(width, numbers.Integral) or width <= 0:
        return  # textwrap rejects it itself
    text = text.expandtabs()
    longest_run = max((match.end() - match.start() for match in _WORDWRAP_RUN.finditer(text)), default=0)
    if len(text) * longest_run / int(width) > _MAX_QUADRATIC_WORK:
        raise TemplateLimitError(
            f"chat template asked wordwrap to break a run of {longest_run:,} characters "
            f"at width {int(width)}; that would take too long"
        )


def _precheck_batch(value: Any, linecount: Any = None, fill_with: Any = None, *_: Any, **__: Any) -> None:
    if fill_with is not None:  # the last batch is padded out to linecount items
        _check_width(linecount, "a padded batch")


def _precheck_slice(value: Any, slices: Any = None, *_: Any, **__: Any) -> None:
    _check_width(slices, "a list of slices")  # one list per slice, even if empty


def _check_striptags(text: str) -> None:
    if len(text) * text.count("<") > _MAX_QUADRATIC_WORK:
        raise TemplateLimitError(
            f"chat template asked striptags to remove {text.count('<'):,} tags from "
            f"{len(text):,} characters; that would take too long"
        )


def _precheck_striptags(value: Any, *_: Any, **__: Any) -> None:
    _check_striptags(str(value))


def _precheck_replace(value: Any, old: Any = "", new: Any = "", count: Any = None, **_: Any) -> None:
    _check_replace(str(value), str(old), str(new), -1 if count is None else count)


def _precheck_join(value: Any, separator: Any = "", attribute: Any = None, **_: Any) -> None:
    if isinstance(value, (list, tuple)):
        budget = _budget()
        budget.check_size(_weight(value, budget) + len(str(separator)) * len(value), "a joined string")


def _precheck_format(value: Any, *args: Any, **kwargs: Any) -> None:
    _check_percent_format(str(value))
    _check_weight(list(args) + list(kwargs.values()), "format arguments")


_FILTER_PRECHECKS: dict[str, Callable[..., None]] = {
    "center": _precheck_center,
    "indent": _precheck_indent,
    "wordwrap": _precheck_wordwrap,
    "striptags": _precheck_striptags,
    "batch": _precheck_batch,
    "slice": _precheck_slice,
    "replace": _precheck_replace,
    "format": _precheck_format,
}


def _join_filter(original: Callable[..., Any]) -> Callable[..., Any]:
    # join consumes its input; materialize it first so the pre-check can weigh it.
    @functools.wraps(original)
    def join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
        items = list(value) if not isinstance(value, (list, tuple)) else value
        _precheck_join(items, d, attribute)
        return original(eval_ctx, items, d, attribute)

    return join


def _build_environment() -> _ChatTemplateEnvironment:
    environment = _ChatTemplateEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        # An attribute or item of an undefined value is undefined too (``tool.function.description``
        # on a tool without it), as in llama.cpp's engine; jinja2's default would raise.
        undefined=_ChainableUndefined,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    filters = dict(environment.filters)
    filters["join"] = _join_filter(filters["join"])
    filters["tojson"] = _tojson
    # urlize builds HTML links (with caller-chosen attributes per URL); no chat template needs it.
    filters.pop("urlize", None)
    environment.filters = {
        name: _guarded_filter(name, function, _FILTER_PRECHECKS.get(name)) for name, function in filters.items()
    }
    environment.filters[_LOOP_GUARD] = _loop_guard
    environment.filters[_CONCAT_GUARD] = _concat_guard
    environment.filters[_OUTPUT_GUARD] = _output_guard

    environment.globals.pop("lipsum", None)  # lorem ipsum generator: useless here, and sized by its caller
    environment.globals.update(
        range=_capped_range,
        dict=_DictBuiltin(),
        namespace=_GuardedNamespace,
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
    )
    return environment


_ENVIRONMENT = _build_environment()


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile (once per distinct source) or raise TemplateError."""
    _check_token_count(source)
    try:
        return _ENVIRONMENT.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(f"chat template does not compile (line {error.lineno}): {error.message}") from error
    except RecursionError as error:
        raise TemplateLimitError("chat template is nested too deeply to compile") from error
    except SyntaxError as error:
        if "too many statically nested blocks" not in str(error):
            raise TemplateError(f"chat template does not compile: {error}") from error
        # Jinja compiles to Python, and CPython allows 20 nested blocks: the same
        # limit as RecursionError above, met in the generated code, not a bug in it.
        raise TemplateLimitError("chat template is nested too deeply to compile "
                                 "(more than Python's 20 nested blocks)") from None
    except (SecurityError, jinja2.TemplateError, ValueError, TypeError, SyntaxError, MemoryError) as error:
        raise TemplateError(f"chat template does not compile: {error}") from error


def _check_token_count(source: str) -> None:
    # Lexing stops at the first token past the limit, so this check is cheap
    # even on a hostile source; parsing and code generation are the slow part.
    # (A syntax error met on the way is left for the compiler to report.)
    tokens = _ENVIRONMENT.lexer.tokeniter(source, None)
    try:
        too_many = any(True for _ in itertools.islice(tokens, MAX_TEMPLATE_TOKENS, None))
    except jinja2.TemplateSyntaxError:
        return
    if too_many:
        raise TemplateLimitError(
            f"the chat template has more than {MAX_TEMPLATE_TOKENS:,} Jinja tokens; it would take too long to compile"
        )


def render_template(template: jinja2.Template, variables: dict[str, Any], limits: RenderLimits) -> str:
    """Render under a fresh budget; every failure becomes a TemplateError."""
    budget = _Budget(limits)
    for value in variables.values():
        budget.remember_weights(value)
    token = _BUDGET.set(budget)
    pieces: list[str] = []
    size = 0
    chunks = None
    try:
        chunks = template.generate(variables)
        for chunk in chunks:
            size += len(chunk)
            if size > limits.max_output_chars:
                raise TemplateLimitError(
                    f"the rendered chat template is longer than {limits.max_output_chars:,} characters"
                )
            budget.tick()
            pieces.append(chunk)
    except ElelemError:
        raise
    except SecurityError as error:
        raise UnsafeTemplateError(f"chat template tried to leave its sandbox: {error}") from error
    except RecursionError as error:
        raise TemplateLimitError("chat template recursed too deeply") from error
    except MemoryError as error:
        raise TemplateLimitError("chat template ran out of memory") from error
    except jinja2.TemplateError as error:
        raise TemplateError(f"chat template failed: {error}") from error
    except Exception as error:  # anything a template expression can raise (TypeError, KeyError, ...)
        raise TemplateError(f"chat template failed: {type(error).__name__}: {error}") from error
    finally:
        if chunks is not None:
            chunks.close()  # drop the suspended render and whatever it holds
        _BUDGET.reset(token)
    return "".join(pieces)

