"""``chat.completion`` dicts and chunks with tool calls (OpenAI's shapes).

The same envelope as :mod:`elelem.api.completions`, plus:

* the message has ``tool_calls`` (``[{"id", "type": "function", "function":
  {"name", "arguments"}}]``, ``arguments`` a JSON string) when the model made
  calls, its ``content`` is then the text around them or None, and
  ``finish_reason`` is ``"tool_calls"``;
* streamed, each call arrives as two ``delta.tool_calls`` chunks, as OpenAI
  sends them: ``{"index", "id", "type", "function": {"name", "arguments": ""}}``
  then ``{"index", "function": {"arguments": ...}}``.  Text before a call is
  streamed as ``content``; the markup never is.
"""
from __future__ import annotations

from typing import Any, Iterator

from ..completions import _Envelope, _usage
from ..generation import TextStream
from .parsers import ToolCallParser
from .streaming import StreamingToolCallParser


def _finish_reason(stream: TextStream, calls: list) -> str:
    # A call cut short by max_tokens is not a call: it stays "length" (and content).
    return "tool_calls" if calls else stream.finish_reason


def chat_completion(stream: TextStream, model: str, parser: ToolCallParser, tool_names) -> dict[str, Any]:
    env = _Envelope(model, chat=True)
    reply = parser.parse(stream.text(), tool_names)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": env.id,
        "object": "chat.completion",
        "created": env.created,
        "model": env.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": _finish_reason(stream, reply.tool_calls)}],
        "usage": _usage(stream),
    }


def chat_completion_chunks(stream: TextStream, model: str, parser: ToolCallParser,
                           tool_names) -> Iterator[dict[str, Any]]:
    env = _Envelope(model, chat=True)
    calls = StreamingToolCallParser(parser, tool_names)

    chunk = env.chat_chunk

    def chunks_of(events) -> Iterator[dict]:
        for kind, value in events:
            if kind == "content":
                yield chunk({"content": value})
                continue
            index = len(emitted)
            emitted.append(value)
            function = value["function"]
            yield chunk({"tool_calls": [{"index": index, "id": value["id"], "type": "function",
                                         "function": {"name": function["name"], "arguments": ""}}]})
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]})

    emitted: list[dict] = []
    with stream:
        yield chunk({"role": "assistant"})
        for delta in stream:
            yield from chunks_of(calls.feed(delta))
        yield from chunks_of(calls.finish())
        yield chunk({}, _finish_reason(stream, emitted))
