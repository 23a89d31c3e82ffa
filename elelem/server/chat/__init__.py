"""OpenAI's Chat Completions (``POST /v1/chat/completions``) and Completions (``POST /v1/completions``).

* :mod:`.request` -- the bodies, checked into the engine's call; the
  Responses and Messages APIs check their translated bodies here too;
* :mod:`.wire` -- the answer: the library's chat shapes as they are.

Errors are OpenAI's JSON (:mod:`..errors`); the key is the app's Bearer check.
"""
from __future__ import annotations

from starlette.requests import Request

from ..body import read_json
from ..generation import Generation, accept
from .request import chat_call, completion_call
from .wire import OpenAIWire

__all__ = ["chat_completions", "completions", "chat_call", "completion_call", "OpenAIWire"]


async def chat_completions(state, request: Request) -> Generation:
    """``POST /v1/chat/completions``."""
    call = chat_call(await read_json(request, state.config.max_body_bytes), state.config)
    return await accept(state, request, call, lambda model_id: OpenAIWire(call.include_usage))


async def completions(state, request: Request) -> Generation:
    """``POST /v1/completions``."""
    call = completion_call(await read_json(request, state.config.max_body_bytes), state.config)
    return await accept(state, request, call, lambda model_id: OpenAIWire(call.include_usage))
