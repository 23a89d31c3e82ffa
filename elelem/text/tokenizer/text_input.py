"""Turn what the caller passed to ``encode`` into the text the tokenizer works on.

The rules (also in the package docstring):

* input larger than :data:`MAX_INPUT_BYTES` of UTF-8 raises ``ValueError``;
* ``str`` with lone surrogates: each surrogate becomes U+FFFD;
* ``bytes`` that are not valid UTF-8: for byte-level BPE each offending byte
  becomes U+FFFD (what llama.cpp does for stray and truncated bytes); for
  SentencePiece vocabularies the offending bytes are kept (as lone surrogates
  U+DC80..U+DCFF, Python's ``surrogateescape``) for the tokenizer to split
  byte-wise as llama.cpp does, so ``decode`` gives the original bytes back.
"""
from __future__ import annotations

import codecs
import re
from typing import Union

from ...errors import InvalidArgumentError

#: Largest input ``encode`` accepts, in bytes of UTF-8 (64 MiB).
MAX_INPUT_BYTES = 64 * 1024 * 1024

_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_each_byte(error: UnicodeError) -> tuple[str, int]:
    # One U+FFFD per invalid byte, like llama.cpp's unicode_cpts_from_utf8
    # (Python's "replace" would give one per maximal invalid sequence).
    if not isinstance(error, UnicodeDecodeError):
        raise error  # a decoding handler: nothing encodes with it
    return "\ufffd" * (error.end - error.start), error.end


_ERRORS = "elelem-replace-each-byte"
codecs.register_error(_ERRORS, _replace_each_byte)


def _too_large(size: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"input of {size} bytes is larger than the tokenizer's limit of {MAX_INPUT_BYTES} bytes")


def normalize_input(text: Union[str, bytes, bytearray, memoryview], *, keep_raw_bytes: bool) -> str:
    """The text to tokenize, as ``str``.

    ``keep_raw_bytes`` (SentencePiece): invalid UTF-8 bytes become lone
    surrogates U+DC80..U+DCFF (``surrogateescape``) that the tokenizer writes out
    as byte tokens; user-supplied surrogates never reach it as such.
    """
    if isinstance(text, str):
        if len(text) > MAX_INPUT_BYTES:
            raise _too_large(len(text))
        if text.isascii():
            return text
        if len(text) * 4 > MAX_INPUT_BYTES:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > MAX_INPUT_BYTES:
                raise _too_large(size)
        return _SURROGATE.sub("\ufffd", text)
    if isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
        if len(data) > MAX_INPUT_BYTES:
            raise _too_large(len(data))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data.decode("utf-8", "surrogateescape" if keep_raw_bytes else _ERRORS)
    raise TypeError(f"text must be str or bytes, not {type(text).__name__}")
