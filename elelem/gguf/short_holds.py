"""Building and freeing a vocabulary's big tables in slices, so other threads get the GIL between them.

A server loads a model beside the models it is running, in one process: while
the load builds a tokenizer's tables (Qwen2: 151,000 tokens and as many merges),
the other models' requests need the GIL for a moment several times per token.
Python hands it over between bytecodes (every ``sys.getswitchinterval()``),
but never inside one C call: ``dict(zip(tokens, range(n)))`` is a single hold
of 30 ms, and a decode of the whole string array another.  The helpers here
do the same work in slices of :data:`SLICE` items, a fraction of a millisecond
of C each, with a bytecode between them where the GIL can change hands.  (A
loop of bytecode per item would hand it over as often, at twice the CPU.)

Freeing is the same: the last reference to a tokenizer frees its tables in
one cascade of deallocations, 15-30 ms of C for Qwen2's.  :func:`tables_of`
and :func:`free_in_slices` let the server's pool, which knows that nothing
else uses a model it unloads, free them a slice at a time instead.
"""
from __future__ import annotations

import gc
import sys
from collections import deque
from itertools import islice
from typing import Any, Iterable, Sequence, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: items per C call: about 0.2-0.5 ms of work for string tables
SLICE = 2048


def dict_in_slices(pairs: Iterable[tuple[K, V]]) -> dict[K, V]:
    """``dict(pairs)`` (a later key wins, as there), built ``SLICE`` pairs at a time."""
    out: dict[K, V] = {}
    items = iter(pairs)
    while True:
        part = list(islice(items, SLICE))
        if not part:
            return out
        out.update(part)


def set_in_slices(items: Sequence[K]) -> set[K]:
    """``set(items)``, built ``SLICE`` items at a time."""
    out: set[K] = set()
    for first in range(0, len(items), SLICE):
        out.update(items[first:first + SLICE])
    return out


#: a table is worth freeing in slices from this many items
BIG = 4 * SLICE

_CONTAINERS = (dict, list, tuple, set, frozenset)


def tables_of(root: object, package: str = "elelem") -> list:
    """The big dicts, lists, tuples and sets reachable from ``root`` through
    containers and objects of ``package``'s classes (not through modules,
    classes, functions or other libraries' objects), each once."""
    seen: set[int] = set()
    found: list = []
    todo: list = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _CONTAINERS):
            if len(obj) >= BIG:
                found.append(obj)
                continue   # its items are what it holds: strings, numbers, pairs
        elif not type(obj).__module__.startswith(package):
            continue
        todo += [child for child in gc.get_referents(obj)
                 if isinstance(child, _CONTAINERS) or type(child).__module__.startswith(package)]
    return found


def free_in_slices(tables: list) -> int:
    """Free each of ``tables`` that nothing else holds, ``SLICE`` items at a
    time; one still held elsewhere is only let go (freed with its last holder).
    Empties ``tables``; the caller keeps no other reference to them.  Returns
    how many were freed here."""
    freed = 0
    while tables:
        table = tables.pop()
        # Held by ``table`` and getrefcount's argument alone: nothing else can see it emptied.
        if sys.getrefcount(table) != 2:
            del table
            continue
        freed += 1
        if isinstance(table, (list, dict, set)):
            _empty(table)
            del table
            continue
        # A tuple or frozenset cannot be emptied: its items are held by slices
        # of it, so that dropping it only counts them down, and the slices are
        # dropped one by one.
        items = iter(table)
        parts = [tuple(islice(items, SLICE)) for _ in range(0, len(table), SLICE)]
        del items, table
        while parts:
            parts.pop()
    return freed


def _empty(table: Any) -> None:
    if isinstance(table, list):
        while table:
            del table[-SLICE:]
        return
    remove = table.pop if isinstance(table, dict) else table.discard
    keys = list(table)
    while keys:
        part = keys[-SLICE:]
        del keys[-SLICE:]
        deque(map(remove, part), maxlen=0)
        del part   # the keys' last references
