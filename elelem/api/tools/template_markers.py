"""A tool-call format read off a chat template: render a probe, see where its calls land.

llama.cpp's autoparser (``common/chat-diff-analyzer.cpp``) renders a template
with and without tool calls and reads the call markup from the difference,
so a model whose template writes a new markup needs no new parser.  This is
the same idea, for the shapes most templates write:

* ``tagged`` -- the name, then each argument between markers::

      <minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE</parameter>\\n</invoke>\\n</minimax:tool_call>
      <seed:tool_call>\\n<function=NAME>\\n<parameter=KEY>VALUE</parameter>\\n</function>\\n</seed:tool_call>

* ``named_json`` -- the name, then the arguments as one JSON object (DeepSeek V3.1's
  ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``);
* ``object_json`` -- each call a JSON object with its name and arguments (Hermes' and
  Granite's ``<tool_call>``, Nemotron Nano 2's ``<TOOLCALL>[...]</TOOLCALL>``,
  MiniMax-M1's ``<tool_calls>``).

The probe is one assistant turn with two calls (two arguments, then one; all
strings), each name, key and value a sentinel, rendered in elelem's own
sandbox beside the same conversation whose assistant turn is plain text:
what differs is the call markup.  The markers around the sentinels are read
by comparing the two calls and the two arguments: the text every call starts
with, the text between a call's name and its first key, and so on, as
llama.cpp compares its renders.  A template that does not write the probe's
calls back (it drops them, or writes them in a shape not listed here) gives
no markers; the format is then chosen otherwise.
"""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any, Optional

from ...text.chat_template import ChatTemplate
from .base import json_end, load_json

log = logging.getLogger("elelem")

TAGGED, NAMED_JSON, OBJECT_JSON = "tagged", "named_json", "object_json"

# The probe's sentinels: words no template writes on its own.
_NAMES = ("zqfuncalpha", "zqfuncbeta")
_KEYS = (("zqkeyone", "zqkeytwo"), ("zqkeythree",))
_VALUES = (("zqvalone", "zqvaltwo"), ("zqvalthree",))
_CONTENT = "zqplaincontent"


@dataclass(frozen=True)
class Markers:
    """The call markup of one template, as rendered (whitespace included).

    A reply's calls are ``section_open``, then calls separated by ``separator``,
    then ``section_close``; a call is ``call_open`` NAME ``name_close`` ARGUMENTS
    ``call_close`` (``object_json``: ``call_open`` JSON ``call_close``); a tagged
    argument is ``key_open`` KEY ``key_close`` VALUE ``value_close``."""

    shape: str
    section_open: str
    section_close: str
    call_open: str
    call_close: str
    separator: str
    name_close: str = ""
    key_open: str = ""
    key_close: str = ""
    value_close: str = ""

    @property
    def start(self) -> str:
        """The marker a reply's calls start with in free text (the first word of the markup)."""
        return _first_word(self.section_open or self.call_open)

    @property
    def end(self) -> str:
        """The marker the calls' markup ends with (empty: it ends with the last call)."""
        return _last_word(self.section_close or self.call_close)

    @property
    def tokens(self) -> tuple[str, ...]:
        """The words of the markup that a model's vocabulary may hold as control tokens."""
        words: list[str] = []
        for marker in (self.section_open, self.call_open, self.name_close, self.key_open, self.key_close,
                       self.value_close, self.call_close, self.section_close):
            for word in re.findall(r"<[^<>\s]+>", marker):
                if word not in words:
                    words.append(word)
        return tuple(words)


_TAG = re.compile(r"<[^<>\s]+>|\[[A-Z_]+\]")


def _first_word(marker: str) -> str:
    words = marker.split()
    word = words[0] if words else ""
    tag = _TAG.match(word)  # the first tag of several written together; not Nemotron Nano 2's "[" after its tag
    return tag.group(0) if tag else word.rstrip("[{")


