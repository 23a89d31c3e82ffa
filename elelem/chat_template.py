"""Chat templates: the GGUF's Jinja ``tokenizer.chat_template``, rendered in a sandbox.

A chat template turns a list of messages into the prompt text a model was
trained on. GGUF files carry it as Jinja source, the same source Hugging Face
``transformers`` renders with ``apply_chat_template``; :class:`ChatTemplate`
renders it the same way (``ImmutableSandboxedEnvironment``, ``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``,
``strftime_now`` and HF's ``tojson``), so prompts match what the model saw in
training. Models without a template get :data:`CHATML_TEMPLATE`.

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
* :data:`MAX_TEMPLATE_CHARS` -- the size of the template source.

The size checks run *before* the operations that can multiply a string's size
(``*``, ``**``, ``+``, ``%``, ``~``, ``center``/``ljust``/``rjust``/``zfill``,
``expandtabs``, ``replace``, ``join``, ``translate``, ``to_bytes``, format
widths and the ``center``, ``indent``, ``wordwrap``, ``replace``, ``join``,
``format`` and ``tojson`` filters), so the limits hold without first
allocating the oversized value. Touching an unsafe attribute raises at once,
where plain Jinja would return an undefined value and carry on.

Differences from ``transformers``, all deliberate:

* ``render`` defaults to ``add_generation_prompt=True`` (elelem renders
  prompts to generate from);
* messages are validated (see :meth:`ChatTemplate.render`), and all data given
  to the template must be plain JSON-like values -- tools are JSON schemas, not
  Python functions to be converted;
* the ``{% generation %}`` tag is accepted but only renders its body (elelem
  does not build assistant-token masks).
"""
from __future__ import annotations

import functools
import json
import logging
import math
import numbers
import re
import string
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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

from .errors import (
    ElelemError,
    GGUFError,
    InvalidArgumentError,
    InvalidTokenError,
    TemplateError,
    TemplateLimitError,
    UnsafeTemplateError,
)

__all__ = [
    "ChatTemplate",
    "RenderLimits",
    "CHATML_TEMPLATE",
    "RENDER_TIMEOUT_S",
    "MAX_OUTPUT_CHARS",
    "MAX_WORK_CHARS",
    "MAX_RANGE_ITEMS",
    "MAX_CALL_DEPTH",
    "MAX_TEMPLATE_CHARS",
]

logger = logging.getLogger("elelem")

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

# Nesting depth allowed in the messages, tools and other data given to a template.
_MAX_DATA_DEPTH = 64
# Width of a tojson indent. Each line of output repeats it once per nesting level.
_MAX_JSON_INDENT = 64
# Longest strftime_now() format string.
_MAX_STRFTIME_FORMAT = 1024
# textwrap breaks an over-long word (or run of spaces) by re-slicing what is
# left of it once per line, so wrapping costs about text length x longest run
# / width character copies. This bound keeps a wordwrap under ~50 ms.
_MAX_WORDWRAP_WORK = 100_000_000
_WORDWRAP_RUN = re.compile(r"\S+|\s+")

#: ChatML, used when a model has no template of its own (llama.cpp makes the
#: same choice). Assistant tool calls are written Hermes-style, one
#: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` each; a ``tools``
#: list is not shown to the model, as ChatML has no convention for it.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
    "{%- if message['tool_calls'] is defined -%}"
    "{%- for tool_call in message['tool_calls'] -%}"
    "{%- set call = tool_call['function'] if tool_call['function'] is defined else tool_call -%}"
    "{%- set arguments = call['arguments'] if call['arguments'] is defined else {} -%}"
    "{%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n' + {'name': call['name'], 'arguments': arguments} | tojson + '\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


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
        elif name == "translate" and args and isinstance(args[0], Mapping):
            longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))), default=1)
            budget.check_size(len(owner) * max(longest, 1), "a translated string")
    elif isinstance(owner, int) and name == "to_bytes":
        _check_width(args[0] if args else kwargs.get("length", 1), "a byte string")
    return args


