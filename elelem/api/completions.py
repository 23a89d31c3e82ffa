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

A chat reply with structure -- reasoning, tool calls -- is read by the
stream's :class:`~elelem.api.reasoning.ReplyParser` (``stream.reply``): the
message then has ``reasoning_content`` (when there was reasoning) beside
``content``, and ``tool_calls`` with ``finish_reason`` ``"tool_calls"``;
streamed, ``reasoning_content`` deltas come before the ``content`` ones, and
each call arrives as two ``tool_calls`` chunks (see :mod:`.tools.responses`).

``echo`` puts the prompt's text in front of the answer (of the first chunk,
streamed).  ``logprobs`` is None unless asked for: for completions (``logprobs=N``)
llama-cpp-python's ``{"tokens", "text_offset", "token_logprobs",
"top_logprobs"}``, offsets counted from the start of the prompt's text as
there; for chat (``logprobs=True``) OpenAI's ``{"content": [{"token",
"logprob", "bytes", "top_logprobs"}], "refusal"}``.  A streamed chunk
carries the entries of the tokens whose text it completes.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Iterator, Optional

from ..sampling.logprobs import TokenLogprob
from .generation import TextStream


class _Envelope:
    """The fields every response and chunk of one request shares."""

    def __init__(self, model: str, chat: bool):
        completion_id = f"cmpl-{uuid.uuid4()}"
        self.id = "chat" + completion_id if chat else completion_id
        self.created = int(time.time())
        self.model = model

    def text_completion(self, text: str, finish_reason=None, logprobs=None) -> dict[str, Any]:
        """A ``text_completion`` object: a whole answer, or one streamed chunk of it."""
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}],
        }

    def chat_chunk(self, delta: dict, finish_reason=None, logprobs=None) -> dict[str, Any]:
        """One ``chat.completion.chunk`` of a streamed chat completion."""
        return {
            "id": self.id,
            "model": self.model,
            "created": self.created,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }


class _LogprobCursor:
    """Hands out a stream's token log-probabilities as the text they made is
    released: up to a text length, each token once, in order."""

    def __init__(self, stream: TextStream):
        self.stream = stream
        self.taken = 0
        self.offset = 0          # text length of the tokens taken

    def take(self, text_length: int) -> list[tuple[TokenLogprob, int]]:
        """The tokens (with their text offsets) whose text starts before
        ``text_length`` and has not been taken yet."""
        entries, texts = self.stream.logprobs or [], self.stream.token_texts
        out = []
        while self.taken < min(len(entries), len(texts)) and self.offset < text_length:
            out.append((entries[self.taken], self.offset))
            self.offset += len(texts[self.taken])
            self.taken += 1
        return out