def _last_word(marker: str) -> str:
    words = marker.split()
    word = words[-1] if words else ""
    tags = _TAG.findall(word)
    if tags and word.startswith(tags[0]):
        return tags[0]  # DeepSeek's section end, written together with the end of the turn
    word = word.lstrip("]}")
    tag = _TAG.match(word)
    if tag:
        return tag.group(0)
    # a tag cut where the probe's renders meet again (Functionary's "<|eom"): no end marker
    return "" if word.startswith("<") else word


def _probe_tools() -> list[dict]:
    return [{"type": "function", "function": {
        "name": name, "description": "A probe.",
        "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in keys},
                       "required": list(keys)}}}
        for name, keys in zip(_NAMES, _KEYS)]


def _probe_calls() -> list[dict]:
    return [{"id": f"call_zq{i}", "type": "function",
             "function": {"name": name, "arguments": dict(zip(keys, values))}}
            for i, (name, keys, values) in enumerate(zip(_NAMES, _KEYS, _VALUES))]


def _conversation(assistant: dict, results: bool) -> list[dict]:
    # A later user turn follows, so that the assistant turn is not the last (templates treat the
    # last turn apart) and ends where the two renders meet again; with ``results``, the calls'
    # results come first (some templates require them after calls, others refuse them after text).
    tool_turns = [{"role": "tool", "tool_call_id": f"call_zq{i}", "content": f"zqresult{i}"} for i in range(2)]
    return [{"role": "user", "content": "zquserquestion"}, assistant, *(tool_turns if results else ()),
            {"role": "user", "content": "zquserfollowup"}]


def call_region(source: str, bos_token: str = "", eos_token: str = "") -> Optional[str]:
    """The text a template writes for the probe's two calls where it would write plain content
    (None: it fails, or writes no call)."""
    try:
        template = ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
    except Exception as error:  # noqa: BLE001 -- a template that does not compile shows no markers
        log.debug("the chat template does not compile: %s", error)
        return None
    tools = _probe_tools()
    for results in (False, True):
        try:
            with_calls = template.render(_conversation({"role": "assistant", "content": None,
                                                        "tool_calls": _probe_calls()}, results),
                                         tools=tools, add_generation_prompt=False)
            plain = template.render(_conversation({"role": "assistant", "content": _CONTENT}, results),
                                    tools=tools, add_generation_prompt=False)
        except Exception as error:  # noqa: BLE001 -- a template may refuse the probe in any way
            log.debug("the chat template does not render the tool-call probe: %s", error)
            continue
        head = _common_prefix(with_calls, plain)
        tail = _common_suffix(with_calls[len(head):], plain[len(head):])
        region = with_calls[len(head):len(with_calls) - len(tail)]
        if _NAMES[0] in region and _NAMES[1] in region:
            return region
    return None


@functools.lru_cache(maxsize=32)
def derive(source: str) -> Optional[Markers]:
    """The call markup a chat template writes, or None when it shows none of the shapes."""
    if not source or not isinstance(source, str):
        return None
    region = call_region(source)
    if region is None:
        return None
    try:
        markers = _analyse(region)
    except (ValueError, IndexError):
        markers = None
    if markers is None or not markers.start:
        return None  # no marker to find a call by in free text (Llama 3's bare JSON)
    return markers


# -- reading the markers off the probe's calls ---------------------------------------

def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n:]


def _opening(text: str) -> str:
    """A common suffix cut to start where markup can start (not inside the previous tag):
    at whitespace, or at an opening bracket."""
    i = 0
    while i < len(text) and not (text[i].isspace() or text[i] in "<[{"):
        i += 1
    return text[i:]


def _closing(text: str) -> str:
    """A common prefix cut to end where markup can end (a closing bracket, or whitespace)."""
    i = len(text)
    while i > 0 and not (text[i - 1].isspace() or text[i - 1] in ">]}"):
        i -= 1
    return text[:i]


