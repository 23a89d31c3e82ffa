"""Reading a request's JSON body, within the server's size limit."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from .errors import APIError, bad_request


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON: a 413 past ``limit`` bytes (told or counted), a 400 when it is not JSON."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"the body has {int(length)} bytes; this server takes at most {limit}",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the body is over {limit} bytes, this server's limit", code="request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as error:  # UnicodeDecodeError included
        raise bad_request(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise bad_request("the body's JSON is nested too deeply") from None
