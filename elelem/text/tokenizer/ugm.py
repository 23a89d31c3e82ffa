"""SentencePiece Unigram (``tokenizer.ggml.model = "t5"``): T5, XLM-RoBERTa
(bge-reranker, nomic-embed-text-v2-moe).

Mirrors ``llm_tokenizer_ugm_session`` (llama-vocab.cpp):

* Normalization, over the UTF-8 bytes: at each offset, the longest
  user-defined token there is kept as it is; else the longest prefix the
  precompiled character map (SentencePiece's normalizer, an XOR-compressed
  compact double array of byte strings and their replacements) knows is
  replaced; else one character is copied.  Then spaces become ``▁``: with
  ``remove_extra_whitespaces`` every run of spaces is dropped and each word
  gets one ``▁`` in front, otherwise each space is one ``▁`` and, with
  ``add_space_prefix``, one more goes before the first non-space byte.
* Viterbi over the normalized text: at each character, every vocabulary
  piece (normal, user-defined or unused) starting there extends the best
  path to its end, with the piece's score (0 for a user-defined one); a
  character no single-character piece covers may be read as the unknown
  token, at the lowest normal score less 10.  Updates happen only on a
  strictly better sum (in float64, pieces tried shortest first), and runs
  of unknown tokens collapse into one.

llama.cpp walks both over bytes; since pieces and the normalized text are
valid UTF-8, a piece can only start and end on character boundaries, so the
Viterbi here walks characters, which finds the same pieces in the same order.
"""
from __future__ import annotations

import struct
from typing import Optional

import numpy as np

from ...errors import GGUFError
from .spm import SPACE_MARK
from .vocab import ATTR_NORMAL, ATTR_UNUSED, ATTR_USER_DEFINED, Vocab

_ESCAPED_SPACE = SPACE_MARK.encode("utf-8")
# Sequence length by the high nibble of a lead byte, as llama.cpp's unicode_len_utf8.
_REPLACEMENT = "\ufffd".encode("utf-8")
# Beginnings of pieces kept for the Viterbi's early stop, up to this many characters.
_SHORT = 4
# llama.cpp's unknown_token_score_penalty
_UNKNOWN_PENALTY = np.float32(10.0)


def _character_length(data: bytes, i: int) -> int:
    """The bytes of the character at ``data[i]`` as llama.cpp's
    unicode_cpt_from_utf8 reads it (lead and continuation bits only), 0 where it throws."""
    lead = data[i]
    if lead < 0x80:
        return 1
    if not lead & 0x40:
        return 0
    length = 2 if not lead & 0x20 else 3 if not lead & 0x10 else 4 if not lead & 0x08 else 0
    if not length or i + length > len(data):
        return 0
    return length if all(data[k] & 0xC0 == 0x80 for k in range(i + 1, i + length)) else 0


