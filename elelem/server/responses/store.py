"""The Responses API's ``previous_response_id``: the conversations of recent responses, in memory.

Each stored response keeps its whole conversation as chat messages (the
earlier turns, its input, and its output as one assistant message), so a
follow-up request continues from it without the client sending it again.
``instructions`` are not part of it: as in OpenAI's API, a follow-up gives
its own.

The store is bounded twice: by how many responses it holds and by the total
size of their conversations (as JSON); past either, the least recently used
go first.  A conversation larger than the whole byte budget is not stored.
Nothing survives a restart.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Optional

DEFAULT_CAPACITY = 256
DEFAULT_MAX_BYTES = 64 * 2**20


class ResponseStore:
    """A thread-safe LRU map: response id -> its conversation (a list of chat messages)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, max_bytes: int = DEFAULT_MAX_BYTES):
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[list, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list) -> bool:
        """Keep ``messages`` under ``response_id``; False when they alone exceed the byte budget."""
        size = len(json.dumps(messages, ensure_ascii=False, default=str))
        if size > self.max_bytes or self.capacity < 1:
            return False
        with self._lock:
            self._drop(response_id)
            self._entries[response_id] = (messages, size)
            self._bytes += size
            while len(self._entries) > self.capacity or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str) -> Optional[list]:
        """The conversation stored under ``response_id`` (a copy of the list), or None."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None:
                return None
            self._entries.move_to_end(response_id)
            return list(entry[0])

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry[1]
