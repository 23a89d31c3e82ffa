"""How one HTTP API writes a generation's answer: the response shapes of a wire protocol.

Every generation endpoint runs the same call on a session (a chat or a
text completion, :mod:`.completions`) and reads OpenAI's chat shapes out of
it: a whole ``chat.completion`` dict, or its ``chat.completion.chunk``\\ s.
A :class:`Wire` turns those into what its API sends: the JSON body, the
server-sent events of a stream, and its errors.  One instance serves one
request, so it may keep state across a stream's events (an item being
built, a content block's index).

:class:`OpenAIWire` is Chat Completions' (and Completions'): the chunks as
they are, as ``data:`` events, then ``data: [DONE]``.  The Responses API
(:mod:`.responses`) and Anthropic's Messages API (:mod:`.messages`) have
wires of their own over the same calls.
"""
from __future__ import annotations

import json
from typing import Optional

from starlette.responses import JSONResponse

from .errors import APIError


def sse(data: dict, event: Optional[str] = None) -> bytes:
    """One server-sent event: ``[event: NAME\\n]data: {json}\\n\\n``."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class Wire:
    """One request's answer in its API's shapes; the OpenAI ones unless overridden."""

    def whole(self, response: dict, usage: dict) -> dict:
        """The JSON body of a non-streamed answer, from the chat (or completion) dict and its usage."""
        return {**response, "usage": usage}

    def events(self, chunk: dict) -> list[bytes]:
        """The events that send one chunk (none while an event is being gathered)."""
        self._last = chunk
        return [sse(chunk)]

    def end(self, usage: dict) -> list[bytes]:
        """The events that close a stream whose chunks all came, with the request's usage."""
        return [b"data: [DONE]\n\n"]

    def error_response(self, error: APIError) -> JSONResponse:
        """An error before any output: the API's error JSON, with its status."""
        return error.response()

    def error_event(self, error: APIError) -> bytes:
        """An error after the stream started: one event the API's clients read as an error."""
        return sse(error.body())


class OpenAIWire(Wire):
    """Chat Completions and Completions; ``include_usage`` adds a last chunk with the usage."""

    def __init__(self, include_usage: bool = False):
        self.include_usage = include_usage
        self._last: Optional[dict] = None

    def end(self, usage: dict) -> list[bytes]:
        out = []
        if self.include_usage and self._last is not None:
            out.append(sse({**{k: self._last[k] for k in ("id", "object", "created", "model")},
                            "choices": [], "usage": usage}))
        return out + [b"data: [DONE]\n\n"]