def _check_replace(text: Any, old: Any, new: Any, count: Any) -> None:
    if not (isinstance(text, (str, bytes)) and isinstance(old, type(text)) and isinstance(new, type(text))):
        return
    occurrences = len(text) + 1 if not old else text.count(old)
    if isinstance(count, numbers.Integral) and count >= 0:
        occurrences = min(occurrences, int(count))
    growth = max(len(new) - len(old), 0)
    _budget().check_size(len(text) + occurrences * growth, "a string with replacements")


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
        _check_binop(operator, left, right)
        return _account(super().call_binop(context, operator, left, right))

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


def _strftime_now(date_format: str) -> str:
    if not isinstance(date_format, str) or len(date_format) > _MAX_STRFTIME_FORMAT:
        raise TemplateError(f"strftime_now() takes a format string of at most {_MAX_STRFTIME_FORMAT} characters")
    return datetime.now().strftime(date_format)


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
    for part in parts:
        _check_weight(part, "a concatenated value")
        text = str(part)
        size += len(text)
        budget.check_size(size, "a concatenated string")
        texts.append(text)
    budget.spend(size)
    return "".join(texts)


@jinja2.pass_context
def _output_guard(context: Any, value: Any) -> Any:
    budget = _budget()
    budget.tick()
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
    indent_width = len(indent) if isinstance(indent, str) else indent
    if isinstance(indent_width, numbers.Integral) and indent_width > _MAX_JSON_INDENT:
        raise TemplateLimitError(f"tojson indent is limited to {_MAX_JSON_INDENT}")
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    pieces = []
    size = 0
    for piece in encoder.iterencode(value):
        size += len(piece)
        budget.check_size(size, "a tojson result")
        pieces.append(piece)
    return "".join(pieces)


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
    if len(text) * longest_run / int(width) > _MAX_WORDWRAP_WORK:
        raise TemplateLimitError(
            f"chat template asked wordwrap to break a run of {longest_run:,} characters "
            f"at width {int(width)}; that would take too long"
        )


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
def _compile(source: str) -> jinja2.Template:
    """Compile (once per distinct source) or raise TemplateError."""
    try:
        return _ENVIRONMENT.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(f"chat template does not compile (line {error.lineno}): {error.message}") from error
    except RecursionError as error:
        raise TemplateLimitError("chat template is nested too deeply to compile") from error
    except (SecurityError, jinja2.TemplateError, ValueError, TypeError, SyntaxError, MemoryError) as error:
        raise TemplateError(f"chat template does not compile: {error}") from error


