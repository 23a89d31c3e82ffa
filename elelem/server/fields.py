"""Request bodies described as data: a JSON object's fields, each one's type, and which are required.

A :class:`Spec` lists an object's fields (a :class:`Field` each: its
:class:`Kind` and whether it is required) and the names it accepts and
ignores; :meth:`Spec.check` refuses the first unknown name, then the first
field that is missing or of the wrong type.  A JSON ``null`` counts as
absent, as OpenAI's and Anthropic's APIs read it.

The checks are the same for every protocol; their words are not.  A
:class:`Style` says how a protocol names a place in a body and words each
refusal: OpenAI's ``messages[2].content must be a string``
(:data:`OPENAI`), Anthropic's ``messages.2.content: must be a string``
(``anthropic.errors``).  Every refusal is a 400 :class:`~.errors.APIError`
whose ``param`` is the place.

What a field's value means beyond its type (a model's token limit, a list's
items, one field allowed only with another) is checked by the protocol's
request module, after the spec.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from .errors import APIError, bad_request


@dataclass(frozen=True)
class Kind:
    """A type a field's value takes: its test, and its name as a refusal says it (``"a string"``)."""

    name: str
    test: Callable[[Any], bool]


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


ANY = Kind("any value", lambda value: True)
STRING = Kind("a string", lambda value: isinstance(value, str))
NONEMPTY_STRING = Kind("a non-empty string", lambda value: isinstance(value, str) and bool(value))
BOOLEAN = Kind("a boolean", lambda value: isinstance(value, bool))
# true or false, and 0 or 1, which equal them: the switches whose clients may write them as numbers.
FLAG = Kind("a boolean", lambda value: value in (True, False))
OBJECT = Kind("an object", lambda value: isinstance(value, dict))
LIST = Kind("a list", lambda value: isinstance(value, list))
NONEMPTY_LIST = Kind("a non-empty list", lambda value: isinstance(value, list) and bool(value))
POSITIVE_INTEGER = Kind("a positive integer", lambda value: _integer(value) and value >= 1)
JSON_SCHEMA = Kind("a JSON schema object", lambda value: isinstance(value, dict))
STRINGS = Kind("a list of strings", lambda value: isinstance(value, list) and all(isinstance(v, str) for v in value))


def number_in(low: float, high: float) -> Kind:
    """A real number (not a boolean) in ``[low, high]``."""
    # The bodies are JSON, whose numbers decode to int or float: the only reals to admit here
    # (numbers.Real admits no other of them, and its type declares no comparison with a float).
    return Kind(f"a number in [{low:g}, {high:g}]", lambda value: not isinstance(value, bool) and isinstance(
        value, (int, float)) and low <= value <= high)


def one_of(*values: Any) -> Kind:
    """One of a few values, compared with ``==`` (so ``n: 1`` and ``n: 1.0`` are both one)."""
    return Kind(" or ".join(repr(v) for v in values), lambda value: any(value == v for v in values))


@dataclass(frozen=True)
class Field:
    """One field: its kind, whether it must be given, and (optionally) the refusal's own words.

    ``message`` replaces the style's wording for this field, missing or of
    the wrong type alike; ``{path}`` and ``{value!r}`` in it are filled in.
    """

    kind: Kind = ANY
    required: bool = False
    message: Optional[str] = None


class Style:
    """How a protocol names a place in a body and words a refusal; OpenAI's unless overridden."""

    def path(self, parent: str, key: Any) -> str:
        """The place of ``key`` (a field name, or an index into a list) under ``parent``."""
        if isinstance(key, int):
            return f"{parent}[{key}]"
        return f"{parent}.{key}" if parent else key

    def not_object(self, path: str) -> APIError:
        return bad_request("the body must be a JSON object") if not path else \
            bad_request(f"{path} must be an object", path)

    def unknown(self, path: str) -> APIError:
        return bad_request(f"unknown field {path!r}", path)

    def missing(self, path: str, field: Field) -> APIError:
        return bad_request(f"{path} is required, as {field.kind.name}", path)

    def wrong(self, path: str, field: Field, value: Any) -> APIError:
        return bad_request(f"{path} must be {field.kind.name}", path)

    def refuse(self, path: str, field: Field, value: Any) -> APIError:
        """The refusal of ``value`` (None: absent) at ``path``."""
        if field.message is not None:
            return bad_request(field.message.format(path=path, value=value), path)
        return self.missing(path, field) if value is None else self.wrong(path, field, value)


OPENAI = Style()


@dataclass(frozen=True)
class Spec:
    """A JSON object's fields.  ``ignored``: names accepted and left unread; ``open``: any other
    name passes too (an object whose API adds fields this server has no use for)."""

    fields: Mapping[str, Field]
    ignored: frozenset = field(default_factory=frozenset)
    open: bool = False

    def names(self) -> frozenset:
        return frozenset(self.fields) | self.ignored

    def check(self, value: Any, style: Style = OPENAI, path: str = "") -> dict:
        """``value`` as a checked object (the same dict); raises the style's 400 for the first problem."""
        if not isinstance(value, dict):
            raise style.not_object(path)
        if not self.open:
            unknown = sorted(set(value) - self.names(), key=str)
            if unknown:
                raise style.unknown(style.path(path, unknown[0]))
        for name, spec in self.fields.items():
            given = value.get(name)
            if given is None and not spec.required:
                continue
            if given is None or not spec.kind.test(given):
                raise style.refuse(style.path(path, name), spec, given)
        return value
