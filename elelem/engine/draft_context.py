"""A drafter's own native context beside the target's: a draft model's or an
MTP head's, one sequence for each target sequence.

What the two share: the tokens each sequence holds, trimming them back to what
the target kept, dropping idle sequences' cells when the context runs short,
and closing (the native model too, when the drafter opened it).
"""
from __future__ import annotations

import threading

import numpy as np


class DraftContext:
    """``context`` has as many sequences as the target's; ``owned_model`` (the
    native model, when the drafter opened it) is closed with it."""

    def __init__(self, context, *, owned_model, max_draft: int):
        self._ctx = context
        self._owned_model = owned_model
        self.max_draft = max_draft
        self._lock = threading.Lock()
        # seq -> the tokens its sequence here holds, in order; and when last used
        self._held: dict[int, list[int]] = {}
        self._last_used: dict[int, float] = {}
        self.evaluated = 0            # statistics: tokens evaluated here
        self.closed = False

    def restart_threads(self) -> None:
        """Start this context's worker threads again, from the calling thread (Engine.restart_threads)."""
        with self._lock:
            if not self.closed:
                self._ctx.set_n_threads(self._ctx.n_threads)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._held.clear()
            self._ctx.close()
            if self._owned_model is not None:
                self._owned_model.close()

    def keep(self, seq: int, n: int) -> None:
        """Trim sequence ``seq`` to its first ``n`` positions."""
        with self._lock:
            held = self._held.get(seq)
            if self.closed or held is None or len(held) <= n:
                return
            del held[n:]
            self._ctx.seq_rm(seq, n)

    def _drop_idle(self, keep: int, need: int) -> bool:
        """Free cells for ``need`` tokens by dropping other sequences' cells,
        least recently used first (they are evaluated again when needed)."""
        cache = self._ctx.cache
        for _, seq in sorted((t, s) for s, t in self._last_used.items() if s != keep):
            if cache.n_free >= need:
                break
            if self._held.get(seq):
                self._ctx.seq_rm(seq, 0)
                self._held[seq] = []
        return cache.n_free >= need


def target_rows(rows: dict, positions: range, width: int) -> tuple[np.ndarray, int]:
    """The target's rows at ``positions`` (from a drafter's position -> row map), one after the
    other, and how many were missing (zeros in their place: rows dropped while it did not draft)."""
    out = np.zeros((len(positions), width), dtype=np.float32)
    missing = 0
    for i, p in enumerate(positions):
        row = rows.get(p)
        if row is None:
            missing += 1
        else:
            out[i] = row
    return out, missing
