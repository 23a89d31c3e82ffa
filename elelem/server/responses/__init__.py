"""OpenAI's Responses API, ``POST /v1/responses``, over the same chat call as Chat Completions.

* :mod:`.request` -- the body, checked and translated into the engine's chat call;
* :mod:`.items` -- conversation items as chat messages, and back;
* :mod:`.wire` -- the answer: a ``response`` object, or its typed stream events;
* :mod:`.store` -- the conversations of recent responses, for ``previous_response_id``;
* :mod:`.errors` -- the Responses API's field names in errors (the shape is OpenAI's).
"""
from __future__ import annotations

from starlette.requests import Request

from ..body import read_json
from ..generation import Generation, accept
from .request import ResponsesRequest, responses_request
from .store import ResponseStore
from .wire import ResponsesWire

__all__ = ["handler", "ResponsesHandler", "ResponsesRequest", "responses_request", "ResponseStore", "ResponsesWire"]


class ResponsesHandler:
    """The route's handler, called as ``handler(state, request)``, and ``store``, the conversations
    of the responses it stored.

    The store belongs to the handler, so to the app that routes to it (one
    per :func:`~..app.create_app`).
    """

    def __init__(self) -> None:
        self.store = ResponseStore()

    async def __call__(self, state, request: Request) -> Generation:
        store = self.store
        checked = responses_request(await read_json(request, state.config.max_body_bytes), state.config, store)
        return await accept(state, request, checked.call, lambda model_id: ResponsesWire(
            model_id, checked.echo, checked.conversation, store if checked.store else None))


def handler() -> ResponsesHandler:
    """The route's handler, ``handler(state, request)``, with a new store of its conversations."""
    return ResponsesHandler()
