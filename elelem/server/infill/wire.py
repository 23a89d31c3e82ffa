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

import time
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


class LineLimits:
    """llama.cpp's ``n_indent`` and ``t_max_predict_ms`` (server-context.cpp, ``process_token``), read
    off the text as it comes.  After the first new line, a line whose indentation (spaces and tabs) is
    under ``n_indent`` ends the text where that indentation ends; and once generating has taken more
    than ``t_max_predict_ms``, the next piece with a new line ends it."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: int = 0):
        self.n_indent, self.t_max_ms = n_indent, t_max_predict_ms
        self.text = ""
        self.cut: Optional[int] = None   # where n_indent ended the text
        self._has_new_line = False
        self._last_nl = 0                # where the line being checked starts (0: none yet)
        self._t0: Optional[float] = None

    @property
    def active(self) -> bool:
        return self.n_indent > 0 or self.t_max_ms > 0

    def feed(self, piece: str) -> bool:
        """Take one piece of text (a token's, in a stream); True when the text ends with it."""
        if self._t0 is None:
            self._t0 = time.perf_counter()
        self.text += piece
        stop = False
        if self._has_new_line and self.n_indent > 0:
            if self._last_nl > 0:
                pos = self._last_nl
                while pos < len(self.text) and self.text[pos] in " \t":
                    pos += 1
                if pos < len(self.text) and pos - self._last_nl < self.n_indent:
                    self.cut, stop = pos, True
            found = self.text.find("\n", self._last_nl)
            if found != -1:
                self._last_nl = found + 1
        if "\n" in piece:
            self._has_new_line = True
            stop = stop or (self.t_max_ms > 0 and (time.perf_counter() - self._t0) * 1000 > self.t_max_ms)
        return stop

    def whole(self, text: str) -> Optional[int]:
        """Where ``n_indent`` ends a whole text (None: nowhere), fed one character at a time."""
        limits = LineLimits(self.n_indent)
        for char in text:
            if limits.feed(char):
                return limits.cut
        return None


class LlamaWire(Wire):
    """One ``/infill`` request's answer in llama-server's shapes."""

    def __init__(self, model_id: str, prompt_text: Callable[[], str], settings: dict,
                 response_fields: Optional[list[str]] = None, limits: Optional[LineLimits] = None):
        self.model_id = model_id
        self.limits = limits if limits is not None else LineLimits()
        self.limited = False  # n_indent or t_max_predict_ms ended the text
        self.prompt_text = prompt_text
        self.settings = settings
        self.response_fields = response_fields
        self.finish_reason: Optional[str] = None
        self.has_new_line = False

    def whole(self, response: dict, usage: dict) -> dict:
        choice = response["choices"][0]
        text = choice["text"]
        # The whole text was generated; llama.cpp would have stopped where n_indent cuts it (the time
        # limit needs a stream to act on).
        cut = self.limits.whole(text) if self.limits.n_indent > 0 else None
        if cut is not None:
            text, self.limited = text[:cut], True
        return self._final(text, choice["finish_reason"])

    def events(self, chunk: dict) -> list[bytes]:
        choice = chunk["choices"][0]
        if choice["finish_reason"] is not None:
            self.finish_reason = choice["finish_reason"]
        text = choice["text"]
        if not text:
            return []
        self.has_new_line = self.has_new_line or "\n" in text
        if self.limits.active and self.limits.feed(text):
            # As llama.cpp, the piece that crossed a limit is sent (a stream cannot take text back);
            # closing the stream ends the chunks after it.
            self.limited = True
            self._text().close()
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
            "stop_type": "limit" if finish_reason == "length" or self.limited else "eos", "stopping_word": "",
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
