"""What each token id detokenizes to, as ``llama_vocab::impl::token_to_piece``.

* control and unknown tokens: nothing, or their text when ``special=True``;
* user-defined tokens: their text, always;
* normal tokens: the piece with GPT-2 byte characters turned back into bytes
  (byte-level BPE), or with ``▁`` turned back into spaces (SentencePiece,
  WordPiece);
* byte tokens ``<0xNN>``: that byte;
* anything else (unused, undefined): nothing.
"""
from __future__ import annotations

from .bpe import CHAR_TO_BYTE
from .spm import SPACE_MARK, byte_of_token
from .vocab import (ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED,
                    Vocab)

# GPT-2 byte character -> Latin-1 character of its byte, for str.translate.
_DECODE_TABLE = {ord(c): chr(b) for c, b in CHAR_TO_BYTE.items()}
# Characters at most U+00FF that are *not* GPT-2 byte characters would survive the
# translation and be mistaken for bytes; send them to a character Latin-1 can't encode.
for _cp in range(0x100):
    if chr(_cp) not in CHAR_TO_BYTE:
        _DECODE_TABLE[_cp] = "\uffff"
del _cp


def byte_level_decode(text: str) -> bytes:
    """The bytes a byte-level BPE piece stands for."""
    try:
        return text.translate(_DECODE_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        # Not a byte-level piece (llama.cpp writes an "[UNK_BYTE_...]" marker
        # here); keep the characters that are not byte characters as UTF-8.
        return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode("utf-8")
                        for c in text)


def build_pieces(vocab: Vocab) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """Pieces of every token: (with special=False, with special=True), as tuples
    (which the cyclic GC stops visiting, see :class:`~.vocab.Vocab`)."""
    byte_level = vocab.model == "gpt2"
    plain: list[bytes] = []
    special: list[bytes] = []
    for text, attr in zip(vocab.tokens, vocab.attrs):
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN):
            piece = text.encode("utf-8")
            plain.append(b"")
            special.append(piece)
            continue
        if attr & ATTR_USER_DEFINED:
            piece = text.encode("utf-8")
        elif attr & ATTR_NORMAL:
            piece = byte_level_decode(text) if byte_level else text.replace(SPACE_MARK, " ").encode("utf-8")
        elif attr & ATTR_BYTE:
            value = byte_of_token(text)
            piece = b"" if value is None else bytes([value])
        else:
            piece = b""
        plain.append(piece)
        special.append(piece)
    return tuple(plain), tuple(special)
