"""llama-cpp-python's response dicts (OpenAI's shapes), built from a :class:`TextStream`.

The keys, their order and the id prefixes follow llama-cpp-python 0.3
(``Llama._create_completion`` and ``llama_chat_format._convert_text_completion*``),
so code written against it ports with an import change:

* completion: ``{"id": "cmpl-…", "object": "text_completion", "created", "model",
  "choices": [{"text", "index", "logprobs", "finish_reason"}], "usage"}``;
  each streamed chunk has the same shape without ``usage``, with the text
  delta and ``finish_reason`` None, and a last chunk has ``text`` ""
  and the ``finish_reason``;
* chat completion: ``"id": "chatcmpl-…"``, ``"object": "chat.completion"``, and
  ``choices[0]["message"] = {"role": "assistant", "content": …}``;
  streamed as ``"chat.completion.chunk"`` objects whose first ``delta`` is
  ``{"role": "assistant"}``, then ``{"content": …}`` deltas, then ``{}`` with
  the ``finish_reason``.

``logprobs`` is always None (elelem does not compute them).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

from .generation import TextStream


class _Envelope:
    """The fields every response and chunk of one request shares."""

    def __init__(self, model: str, chat: bool):
        completion_id = f"cmpl-{uuid.uuid4()}"
        self.id = "chat" + completion_id if chat else completion_id
        self.created = int(time.time())
        self.model = model

    def text_completion(self, text: str, finish_reason=None) -> dict[str, Any]:
        """A ``text_completion`` object: a whole answer, or one streamed chunk of it."""
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
        }

    def chat_chunk(self, delta: dict, finish_reason=None) -> dict[str, Any]:
        """One ``chat.completion.chunk`` of a streamed chat completion."""
        return {
            "id": self.id,
            "model": self.model,
            "created": self.created,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }


def _usage(stream: TextStream) -> dict[str, int]:
    return {
        "prompt_tokens": stream.prompt_tokens,
        "completion_tokens": stream.completion_tokens,
        "total_tokens": stream.prompt_tokens + stream.completion_tokens,
    }


def completion(stream: TextStream, model: str) -> dict[str, Any]:
    env = _Envelope(model, chat=False)
    text = stream.text()
    return {**env.text_completion(text, stream.finish_reason), "usage": _usage(stream)}


def completion_chunks(stream: TextStream, model: str) -> Iterator[dict[str, Any]]:
    env = _Envelope(model, chat=False)
    with stream:  # closing this generator stops the generation
        for delta in stream:
            yield env.text_completion(delta, None)
        yield env.text_completion("", stream.finish_reason)


def chat_completion(stream: TextStream, model: str) -> dict[str, Any]:
    env = _Envelope(model, chat=True)
    text = stream.text()
    return {
        "id": env.id,
        "object": "chat.completion",
        "created": env.created,
        "model": env.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": stream.finish_reason,
        }],
        "usage": _usage(stream),
    }


def chat_completion_chunks(stream: TextStream, model: str) -> Iterator[dict[str, Any]]:
    env = _Envelope(model, chat=True)
    chunk = env.chat_chunk

    with stream:
        yield chunk({"role": "assistant"}, None)
        for delta in stream:
            yield chunk({"content": delta}, None)
        yield chunk({}, stream.finish_reason)
