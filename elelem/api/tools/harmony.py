"""gpt-oss's harmony format: a reply is messages on channels.

After the prompt's ``<|start|>assistant``, the model writes one message or
several, each a header, ``<|message|>`` and a body, the next one after
``<|end|><|start|>assistant``::

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
    <|start|>assistant<|channel|>final<|message|>It is sunny.

* ``analysis``: the reasoning (``reasoning_content``);
* ``commentary to=functions.NAME``: a call, its body the arguments' JSON
  (the recipient may also come before the channel, as the template writes
  it: ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``);
  ``<|call|>`` ends it and the generation;
* ``final``, and ``commentary`` with no recipient (a preamble): the content.

``<|channel|>``, ``<|message|>``, ``<|start|>``, ``<|end|>`` and
``<|constrain|>`` are control tokens: the reply's text shows them (preserved
tokens, as llama.cpp's); ``<|return|>`` and ``<|call|>`` end the generation
and are never in the text.  With ``reasoning_format="none"`` the analysis
messages stay in the content, markup included, as llama.cpp gives them.  A
reply that does not follow the format is content; so is a call whose
arguments are not JSON or whose function is not among the tools.

Constrained: ``<|channel|>`` forced, then the analysis message the model
may write first (free text), then ``commentary to=functions.NAME
<|constrain|>json<|message|>`` and JSON valid against the function's schema.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Optional, Sequence

from ...sampling.constrained import Forced
from ...sampling.lazy import Trigger
from .base import CallStream, Event, JsonEnd, ToolCallParser, ToolSpecs, load_json, partial_suffix, tool_call_dict
from .constrained import Rules, call_choice, json_expr, lark_string, parameters_schema

log = logging.getLogger("elelem")

CHANNEL, MESSAGE, START, END = "<|channel|>", "<|message|>", "<|start|>", "<|end|>"
CONSTRAIN = "<|constrain|>"
_BODY_ENDS = (END, START, "<|call|>", "<|return|>")
_HEADER_STARTS = (CHANNEL, " to=", "to=", START)
_MAX_HEADER = 256
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")

_HEADER, _BODY, _CONTENT = "header", "body", "content"
_FREE_TEXT = "/(.|\\n)*/"


class HarmonyParser(ToolCallParser):
    name = "harmony"
    start_tag = CHANNEL
    preserved_tokens = (CHANNEL, MESSAGE, START, END, CONSTRAIN)
    handles_reasoning = True
    reasoning_as_thinking = True

    def stream(self, tool_names: Any = (), *, extract_reasoning: bool = True,
               parse_calls: bool = True) -> "HarmonyStream":
        return HarmonyStream(ToolSpecs.of(tool_names), extract_reasoning, parse_calls)

    def parse_call(self, body: str) -> Optional[dict]:
        reply = self.parse(body)
        return reply.tool_calls[0] if len(reply.tool_calls) == 1 else None

    def constraint_phases(self, functions: Sequence[Mapping[str, Any]], vocab) -> list:
        rules = Rules()
        message, end, start = vocab.lit(MESSAGE), vocab.lit(END), vocab.lit(START)
        if END in vocab.control:  # plain text cannot hold a control token: free text ends at <|end|>
            reasoning = rules.add(_FREE_TEXT, "free") + " " + end
        else:
            reasoning = rules.text_until(END)
        analysis = f'("analysis" {message} {reasoning} {start} "assistant" {vocab.lit(CHANNEL)})?'
        calls = call_choice(functions, rules, lambda function: (
            f"{lark_string(function['name'])} {vocab.lit(' ' + CONSTRAIN + 'json' + MESSAGE)} "
            f"{json_expr(parameters_schema(function))}"))
        grammar = rules.grammar(f'{analysis} "commentary to=functions." ({calls})')
        return [Forced(vocab.encode(CHANNEL)), grammar]

    def call_triggers(self, functions: Sequence[Mapping[str, Any]], vocab, *, required: bool) -> list:
        # Every message starts with <|channel|>: a required call is held from the first one
        # (an analysis message may come first, see constraint_phases); under "auto" only a
        # message to a function is a call.
        marker = CHANNEL if required else CHANNEL + "commentary to=functions."
        return [Trigger.word(marker, self.constraint_phases(functions, vocab))]


class HarmonyStream(CallStream):
    def __init__(self, tools: ToolSpecs, extract_reasoning: bool, parse_calls: bool):
        super().__init__()
        self._tools = tools
        self._extract = extract_reasoning
        self._parse_calls = parse_calls
        self._mode = _HEADER
        self._buffer = ""
        self._header = ""
        self._kind = ""        # the body's: "reasoning", "content", "call", "other"
        self._name = ""
        self._body = ""        # a call's body so far
        self._json = JsonEnd()  # where a call's JSON closes, scanned as it arrives

    def finish(self) -> list[Event]:
        events: list[Event] = []
        self._drain(events, final=True)
        rest, self._buffer = self._buffer, ""
        if self._mode == _HEADER and rest:
            self._emit(events, "content", rest)  # a header that never ended: not the format
        elif self._mode == _BODY:
            if self._kind == "call":
                self._body += rest
            else:
                self._body_text(rest, events)
            self._end_body(events)
        elif self._mode == _CONTENT:
            self._emit(events, "content", rest)
        return events

    # -- internals ---

    def _drain(self, events: list[Event], final: bool) -> None:
        while self._buffer:
            if self._mode == _CONTENT:
                # Plain text, up to a message the model opens after it (a forced call, say).  Its first
                # character is text whatever it is: the header read there failed.
                at, _ = _first(self._buffer[1:], (CHANNEL, START))
                at = at + 1 if at >= 0 else -1
                keep = 0 if at >= 0 or final else partial_suffix(self._buffer, (CHANNEL, START))
                end = at if at >= 0 else len(self._buffer) - keep
                self._emit(events, "content", self._buffer[:end])
                self._buffer = self._buffer[end:]
                if at < 0:
                    return
                self._mode = _HEADER
                continue
            if self._mode == _HEADER:
                if not self._read_header(events):
                    return
                continue
            # a body: it ends at a marker, or (a call's) where its JSON closes
            at, marker = _first(self._buffer, _BODY_ENDS)
            keep = 0 if at >= 0 or final else partial_suffix(self._buffer, _BODY_ENDS)
            commit = self._buffer[:at] if at >= 0 else self._buffer[:len(self._buffer) - keep]
            if self._kind == "call":
                base = len(self._body)
                self._body += commit
                json_end = self._json.scan(self._body)
                if json_end is not None and json_end >= 0:  # the arguments are whole: so is the call
                    self._buffer = self._buffer[json_end - base:]
                    self._body = self._body[:json_end]
                    self._end_body(events)
                    self._mode = _HEADER
                    continue
            else:
                self._body_text(commit, events)
            self._buffer = self._buffer[len(commit):]
            if at < 0:
                return
            if marker == END and self._kind == "reasoning" and not self._extract:
                self._emit(events, "content", END)
            self._buffer = self._buffer[(len(marker) if marker != START else 0):]
            self._end_body(events)
            self._mode = _HEADER

    def _read_header(self, events: list[Event]) -> bool:
        """Read a header from the buffer; False while it is incomplete."""
        stripped = self._buffer.lstrip()
        if not stripped:
            return False
        for skipped in (END, "<|call|>", START + "assistant"):  # the end of a call, the next message's opening
            if stripped.startswith(skipped):
                self._buffer = stripped[len(skipped):]
                return True
            if skipped.startswith(stripped):
                return False
        if not any(h.startswith(stripped[:len(h)]) for h in _HEADER_STARTS):
            self._mode = _CONTENT  # not a harmony header: a model that writes plain text
            return True
        at = self._buffer.find(MESSAGE, 0, _MAX_HEADER + len(MESSAGE))
        if at < 0:
            if len(self._buffer) >= _MAX_HEADER + len(MESSAGE):
                self._mode = _CONTENT
                return True
            return False
        header = self._buffer[:at]
        self._buffer = self._buffer[at + len(MESSAGE):]
        self._header = header
        self._open_body(header, events)
        return True

    def _open_body(self, header: str, events: list[Event]) -> None:
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        channel_name = channel.group(1) if channel else ""
        self._mode, self._body, self._name = _BODY, "", ""
        self._json = JsonEnd()
        if recipient is not None and recipient.group(1) != "assistant":
            target = recipient.group(1)
            if self._parse_calls and target.startswith("functions."):
                self._kind, self._name = "call", target[len("functions."):]
            else:
                self._kind = "other"
        elif channel_name == "analysis":
            self._kind = "reasoning"
            if not self._extract:
                self._emit(events, "content", header + MESSAGE)
        else:  # final, a commentary preamble, or a channel we do not know: the text of the reply
            self._kind = "content"

    def _body_text(self, text: str, events: list[Event]) -> None:
        if not text:
            return
        if self._kind in ("call", "other"):
            self._body += text
        elif self._kind == "reasoning" and self._extract:
            self._emit(events, "reasoning", text)
        else:
            self._emit(events, "content", text)

    def _end_body(self, events: list[Event]) -> None:
        if self._kind in ("call", "other"):
            call = None
            if self._kind == "call":
                ok, arguments = load_json(self._body)
                if ok and isinstance(arguments, dict) and self._tools.known(self._name):
                    call = tool_call_dict(self._name, arguments)
            if call is not None:
                self.calls.append(call)
                events.append(("tool_call", call))
            else:
                if self._kind == "call":
                    log.warning("a harmony tool call in the reply is malformed or names an unknown function; it "
                                "is returned as content: %.200r", self._header + MESSAGE + self._body)
                self._emit(events, "content", self._header + MESSAGE + self._body)
        self._kind, self._body = "", ""

    @staticmethod
    def _emit(events: list[Event], kind: str, text: str) -> None:
        if text:
            events.append((kind, text))


def _first(text: str, markers: Sequence[str]) -> tuple[int, str]:
    best, found = -1, ""
    for marker in markers:
        i = text.find(marker)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, marker
    return best, found


def matches(source: str) -> bool:
    return CHANNEL in source

