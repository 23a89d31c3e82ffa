"""A size-bounded dictionary for per-word tokenization results."""
from __future__ import annotations

from typing import Callable, Generic, Hashable, Iterable, Sequence, TypeVar

# A word's or chunk's token ids.
V = TypeVar("V", bound=Sequence[int])


class BoundedCache(Generic[V]):
    """A dict that drops its oldest half when full.

    Cheaper than an LRU on the hot path (a hit is one dict lookup); words that
    keep recurring are simply re-inserted after an eviction.
    """

    def __init__(self, capacity: int):
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self._data: dict[Hashable, V] = {}
        self.get = self._data.get

    def put(self, key: Hashable, value: V) -> None:
        data = self._data
        if len(data) >= self.capacity:
            drop = len(data) // 2
            for old in list(data)[:drop]:  # dicts keep insertion order
                data.pop(old, None)  # another thread may have dropped it already
        data[key] = value

    def extend_encoded(self, out: list[int], parts: Iterable[str], encode: Callable[[str], V], max_len: int) -> None:
        """``out += encode(part)`` for each part, from the cache where it is there;
        parts longer than ``max_len`` characters are encoded but not kept."""
        get = self._data.get
        for part in parts:
            value = get(part)
            if value is None:
                value = encode(part)
                if len(part) <= max_len:
                    self.put(part, value)
            out += value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()
