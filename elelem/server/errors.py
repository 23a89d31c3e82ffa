"""Every failure as OpenAI's error JSON, ``{"error": {"message", "type", "param", "code"}}``.

A request the client got wrong is a 4xx naming what is wrong; only the
server's own failures are 5xx, and the server keeps serving after either.
"""
from __future__ import annotations

import logging
from typing import Optional

from starlette.responses import JSONResponse

from ..errors import (CapacityError, ClosedError, ContextLimitError, ElelemError, InvalidArgumentError,
                      InvalidTokenError, KVCacheFullError, TemplateError)

log = logging.getLogger("elelem.server")


class APIError(Exception):
    """An error response: status, OpenAI's ``type``, and the optional ``param`` and ``code``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, retry_after: Optional[int] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(message: str, retry_after: int) -> APIError:
    return APIError(503, message, type="server_overloaded", code="server_overloaded", retry_after=retry_after)


def from_exception(error: BaseException, retry_after: int = 1) -> APIError:
    """The response for an exception a library call raised."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, (KVCacheFullError, CapacityError)):  # before ContextLimitError: a KVCacheFullError is one
        return overloaded(str(error), retry_after)
    if isinstance(error, ContextLimitError):
        return bad_request(str(error), code="context_length_exceeded")
    if isinstance(error, (InvalidArgumentError, InvalidTokenError, TemplateError, TypeError)):
        return bad_request(str(error), getattr(error, "param", None))  # GrammarError names its field
    if isinstance(error, ClosedError):  # the model was unloaded or the server is stopping
        return overloaded(str(error), retry_after)
    if isinstance(error, ElelemError):
        log.error("request failed: %s: %s", type(error).__name__, error)
        return APIError(500, str(error), type="server_error")
    log.exception("unexpected error in a request", exc_info=error)
    return APIError(500, f"internal error: {type(error).__name__}", type="server_error")
