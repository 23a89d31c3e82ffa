"""Drafting with an EAGLE-3 head (elelem.model.archs.eagle3).

The head reads the inputs of three of the target's layers at each position
(the target's context hands them over as its rows' hidden states:
``Context.set_feature_layers``), fuses them into its own ``g``
(``eagle3_fuse``), and drafts from one decoder layer.  Its position ``P``
takes the token *after* ``P`` with ``g[P]`` (llama.cpp's input convention,
common/speculative.cpp ``common_speculative_impl_draft_eagle3``), and its
logits there guess the token after that.  So, after a history of ``L``
tokens whose last one the target has picked but not evaluated: positions
``0 .. L-2`` pair ``history[P+1]`` with the target's ``g[P]``, and the last
of them (the "seed") gives ``d1``; then ``d1`` paired with the head's own
pre-norm state of that row gives ``d2``; and so on.  Its draft vocabulary
maps to the target's through ``d2t``.

Everything else is the MTP head's (elelem.engine.mtp): one head sequence per
target sequence, positions paired with the head's own states trimmed after
each verification and evaluated again with the target's, rows the target did
not evaluate in this generation taken as zeros (fewer drafts confirmed, the
same text), the planner's draft length and probes.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from .._core import eagle3_fuse
from .draft_context import target_rows
from .mtp import MTPDrafter, MTPHead


class Eagle3Head(MTPHead):
    """An EAGLE-3 head's native context, drafting for every sequence of one engine."""

    kind = "eagle3"

    def __init__(self, context, *, owned_model=None, d2t: Optional[np.ndarray] = None, n_features: int,
                 max_draft: Optional[int] = None, hybrid: bool = False):
        super().__init__(context, owned_model=owned_model, max_draft=max_draft, hybrid=hybrid)
        self.d2t = d2t                 # draft id -> target id; None where the vocabularies are one
        self.n_features = n_features   # 3 * the target's n_embd

    def drafter(self, seq: int, history: Sequence[int], costs) -> "Eagle3Drafter":
        return Eagle3Drafter(self, seq, history, costs)

    def target_id(self, logits: np.ndarray) -> int:
        best = int(np.argmax(logits))
        return best if self.d2t is None else int(self.d2t[best])

    def fuse(self, features: np.ndarray) -> np.ndarray:
        """g of each row of the target's ``features``, in n_batch chunks."""
        step = self._ctx.n_batch
        return np.concatenate([eagle3_fuse(self._ctx, features[i:i + step]) for i in range(0, len(features), step)])

    def draft(self, seq: int, history: Sequence[int], rows: dict[int, np.ndarray], n: int,
              window: Optional[int] = None) -> list[int]:
        """Bring head sequence ``seq`` to ``history`` (its last token not yet
        evaluated by the target: the seed pairs it with the target's last
        row), then ``n`` greedy drafts.  ``window`` is MTPHead's; this head
        evaluates every pair it has not (its positions are the pairs')."""
        with self._lock:
            if self.closed or n <= 0:
                return []
            held = self._held.setdefault(seq, [])   # held[P] is the token paired at position P: history[P + 1]
            self._last_used[seq] = time.monotonic()
            length = len(history) - 1                # positions 0 .. L-2
            if length <= 0:
                return []
            start = 0
            while start < min(len(held), length) and held[start] == history[start + 1]:
                start += 1
            if start == length:      # it holds the seed too: evaluate that again for its logits
                start -= 1
            if start < len(held):
                del held[start:]
                self._ctx.seq_rm(seq, start)
            features, missing = target_rows(rows, range(start, length), self.n_features)
            self.missing_rows += missing
            t0 = time.perf_counter()
            g = self.fuse(features)
            self.step_seconds += time.perf_counter() - t0
            logits, h = self._evaluate(seq, list(history[start + 1:length + 1]), g)
            drafts = [self.target_id(logits)]
            while len(drafts) < n:
                t0 = time.perf_counter()
                logits, h = self._evaluate(seq, drafts[-1:], h[None, :])
                self._record_step(time.perf_counter() - t0)
                drafts.append(self.target_id(logits))
            return drafts


class Eagle3Drafter(MTPDrafter):
    """Drafts for one generation from an :class:`Eagle3Head`; the rows it
    observes are the target's feature rows (its three layers' inputs)."""

    kind = "eagle3"

    def propose(self, limit: int) -> list[int]:
        drafts = super().propose(limit)
        # The head keeps what the target's rows paired (up to the seed, position L-2);
        # MTPDrafter counted one more (its positions are the tokens').
        self._base = max(0, self._base - 1)
        return drafts