# --- validating what goes into a template -------------------------------------------


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """A copy of ``value`` made only of JSON-like Python types.

    Templates can call methods on what they are given; restricting the data to
    str, numbers, bools, None, lists and dicts keeps objects with dangerous
    methods (files, models, arrays) out of the sandbox.
    """
    if depth > _MAX_DATA_DEPTH:
        raise InvalidArgumentError(f"{where} is nested more than {_MAX_DATA_DEPTH} levels deep")
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass may carry extra methods
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, numbers.Real))):
                raise InvalidArgumentError(f"{where} has a key of type {type(key).__name__}; use strings")
            plain_key = _plain(key, where, depth + 1)
            plain[plain_key] = _plain(item, f"{where}[{plain_key!r}]", depth + 1)
        return plain
    if isinstance(value, (list, tuple)):
        items = [_plain(item, f"{where}[{index}]", depth + 1) for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise InvalidArgumentError(
        f"{where} is a {type(value).__name__}; chat template data must be str, int, float, bool, None, list or dict"
    )


def _checked_tool_calls(tool_calls: Any, where: str) -> None:
    if isinstance(tool_calls, (str, bytes)) or not isinstance(tool_calls, Sequence):
        raise InvalidArgumentError(f"{where}['tool_calls'] must be a list of tool calls")
    for index, tool_call in enumerate(tool_calls):
        call_where = f"{where}['tool_calls'][{index}]"
        if not isinstance(tool_call, Mapping):
            raise InvalidArgumentError(f"{call_where} must be a dict, got {type(tool_call).__name__}")
        # OpenAI nests the call under 'function'; some callers pass it flat.
        function = tool_call.get("function", tool_call)
        if not isinstance(function, Mapping):
            raise InvalidArgumentError(f"{call_where}['function'] must be a dict, got {type(function).__name__}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidArgumentError(f"{call_where} needs a non-empty string 'name'")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, (str, Mapping)):
            raise InvalidArgumentError(
                f"{call_where}['arguments'] must be a dict or a JSON string, got {type(arguments).__name__}"
            )


def _checked_messages(messages: Any) -> list[dict]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("messages must be a list of dicts like {'role': 'user', 'content': '...'}")
    if not messages:
        raise InvalidArgumentError("messages must not be empty")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise InvalidArgumentError(
                f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidArgumentError(f"{where}['role'] must be a non-empty string, got {role!r}")
        tool_calls = message.get("tool_calls")
        if "content" not in message and not (role == "assistant" and tool_calls):
            raise InvalidArgumentError(
                f"{where} has no 'content' (only an assistant message with tool_calls may omit it)"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise InvalidArgumentError(f"{where}['content'] must be a string or None, got {type(content).__name__}")
        if tool_calls is not None:
            if role != "assistant":
                raise InvalidArgumentError(f"{where} has 'tool_calls' but only assistant messages may make tool calls")
            _checked_tool_calls(tool_calls, where)
        if message.get("tool_call_id") is not None:
            if role != "tool":
                raise InvalidArgumentError(f"{where} has 'tool_call_id' but only tool messages answer a tool call")
            if not isinstance(message["tool_call_id"], str):
                raise InvalidArgumentError(f"{where}['tool_call_id'] must be a string")
        if message.get("name") is not None and not isinstance(message["name"], str):
            raise InvalidArgumentError(f"{where}['name'] must be a string")
        # Like transformers, drop None-valued keys: templates test for a missing
        # key but would print "None" or fail on `'...' + None`.
        checked.append(_plain({key: value for key, value in message.items() if value is not None}, where))
    return checked


def _checked_dict_list(value: Any, name: str) -> list | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"{name} must be a list of dicts")
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise InvalidArgumentError(
                f"{name}[{index}] must be a dict (a JSON schema for tools), got {type(item).__name__}"
            )
    return _plain(list(value), name)


# --- the public class ---------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template, ready to render conversations into prompts.

    ``source`` is Jinja source as found in ``tokenizer.chat_template``;
    ``bos_token``/``eos_token`` are the token *strings* the template may print.
    The source is compiled (and cached by its text) here, so a broken template
    fails at construction with :class:`~elelem.errors.TemplateError`.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        limits: RenderLimits | None = None,
    ) -> None:
        if not isinstance(source, str):
            raise InvalidArgumentError(f"a chat template must be a string of Jinja source, got {type(source).__name__}")
        if not source.strip():
            raise TemplateError("the chat template is empty")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TemplateLimitError(
                f"the chat template has {len(source):,} characters; the limit is {MAX_TEMPLATE_CHARS:,}"
            )
        for name, token in (("bos_token", bos_token), ("eos_token", eos_token)):
            if not isinstance(token, str):
                raise InvalidArgumentError(f"{name} must be a string, got {type(token).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.limits = limits if limits is not None else RenderLimits()
        #: True when this is the ChatML fallback for a model without a template.
        self.is_fallback = False
        self._template = _compile(source)

    @classmethod
    def from_metadata(
        cls,
        metadata: Mapping[str, Any],
        *,
        token_text: Callable[[int], str] | None = None,
        name: str | None = None,
        limits: RenderLimits | None = None,
    ) -> ChatTemplate:
        """The template a GGUF file's metadata describes.

        Reads ``tokenizer.chat_template`` (or ``tokenizer.chat_template.<name>``
        for one of a model's named templates, such as ``"tool_use"``). The BOS
        and EOS strings come from ``tokenizer.ggml.bos_token_id`` /
        ``eos_token_id``, looked up with ``token_text`` or else in the
        ``tokenizer.ggml.tokens`` list. A model without a template gets
        :data:`CHATML_TEMPLATE` (``is_fallback`` is then True), as llama.cpp does.
        """
        key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
        source = _metadata_text(metadata.get(key), key)
        if name is not None and source is None:
            available = metadata.get("tokenizer.chat_templates") or []
            raise TemplateError(f"the model has no chat template named {name!r} (it has: {list(available)})")
        bos_token = _special_token_text(metadata, "tokenizer.ggml.bos_token_id", token_text)
        eos_token = _special_token_text(metadata, "tokenizer.ggml.eos_token_id", token_text)
        if source is None or not source.strip():
            logger.info("the model has no chat template; using ChatML")
            template = cls(CHATML_TEMPLATE, bos_token=bos_token, eos_token=eos_token, limits=limits)
            template.is_fallback = True
            return template
        return cls(source, bos_token=bos_token, eos_token=eos_token, limits=limits)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages``.

        Each message is a dict with a non-empty string ``role`` and a
        ``content`` that is a string or None; an assistant message may carry
        ``tool_calls`` (a list of ``{"function": {"name", "arguments"}}``, and
        may then omit ``content``), a tool message ``tool_call_id``, and any
        message a string ``name``. Other keys are passed through. Bad shapes
        raise :class:`~elelem.errors.InvalidArgumentError`.

        ``tools`` (JSON schemas) and ``documents`` are handed to the template
        as they are, and so is ``extra`` (e.g. ``enable_thinking=False``),
        which may also override ``bos_token``/``eos_token``. With
        ``add_generation_prompt`` the prompt ends with the header of an
        assistant turn, ready for the model to continue.

        Raises :class:`~elelem.errors.TemplateError` when the template fails or
        calls ``raise_exception``; its subclasses
        :class:`~elelem.errors.UnsafeTemplateError` and
        :class:`~elelem.errors.TemplateLimitError` say the template tried to
        leave the sandbox or to exceed :attr:`limits`.
        """
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **{key: _plain(value, key) for key, value in extra.items()},
            "messages": _checked_messages(messages),
            "tools": _checked_dict_list(tools, "tools"),
            "documents": _checked_dict_list(documents, "documents"),
            "add_generation_prompt": bool(add_generation_prompt),
        }
        return _render(self._template, variables, self.limits)

    def __repr__(self) -> str:
        kind = "ChatML fallback" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind}, bos_token={self.bos_token!r}, eos_token={self.eos_token!r})"


def _render(template: jinja2.Template, variables: dict[str, Any], limits: RenderLimits) -> str:
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


def _metadata_text(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise GGUFError(f"{key} is not valid UTF-8") from error
    raise GGUFError(f"{key} must be a string, got {type(value).__name__}")


def _special_token_text(metadata: Mapping[str, Any], key: str, token_text: Callable[[int], str] | None) -> str:
    token_id = metadata.get(key)
    if token_id is None:
        return ""
    if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
        raise GGUFError(f"{key} must be an integer, got {token_id!r}")
    token_id = int(token_id)
    if token_text is not None:
        return _metadata_text(token_text(token_id), key) or ""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        logger.debug("%s is set but the metadata has no token list; using an empty string", key)
        return ""
    if not 0 <= token_id < len(tokens):
        raise InvalidTokenError(f"{key} is {token_id}, outside the vocabulary [0, {len(tokens)})")
    return _metadata_text(tokens[token_id], key) or ""
