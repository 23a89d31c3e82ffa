"""Chat Completions' and Completions' wire: the library's chunks as ``data:`` events, then ``[DONE]``."""
from __future__ import annotations

from typing import Optional

from ..wire import Wire, sse


class OpenAIWire(Wire):
    """Chat Completions and Completions; ``include_usage`` adds a last chunk with the usage."""

    def __init__(self, include_usage: bool = False):
        self.include_usage = include_usage
        self._last: Optional[dict] = None

    def events(self, chunk: dict) -> list[bytes]:
        self._last = chunk
        return [sse(chunk)]

    def end(self, usage: dict) -> list[bytes]:
        out = []
        if self.include_usage and self._last is not None:
            out.append(sse({**{k: self._last[k] for k in ("id", "object", "created", "model")},
                            "choices": [], "usage": usage}))
        return out + [b"data: [DONE]\n\n"]