def _find_all(region: str, words: list[str]) -> Optional[list[tuple[int, int]]]:
    """The spans of ``words`` in ``region``, each after the last (None: not there in order)."""
    spans, at = [], 0
    for word in words:
        i = region.find(word, at)
        if i < 0:
            return None
        spans.append((i, i + len(word)))
        at = i + len(word)
    return spans


def _split_calls(prefix: str, between: str, suffix: str) -> Optional[tuple[str, str, str, str, str]]:
    """(section_open, call_open, call_close, separator, section_close) from the text before the
    first call, between the two, and after the last: the text every call starts with is what the
    text before the first and before the second share at their ends, and so on."""
    call_open = _opening(_common_suffix(prefix, between))
    section_open = prefix[:len(prefix) - len(call_open)]
    rest = between[:len(between) - len(call_open)]
    call_close = _closing(_common_prefix(rest, suffix))
    separator = rest[len(call_close):]
    section_close = suffix[len(call_close):]
    if separator.strip() not in ("", ","):
        return None
    return section_open, call_open, call_close, separator, section_close


def _analyse(region: str) -> Optional[Markers]:
    keys = [k for ks in _KEYS for k in ks]
    values = [v for vs in _VALUES for v in vs]
    words = [_NAMES[0], keys[0], values[0], keys[1], values[1], _NAMES[1], keys[2], values[2]]
    spans = _find_all(region, words)
    if spans is None:
        return None
    (n1, n1e), (k1, k1e), (v1, v1e), (k2, _), (_, v2e), (n2, n2e), (k3, _), (_, v3e) = spans
    if _is_json_key(region, k1, k1e):
        objects = _json_objects(region, n1, n2)
        if objects is not None:
            (o1, o1e), (o2, o2e) = objects
            split = _split_calls(region[:o1], region[o1e:o2], region[o2e:])
            return None if split is None else Markers(OBJECT_JSON, split[0], split[4], split[1], split[2], split[3])
        args1, args2 = _json_after(region, n1e, k1), _json_after(region, n2e, k3)
        if args1 is None or args2 is None:
            return None
        name_close = region[n1e:args1[0]]
        if region[n2e:args2[0]] != name_close:
            return None
        split = _split_calls(region[:n1], region[args1[1]:n2], region[args2[1]:])
        return None if split is None else Markers(NAMED_JSON, split[0], split[4], split[1], split[2], split[3],
                                                  name_close=name_close)
    # tagged: what precedes every key, and what follows every value
    key_open = _opening(_common_suffix(region[n1e:k1], region[v1e:k2]))
    if not key_open.strip():
        return None
    name_close = region[n1e:k1][:k1 - n1e - len(key_open)]
    value_close = region[v1e:k2][:k2 - v1e - len(key_open)]
    key_close = region[k1e:v1]
    if not value_close.strip() or region[n2e:k3] != name_close + key_open:
        return None
    if not (region.startswith(value_close, v2e) and region.startswith(value_close, v3e)):
        return None
    split = _split_calls(region[:n1], region[v2e + len(value_close):n2], region[v3e + len(value_close):])
    if split is None:
        return None
    return Markers(TAGGED, split[0], split[4], split[1], split[2], split[3], name_close=name_close,
                   key_open=key_open, key_close=key_close, value_close=value_close)


def _is_json_key(region: str, at: int, end: int) -> bool:
    return at > 0 and region[at - 1] == '"' and re.match(r'"\s*:', region[end:]) is not None


def _json_objects(region: str, n1: int, n2: int) -> Optional[list[tuple[int, int]]]:
    """The spans of the two calls written as JSON objects that hold their names, or None."""
    spans: list[tuple[int, int]] = []
    for name, at, low in ((_NAMES[0], n1, 0), (_NAMES[1], n2, None)):
        low = spans[0][1] if low is None else low
        found = None
        for start in (m.start() for m in re.finditer(r"\{", region[low:at])):
            start += low
            end = json_end(region, start)
            if end is None or end < 0:
                continue
            ok, value = load_json(region[start:end])
            if ok and isinstance(value, dict) and value.get("name") == name:
                found = (start, end)
                break
        if found is None:
            return None
        spans.append(found)
    return spans


