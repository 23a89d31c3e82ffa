"""Anthropic's error shape, ``{"type": "error", "error": {"type", "message"}}``, and its words for a
body's refusals (places as dotted paths, ``messages.2.content.0.type``, as its own API names them)."""
from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ..errors import APIError, bad_request
from ..fields import ANY, Field, Style

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                529: "overloaded_error"}


def error_body(error: APIError) -> tuple[int, dict]:
    """Anthropic's status and JSON for an error (a 503, the server's 'overloaded', is its 529)."""
    status = 529 if error.status == 503 else error.status
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    message = error.message
    if error.param and not message.startswith(error.param):
        message = f"{error.param}: {message}"
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def error_response(error: APIError) -> JSONResponse:
    status, body = error_body(error)
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


class AnthropicStyle(Style):
    """Refusals in the words of Anthropic's API (its validator's "Field required", "Extra inputs are
    not permitted"), each starting with the place it names."""

    def path(self, parent: str, key: Any) -> str:
        return f"{parent}.{key}" if parent else str(key)

    def not_object(self, path: str) -> APIError:
        return bad_request(f"{path}: must be an object", path) if path else \
            bad_request("the body must be a JSON object")

    def unknown(self, path: str) -> APIError:
        # A top-level name may be a field of Anthropic's API that this server lacks; deeper, a typo.
        why = "" if "." in path else " (this server does not support it)"
        return bad_request(f"{path}: Extra inputs are not permitted{why}", path)

    def missing(self, path: str, field: Field) -> APIError:
        kind = "" if field.kind is ANY else f", as {field.kind.name}"
        return bad_request(f"{path}: Field required{kind}", path)

    def wrong(self, path: str, field: Field, value: Any) -> APIError:
        if field.required:
            return self.missing(path, field)
        return bad_request(f"{path}: must be {field.kind.name}", path)


ANTHROPIC = AnthropicStyle()
