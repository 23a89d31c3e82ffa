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

The budget and its size checks are in :mod:`.template_budget`, the guarded
filters in :mod:`.template_filters`; this module is the environment that
compiles and renders, and the globals templates can call.
"""

from __future__ import annotations

import functools
import itertools
import math
import types
from collections.abc import Callable, Iterable, Iterator
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

from ..errors import ElelemError, TemplateError, TemplateLimitError, UnsafeTemplateError
from .template_budget import (
    _BUDGET,
    MAX_CALL_DEPTH,
    MAX_OUTPUT_CHARS,
    MAX_RANGE_ITEMS,
    MAX_TEMPLATE_CHARS,
    MAX_TEMPLATE_TOKENS,
    MAX_WORK_CHARS,
    RENDER_TIMEOUT_S,
    RenderLimits,
    _account,
    _budget,
    _Budget,
    _check_binop,
    _check_brace_format,
    _check_weight,
    _checked_method_args,
)
from .template_filters import (
    _FILTER_PRECHECKS,
    _concat_guard,
    _guarded_filter,
    _join_filter,
    _loop_guard,
    _output_guard,
    _tojson,
)

__all__ = [
    "MAX_CALL_DEPTH",
    "MAX_OUTPUT_CHARS",
    "MAX_RANGE_ITEMS",
    "MAX_TEMPLATE_CHARS",
    "MAX_TEMPLATE_TOKENS",
    "MAX_WORK_CHARS",
    "RENDER_TIMEOUT_S",
    "RenderLimits",
    "compile_template",
    "now",
    "render_template",
]

# Longest strftime_now() format string.
_MAX_STRFTIME_FORMAT = 1024


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

    def _guard(self, node: nodes.Node, name: str) -> nodes.Expr:
        guarded = nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)
        guarded.set_environment(self.environment)
        return guarded

    # generic_visit rewrites a node's children in place and returns the node itself.

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._guard(node.iter, _LOOP_GUARD)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        parts = nodes.List(node.nodes, lineno=node.lineno)
        parts.set_environment(self.environment)
        return self._guard(parts, _CONCAT_GUARD)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
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
    length: float
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
    chunks: Iterator[str] | None = None
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
        if isinstance(chunks, types.GeneratorType):
            chunks.close()  # drop the suspended render and whatever it holds
        _BUDGET.reset(token)
    return "".join(pieces)

