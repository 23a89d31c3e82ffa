"""llama-server's answer to ``/completion`` and ``/infill``: its own JSON, not OpenAI's.

A whole answer is one object: ``content``, ``stop: true``, ``stop_type``
(``eos``, ``limit``), ``tokens_predicted``, ``tokens_evaluated``, the
prompt's text, ``generation_settings`` and ``timings``.  A stream is
``data: {json}`` events, each with a piece of ``content`` and ``stop:
false``, then that final object with empty ``content`` (llama.cpp sends the
text only once in a stream), and no ``[DONE]``.  ``response_fields`` keeps
only the fields named in the final object, a ``/`` reaching into one
(``timings/prompt_n``), as llama.cpp's ``json_get_nested_values``.  Errors are
``{"error": {"code", "message", "type"}}`` with the code as the status.
"""
from __future__ import annotations

from typing import Callable, Optional

from starlette.responses import JSONResponse

from ..errors import APIError
from ..wire import Wire, sse

#: llama.cpp's error types by status (format_error_response).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}


def error_body(error: APIError) -> dict:
    kind = "exceed_context_size_error" if error.code == "context_length_exceeded" else \
        _TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
    return {"error": {"code": error.status, "message": error.message, "type": kind}}


def error_response(error: APIError) -> JSONResponse:
    """An error in llama-server's shape, with its status (and Retry-After, where there is one)."""
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


def nested_fields(paths: list[str], response: dict) -> dict:
    """llama.cpp's ``json_get_nested_values``: each path that exists, by its path; the others left out."""
    out = {}
    for path in paths:
        value: object = response
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


class LlamaWire(Wire):
    """One ``/infill`` request's answer in llama-server's shapes."""

    def __init__(self, model_id: str, prompt_text: Callable[[], str], settings: dict,
                 response_fields: Optional[list[str]] = None):
        self.model_id = model_id
        self.prompt_text = prompt_text
        self.settings = settings
        self.response_fields = response_fields
        self.finish_reason: Optional[str] = None
        self.has_new_line = False

    def whole(self, response: dict, usage: dict) -> dict:
        choice = response["choices"][0]
        return self._final(choice["text"], choice["finish_reason"])

    def events(self, chunk: dict) -> list[bytes]:
        choice = chunk["choices"][0]
        if choice["finish_reason"] is not None:
            self.finish_reason = choice["finish_reason"]
        text = choice["text"]
        if not text:
            return []
        self.has_new_line = self.has_new_line or "\n" in text
        # llama.cpp applies response_fields to the final object only.
        return [sse({"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": -1,
                     "tokens_predicted": self._text().completion_tokens,
                     "tokens_evaluated": self._text().prompt_tokens})]

    def end(self, usage: dict) -> list[bytes]:
        return [sse(self._final("", self.finish_reason))]

    def error_response(self, error: APIError) -> JSONResponse:
        return error_response(error)

    def error_event(self, error: APIError) -> bytes:
        return sse(error_body(error))

    # -- the final object ------------------------------------------------------

    def _text(self):
        assert self.answer is not None  # started() comes before any output
        return self.answer.text

    def _final(self, content: str, finish_reason: Optional[str]) -> dict:
        text = self._text()
        evaluated = text.prompt_tokens - text.reused_tokens
        prefill_ms, decode_ms = text.prefill_seconds * 1000, text.decode_seconds * 1000
        predicted = text.completion_tokens
        return self._filtered({
            "index": 0, "content": content, "tokens": [], "id_slot": -1, "stop": True,
            "model": self.model_id, "tokens_predicted": predicted, "tokens_evaluated": text.prompt_tokens,
            "generation_settings": self.settings, "prompt": self.prompt_text(),
            "has_new_line": self.has_new_line or "\n" in content, "truncated": False,
            # A stop string and an end-of-generation token both end as "stop" in the library.
            "stop_type": "limit" if finish_reason == "length" else "eos", "stopping_word": "",
            "tokens_cached": text.prompt_tokens + predicted,
            "timings": {"cache_n": text.reused_tokens, "prompt_n": evaluated, "prompt_ms": prefill_ms,
                        "prompt_per_token_ms": prefill_ms / evaluated if evaluated else 0.0,
                        "prompt_per_second": 1000 * evaluated / prefill_ms if prefill_ms else 0.0,
                        "predicted_n": predicted, "predicted_ms": decode_ms,
                        "predicted_per_token_ms": decode_ms / predicted if predicted else 0.0,
                        "predicted_per_second": 1000 * predicted / decode_ms if decode_ms else 0.0},
        })

    def _filtered(self, response: dict) -> dict:
        return response if not self.response_fields else nested_fields(self.response_fields, response)
