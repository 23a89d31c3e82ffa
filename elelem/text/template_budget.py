"""The budget of one chat-template render: its limits, what it has spent, and the size checks.

A render's :class:`_Budget` lives in a ContextVar, so concurrent renders
(threads, asyncio tasks) each have their own.  The checks here run *before*
the operations that can multiply a value's size, so the limits hold without
first allocating the oversized value; :mod:`.template_sandbox` calls them from
the environment's hooks and :mod:`.template_filters` from the filters.
"""

from __future__ import annotations

import numbers
import re
import string
import time
import types
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2.utils import Namespace

from ..errors import InvalidArgumentError, TemplateLimitError

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


# Character copies allowed to the library code that is quadratic in its
# input: textwrap (wordwrap) re-slices an over-long word or run of spaces once
# per line, about text length x longest run / width copies; markupsafe's
# striptags rebuilds the whole string once per tag, about length x tags.
# This bound keeps either under ~50 ms.
_MAX_QUADRATIC_WORK = 100_000_000


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
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0:
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
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        occurrences = text.count(old) if old else len(text) + 1
    elif isinstance(text, bytes) and isinstance(old, bytes) and isinstance(new, bytes):
        occurrences = text.count(old) if old else len(text) + 1
    else:
        return  # str.replace and bytes.replace refuse anything else themselves
    if isinstance(count, numbers.Integral) and int(count) >= 0:
        occurrences = min(occurrences, int(count))
    growth = max(len(new) - len(old), 0)
    _budget().check_size(len(text) + occurrences * growth, "a string with replacements")


def _check_striptags(text: str) -> None:
    if len(text) * text.count("<") > _MAX_QUADRATIC_WORK:
        raise TemplateLimitError(
            f"chat template asked striptags to remove {text.count('<'):,} tags from "
            f"{len(text):,} characters; that would take too long"
        )
