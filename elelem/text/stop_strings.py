"""Stop strings: cut generated text at the first one to complete, and never leak a part of one.

While streaming, text that could be the start of a stop string is held back
until the next delta shows whether it is (then it is dropped, with everything
after it) or is not (then it is released).  So a consumer never sees even the
first characters of a stop string.
"""
from __future__ import annotations

from typing import Iterable, Optional, Union

from ..errors import InvalidArgumentError

StopArg = Union[str, Iterable[str], None]


def normalize_stop(stop: StopArg) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (a lone string is one stop string)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    try:
        items = list(stop)
    except TypeError:
        raise InvalidArgumentError(f"stop must be a string or a list of strings, got {type(stop).__name__}") from None
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgumentError(f"stop strings must be str, got {item!r}")
    # An empty stop string would match before the first character: ignore it, as llama.cpp does.
    return tuple(dict.fromkeys(s for s in items if s))


class StopStringFilter:
    """Feed text deltas, get back the part that is certainly not (part of) a stop string."""

    def __init__(self, stops: Iterable[str]):
        self.stops = tuple(stops)
        self.stopped = False
        self._held = ""

    def push(self, text: str) -> str:
        """The text that can be released now; after a stop string is seen, always ``""``."""
        if self.stopped or not text:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        cut = _first_match(buffer, self.stops)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return buffer[:cut]
        keep = partial_suffix(buffer, self.stops)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep]

    def flush(self) -> str:
        """End of text: what was held back was not a stop string after all."""
        held, self._held = ("" if self.stopped else self._held), ""
        return held


def _first_match(text: str, stops: tuple[str, ...]) -> Optional[int]:
    """Where to cut ``text``: at the stop string that is complete first as the
    text grows (the earliest end; at one end, the earliest start), so that the
    cut does not depend on how the text arrived in pieces (``"a<b"`` with stop
    strings ``"<"`` and ``"a<b"`` is cut after ``"a"``, in one piece or two)."""
    found = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stops) if i >= 0]
    return min(found)[1] if found else None


def partial_suffix(text: str, tags: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one
    of ``tags`` (a stop string, a tool call's tag): text to hold back until
    the next piece says whether the tag follows."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best
