"""A character-level pushdown automaton for JSON that matches a schema.

The automaton accepts exactly the compact JSON texts that validate against
a JSON schema in the supported subset:

* ``type``: ``object`` (``properties``, ``required``), ``array`` (``items``,
  ``minItems``, ``maxItems``), ``string`` (``minLength``, ``maxLength``),
  ``integer``, ``number``, ``boolean``, ``null``, and a list of types whose
  first characters differ (``["string", "null"]``);
* ``enum`` and ``const`` (any JSON values);
* a schema without a type (``{}``) is read as "any scalar": a string,
  number, boolean or null.

Other keywords (``minimum``, ``pattern``, ``format``, ...) are ignored, so the
output then satisfies the schema less strictly than a validator would ask.

Why the shape is restricted: the automaton must be deterministic and its
states small and hashable, so the token constraint can cache transitions.
Object properties come in the schema's order (required ones always, optional
ones may be skipped) -- what llama.cpp's grammar converter also does.
Whitespace is only a single optional space after ``:`` and ``,``, which is
how ``json.dumps`` and the chat templates' ``tojson`` write JSON, so the
model's most likely spelling stays allowed.  Strings, numbers and arrays
have length caps (:class:`Limits`), so every path through the automaton
ends: however adversarial the logits, the JSON closes after a bounded
number of characters.

A state is a tuple of frames (a stack); each frame is a tuple whose first
item is the index of its node.  The empty tuple is the accepting state.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from ..errors import InvalidArgumentError

State = tuple  # a tuple of frames; () means "the JSON value is complete"

_DIGITS = "0123456789"
_ESCAPES = '"\\/bfnrt'
_HEX = "0123456789abcdefABCDEF"


@dataclass(frozen=True)
class Limits:
    """Caps that keep every JSON value finite, whatever the model prefers."""

    max_string_chars: int = 256  # unless the schema's maxLength says less
    max_array_items: int = 32  # unless the schema's maxItems says less
    max_number_digits: int = 16  # in the integer part, and again in the fraction
    max_depth: int = 16  # nesting of schemas


# --- the step results a node's feed() returns --------------------------------
# ("stay", frame): the character was consumed; the node goes on as ``frame``.
# ("pop",): the character was consumed and ended this node.
# ("pop_refeed",): this node ended *before* the character; the parent reads it.
# ("push", frame, child): this node becomes ``frame`` and a new ``child`` node
#     starts at this character.
# ("become", child): this node is replaced by ``child``, which reads the character.
# ("stay_then_child", frame, child): the character was consumed; the node goes
#     on as ``frame`` once a new ``child`` (starting at the next character) ends.
# None: the character is not allowed here.


class _Node:
    index = -1

    def start(self) -> tuple:
        return (self.index, 0)

    def first_chars(self) -> Optional[frozenset[str]]:
        """The characters this node may start with (None: not known cheaply)."""
        return None

    def feed(self, frame: tuple, ch: str):  # pragma: no cover - abstract
        raise NotImplementedError


class _Literals(_Node):
    """One of a fixed set of texts (enum values, booleans, null, property keys...)."""

    def __init__(self, texts: Sequence[str]):
        self.texts = tuple(dict.fromkeys(texts))
        if not self.texts or any(not t for t in self.texts):
            raise InvalidArgumentError("an enum needs at least one non-empty value")

    def start(self) -> tuple:
        return (self.index, "")

    def first_chars(self):
        return frozenset(t[0] for t in self.texts)

    def feed(self, frame, ch):
        prefix = frame[1] + ch
        longer = any(t.startswith(prefix) and len(t) > len(prefix) for t in self.texts)
        if prefix in self.texts and not longer:
            return ("pop",)
        if longer:
            return ("stay", (self.index, prefix))
        if frame[1] in self.texts:  # e.g. enum [1, 12] after "1": the number ended here
            return ("pop_refeed",)
        return None


class _String(_Node):
    """A JSON string: frame is (index, phase, length); phases: 0 before the
    opening quote, 1 inside, 2 after a backslash, 3..6 inside a \\uXXXX."""

    def __init__(self, min_length: int, max_length: int):
        self.min_length = min_length
        self.max_length = max_length

    def start(self):
        return (self.index, 0, 0)

    def first_chars(self):
        return frozenset('"')

    def feed(self, frame, ch):
        _, phase, length = frame
        if phase == 0:
            return ("stay", (self.index, 1, 0)) if ch == '"' else None
        if phase == 1:
            if ch == '"':
                return ("pop",) if length >= self.min_length else None
            if length >= self.max_length or ch < " ":
                return None
            if ch == "\\":
                return ("stay", (self.index, 2, length))
            return ("stay", (self.index, 1, length + 1))
        if phase == 2:
            if ch in _ESCAPES:
                return ("stay", (self.index, 1, length + 1))
            return ("stay", (self.index, 3, length)) if ch == "u" else None
        if ch not in _HEX:
            return None
        return ("stay", (self.index, 1, length + 1) if phase == 6 else (self.index, phase + 1, length))


class _Number(_Node):
    """``-?(0|[1-9][0-9]*)(\\.[0-9]+)?`` (the fraction only for ``number``).
    Frame: (index, phase, digits); phases: 0 start, 1 after '-', 2 after a
    leading 0, 3 integer digits, 4 after '.', 5 fraction digits."""

    _ENDABLE = (2, 3, 5)

    def __init__(self, integer: bool, max_digits: int):
        self.integer = integer
        self.max_digits = max_digits

    def first_chars(self):
        return frozenset("-" + _DIGITS)

    def start(self):
        return (self.index, 0, 0)

    def feed(self, frame, ch):
        _, phase, digits = frame
        i = self.index
        if phase in (0, 1):
            if ch == "-" and phase == 0:
                return ("stay", (i, 1, 0))
            if ch == "0":
                return ("stay", (i, 2, 1))
            if ch in _DIGITS:
                return ("stay", (i, 3, 1))
            return None
        if ch in _DIGITS and phase in (3, 4, 5):
            if phase == 4:
                return ("stay", (i, 5, 1))
            return ("stay", (i, phase, digits + 1)) if digits < self.max_digits else None
        if ch == "." and phase in (2, 3) and not self.integer:
            return ("stay", (i, 4, 0))
        return ("pop_refeed",) if phase in self._ENDABLE else None


class _Union(_Node):
    """One of several values that start with different characters."""

    def __init__(self, options: Sequence[_Node]):
        self.options = tuple(options)

    def start(self):
        return (self.index,)

    def first_chars(self):
        return frozenset().union(*(o.first_chars() for o in self.options))

    def feed(self, frame, ch):
        for option in self.options:
            if ch in option.first_chars():
                return ("become", option)
        return None


class _Object(_Node):
    """An object whose properties come in schema order.

    Frame: (index, phase, next_property, key_prefix).  Phases: 0 before '{',
    1 after '{', 2 in a key, 3 before ':', 4 after ':' (a space may follow),
    5 after ': ', 6 after a value, 7 after ',' (a space may follow), 8 after ', '.
    """

    def __init__(self, properties: Sequence[tuple[str, _Node, bool]]):
        self.names = tuple(json.dumps(name, ensure_ascii=False) for name, _, _ in properties)
        self.children = tuple(child for _, child, _ in properties)
        self.required = tuple(req for _, _, req in properties)

    def start(self):
        return (self.index, 0, 0, "")

    def first_chars(self):
        return frozenset("{")

    def _keys_allowed(self, position: int) -> range:
        # From `position` up to and including the next required property.
        end = position
        while end < len(self.names):
            end += 1
            if self.required[end - 1]:
                break
        return range(position, end)

    def _may_close(self, position: int) -> bool:
        return not any(self.required[position:])

    def feed(self, frame, ch):
        i, phase, position, prefix = frame
        if phase == 0:
            return ("stay", (i, 1, 0, "")) if ch == "{" else None
        if phase in (1, 8) or (phase == 7 and ch != " "):
            if ch == "}" and phase == 1 and self._may_close(position):
                return ("pop",)
            if ch == '"' and self._keys_allowed(position):
                return ("stay", (i, 2, position, '"'))
            return None
        if phase == 7:  # ch == " "
            return ("stay", (i, 8, position, ""))
        if phase == 2:
            key = prefix + ch
            for j in self._keys_allowed(position):
                if self.names[j] == key:
                    return ("stay", (i, 3, j, ""))
                if self.names[j].startswith(key):
                    return ("stay", (i, 2, position, key))
            return None
        if phase == 3:
            return ("stay", (i, 4, position, "")) if ch == ":" else None
        if phase == 4 and ch == " ":
            return ("stay", (i, 5, position, ""))
        if phase in (4, 5):
            return ("push", (i, 6, position + 1, ""), self.children[position])
        # phase 6: after a value
        if ch == "," and position < len(self.names):
            return ("stay", (i, 7, position, ""))
        if ch == "}" and self._may_close(position):
            return ("pop",)
        return None


class _Array(_Node):
    """Frame: (index, phase, count); phases: 0 before '[', 1 after '[',
    2 after an item, 3 after ',' (a space may follow), 4 after ', '."""

    def __init__(self, item: _Node, min_items: int, max_items: int):
        self.item = item
        self.min_items = min_items
        self.max_items = max_items

    def start(self):
        return (self.index, 0, 0)

    def first_chars(self):
        return frozenset("[")

    def feed(self, frame, ch):
        i, phase, count = frame
        if phase == 0:
            return ("stay", (i, 1, 0)) if ch == "[" else None
        if phase == 1 and ch == "]":
            return ("pop",) if self.min_items == 0 else None
        if phase in (1, 4) or (phase == 3 and ch != " "):
            if phase == 1 and self.max_items == 0:
                return None
            return ("push", (i, 2, count + 1), self.item)
        if phase == 3:
            return ("stay", (i, 4, count))
        if ch == "," and count < self.max_items:
            return ("stay", (i, 3, count))
        if ch == "]" and count >= self.min_items:
            return ("pop",)
        return None


class _ToolCall(_Node):
    """``{"name": "<one of the tools>", "arguments": <that tool's schema>}``.

    The name decides which schema the arguments follow, so the whole call is
    one literal prefix per tool, then that tool's arguments, then ``}``.
    Frame: (index, phase, text) -- phase 0 inside the prefix, 1 after the arguments.
    """

    def __init__(self, prefixes: Sequence[str], arguments: Sequence[_Node]):
        self.prefixes = tuple(prefixes)
        self.arguments = tuple(arguments)

    def start(self):
        return (self.index, 0, "")

    def first_chars(self):
        return frozenset("{")

    def feed(self, frame, ch):
        i, phase, text = frame
        if phase == 1:
            return ("pop",) if ch == "}" else None
        text += ch
        for prefix, arguments in zip(self.prefixes, self.arguments):
            if prefix == text:
                return ("stay_then_child", (i, 1, ""), arguments)
            if prefix.startswith(text):
                return ("stay", (i, 0, text))
        return None


class JsonAutomaton:
    """The automaton of one schema: :meth:`advance` one character at a time.

    Build one with :meth:`for_schema` or :meth:`for_tool_call`.  States are
    plain tuples, so callers can cache on them.
    """

    def __init__(self, nodes: list[_Node], root: _Node):
        self._nodes = nodes
        self.initial: State = (root.start(),)
        self._memo: dict[tuple[State, str], Optional[State]] = {}

    # -- building ------------------------------------------------------------

    @classmethod
    def for_schema(cls, schema: Mapping[str, Any], limits: Limits = Limits()) -> "JsonAutomaton":
        """The JSON texts that validate against ``schema`` (see the module doc)."""
        builder = _Builder(limits)
        root = builder.node(schema, 0)
        return cls(builder.nodes, root)

    @classmethod
    def for_tool_call(cls, functions: Sequence[Mapping[str, Any]], limits: Limits = Limits()) -> "JsonAutomaton":
        """A Hermes-style call of one of ``functions`` (OpenAI ``function`` dicts:
        ``name`` and ``parameters``), spelled as ``json.dumps`` writes it."""
        if not functions:
            raise InvalidArgumentError("a constrained tool call needs at least one function")
        builder = _Builder(limits)
        prefixes, arguments = [], []
        for function in functions:
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError(f"a tool function needs a non-empty string name, got {name!r}")
            prefixes.append('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
            parameters = function.get("parameters") or {"type": "object", "properties": {}}
            arguments.append(builder.node(parameters, 1))
        root = builder.add(_ToolCall(prefixes, arguments))
        return cls(builder.nodes, root)

    # -- running -------------------------------------------------------------

    def advance(self, state: State, ch: str) -> Optional[State]:
        """The state after reading ``ch``, or None when ``ch`` is not allowed."""
        key = (state, ch)
        try:
            return self._memo[key]
        except KeyError:
            pass
        result = self._advance(state, ch)
        if len(self._memo) > 200_000:  # states with string lengths in them never end
            self._memo.clear()
        self._memo[key] = result
        return result

    def advance_text(self, state: State, text: str) -> Optional[State]:
        """The state after reading all of ``text``; None if any character is
        not allowed, or if characters follow the end of the value."""
        for ch in text:
            if not state:
                return None
            state = self.advance(state, ch)
            if state is None:
                return None
        return state

    def accepts(self, text: str) -> bool:
        return self.advance_text(self.initial, text) == ()

    def _advance(self, state: State, ch: str) -> Optional[State]:
        nodes = self._nodes
        stack = list(state)
        while stack:
            frame = stack.pop()
            step = nodes[frame[0]].feed(frame, ch)
            if step is None:
                return None
            kind = step[0]
            if kind == "stay":
                stack.append(step[1])
                return tuple(stack)
            if kind == "pop":
                return tuple(stack)
            if kind == "pop_refeed":
                continue  # the parent reads ch
            if kind == "push":
                stack.append(step[1])
                stack.append(step[2].start())  # the child reads ch
                continue
            if kind == "stay_then_child":  # ch consumed; the child starts at the next character
                stack.append(step[1])
                stack.append(step[2].start())
                return tuple(stack)
            if kind == "become":
                stack.append(step[1].start())
                continue
        return None  # a character after the end of the value


class _Builder:
    def __init__(self, limits: Limits):
        self.limits = limits
        self.nodes: list[_Node] = []

    def add(self, node: _Node) -> _Node:
        node.index = len(self.nodes)
        self.nodes.append(node)
        return node

    def node(self, schema: Any, depth: int) -> _Node:
        if depth > self.limits.max_depth:
            raise InvalidArgumentError(f"the schema nests deeper than {self.limits.max_depth} levels")
        if schema is True or schema is None:
            schema = {}
        if not isinstance(schema, Mapping):
            raise InvalidArgumentError(f"a JSON schema must be an object, got {schema!r}")
        if "const" in schema:
            return self.add(_Literals([json.dumps(schema["const"], ensure_ascii=False)]))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, Sequence) or isinstance(values, str) or not values:
                raise InvalidArgumentError(f"enum must be a non-empty list, got {values!r}")
            return self.add(_Literals([json.dumps(v, ensure_ascii=False) for v in values]))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self._union([self.node({**schema, "type": k}, depth) for k in kind], schema)
        if kind is None:
            return self._union([self.node({"type": k}, depth) for k in ("string", "number", "boolean", "null")],
                               schema)
        build: Optional[Callable[[Mapping[str, Any], int], _Node]] = getattr(self, f"_{kind}", None)
        if build is None:
            raise InvalidArgumentError(f"unsupported JSON schema type {kind!r}")
        return build(schema, depth)

    def _union(self, options: list[_Node], schema) -> _Node:
        seen: set[str] = set()
        for option in options:
            chars = option.first_chars()
            if chars & seen:
                raise InvalidArgumentError(f"unsupported union of overlapping types in {schema!r}")
            seen |= chars
        return self.add(_Union(options))

    def _object(self, schema, depth):
        properties = schema.get("properties") or {}
        required_names = schema.get("required") or []
        if not isinstance(properties, dict) or not all(isinstance(name, str) for name in properties):
            raise InvalidArgumentError(f"an object schema's properties must map names to schemas, got {properties!r:.80}")
        if not isinstance(required_names, list) or not all(isinstance(name, str) for name in required_names):
            raise InvalidArgumentError(f"an object schema's required must be a list of names, got {required_names!r:.80}")
        required = set(required_names)
        unknown = required - set(properties)
        if unknown:
            raise InvalidArgumentError(f"required properties {sorted(unknown)} are not in properties")
        children = [(name, self.node(sub, depth + 1), name in required) for name, sub in properties.items()]
        return self.add(_Object(children))

    def _array(self, schema, depth):
        item = self.node(schema.get("items", {}), depth + 1)
        min_items = int(schema.get("minItems", 0))
        max_items = min(int(schema.get("maxItems", self.limits.max_array_items)), self.limits.max_array_items)
        if min_items > max_items:
            raise InvalidArgumentError(f"minItems {min_items} exceeds the cap of {max_items} items")
        return self.add(_Array(item, min_items, max_items))

    def _string(self, schema, depth):
        min_length = int(schema.get("minLength", 0))
        max_length = min(int(schema.get("maxLength", self.limits.max_string_chars)), self.limits.max_string_chars)
        if min_length > max_length:
            raise InvalidArgumentError(f"minLength {min_length} exceeds the cap of {max_length} characters")
        return self.add(_String(min_length, max_length))

    def _integer(self, schema, depth):
        return self.add(_Number(True, self.limits.max_number_digits))

    def _number(self, schema, depth):
        return self.add(_Number(False, self.limits.max_number_digits))

    def _boolean(self, schema, depth):
        return self.add(_Literals(["true", "false"]))

    def _null(self, schema, depth):
        return self.add(_Literals(["null"]))
