"""The Messages API's answer: a ``message`` object, or its stream of events, from chat shapes.

Whole, the answer is a ``message`` object whose ``content`` is a
``thinking`` block (the reply's reasoning), a ``text`` block and a
``tool_use`` block per call.  Streamed, the events are ``message_start``,
``content_block_start``/``_delta``/``_stop`` (``text_delta``,
``input_json_delta``, ``thinking_delta``), ``message_delta`` and
``message_stop``.  An error after a stream started is an ``event: error``.

``stop_sequence`` is always null, and ``stop_reason`` ``end_turn`` when a
stop sequence ended the text: the library's stream does not say which stop
string matched, or whether one did rather than an end-of-generation token.
``usage.cache_read_input_tokens`` counts the prompt's tokens found in the
KV cache (prefix reuse), which ``input_tokens`` then leaves out, as in
Anthropic's accounting.
"""
from __future__ import annotations

import uuid
from typing import Any, Optional

from starlette.responses import JSONResponse

from ..errors import APIError
from ..tools import arguments_object
from ..wire import Wire, sse
from .errors import error_body, error_response

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stop_reason(finish_reason: Optional[str]) -> str:
    """Anthropic's stop_reason for a chat finish_reason; end_turn for any other, or for none."""
    return _STOP_REASONS.get(finish_reason, "end_turn") if finish_reason is not None else "end_turn"


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` id for a chat tool call's ``call_`` one (any other id stays as it is)."""
    return "toolu_" + call_id[len("call_"):] if call_id.startswith("call_") else call_id


class MessagesWire(Wire):
    """A chat answer as a ``message`` object or as the Messages API's stream events.

    ``message_start`` waits for the first output (so an error while the
    prompt is read is still a JSON error with its status, and the usage it
    carries knows the cached prompt tokens); a thinking, text or tool_use
    block opens when its first delta comes, and closes when another kind of
    content, or the end, does.
    """

    def __init__(self, model_id: str):
        self.model_id = model_id
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self._started = False
        self._open: Optional[str] = None  # the kind of the open content block
        self._index = -1                  # the last content block's index
        self._tool_blocks: dict[Any, int] = {}  # a chat tool call's index -> its block's
        self._finish: Optional[str] = None

    def _stream(self):
        return self.answer.text if self.answer is not None else None  # the prompt's token counts

    def _usage(self, usage: Optional[dict] = None) -> dict:
        stream = self._stream()
        prompt = usage["prompt_tokens"] if usage else (stream.prompt_tokens if stream is not None else 0)
        cached = min(stream.reused_tokens, prompt) if stream is not None else 0
        return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached, "output_tokens": usage["completion_tokens"] if usage else 0}

    # -- a whole answer ---

    def whole(self, response: dict, usage: dict) -> dict:
        choice = response["choices"][0]
        message = choice["message"]
        content: list[dict] = []
        if message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"],
                            "input": arguments_object(call["function"].get("arguments"))})
        return {**self._message(content, _stop_reason(choice.get("finish_reason"))),
                "usage": self._usage(usage)}

    def _message(self, content: list, stop_reason: Optional[str]) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_id, "content": content,
                "stop_reason": stop_reason, "stop_sequence": None}

    # -- a stream ---

    def events(self, chunk: dict) -> list[bytes]:
        choices = chunk.get("choices") or []
        if not choices:
            return []
        choice = choices[0]
        delta = choice.get("delta") or {}
        out: list[bytes] = []
        if delta.get("reasoning_content"):
            out += self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            out += self._open_block("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") is not None:  # a new call: its block opens
                out += self._close_block()
                out += self._open_block("tool_use", {"type": "tool_use", "id": tool_use_id(call["id"]),
                                                     "name": function.get("name", ""), "input": {}})
                self._tool_blocks[call.get("index")] = self._index
            if function.get("arguments"):
                out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]},
                                       self._tool_blocks.get(call.get("index"), self._index)))
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return self._start() + out if out else []

    def end(self, usage: dict) -> list[bytes]:
        out = self._start() + self._close_block()
        out.append(sse({"type": "message_delta", "delta": {
            "stop_reason": _stop_reason(self._finish), "stop_sequence": None},
            "usage": self._usage(usage)}, event="message_delta"))
        out.append(sse({"type": "message_stop"}, event="message_stop"))
        return out

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [sse({"type": "message_start", "message": {**self._message([], None), "usage": self._usage()}},
                    event="message_start")]

    def _open_block(self, kind: str, block: dict) -> list[bytes]:
        if self._open == kind and kind != "tool_use":
            return []
        out = self._close_block()
        self._index += 1
        self._open = kind
        return out + [sse({"type": "content_block_start", "index": self._index, "content_block": block},
                          event="content_block_start")]

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [sse({"type": "content_block_stop", "index": self._index}, event="content_block_stop")]

    def _delta(self, delta: dict, index: Optional[int] = None) -> bytes:
        return sse({"type": "content_block_delta", "index": self._index if index is None else index,
                    "delta": delta}, event="content_block_delta")

    # -- errors ---

    def error_response(self, error: APIError) -> JSONResponse:
        return error_response(error)

    def error_event(self, error: APIError) -> bytes:
        return sse(error_body(error)[1], event="error")
