"""The filters of the chat-template sandbox: Jinja's own, each wrapped to weigh its input
and account for its result, and the guards the compiler inserts into every template.

Every filter runs under the render's budget (:mod:`.template_budget`); the ones
that can multiply a value's size (``center``, ``indent``, ``wordwrap``,
``batch``, ``slice``, ``replace``, ``join``, ``format``, ``tojson``) are
checked before they run.
"""

from __future__ import annotations

import functools
import json
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2

from ..errors import TemplateLimitError
from .template_budget import (
    _MAX_QUADRATIC_WORK,
    _account,
    _budget,
    _check_percent_format,
    _check_replace,
    _check_striptags,
    _check_weight,
    _check_width,
    _weight,
)

# Width of a tojson indent. Each line of output repeats it once per nesting level.
_MAX_JSON_INDENT = 64
_WORDWRAP_RUN = re.compile(r"\S+|\s+")


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
    if isinstance(indent_width, numbers.Integral) and int(indent_width) > _MAX_JSON_INDENT:
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
