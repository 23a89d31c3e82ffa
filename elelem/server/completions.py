"""One checked call run on a session: the library's text stream, and OpenAI's response shapes over it.

The library's ``create_chat_completion`` and ``create_completion`` build the
same dicts, but hide the stream they read, whose token counts the server
needs (``stream_options.include_usage``, ``/metrics``); so this opens the
stream with ``chat_stream``/``stream`` and builds the responses with the
library's own builders.
"""
from __future__ import annotations

from typing import Callable, Iterator

from ..api import completions as shapes
from ..api.generation import TextStream
from ..errors import InvalidArgumentError
from .schema import Call


class Answer:
    """A started call: ``whole()`` for the full response, or ``chunks()`` to stream it."""

    def __init__(self, text: TextStream, whole: Callable[[], dict], chunks: Callable[[], Iterator[dict]]):
        self.text = text
        self.whole = whole
        self.chunks = chunks

    def usage(self) -> dict:
        """OpenAI's usage, with speculative decoding's drafts in the fields of its
        Predicted Outputs: ``accepted_prediction_tokens`` were drafted and
        confirmed (each saved a step), ``rejected_prediction_tokens`` drafted and
        discarded.  The completion counts each generated token once, as before."""
        text = self.text
        return {"prompt_tokens": text.prompt_tokens, "completion_tokens": text.completion_tokens,
                "total_tokens": text.prompt_tokens + text.completion_tokens,
                "completion_tokens_details": {
                    "accepted_prediction_tokens": text.accepted_tokens,
                    "rejected_prediction_tokens": text.drafted_tokens - text.accepted_tokens}}


def start(session, call: Call, model_id: str) -> Answer:
    """Tokenize and check the call (bad input raises here, before any compute)."""
    if call.chat:
        return _chat(session, call, model_id)
    return _completion(session, call, model_id)


def _chat(session, call: Call, model_id: str) -> Answer:
    # The stream's reply parser reads the reasoning and the tool calls (text.reply; None: plain text).
    text = session.chat_stream(call.messages, tools=call.tools, tool_choice=call.tool_choice, **call.options)
    if text.reply is not None and text.reply.parses_calls and text.logprobs is not None:
        text.close()
        raise InvalidArgumentError("logprobs are not available for replies parsed into tool calls")
    return Answer(text, lambda: shapes.chat_completion(text, model_id),
                  lambda: shapes.chat_completion_chunks(text, model_id))


def _completion(session, call: Call, model_id: str) -> Answer:
    text = session.stream(call.prompt, **call.options)
    base = 0 if text.logprobs is None else shapes.text_offset_base(call.prompt, session.detokenize)
    echo = shapes.prompt_text(call.prompt, session.detokenize) if call.echo else ""
    return Answer(text, lambda: shapes.completion(text, model_id, base, echo),
                  lambda: shapes.completion_chunks(text, model_id, base, echo))
