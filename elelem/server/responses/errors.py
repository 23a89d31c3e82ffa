"""The Responses API's names in errors: a chat check (or the library) names chat's fields, the client
sent the Responses API's."""
from __future__ import annotations

from typing import Optional

from ..errors import APIError

_PARAMS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format"}


def responses_param(param: Optional[str]) -> Optional[str]:
    """The Responses API's name for a chat request's field."""
    if param is None:
        return None
    if param.startswith("messages"):  # the messages are built from instructions, input and earlier turns
        return "input"
    return _PARAMS.get(param, param)


def renamed(error: APIError) -> APIError:
    """``error`` naming the Responses API's fields where a chat check or the library named chat's."""
    message = error.message.replace("max_tokens", "max_output_tokens").replace("response_format", "text.format")
    return APIError(error.status, message, type=error.type, param=responses_param(error.param), code=error.code,
                    retry_after=error.retry_after)
