"""SentencePiece-style BPE (``tokenizer.ggml.model = "llama"``): Llama 2, Gemma.

Mirrors ``llm_tokenizer_spm_session``: spaces become ``▁`` (U+2581), the text is
split into characters, and the adjacent pair whose concatenation is the
highest-scoring vocabulary token is merged until none is left (ties: leftmost).
A final symbol that is not a token is written as ``<0xNN>`` byte tokens.
Invalid UTF-8 input keeps its raw bytes (as lone surrogates, see
``text_input``) and is split into symbols byte-wise exactly like llama.cpp.

llama.cpp runs that loop over a whole fragment at once.  Merges can only
produce vocabulary tokens, so the loop never joins two characters that no
token spans; in particular, a ``▁`` can be crossed only by a token holding ``▁``
after its first character.  Cutting the text before each ``▁`` that no such
token covers therefore leaves the result unchanged, and lets words be cached.
"""
from __future__ import annotations

import logging
import re
from typing import Optional

from ...gguf.short_holds import dict_in_slices
from .cache import BoundedCache
from .merge import merge
from .special import trie_pattern
from .vocab import Vocab

log = logging.getLogger("elelem")

SPACE_MARK = "\u2581"
_BEFORE_SPACE_MARK = re.compile(f"(?={SPACE_MARK})")
# Raw bytes of invalid UTF-8 input arrive as lone surrogates (surrogateescape).
_RAW_BYTE = re.compile("[\udc80-\udcff]")
# Sequence length by the high nibble of a lead byte, as llama.cpp's unicode_len_utf8.
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)


class SentencePieceBPE:
    """Escaped text to ids for a score-based SentencePiece vocabulary."""

    #: chunks longer than this (in characters) are not cached
    CACHE_MAX_CHUNK = 256

    def __init__(self, vocab: Vocab, *, cache_size: int = 1 << 16):
        self._token_to_id = vocab.token_to_id
        self._vocab = vocab
        self._score_rank_table: Optional[dict[str, int]] = None  # built on first use
        self._byte_ids: Optional[list[Optional[int]]] = None
        self._cache: BoundedCache[tuple[int, ...]] = BoundedCache(cache_size)
        # Tokens a cut before "▁" could split: "▁" after their first character.
        spanning = [t for t in vocab.tokens if SPACE_MARK in t[1:]]
        # At each position: the longest spanning token starting there.
        self._spanning = re.compile("(?=(" + trie_pattern(spanning) + "))") if spanning else None

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (raw text, spaces not yet escaped) to ``out``."""
        escaped = text.replace(" ", SPACE_MARK)
        if not escaped.isascii() and _RAW_BYTE.search(escaped):
            out += self._encode_symbols(_byte_rule_symbols(escaped))
            return
        self._cache.extend_encoded(out, self._chunks(escaped), self._encode_chunk, self.CACHE_MAX_CHUNK)

    def _chunks(self, text: str) -> list[str]:
        occurrences = []
        if self._spanning is not None and SPACE_MARK in text:
            occurrences = [(m.start(), m.start() + len(m.group(1))) for m in self._spanning.finditer(text)]
        if not occurrences:
            return [c for c in _BEFORE_SPACE_MARK.split(text) if c]
        # A "▁" inside an occurring spanning token is not a cut.
        blocked = set()
        for start, end in occurrences:
            pos = text.find(SPACE_MARK, start + 1, end)
            while pos != -1:
                blocked.add(pos)
                pos = text.find(SPACE_MARK, pos + 1, end)
        cuts = [0]
        cuts += [m.start() for m in _BEFORE_SPACE_MARK.finditer(text)
                 if m.start() > 0 and m.start() not in blocked]
        cuts.append(len(text))
        return [text[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]

    def build_tables(self) -> None:
        """The score ranks, now rather than at the first encode."""
        self._score_ranks

    @property
    def _score_ranks(self) -> dict[str, int]:
        """Token text -> rank of its score (0 = highest): the merge key.

        Ranks order pairs exactly like the scores do, ties included, and are
        small ints, which the merge loop packs into its queue entries.
        """
        if self._score_rank_table is None:
            vocab = self._vocab
            scores = vocab.scores or [0.0] * vocab.n_vocab
            rank_of = {score: rank for rank, score in enumerate(sorted(set(scores), reverse=True))}
            # A later duplicate text wins, matching token_to_id.
            self._score_rank_table = dict_in_slices(zip(vocab.tokens, map(rank_of.__getitem__, scores)))
        return self._score_rank_table

    def _encode_chunk(self, chunk: str) -> tuple[int, ...]:
        return self._encode_symbols(list(chunk))

    def _encode_symbols(self, symbols: list[str]) -> tuple[int, ...]:
        lookup = self._token_to_id.get
        ids: list[Optional[int]] = []
        for part in merge(symbols, self._score_ranks, ""):
            token_id = lookup(part)
            if token_id is not None:
                ids.append(token_id)
            else:
                # Unknown character: its UTF-8 bytes as byte tokens.  Raw bytes
                # of invalid input travel as lone surrogates (surrogateescape).
                ids.extend(self._byte_token(b) for b in part.encode("utf-8", "surrogateescape"))
        return tuple(i for i in ids if i is not None)

    def _byte_token(self, b: int) -> Optional[int]:
        if self._byte_ids is None:
            self._byte_ids = [self._find_byte_token(x) for x in range(256)]
        return self._byte_ids[b]

    def _find_byte_token(self, b: int) -> Optional[int]:
        # llama.cpp: "<0xNN>", else the byte itself as a one-character token.
        token_id = self._token_to_id.get(f"<0x{b:02X}>")
        if token_id is None and b < 0x80:
            token_id = self._token_to_id.get(chr(b))
        if token_id is None:
            token_id = self._vocab.unk_id
            log.warning("tokenizer: no byte token for 0x%02X; using the unknown token %s", b, token_id)
        return token_id


def _byte_rule_symbols(text: str) -> list[str]:
    """Symbols of text holding raw bytes, split the way llama.cpp splits bytes:
    a lead byte claims as many bytes as it announces, valid or not."""
    data = text.encode("utf-8", "surrogateescape")
    symbols, pos, size = [], 0, len(data)
    while pos < size:
        step = min(_UTF8_LEN[data[pos] >> 4], size - pos)
        symbols.append(data[pos:pos + step].decode("utf-8", "surrogateescape"))
        pos += step
    return symbols


def byte_of_token(text: str) -> Optional[int]:
    """The byte a ``<0xNN>`` token stands for."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            return None
    return None

