"""Building a vocabulary's big tables in slices, so other threads get the GIL between them.

A server loads a model beside the models it is running, in one process: while
the load builds a tokenizer's tables (Qwen2: 151,000 tokens and as many merges),
the other models' requests need the GIL for a moment several times per token.
Python hands it over between bytecodes (every ``sys.getswitchinterval()``),
but never inside one C call: ``dict(zip(tokens, range(n)))`` is a single hold
of 30 ms, and a decode of the whole string array another.  The helpers here
do the same work in slices of :data:`SLICE` items, a fraction of a millisecond
of C each, with a bytecode between them where the GIL can change hands.  (A
loop of bytecode per item would hand it over as often, at twice the CPU.)
"""
from __future__ import annotations

from itertools import islice
from typing import Iterable, Sequence, TypeVar

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
