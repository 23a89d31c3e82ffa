"""Cut special tokens out of text before BPE, as ``tokenizer_st_partition`` does.

llama.cpp takes the special tokens longest first and, for each, cuts every
non-overlapping occurrence (left to right) out of the text fragments still
unclaimed.  So a longer token wins over a shorter one anywhere in the text, not
only where they start at the same place.

Doing that literally costs one pass over the text per special token (Gemma 3
has 6,400).  Here a single regex pass finds which special tokens occur at all;
only those are then cut, longest first, with ``str.find``, skipping occurrences
that overlap a cut already made.  The outcome is the same.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from typing import Iterable, Optional, Union

Fragment = Union[str, int]  # raw text, or a special token id


class SpecialTokenSplitter:
    """Splits text into raw-text fragments and special-token ids."""

    def __init__(self, tokens: Iterable[tuple[str, int]]):
        # Priority: longer first; llama.cpp's sort leaves ties in no set order,
        # the lower id is at least stable.
        entries = sorted(((t, i) for t, i in tokens if t), key=lambda e: (-len(e[0]), e[1]))
        self._ids: dict[str, int] = {}
        for text, token_id in entries:
            self._ids.setdefault(text, token_id)
        self._order = {text: rank for rank, text in enumerate(self._ids)}
        self._first_chars = frozenset(t[0] for t in self._ids)
        self._finder: Optional[re.Pattern[str]] = None  # compiled on first use

    def __bool__(self) -> bool:
        return bool(self._ids)

    def split(self, text: str) -> list[Fragment]:
        if not text:
            return []
        if not self._ids or not any(c in text for c in self._first_chars):
            return [text]
        present = self._present(text)
        if not present:
            return [text]
        starts: list[int] = []
        ends: list[int] = []
        owners: list[int] = []
        for token_text in sorted(present, key=self._order.__getitem__):
            found = self._occurrences(text, token_text, starts, ends)
            if found:
                token_id = self._ids[token_text]
                merged = sorted(list(zip(starts, ends, owners)) + [(s, e, token_id) for s, e in found])
                starts = [m[0] for m in merged]
                ends = [m[1] for m in merged]
                owners = [m[2] for m in merged]
        fragments: list[Fragment] = []
        pos = 0
        for start, end, token_id in zip(starts, ends, owners):
            if start > pos:
                fragments.append(text[pos:start])
            fragments.append(token_id)
            pos = end
        if pos < len(text):
            fragments.append(text[pos:])
        return fragments

    @staticmethod
    def _occurrences(text: str, token_text: str, starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
        """Left-to-right, non-overlapping occurrences that fit between earlier cuts."""
        found: list[tuple[int, int]] = []
        size = len(token_text)
        pos = 0
        find = text.find
        while True:
            start = find(token_text, pos)
            if start < 0:
                return found
            end = start + size
            i = bisect_right(starts, start) - 1
            if i >= 0 and ends[i] > start:  # starts inside an earlier cut
                pos = ends[i]
                continue
            if i + 1 < len(starts) and starts[i + 1] < end:  # runs into the next cut
                pos = ends[i + 1]
                continue
            found.append((start, end))
            pos = end

    def _present(self, text: str) -> set[str]:
        """The special tokens that occur in ``text``."""
        if self._finder is None:
            self._finder = re.compile("(?=(" + trie_pattern(self._ids) + "))", re.DOTALL)
        # At each position the finder reports the longest token starting there;
        # any shorter token starting there is a prefix of it.
        present: set[str] = set()
        for longest in set(self._finder.findall(text)):
            present.update(t for t in _prefixes(longest) if t in self._ids)
        return present


def _prefixes(text: str) -> Iterable[str]:
    return (text[:n] for n in range(1, len(text) + 1))


def trie_pattern(words: Iterable[str]) -> str:
    """A regex matching the longest of ``words`` at a position; common prefixes
    are factored out, so thousands of words cost no more than their length."""
    root: dict = {}
    END = ""
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[END] = True

    # Iterative post-order walk: the pattern of a node needs its children's.
    patterns: dict[int, str] = {}
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        children = [(ch, child) for ch, child in node.items() if ch != END]
        if not expanded:
            stack.append((node, True))
            stack.extend((child, False) for _, child in children)
            continue
        branches = [re.escape(ch) + patterns.pop(id(child)) for ch, child in sorted(children)]
        if not branches:
            body = ""
        elif len(branches) == 1:
            body = branches[0]
        else:
            body = "(?:" + "|".join(branches) + ")"
        if END in node and branches:
            body = "(?:" + body + ")?"  # greedy: the longer token first
        patterns[id(node)] = body
    return patterns[id(root)]