class CharsMap:
    """SentencePiece's precompiled character map: a 4-byte little-endian size,
    that many bytes of XCDA nodes (uint32 each), then NUL-terminated replacements."""

    def __init__(self, blob: bytes):
        if len(blob) < 4:
            raise GGUFError("tokenizer.ggml.precompiled_charsmap is too small for its size header")
        (size,) = struct.unpack_from("<I", blob, 0)
        if size + 4 >= len(blob):
            raise GGUFError("tokenizer.ggml.precompiled_charsmap: its node array runs past its end")
        self.nodes = np.frombuffer(blob, dtype="<u4", count=size // 4, offset=4).tolist()
        self.replacements = blob[4 + size:]

    def _node(self, index: int) -> int:
        if index >= len(self.nodes):
            raise GGUFError("tokenizer.ggml.precompiled_charsmap: a node index is out of its array")
        return self.nodes[index]

    def _base(self, index: int) -> int:
        node = self._node(index)
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest_match(self, data: bytes, start: int) -> tuple[int, bytes]:
        """(bytes matched, their replacement) of the longest prefix of
        ``data[start:]`` the map has; (0, b"") where it has none."""
        longest, value = 0, 0
        index = self._base(0)
        for offset in range(start, len(data)):
            c = data[offset]
            if c == 0:
                break
            index ^= c
            node = self._node(index)
            if node & ((1 << 31) | 0xFF) != c:   # LCHECK: not a child of the previous node
                break
            leaf = (node >> 8) & 1
            index ^= self._base(index)
            if leaf:
                longest = offset - start + 1
                value = self._node(index) & ((1 << 31) - 1)
        if not longest:
            return 0, b""
        if value >= len(self.replacements):
            raise GGUFError("tokenizer.ggml.precompiled_charsmap: a replacement index is out of its strings")
        end = self.replacements.find(b"\0", value)
        if end < 0:
            raise GGUFError("tokenizer.ggml.precompiled_charsmap: an unterminated replacement")
        return longest, self.replacements[value:end]


class Unigram:
    """Text fragments (no special tokens in them) to ids for a Unigram vocabulary."""

    def __init__(self, vocab: Vocab, charsmap: Optional[bytes]):
        if vocab.unk_id is None:
            raise GGUFError("a Unigram (t5) vocabulary needs an unknown token")
        self._unk = vocab.unk_id
        self._charsmap = CharsMap(charsmap) if charsmap else None
        self._prepend = vocab.add_space_prefix
        self._merge_spaces = vocab.remove_extra_whitespaces
        scores = vocab.scores or [0.0] * vocab.n_vocab
        attrs = vocab.attrs
        # The pieces the Viterbi may use; a later duplicate wins, as in llama.cpp's trie.
        usable = ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED
        self._pieces: dict[str, tuple[int, float]] = {
            text: (i, 0.0 if attrs[i] & ATTR_USER_DEFINED else scores[i])
            for i, text in enumerate(vocab.tokens) if attrs[i] & usable and text}
        self._longest: dict[str, int] = {}   # first character -> longest piece starting with it
        for text in self._pieces:
            if len(text) > self._longest.get(text[0], 0):
                self._longest[text[0]] = len(text)
        # The pieces' beginnings up to _SHORT characters: where the text's is none, no longer
        # piece starts there either (the trie walk ending, in llama.cpp).
        self._short = {text[:k] for text in self._pieces for k in range(2, min(len(text), _SHORT) + 1)}
        normal = [scores[i] for i in range(vocab.n_vocab) if attrs[i] & ATTR_NORMAL]
        min_score = np.float32(min(normal)) if normal else np.finfo(np.float32).max
        user_defined: dict[int, list[bytes]] = {}
        for i, text in enumerate(vocab.tokens):
            if attrs[i] & ATTR_USER_DEFINED and text:
                raw = text.encode("utf-8")
                user_defined.setdefault(raw[0], []).append(raw)
        # Longest first, for the normalizer's longest match.
        self._user_defined = {b: sorted(set(v), key=len, reverse=True) for b, v in user_defined.items()}
        self._unknown_score = float(np.float32(min_score - _UNKNOWN_PENALTY))   # float arithmetic, as llama.cpp

    # -- normalization ---------------------------------------------------------

    def normalize(self, text: str) -> str:
        """The text the Viterbi reads.  Raw bytes of invalid UTF-8 arrive as
        lone surrogates (``text_input``, surrogateescape): a byte that starts
        no character llama.cpp's decoder accepts becomes U+FFFD here, after
        the map was tried on it, as in llama.cpp."""
        data = text.encode("utf-8", "surrogateescape")
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            for piece in self._user_defined.get(data[i], ()):
                if data.startswith(piece, i):
                    out += piece
                    i += len(piece)
                    break
            else:
                matched, replacement = self._charsmap.longest_match(data, i) if self._charsmap else (0, b"")
                if matched:
                    out += replacement
                    i += matched
                else:
                    length = _character_length(data, i)
                    out += data[i:i + length] if length else _REPLACEMENT
                    i += length or 1
        return self._spaces(bytes(out)).decode("utf-8", "surrogateescape")

    def _spaces(self, data: bytes) -> bytes:
        if self._merge_spaces:
            return b"".join(_ESCAPED_SPACE + word for word in data.split(b" ") if word)
        first = len(data) - len(data.lstrip(b" "))
        if self._prepend and first < len(data):
            data = data[:first] + b" " + data[first:]
        return data.replace(b" ", _ESCAPED_SPACE)

    # -- Viterbi ---------------------------------------------------------------

    def encode(self, text: str, out: list[int]) -> None:
        s = self.normalize(text)
        n = len(s)
        if n == 0:
            return
        score = [-np.inf] * (n + 1)
        token = [self._unk] * (n + 1)
        start = [0] * (n + 1)
        score[0] = 0.0
        pieces, longest, short, unknown = self._pieces, self._longest, self._short, self._unknown_score
        for i in range(n):
            here = score[i]
            single = False
            for end in range(i + 1, min(n, i + longest.get(s[i], 0)) + 1):
                piece = s[i:end]
                if end - i <= _SHORT and end > i + 1 and piece not in short:
                    break
                found = pieces.get(piece)
                if found is None:
                    continue
                if end == i + 1:
                    single = True
                candidate = here + found[1]
                if candidate > score[end]:
                    score[end], token[end], start[end] = candidate, found[0], i
            if not single:
                candidate = here + unknown
                if candidate > score[i + 1]:
                    score[i + 1], token[i + 1], start[i + 1] = candidate, self._unk, i
        ids: list[int] = []
        at, previous_unknown = n, False
        while True:
            unknown_here = token[at] == self._unk
            if not (previous_unknown and unknown_here):
                ids.append(token[at])
            if start[at] == 0:
                break
            previous_unknown = unknown_here
            at = start[at]
        out.extend(reversed(ids))
