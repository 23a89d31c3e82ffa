"""The merge loop shared by both BPE flavours.

llama.cpp's tokenizers (``llm_tokenizer_bpe_session``, ``llm_tokenizer_spm_session``)
keep a priority queue of adjacent pairs and repeatedly merge the best pair,
breaking ties by the leftmost position.  That is the same as "merge the leftmost
best adjacent pair, again and again", which is what both functions here do:

* :func:`merge_scan` keeps one key per adjacent pair in a list and takes the
  C-speed ``min`` after each merge: O(n^2), the fastest for ordinary words.
* :func:`merge_heap` is the priority-queue version over a linked list,
  O(n log n), for long pieces (a megabyte of one letter is one piece).

A pair's key is ``table.get(left + sep + right)``, a non-negative int, smaller
is better, ``None`` when the pair cannot merge: merge ranks with ``sep=" "`` for
byte-level BPE, token score ranks with ``sep=""`` for SentencePiece.  Both
functions give identical results for the same table.
"""
from __future__ import annotations

import heapq
from array import array
from typing import Mapping

_NO_MERGE = float("inf")

#: pieces with more symbols than this use the heap
SCAN_LIMIT = 64


def merge(symbols: list[str], table: Mapping[str, int], sep: str) -> list[str]:
    if len(symbols) <= SCAN_LIMIT:
        return merge_scan(symbols, table, sep)
    return merge_heap(symbols, table, sep)


def merge_scan(symbols: list[str], table: Mapping[str, int], sep: str) -> list[str]:
    parts = list(symbols)
    if len(parts) < 2:
        return parts
    get = table.get
    keys = [get(parts[i] + sep + parts[i + 1], _NO_MERGE) for i in range(len(parts) - 1)]
    while keys:
        best = min(keys)
        if best == _NO_MERGE:
            break
        i = keys.index(best)  # the leftmost of the best
        merged = parts[i] + parts[i + 1]
        parts[i] = merged
        del parts[i + 1]
        del keys[i]
        if i > 0:
            keys[i - 1] = get(parts[i - 1] + sep + merged, _NO_MERGE)
        if i < len(keys):
            keys[i] = get(merged + sep + parts[i + 1], _NO_MERGE)
    return parts


def merge_heap(symbols: list[str], table: Mapping[str, int], sep: str) -> list[str]:
    text = list(symbols)  # "" once merged into its left neighbour
    n = len(text)
    if n < 2:
        return text
    get = table.get
    # Links as machine-int arrays: a 1 MB run of one letter is a million symbols.
    nxt = array("q", range(1, n + 1))
    nxt[-1] = -1
    prv = array("q", range(-1, n - 1))
    # One int per queued pair, ordered like llama.cpp's queue (key, then left):
    # key << 64 | left << 32 | combined length when queued.  The length is
    # enough to spot a stale pair: a merged-away side is "", and a side that
    # grew makes the sum larger.
    heap = []
    for i in range(n - 1):
        k = get(text[i] + sep + text[i + 1])
        if k is not None:
            heap.append(k << 64 | i << 32 | (len(text[i]) + len(text[i + 1])))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush

    while heap:
        entry = pop(heap)
        left, size = (entry >> 32) & 0xFFFFFFFF, entry & 0xFFFFFFFF
        right = nxt[left]
        if right < 0 or not text[left] or not text[right] or len(text[left]) + len(text[right]) != size:
            continue
        merged = text[left] + text[right]
        text[left] = merged
        text[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
            k = get(merged + sep + text[after])
            if k is not None:
                push(heap, k << 64 | left << 32 | (len(merged) + len(text[after])))
        before = prv[left]
        if before >= 0:
            k = get(text[before] + sep + merged)
            if k is not None:
                push(heap, k << 64 | before << 32 | (len(text[before]) + len(merged)))
    return [t for t in text if t]
