"""The engine's call that every generation endpoint makes, and running it on a session.

Each protocol's request module checks its body and builds a :class:`Call`:
a chat (messages, tools) or a text completion (a prompt), with the
library's keyword options.  :func:`start` runs it and reads OpenAI's chat
shapes out of it, which each protocol's wire then writes in its own.

The library's ``create_chat_completion`` and ``create_completion`` build the
same dicts, but hide the stream they read, whose token counts the server
needs (``stream_options.include_usage``, ``/metrics``); so this opens the
stream with ``chat_stream``/``stream`` and builds the responses with the
library's own builders.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from ..api import completions as shapes
from ..api.generation import TextStream
from ..errors import InvalidArgumentError


@dataclass
class Call:
    """One checked request: what to run and how to answer."""

    chat: bool
    model: Optional[str]
    stream: bool = False
    include_usage: bool = False
    messages: list = field(default_factory=list)
    tools: Optional[list] = None
    tool_choice: Any = None
    prompt: Any = None
    # A prompt only the model's tokenizer can build (/infill): called on the session, it gives the prompt,
    # and may complete the options that need the vocabulary.
    build_prompt: Optional[Callable[[Any, "Call"], Any]] = None
    echo: bool = False
    options: dict = field(default_factory=dict)   # max_tokens, stop and sampling, as the library takes them


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
        discarded.  The completion counts each generated token once."""
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
    if call.build_prompt is not None:
        call.prompt = call.build_prompt(session, call)
    text = session.stream(call.prompt, **call.options)
    base = 0 if text.logprobs is None else shapes.text_offset_base(call.prompt, session.detokenize)
    echo = shapes.prompt_text(call.prompt, session.detokenize) if call.echo else ""
    return Answer(text, lambda: shapes.completion(text, model_id, base, echo),
                  lambda: shapes.completion_chunks(text, model_id, base, echo))
