"""Anthropic's Messages API, ``POST /v1/messages``, over the same chat call as Chat Completions.

* :mod:`.request` -- the body, checked in Anthropic's terms and translated
  into the engine's chat call;
* :mod:`.wire` -- the answer: a ``message`` object or the Messages API's
  stream events;
* :mod:`.errors` -- Anthropic's error shape and statuses (a full queue is
  529 ``overloaded_error``), and its words for a body's refusals.

The app checks the key as ``x-api-key`` (Anthropic's clients) or
``Authorization: Bearer``, and writes every error before the generation,
that check's included, with :func:`error_response`.
"""
from __future__ import annotations

from starlette.requests import Request

from ..body import read_json
from ..generation import Generation, accept
from .errors import error_body, error_response
from .request import MAX_STOP_SEQUENCES, MessagesRequest, messages_request
from .wire import MessagesWire, tool_use_id

__all__ = ["messages", "error_body", "error_response", "MAX_STOP_SEQUENCES", "MessagesRequest",
           "messages_request", "MessagesWire", "tool_use_id"]


async def messages(state, request: Request) -> Generation:
    """``POST /v1/messages``."""
    checked = messages_request(await read_json(request, state.config.max_body_bytes), state.config)
    return await accept(state, request, checked.call, MessagesWire)
