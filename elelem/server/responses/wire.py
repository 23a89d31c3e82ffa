"""The Responses API's answer: a ``response`` object, or its typed stream of events, from chat shapes.

Whole, the chat completion becomes ``{"object": "response", "output": [...],
"usage": {"input_tokens", "output_tokens", ...}, ...}`` whose output items are,
in order: a ``reasoning`` item (when the chat message has
``reasoning_content``), a ``message`` item with one ``output_text`` part (left
out when the reply is only tool calls), and a ``function_call`` item per tool
call.  A reply cut by ``max_output_tokens`` (or the context) is ``status:
"incomplete"`` with ``incomplete_details.reason`` ``"max_output_tokens"``.

Streamed, each event is ``event: TYPE`` then ``data: {"type": TYPE,
"sequence_number": N, ...}``: ``response.created`` and
``response.in_progress``; for each item ``response.output_item.added``, its
content (``response.content_part.added``, the ``response.output_text.delta``\\ s
or ``response.reasoning_text.delta``\\ s, their ``.done``,
``response.content_part.done``; for a call, the
``response.function_call_arguments.delta``\\ s and ``.done``), then
``response.output_item.done``; last ``response.completed`` (or
``response.incomplete``) with the whole response.  An error once the stream
has started is an ``error`` event, then ``response.failed``.

The wire also keeps the finished conversation in the store (unless the
request said ``store: false``), for ``previous_response_id``.
"""
from __future__ import annotations

import time
import uuid
from typing import Optional

from ..errors import APIError
from ..wire import Wire, sse
from .errors import renamed
from .items import assistant_message
from .store import ResponseStore


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(usage: dict) -> dict:
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def _message_item(item_id: str, text: Optional[str], status: str) -> dict:
    content = [] if text is None else [_text_part(text)]
    return {"id": item_id, "type": "message", "status": status, "content": content, "role": "assistant"}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _reasoning_item(item_id: str, text: Optional[str], status: str) -> dict:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "arguments": arguments, "call_id": call_id,
            "name": name}


class _Open:
    """An output item being streamed: its kind, place, id, and the text (or arguments) so far."""

    def __init__(self, kind: str, index: int, item_id: str, call_id: str = "", name: str = ""):
        self.kind = kind
        self.index = index
        self.id = item_id
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []

    def item(self, status: str, text: Optional[str] = None) -> dict:
        if self.kind == "message":
            return _message_item(self.id, text, status)
        if self.kind == "reasoning":
            return _reasoning_item(self.id, text, status)
        return _call_item(self.id, self.call_id, self.name, "" if text is None else text, status)


