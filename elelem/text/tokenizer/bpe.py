"""Byte-level BPE (``tokenizer.ggml.model = "gpt2"``): GPT-2, Qwen2, Llama 3, SmolLM; and
Gemma 4's BPE over SentencePiece-style pieces (``"gemma4"``, at the end).

Text is split into words by the pre-tokenizer, each word's UTF-8 bytes are
written with GPT-2's byte-to-character table, and adjacent symbols are merged by
rank (the position of ``"left right"`` in ``tokenizer.ggml.merges``) as
``llm_tokenizer_bpe_session::tokenize`` does.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional, Sequence

from ...gguf.short_holds import dict_in_slices
from .cache import BoundedCache
from .merge import merge
from .pretokenize import PreTokenizer


def _byte_to_char() -> list[str]:
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the other
    bytes take the code points from U+0100 on, in byte order."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = [], 0
    for b in range(256):
        if b in printable:
            table.append(chr(b))
        else:
            table.append(chr(0x100 + extra))
            extra += 1
    return table


BYTE_TO_CHAR: list[str] = _byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}

# str.translate table: a Latin-1 decoded byte -> its GPT-2 character.
_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(text: str) -> str:
    """``text``'s UTF-8 bytes as GPT-2 byte characters."""
    return text.encode("utf-8").decode("latin-1").translate(_ENCODE_TABLE)


class ByteLevelBPE:
    """Words to ids for a byte-level BPE vocabulary."""

    #: words longer than this (in characters) are not cached
    CACHE_MAX_WORD = 256

    def __init__(self, token_to_id: Mapping[str, int], merges: Sequence[str],
                 pretokenizer: PreTokenizer, *, cache_size: int = 1 << 16):
        self._token_to_id = token_to_id
        self._merges = merges
        self._ranks: Optional[dict[str, int]] = None  # built on first use
        self.pretokenizer = pretokenizer
        self._cache: BoundedCache[tuple[int, ...]] = BoundedCache(cache_size)

    @property
    def ranks(self) -> dict[str, int]:
        """Merge rule text ``"left right"`` -> rank.

        llama.cpp splits each rule at its first space after the first character.
        Byte-level symbols never contain a space (U+0020 is written ``Ġ``), so
        looking up ``left + " " + right`` finds exactly the rule llama.cpp
        parsed into that pair, and rules it could not parse never match.
        """
        if self._ranks is None:
            n = len(self._merges)
            # Reversed, so that the first of duplicate rules wins, as in llama.cpp.
            self._ranks = dict_in_slices(zip(reversed(self._merges), range(n - 1, -1, -1)))
            self._merges = ()  # no longer needed
        return self._ranks

    def build_tables(self) -> None:
        """The merge ranks, now rather than at the first encode."""
        self.ranks

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (a fragment with no special tokens) to ``out``."""
        self._cache.extend_encoded(out, self.pretokenizer.split(text), self._encode_word, self.CACHE_MAX_WORD)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        encoded = byte_encode(word)
        lookup = self._token_to_id.get
        whole = lookup(encoded)
        if whole is not None and (len(encoded) == 1 or self.pretokenizer.ignore_merges):
            return (whole,)
        parts = merge(list(encoded), self.ranks, " ")
        ids = []
        for part in parts:
            token_id = lookup(part)
            if token_id is not None:
                ids.append(token_id)
                continue
            # No such token (only in odd vocabularies): llama.cpp then looks up
            # each byte of the piece's UTF-8 as a one-byte token and drops misses.
            for b in part.encode("utf-8"):
                single = lookup(chr(b)) if b < 0x80 else None
                if single is not None:
                    ids.append(single)
        return tuple(ids)


# Gemma 4's tokenizer (``tokenizer.ggml.model = "gemma4"``): llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_GEMMA4 path of llm_tokenizer_bpe_session.
SPACE_MARK = "\u2581"
_LINES = re.compile(r"[^\n]+|\n+")


class SentencePieceStyleBPE:
    """Words to ids for Gemma 4's vocabulary: BPE merges by rank, as byte-level
    BPE, but over raw UTF-8 characters with spaces written ``▁`` (SentencePiece
    style), and ``<0xNN>`` tokens for bytes no piece covers.

    As llama.cpp: every space becomes ``▁`` (escape_whitespaces), the text is
    split into runs of newlines and runs of anything else (the only split its
    regex ``[^\\n]+|[\\n]+`` makes), a run of newlines that is itself a token
    is that token (llama.cpp#21343), every other run is merged from its
    characters by rank, and a piece with no token is written byte by byte as
    ``<0xNN>`` tokens (bytes without one are dropped)."""

    CACHE_MAX_WORD = 256

    def __init__(self, token_to_id: Mapping[str, int], merges: Sequence[str], *, cache_size: int = 1 << 16):
        self._token_to_id = token_to_id
        self._merges = merges
        self._ranks: Optional[dict[str, int]] = None
        self._cache: BoundedCache[tuple[int, ...]] = BoundedCache(cache_size)

    @property
    def ranks(self) -> dict[str, int]:
        """Merge rule text ``"left right"`` -> rank (first of duplicates wins).
        Symbols never hold a space (spaces are ``▁`` by then), so ``left + " "
        + right`` finds exactly the rule llama.cpp parsed into that pair."""
        if self._ranks is None:
            n = len(self._merges)
            self._ranks = dict_in_slices(zip(reversed(self._merges), range(n - 1, -1, -1)))
            self._merges = ()
        return self._ranks

    def build_tables(self) -> None:
        """The merge ranks, now rather than at the first encode."""
        self.ranks

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (a fragment with no special tokens) to ``out``."""
        words = _LINES.findall(text.replace(" ", SPACE_MARK))
        self._cache.extend_encoded(out, words, self._encode_word, self.CACHE_MAX_WORD)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        lookup = self._token_to_id.get
        if word[0] == "\n":  # a run of newlines (the split makes nothing else start with one)
            whole = lookup(word)
            if whole is not None:
                return (whole,)
        ids = []
        for part in merge(list(word), self.ranks, " "):
            token_id = lookup(part)
            if token_id is not None:
                ids.append(token_id)
                continue
            for b in part.encode("utf-8"):
                byte_id = lookup(f"<0x{b:02X}>")
                if byte_id is not None:
                    ids.append(byte_id)
        return tuple(ids)
