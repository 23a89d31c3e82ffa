"""Drafting with a Gemma 4 drafter file (``gemma4-assistant``).

A drafter of a few layers that reads its target's own cache
(elelem.model.archs.gemma4_assistant): it keeps no cells, so there is
nothing to bring up to date or trim between drafts.  A draft is llama.cpp's
draft-mtp with shared memory (common/speculative.cpp, ``is_mem_shared``):
the token the target just picked (``x[L]``, not evaluated yet) with the
target's final normed hidden state ``h[L-1]`` gives ``d1``; ``d1`` with the
drafter's own hidden state gives ``d2``; and so on, every step at position
``L`` -- the drafts attend over the target's cells before ``L`` only (as
transformers' Gemma4Assistant: the drafts share one position).

It is driven as the MTP head is (elelem.engine.mtp: the same drafter per
generation, planned from measured costs, probing where drafting does not
pay, beside prompt lookup): only the head differs.  The target verifies
every draft, so the text is the target's whatever the drafter proposes.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional, Sequence

import numpy as np

from .mtp import DEFAULT_MAX_DRAFT, PRIOR_HEAD_COST, MTPDrafter
from .step_costs import SMOOTHING, StepCosts

log = logging.getLogger("elelem")


class AssistantHead:
    """A Gemma 4 drafter's native context (sharing the target's cache),
    drafting for every sequence of one engine."""

    kind = "assistant"

    def __init__(self, context, *, owned_model=None, max_draft: int = DEFAULT_MAX_DRAFT):
        self._ctx = context
        self._owned_model = owned_model
        self.max_draft = max_draft
        self.n_embd = context.model.hparams["n_embd_out"]
        self._lock = threading.Lock()
        self.closed = False
        self.evaluated = 0             # statistics: drafter steps' tokens, the time they took,
        self.step_seconds = 0.0
        self.missing_rows = 0          # and drafts started without the target's hidden state (zeros)
        self._step_cost: float | None = None   # seconds of a one-token drafter step (running average)

    def drafter(self, seq: int, history: Sequence[int], costs: StepCosts) -> "AssistantDrafter":
        return AssistantDrafter(self, seq, history, costs)

    def rollback_cost(self, costs: StepCosts) -> float:
        """Nothing: it keeps no cells to roll back, and its target (gemma4) is not hybrid."""
        return 0.0

    def relative_cost(self, costs: StepCosts) -> float:
        """A one-token drafter step against a one-token target step."""
        target = costs.seconds(1)
        if self._step_cost is None or target is None:
            return PRIOR_HEAD_COST
        return self._step_cost / target

    def draft(self, seq: int, history: Sequence[int], rows: dict[int, np.ndarray], n: int,
              window: Optional[int] = None) -> list[int]:
        """``n`` greedy drafts after ``history``, whose last token the target
        has not evaluated: its cache holds positions ``0 .. len(history) - 2``
        of ``seq``, and ``rows`` the hidden states it gave there.  ``window``
        is MTPHead's: this drafter has no tokens of its own to catch up on."""
        with self._lock:
            if self.closed or n <= 0 or not history:
                return []
            position = len(history) - 1
            hidden = rows.get(position - 1)
            if hidden is None:
                hidden = np.zeros(self.n_embd, dtype=np.float32)
                self.missing_rows += position > 0
            token = int(history[-1])
            drafts: list[int] = []
            while len(drafts) < n:
                t0 = time.perf_counter()
                logits = self._ctx.draft_step([token], [seq], [position], hidden[None, :])
                seconds = time.perf_counter() - t0
                self.step_seconds += seconds
                self.evaluated += 1
                self._step_cost = seconds if self._step_cost is None else \
                    self._step_cost + SMOOTHING * (seconds - self._step_cost)
                hidden = self._ctx.last_hidden[0].copy()
                token = int(np.argmax(logits[0]))
                drafts.append(token)
            return drafts

    def keep(self, seq: int, n: int) -> None:
        """Nothing to trim: the drafter holds no cells of its own."""

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._ctx.close()
            if self._owned_model is not None:
                self._owned_model.close()


class AssistantDrafter(MTPDrafter):
    """Drafts for one generation from an :class:`AssistantHead` (the MTP
    head's drafter: the target's hidden states observed, drafts planned and
    probed the same way)."""

    kind = "assistant"