class ResponsesWire(Wire):
    """One ``/v1/responses`` request's answer.  ``echo`` holds the request's fields the response repeats;
    ``conversation`` (the chat messages without the instructions) is stored with the output unless
    ``store`` is None."""

    def __init__(self, model: str, echo: dict, conversation: list, store: Optional[ResponseStore]):
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.echo = echo
        self.conversation = conversation
        self.store = store
        self._seq = 0
        self._started = False
        self._output: list[dict] = []          # the items as last sent (added, then done)
        self._open: Optional[_Open] = None
        self._calls: dict[int, _Open] = {}     # chat's tool-call index -> its item
        self._finish: Optional[str] = None

    # -- the response object ---------------------------------------------------------

    def response(self, status: str, output: list, usage: Optional[dict] = None,
                 error: Optional[dict] = None) -> dict:
        echo = self.echo
        body = {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "background": echo.get("background", False), "error": error,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": echo.get("instructions"), "max_output_tokens": echo.get("max_output_tokens"),
                "model": self.model, "output": output, "parallel_tool_calls": echo.get("parallel_tool_calls", False),
                "previous_response_id": echo.get("previous_response_id"),
                "reasoning": echo.get("reasoning", {"effort": None, "summary": None}),
                "service_tier": echo.get("service_tier", "default"), "store": self.store is not None,
                "temperature": echo.get("temperature"), "text": echo.get("text", {"format": {"type": "text"}}),
                "tool_choice": echo.get("tool_choice", "auto"), "tools": echo.get("tools", []),
                "top_p": echo.get("top_p"), "truncation": echo.get("truncation", "disabled"),
                "usage": usage, "user": echo.get("user"), "metadata": echo.get("metadata", {})}
        if status in ("completed", "incomplete"):
            body["completed_at"] = int(time.time())
        return body

    def _keep(self, items: list) -> None:
        if self.store is not None:
            self.store.put(self.id, self.conversation + [assistant_message(items)])

    # -- whole -------------------------------------------------------------------------

    def whole(self, response: dict, usage: dict) -> dict:
        choice = response["choices"][0]
        message = choice.get("message") or {}
        status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
        content, calls = message.get("content"), message.get("tool_calls") or []
        reasoning = message.get("reasoning_content")
        items = []
        if reasoning:
            cut = status == "incomplete" and not content and not calls
            items.append(_reasoning_item(new_id("rs"), reasoning, "incomplete" if cut else "completed"))
        if content or not calls:
            items.append(_message_item(new_id("msg"), content or "", status))
        for call in calls:
            function = call.get("function") or {}
            items.append(_call_item(new_id("fc"), call.get("id") or new_id("call"), function.get("name", ""),
                                    function.get("arguments") or "", "completed"))
        self._keep(items)
        return self.response(status, items, _usage(usage))

    # -- streamed ----------------------------------------------------------------------

    def _event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(data, event=kind)

    def _begin(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        shell = self.response("in_progress", [])
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def events(self, chunk: dict) -> list[bytes]:
        out = self._begin()
        choices = chunk.get("choices") or []
        if not choices:
            return out
        choice = choices[0]
        delta = choice.get("delta") or {}
        if delta.get("reasoning_content"):
            out += self._text_delta("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            out += self._text_delta("message", delta["content"])
        for call in delta.get("tool_calls") or []:
            out += self._call_delta(call)
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return out

    def _add(self, kind: str, **names) -> tuple[_Open, list[bytes]]:
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = self._open = _Open(kind, len(self._output), new_id(prefix), **names)
        added = item.item("in_progress")
        self._output.append(added)
        out = [self._event("response.output_item.added", output_index=item.index, item=added)]
        if kind == "message":
            out.append(self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                                   content_index=0, part=_text_part("")))
        elif kind == "reasoning":
            out.append(self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                                   content_index=0, part={"type": "reasoning_text", "text": ""}))
        return item, out

    def _text_delta(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        item = self._open
        if item is None or item.kind != kind:
            out += self._close()
            item, added = self._add(kind)
            out += added
        item.parts.append(text)
        if kind == "message":
            out.append(self._event("response.output_text.delta", item_id=item.id, output_index=item.index,
                                   content_index=0, delta=text, logprobs=[]))
        else:
            out.append(self._event("response.reasoning_text.delta", item_id=item.id, output_index=item.index,
                                   content_index=0, delta=text))
        return out

    def _call_delta(self, call: dict) -> list[bytes]:
        out: list[bytes] = []
        index = call.get("index", 0)
        function = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            out += self._close()
            item, added = self._add("function_call", call_id=call.get("id") or new_id("call"),
                                    name=function.get("name") or "")
            out += added
            self._calls[index] = item
        arguments = function.get("arguments")
        if arguments:  # a chat stream sends each call's deltas together, so its item is still the open one
            item.parts.append(arguments)
            out.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                   output_index=item.index, delta=arguments))
        return out

    def _close(self, status: str = "completed") -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        text = "".join(item.parts)
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "message":
            out = [self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                   self._event("response.content_part.done", **where, content_index=0, part=_text_part(text))]
        elif item.kind == "reasoning":
            out = [self._event("response.reasoning_text.done", **where, content_index=0, text=text),
                   self._event("response.content_part.done", **where, content_index=0,
                               part={"type": "reasoning_text", "text": text})]
        else:
            out = [self._event("response.function_call_arguments.done", **where, arguments=text)]
            status = "completed"  # a call that was parsed is whole
        done = self._output[item.index] = item.item(status, text)
        return out + [self._event("response.output_item.done", output_index=item.index, item=done)]

    def end(self, usage: dict) -> list[bytes]:
        out = self._begin()
        status = "incomplete" if self._finish == "length" else "completed"
        out += self._close(status)
        if not any(item["type"] in ("message", "function_call") for item in self._output):
            _, added = self._add("message")  # every answer has its message, if only an empty one
            out += added + self._close(status)
        self._keep(self._output)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + [self._event(kind, response=self.response(status, self._output, _usage(usage)))]

    # -- errors ------------------------------------------------------------------------

    def error_response(self, error: APIError):
        return renamed(error).response()

    def error_event(self, error: APIError) -> bytes:
        error = renamed(error)
        code = error.code or ("server_error" if error.status >= 500 else error.type)
        failed = self.response("failed", self._output,
                               error={"code": "server_error" if error.status >= 500 else code,
                                      "message": error.message})
        return self._event("error", code=code, message=error.message, param=error.param) + \
            self._event("response.failed", response=failed)
