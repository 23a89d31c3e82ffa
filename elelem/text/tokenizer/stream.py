"""Incremental detokenization for streaming generation."""
from __future__ import annotations

import codecs
from typing import Callable, Iterable, Union

# The decoder is handed the two functions it needs rather than the Tokenizer, so
# this module does not import tokenizer.py (which imports it): no import cycle.
#: ``decode_continue(ids, special, state) -> bytes``: the bytes of ``ids`` after
#: what ``state`` says was decoded before; updates ``state`` in place.
DecodeContinue = Callable[[Iterable[int], bool, list], bytes]
#: ``start_state() -> state``: the state at the start of a text.
StartState = Callable[[], list]


class StreamDecoder:
    """Feed token ids, get text back as soon as it is complete UTF-8.

    A character whose bytes arrive in several tokens (an emoji as byte tokens)
    comes out whole once its last byte arrives, never as U+FFFD.  Call
    :meth:`flush` at the end: bytes still waiting for the rest of their
    character come out as U+FFFD then.  The concatenated output equals
    ``tokenizer.decode(all_ids, special=...).decode("utf-8", "replace")``.
    """

    def __init__(self, decode_continue: DecodeContinue, start_state: StartState, *, special: bool = False):
        self._decode_continue = decode_continue
        self._start_state = start_state
        self.special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._state = start_state()

    def feed(self, ids: Union[int, Iterable[int]]) -> str:
        """Add one id or several; return the text they complete (maybe ``""``)."""
        if not hasattr(ids, "__iter__"):
            ids = (ids,)
        data = self._decode_continue(ids, self.special, self._state)
        return self._decoder.decode(data) if data else ""

    def flush(self) -> str:
        """End of stream: whatever is pending, incomplete characters as U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        self._state = self._start_state()
        return text
