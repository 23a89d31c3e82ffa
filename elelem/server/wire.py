"""How one HTTP API writes a generation's answer: the response shapes of a wire protocol.

Every generation endpoint runs the same call on a session (a chat or a
text completion, :mod:`.call`) and reads OpenAI's chat shapes out of
it: a whole ``chat.completion`` dict, or its ``chat.completion.chunk``\\ s.
A :class:`Wire` turns those into what its API sends: the JSON body, the
server-sent events of a stream, and its errors.  One instance serves one
request, so it may keep state across a stream's events (an item being
built, a content block's index).

Each protocol package has its wire: Chat Completions' (``chat.wire``: the
chunks as they are, as ``data:`` events, then ``data: [DONE]``), the
Responses API's (``responses.wire``) and Anthropic's Messages API's
(``anthropic.wire``).
"""
from __future__ import annotations

import json
from typing import Optional

from starlette.responses import JSONResponse

from .call import Answer
from .errors import APIError


def sse(data: dict, event: Optional[str] = None) -> bytes:
    """One server-sent event: ``[event: NAME\\n]data: {json}\\n\\n``."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class Wire:
    """One request's answer in its API's shapes; OpenAI's unless overridden."""

    #: The started call, once the prompt is read: its stream has the token counts.
    answer: Optional[Answer] = None

    def started(self, answer: Answer) -> None:
        """The call was started (its prompt tokenized and checked); called before any output."""
        self.answer = answer

    def whole(self, response: dict, usage: dict) -> dict:
        """The JSON body of a non-streamed answer, from the chat (or completion) dict and its usage."""
        return {**response, "usage": usage}

    def events(self, chunk: dict) -> list[bytes]:
        """The events that send one chunk (none while an event is being gathered)."""
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
