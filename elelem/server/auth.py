"""The server's API key, checked the same way for every route that needs it.

OpenAI's clients send ``Authorization: Bearer KEY``; Anthropic's send
``x-api-key: KEY``, so the Messages API takes either.  A wrong or missing
key is a 401; each protocol writes it in its own error shape.
"""
from __future__ import annotations

import hmac
from typing import Optional

from starlette.requests import Request

from .errors import APIError


def check_key(api_key: Optional[str], request: Request, *, x_api_key: bool = False) -> None:
    """Raise a 401 unless the request carries ``api_key`` (no key configured: every request passes).
    ``x_api_key``: the ``x-api-key`` header counts too."""
    if api_key is None:
        return
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    given = [bearer] if scheme.lower() == "bearer" else []
    if x_api_key:
        given.insert(0, request.headers.get("x-api-key", ""))
    # Compared in constant time, so the response time does not reveal how much of a guess was right.
    if not any(hmac.compare_digest(g.strip().encode(), api_key.encode()) for g in given):
        send = "'x-api-key: <key>' or 'Authorization: Bearer <key>'" if x_api_key else \
            "'Authorization: Bearer <key>'"
        raise APIError(401, f"a missing or wrong API key: send {send}", code="invalid_api_key")
