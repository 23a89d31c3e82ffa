"""Tool calls out of a stream of text deltas, as they complete.

:class:`StreamingToolCallParser` takes the deltas of a reply and gives back
events: ``("content", text)`` for text that is certainly not call markup,
and ``("tool_call", call)`` when a call is whole (its closing tag arrived,
or its JSON closed).  Text that could be the start of a marker is held back
(as the stop-string filter does), so no part of the markup ever shows up
as content, whatever the chunking.  It is the format's own
:meth:`~.base.ToolCallParser.stream`: each format reads its replies
incrementally, and a whole reply the same way.

Whitespace between calls is dropped, as :meth:`ToolCallParser.parse` drops
it.  A reply that starts with ``{`` may be a call written without its tags
(small Qwen models do that; Llama 3 always does), so it is held back until
the end, then returned as calls or as content.
"""
from __future__ import annotations

from typing import Any, Optional

from .base import Event, ToolCallParser

__all__ = ["StreamingToolCallParser", "parse_stream", "Event"]


class StreamingToolCallParser:
    def __init__(self, parser: ToolCallParser, tool_names: Any = ()):
        self._stream = parser.stream(tool_names)

    @property
    def calls(self) -> list[dict]:
        return self._stream.calls

    def feed(self, delta: str) -> list[Event]:
        return self._stream.feed(delta)

    def finish(self) -> list[Event]:
        """The end of the reply: release or resolve whatever is held."""
        return self._stream.finish()


def parse_stream(parser: ToolCallParser, deltas, tool_names: Any = ()) -> tuple[Optional[str], list]:
    """Run deltas through a streaming parser: (content, calls), for tests and tools."""
    stream = parser.stream(tool_names)
    events = [e for d in deltas for e in stream.feed(d)] + stream.finish()
    content = "".join(e[1] for e in events if e[0] == "content")
    return (content or None), [e[1] for e in events if e[0] == "tool_call"]
