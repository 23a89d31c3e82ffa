"""How many HTTP requests the server holds at once, answered in OpenAI's JSON past the limit.

uvicorn's own ``limit_concurrency`` answers an excess connection with a
plain-text 503 that OpenAI clients cannot parse, so the limit is enforced
here, per request, with OpenAI's error JSON and ``Retry-After``; uvicorn's
stays as a looser backstop on connections (see serving.py).
"""
from __future__ import annotations

from .errors import overloaded


class RequestLimit:
    """ASGI middleware: at most ``limit`` HTTP requests in progress."""

    def __init__(self, app, limit: int, retry_after: int):
        self.app = app
        self.limit = limit
        self.retry_after = retry_after
        self.active = 0          # touched only in the event loop: no lock

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            response = overloaded(f"the server holds {self.limit} requests at once; try again shortly",
                                  self.retry_after).response()
            await response(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