def prompt_text(prompt, detokenize) -> str:
    """The prompt as text, as ``echo`` returns it: itself, or its token ids decoded."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (bytes, bytearray)):
        return bytes(prompt).decode("utf-8", "replace")
    return detokenize(list(prompt)).decode("utf-8", errors="ignore")


def text_offset_base(prompt, detokenize) -> int:
    """Where llama-cpp-python's logprobs text offsets start: after the prompt's text."""
    return len(prompt_text(prompt, detokenize))


def _token_str(tokenizer, token: int) -> str:
    return tokenizer.token_bytes(token).decode("utf-8", errors="ignore")


def _completion_logprobs(stream: TextStream, taken, offset_base: int) -> dict[str, Any]:
    tokenizer = stream.tokenizer
    tokens, offsets, values, tops = [], [], [], []
    for entry, offset in taken:
        chosen = _token_str(tokenizer, entry.token)
        tokens.append(chosen)
        offsets.append(offset_base + offset)
        values.append(entry.logprob)
        top = {_token_str(tokenizer, i): lp for i, lp in entry.top}
        top[chosen] = entry.logprob          # as llama-cpp-python: the chosen token is always listed
        tops.append(top)
    return {"tokens": tokens, "text_offset": offsets, "token_logprobs": values, "top_logprobs": tops}


def _chat_logprobs(stream: TextStream, taken) -> dict[str, Any]:
    tokenizer = stream.tokenizer

    def item(token: int, logprob: float) -> dict[str, Any]:
        return {"token": _token_str(tokenizer, token), "logprob": logprob, "bytes": list(tokenizer.token_bytes(token))}

    return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(i, lp) for i, lp in e.top]}
                        for e, _ in taken], "refusal": None}


def _usage(stream: TextStream) -> dict[str, int]:
    return {
        "prompt_tokens": stream.prompt_tokens,
        "completion_tokens": stream.completion_tokens,
        "total_tokens": stream.prompt_tokens + stream.completion_tokens,
    }


def completion(stream: TextStream, model: str, offset_base: int = 0, echo: str = "") -> dict[str, Any]:
    """A ``text_completion`` dict; ``echo`` (the prompt's text, for ``echo=True``) comes before the answer."""
    env = _Envelope(model, chat=False)
    text = stream.text()
    logprobs = None
    if stream.logprobs is not None:
        logprobs = _completion_logprobs(stream, _LogprobCursor(stream).take(len(text)), offset_base)
    return {**env.text_completion(echo + text, stream.finish_reason, logprobs), "usage": _usage(stream)}


def completion_chunks(stream: TextStream, model: str, offset_base: int = 0,
                      echo: str = "") -> Iterator[dict[str, Any]]:
    """The chunks of a streamed completion; ``echo`` comes ahead of the first delta
    (llama-cpp-python echoes only whole answers; OpenAI's streams echo too)."""
    env = _Envelope(model, chat=False)
    cursor = _LogprobCursor(stream) if stream.logprobs is not None else None
    emitted = 0
    with stream:  # closing this generator stops the generation
        for delta in stream:
            emitted += len(delta)
            logprobs = None if cursor is None else _completion_logprobs(stream, cursor.take(emitted), offset_base)
            yield env.text_completion(echo + delta, None, logprobs)
            echo = ""
        yield env.text_completion(echo, stream.finish_reason, None if cursor is None else
                                  _completion_logprobs(stream, cursor.take(emitted), offset_base))


def _finish_reason(stream: TextStream, calls: list) -> Optional[str]:
    # A call cut short by max_tokens is not a call: it stays "length" (and content).
    return "tool_calls" if calls else stream.finish_reason


def chat_completion(stream: TextStream, model: str, reply=None) -> dict[str, Any]:
    """A ``chat.completion`` dict; ``reply`` (default: the stream's own) reads reasoning and tool calls."""
    reply = reply if reply is not None else getattr(stream, "reply", None)
    env = _Envelope(model, chat=True)
    text = stream.text()
    logprobs = None if stream.logprobs is None else _chat_logprobs(stream, _LogprobCursor(stream).take(len(text)))
    message: dict[str, Any] = {"role": "assistant", "content": text}
    calls: list = []
    if reply is not None:
        parsed = reply.parse(text)
        calls = parsed.tool_calls
        message["content"] = parsed.content if (calls or reply.parses_calls) else (parsed.content or "")
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if calls:
            message["tool_calls"] = calls
    return {
        "id": env.id,
        "object": "chat.completion",
        "created": env.created,
        "model": env.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": _finish_reason(stream, calls),
        }],
        "usage": _usage(stream),
    }


def chat_completion_chunks(stream: TextStream, model: str, reply=None) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed chat completion; ``reply`` as in :func:`chat_completion`."""
    reply = reply if reply is not None else getattr(stream, "reply", None)
    if reply is not None:
        return _parsed_chunks(stream, model, reply)
    return _plain_chunks(stream, model)


def _plain_chunks(stream: TextStream, model: str) -> Iterator[dict[str, Any]]:
    env = _Envelope(model, chat=True)
    chunk = env.chat_chunk

    cursor = _LogprobCursor(stream) if stream.logprobs is not None else None
    emitted = 0
    with stream:
        yield chunk({"role": "assistant"}, None)
        for delta in stream:
            emitted += len(delta)
            yield chunk({"content": delta}, None, None if cursor is None else _chat_logprobs(stream, cursor.take(emitted)))
        yield chunk({}, stream.finish_reason, None if cursor is None else _chat_logprobs(stream, cursor.take(emitted)))


def _parsed_chunks(stream: TextStream, model: str, reply) -> Iterator[dict[str, Any]]:
    """Reasoning, content and tool-call deltas, as the reply's parser finds them.  With
    logprobs, a chunk carries the entries of the tokens read so far that no chunk has yet."""
    env = _Envelope(model, chat=True)
    chunk = env.chat_chunk
    parser = reply.stream()
    cursor = _LogprobCursor(stream) if stream.logprobs is not None else None
    emitted: list[dict] = []
    fed = 0

    def logprobs():
        return None if cursor is None else _chat_logprobs(stream, cursor.take(fed))

    def chunks_of(events) -> Iterator[dict]:
        for kind, value in events:
            if kind == "content":
                yield chunk({"content": value}, None, logprobs())
            elif kind == "reasoning":
                yield chunk({"reasoning_content": value}, None, logprobs())
            else:
                index = len(emitted)
                emitted.append(value)
                function = value["function"]
                yield chunk({"tool_calls": [{"index": index, "id": value["id"], "type": "function",
                                             "function": {"name": function["name"], "arguments": ""}}]})
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]})

    with stream:
        yield chunk({"role": "assistant"})
        for delta in stream:
            fed += len(delta)
            yield from chunks_of(parser.feed(delta))
        yield from chunks_of(parser.finish())
        yield chunk({}, _finish_reason(stream, emitted), logprobs())
