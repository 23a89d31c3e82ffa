"""WordPiece (``tokenizer.ggml.model = "bert"``): BERT, nomic-bert and other encoders.

Mirrors ``llm_tokenizer_wpm_session`` (llama-vocab.cpp).  GGUF BERT
vocabularies write a word-initial piece with a leading ``▁`` (U+2581) and a
continuation piece bare: the converter turned ``hello`` into ``▁hello`` and
``##ing`` into ``ing``.  A fragment of text is

1. normalized per code point, as llama.cpp's BertNormalizer options say
   (``tokenizer.ggml.normalizer.lowercase``, default true, and
   ``...strip_accents``, default: the lowercase flag): with strip_accents each
   code point becomes the *first* code point of its NFD (llama.cpp keeps only
   that one, so a Hangul syllable keeps its first jamo) and marks are dropped;
   NUL, U+FFFD and control / format / private-use characters are dropped
   always; then the simple lowercase mapping;
2. split into words at whitespace, with every punctuation character, ASCII
   symbol and CJK ideograph a word of its own;
3. each word, with ``▁`` in front, is covered greedily by the longest token at
   each position; a word that cannot be covered becomes the unknown token.

The code point classes are those of llama.cpp's Unicode 15.1 tables
(``_unicode_classes``), not the running Python's ``unicodedata``.
"""
from __future__ import annotations

import functools
import re
from typing import Optional, cast

from ...errors import GGUFError
from ._unicode_classes import CONTROL, LOWERCASE_PAIRS, MARK, NFD_FIRST_RANGES, PUNCTUATION
from .cache import BoundedCache
from .pretokenize import WHITESPACE
from .spm import SPACE_MARK
from .vocab import ATTR_BYTE, Vocab

# llama.cpp's is_chinese_char, its 0x2B920 start (Hugging Face's, not Unicode's 0x2B820) included.
_CJK = (r"\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
        r"\U0002b920-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f")
# ASCII characters of general category S: only these symbols are words of their own.
_ASCII_SYMBOLS = r"$+<=>\^`|~"
_ALONE = f"{PUNCTUATION}{_ASCII_SYMBOLS}{_CJK}"
_CHUNK = re.compile(f"[^{WHITESPACE}]+")
_WORD = re.compile(f"[^{WHITESPACE}{_ALONE}]+|[{_ALONE}]")
# Dropped characters; whitespace is a separator even where it is a control character (\t, \n).
_DROP = re.compile(f"(?![{WHITESPACE}])[\\x00\\ufffd{CONTROL}]")
_DROP_WITH_MARKS = re.compile(f"(?![{WHITESPACE}])[\\x00\\ufffd{CONTROL}{MARK}]")


_MISSING = -1  # not a prefix of any token (token ids are never negative)


def _hex_rows(text: str) -> list[list[int]]:
    return [[int(v, 16) for v in word.split(",")] for word in text.split()]


@functools.cache
def _lowercase_table() -> dict[int, int]:
    return {upper: lower for upper, lower in _hex_rows("".join(LOWERCASE_PAIRS))}


@functools.cache
def _nfd_first_table() -> dict[int, int]:
    return {cp: target for first, last, target in _hex_rows("".join(NFD_FIRST_RANGES))
            for cp in range(first, last + 1)}


def split_words(text: str, *, lowercase: bool, strip_accents: bool) -> list[str]:
    """The words llama.cpp's WPM ``preprocess`` makes of ``text``."""
    ascii_only = text.isascii()
    if not ascii_only:
        if strip_accents:
            text = text.translate(_nfd_first_table())
        text = (_DROP_WITH_MARKS if strip_accents else _DROP).sub("", text)
    elif not text.isprintable():  # ASCII: only C0 controls and DEL are dropped
        text = _DROP.sub("", text)
    if lowercase:
        # For ASCII, str.lower() is the simple mapping; elsewhere it is the full
        # one (U+0130 -> two code points, final sigma), which llama.cpp does not use.
        text = text.lower() if ascii_only else text.translate(_lowercase_table())
    return _WORD.findall(text)


