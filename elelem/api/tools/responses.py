"""``chat.completion`` dicts and chunks with tool calls (OpenAI's shapes).

The same envelope as :mod:`elelem.api.completions`, which builds them
(with the reply's :class:`~elelem.api.reasoning.ReplyParser`), plus:

* the message has ``tool_calls`` (``[{"id", "type": "function", "function":
  {"name", "arguments"}}]``, ``arguments`` a JSON string) when the model made
  calls, its ``content`` is then the text around them or None, and
  ``finish_reason`` is ``"tool_calls"``;
* ``reasoning_content``, when the model reasoned (before its content and calls);
* streamed, each call arrives as two ``delta.tool_calls`` chunks, as OpenAI
  sends them: ``{"index", "id", "type", "function": {"name", "arguments": ""}}``
  then ``{"index", "function": {"arguments": ...}}``.  Reasoning is streamed
  as ``reasoning_content`` deltas, text before a call as ``content``; the
  markup never is.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

from .. import completions
from ..generation import TextStream
from .parsers import ToolCallParser


def _reply(stream: TextStream, parser: Optional[ToolCallParser], tool_names):
    from ..reasoning import ReplyParser  # the reasoning module builds on this package
    reply = getattr(stream, "reply", None)
    if reply is not None and (parser is None or reply.format is parser):
        return reply
    return ReplyParser(parser, tool_names, parse_calls=parser is not None)


def chat_completion(stream: TextStream, model: str, parser: Optional[ToolCallParser] = None,
                    tool_names=()) -> dict[str, Any]:
    return completions.chat_completion(stream, model, _reply(stream, parser, tool_names))


def chat_completion_chunks(stream: TextStream, model: str, parser: Optional[ToolCallParser] = None,
                           tool_names=()) -> Iterator[dict[str, Any]]:
    return completions.chat_completion_chunks(stream, model, _reply(stream, parser, tool_names))