def _json_after(region: str, name_end: int, key_at: int) -> Optional[tuple[int, int]]:
    """The span of the JSON object of arguments written after a name (the first key inside it)."""
    start = region.rfind("{", name_end, key_at)
    if start < 0:
        return None
    end = json_end(region, start)
    if end is None or end < 0:
        return None
    ok, value = load_json(region[start:end])
    return (start, end) if ok and isinstance(value, dict) else None


def describe(markers: Any) -> str:
    """A one-line description, for logs."""
    if not isinstance(markers, Markers):
        return "no markers"
    return (f"{markers.shape}: {markers.section_open!r} {markers.call_open!r} NAME {markers.name_close!r} "
            f"{markers.key_open!r} KEY {markers.key_close!r} VALUE {markers.value_close!r} "
            f"{markers.call_close!r} {markers.separator!r} {markers.section_close!r}")


# -- reasoning markup -------------------------------------------------------------------

_REASONING = "zqreasoningtext"
# What a reasoning tag is called (<think>, <seed:think>, <|START_THINKING|>, [THINK], <thought>):
# a template may write the reasoning inside other markup (a message's channel), which is not its own.
_REASONING_WORD = re.compile(r"think|thought|reason", re.IGNORECASE)


@functools.lru_cache(maxsize=32)
def derive_reasoning(source: str) -> Optional[tuple[str, str]]:
    """The markers a chat template writes around an assistant turn's ``reasoning_content``, as
    (start, end), or None when it writes none (or none that look like markup).

    As llama.cpp's analysis of reasoning (``analyze_reasoning``, chat-diff-analyzer.cpp): the turn
    rendered with and without its reasoning; what the reasoning adds, around the reasoning's text,
    is the markup."""
    if not source or not isinstance(source, str):
        return None
    try:
        template = ChatTemplate(source)
    except Exception:  # noqa: BLE001 -- a template that does not compile shows no markers
        return None
    turns = []
    for reasoning in (_REASONING, None):
        assistant = {"role": "assistant", "content": _CONTENT}
        if reasoning is not None:
            assistant["reasoning_content"] = reasoning
        try:
            # the turn after the last user message: the one templates keep the reasoning of
            turns.append(template.render([{"role": "user", "content": "zquserquestion"}, assistant],
                                         add_generation_prompt=False, enable_thinking=True))
        except Exception as error:  # noqa: BLE001 -- a template may refuse the probe in any way
            log.debug("the chat template does not render the reasoning probe: %s", error)
            return None
    with_reasoning, plain = turns
    head = _common_prefix(with_reasoning, plain)
    tail = _common_suffix(with_reasoning[len(head):], plain[len(head):])
    region = with_reasoning[len(head):len(with_reasoning) - len(tail)]
    at = region.find(_REASONING)
    if at < 0 or region.count(_REASONING) != 1:
        return None
    # the text both renders share may hold the markers (a template that writes an empty block
    # without reasoning): the start is the tag before the reasoning, the end the tag after it
    start = _opening_tag(head, region[:at])
    after = (region[at + len(_REASONING):] + tail).lstrip()
    end_tag = _TAG.match(after)
    if not start or end_tag is None or not _TAG.fullmatch(start) or not _REASONING_WORD.search(start):
        return None
    return start, end_tag.group(0)


def _opening_tag(head: str, before: str) -> str:
    """The reasoning's opening marker: the text before it in the render, back to where its tag opens."""
    text = (head + before).rstrip()
    at = max(text.rfind("<"), text.rfind("["))
    return text[at:] if at >= 0 else ""