def check_wordpiece_vocab(vocab: Vocab) -> int:
    """Refuse a BERT vocabulary llama.cpp could not tokenize with: GGUFError naming the key.
    Returns the id of its [UNK] token, which every word without a match becomes."""
    missing = [f"{role} (tokenizer.ggml.{key}; default id {default})"
               for role, name, key, default in (("[UNK]", "unk", "unknown_token_id", 100),
                                                ("[CLS]", "bos", "bos_token_id", 101),
                                                ("[SEP]", "sep", "seperator_token_id", 102))
               if vocab.special_ids.get(name) is None]
    if missing:
        raise GGUFError(f"WordPiece (bert) vocabulary of {vocab.n_vocab} tokens has no "
                        + ", no ".join(missing) + " inside it")
    byte_ids = [i for i, attr in enumerate(vocab.attrs) if attr & ATTR_BYTE]
    if byte_ids:  # llama.cpp aborts on these (token_to_byte has no WPM case)
        raise GGUFError(f"WordPiece (bert) vocabulary has byte tokens (tokenizer.ggml.token_type 6), "
                        f"e.g. id {byte_ids[0]} {vocab.tokens[byte_ids[0]]!r}")
    return cast(int, vocab.unk_id)  # present: checked with the other special tokens above


class WordPiece:
    """Text to ids for a WordPiece vocabulary (``▁``-prefixed word starts)."""

    #: chunks longer than this (in characters) are not cached
    CACHE_MAX_CHUNK = 256

    def __init__(self, token_to_id: dict[str, int], unk_id: int, *, lowercase: bool = True,
                 strip_accents: bool = True, cache_size: int = 1 << 16):
        self._token_to_id = token_to_id
        self._unk_id = unk_id
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self._prefixes: Optional[dict[str, Optional[int]]] = None  # built on first use
        self._cache: BoundedCache[tuple[int, ...]] = BoundedCache(cache_size)

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (a fragment with no special tokens) to ``out``."""
        # Whitespace separates words whatever the normalizer does (no NFD or
        # lowercase mapping turns whitespace into anything else, or back), so
        # the text is cut there first and each chunk between is cached whole.
        self._cache.extend_encoded(out, _CHUNK.findall(text), self._encode_chunk, self.CACHE_MAX_CHUNK)

    def _encode_chunk(self, chunk: str) -> tuple[int, ...]:
        ids: list[int] = []
        for word in split_words(chunk, lowercase=self.lowercase, strip_accents=self.strip_accents):
            ids += self._encode_word(word)
        return tuple(ids)

    @property
    def prefixes(self) -> dict[str, Optional[int]]:
        """Every prefix of every token -> that token's id, or None where the prefix is no token."""
        if self._prefixes is None:
            table: dict[str, Optional[int]] = {}
            for text in self._token_to_id:
                for end in range(1, len(text)):
                    table.setdefault(text[:end], None)
            table.update(self._token_to_id)
            self._prefixes = table
        return self._prefixes

    def _encode_word(self, word: str) -> tuple[int, ...]:
        """The longest token at each position, as llama.cpp's longest-first search finds it:
        scanning forward while the text read so far begins some token gives the same one."""
        word = SPACE_MARK + word
        whole = self._token_to_id.get(word)  # the common case: the longest match at 0 is all of it
        if whole is not None:
            return (whole,)
        lookup = self.prefixes.get
        n = len(word)
        ids: list[int] = []
        start = 0
        while start < n:
            best_id: Optional[int] = None
            best_end = start
            for end in range(start + 1, n + 1):
                entry = lookup(word[start:end], _MISSING)
                if entry == _MISSING:
                    break
                if entry is not None:
                    best_id, best_end = entry, end
            if best_id is None:
                return (self._unk_id,)  # one uncovered position discards the whole word
            ids.append(best_id)
            start = best_end
        return tuple(ids)
