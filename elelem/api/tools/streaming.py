"""Tool calls out of a stream of text deltas, as they complete.

:class:`StreamingToolCallParser` takes the deltas of a reply and gives back
events: ``("content", text)`` for text that is certainly not call markup,
and ``("tool_call", call)`` when a call's closing tag arrives.  Text that
could be the start of a tag is held back (as the stop-string filter does),
so no part of the markup ever shows up as content, whatever the chunking.

Whitespace between calls is dropped, as :meth:`ToolCallParser.parse` drops
it.  A reply that starts with ``{`` may be a call written without its tags
(small Qwen models do that), so it is held back until the end, then
returned as one call or as content.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from .parsers import ToolCallParser

log = logging.getLogger("elelem")

Event = tuple  # ("content", str) or ("tool_call", dict)

_TEXT, _IN_CALL, _MAYBE_BARE = "text", "in_call", "maybe_bare"


class StreamingToolCallParser:
    def __init__(self, parser: ToolCallParser, tool_names: Sequence[str] = ()):
        self._parser = parser
        self._tool_names = tuple(tool_names)
        self._mode = _TEXT
        self._buffer = ""
        self._started = False  # any non-whitespace seen
        self._pending_space = ""  # whitespace held until we know it is not between calls
        self.calls: list[dict] = []

    def feed(self, delta: str) -> list[Event]:
        events: list[Event] = []
        self._buffer += delta
        self._drain(events, final=False)
        return events

    def finish(self) -> list[Event]:
        """The end of the reply: release or resolve whatever is held."""
        events: list[Event] = []
        self._drain(events, final=True)
        buffer, self._buffer = self._buffer, ""
        if self._mode == _IN_CALL:
            self._finish_call(buffer, self._parser.start_tag + buffer, events)
        elif self._mode == _MAYBE_BARE:
            call = self._parser.parse_bare_call(buffer, self._tool_names)
            if call is not None:
                self.calls.append(call)
                events.append(("tool_call", call))
            else:
                self._content(buffer, events)
        else:
            self._content(buffer, events)
        if self._pending_space and not self.calls:
            events.append(("content", self._pending_space))
        self._pending_space = ""
        return events

    # -- internals -------------------------------------------------------------

    def _drain(self, events: list[Event], final: bool) -> None:
        start_tag, end_tag = self._parser.start_tag, self._parser.end_tag
        while self._buffer:
            if self._mode == _MAYBE_BARE:
                return  # held to the end
            if self._mode == _IN_CALL:
                end = self._buffer.find(end_tag)
                if end < 0:
                    return
                body, self._buffer = self._buffer[:end], self._buffer[end + len(end_tag):]
                self._finish_call(body, start_tag + body + end_tag, events)
                self._mode = _TEXT
                continue
            if not self._started:
                stripped = self._buffer.lstrip()
                if not stripped:
                    return
                if stripped.startswith("{") and self._tool_names:
                    self._mode = _MAYBE_BARE
                    return
            start = self._buffer.find(start_tag)
            if start >= 0:
                self._content(self._buffer[:start], events)
                self._buffer = self._buffer[start + len(start_tag):]
                self._mode = _IN_CALL
                self._started = True
                continue
            keep = 0 if final else _partial_tag(self._buffer, start_tag)
            self._content(self._buffer[:len(self._buffer) - keep], events)
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return

    def _finish_call(self, body: str, markup: str, events: list[Event]) -> None:
        call = self._parser.parse_call(body)
        if call is None:
            log.warning("a tool call in the reply is malformed; it is returned as content: %.200r", markup)
            self._content(markup, events)
        else:
            self._pending_space = ""
            self.calls.append(call)
            events.append(("tool_call", call))

    def _content(self, text: str, events: list[Event]) -> None:
        if not text:
            return
        if not text.strip():
            self._pending_space += text  # maybe just the newline between two calls
            return
        self._started = True
        events.append(("content", self._pending_space + text))
        self._pending_space = ""


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_stream(parser: ToolCallParser, deltas, tool_names: Sequence[str] = ()) -> tuple[Optional[str], list]:
    """Run deltas through a streaming parser: (content, calls), for tests and tools."""
    stream = StreamingToolCallParser(parser, tool_names)
    events = [e for d in deltas for e in stream.feed(d)] + stream.finish()
    content = "".join(e[1] for e in events if e[0] == "content")
    return (content or None), [e[1] for e in events if e[0] == "tool_call"]
