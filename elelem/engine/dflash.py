"""Drafting with a DFlash drafter (elelem.model.archs.dflash).

A DFlash drafter drafts a block of tokens in one forward pass, as llama.cpp's
draft-dflash does (common/speculative.cpp,
``common_speculative_impl_draft_dflash``): its cache holds, for every
position the target evaluated, K and V made from the target's layer inputs
there (the *injection*: the target's context hands those over as its rows'
hidden states, ``Context.set_feature_layers``); a draft is one step of the
token the target just picked followed by ``n`` mask tokens, at the positions
after the injected ones, attending over them and over each other both ways;
the argmax of the logits at the mask positions are the ``n`` drafts.  The
block's cells are dropped afterwards (llama.cpp's server removes the draft
context's cells past the verified ones after every draft), so the cache holds
only injected positions.

So, after a history of ``L`` tokens whose last one the target has picked but
not evaluated: positions ``0 .. L-2`` are injected from the target's rows
there (rows the target did not evaluate in this generation -- a reused
prefix -- are taken as zeros: fewer drafts confirmed, the same text), and
the block is ``history[L-1]`` and the masks at ``L-1 ..``.  Everything else
(one sequence per target sequence, the planner's draft length and probes,
beside prompt lookup) is the MTP head's, elelem.engine.mtp.
"""
from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

import numpy as np

from ..errors import ElelemError
from .draft_context import target_rows
from .mtp import MTPDrafter, MTPHead

log = logging.getLogger("elelem")


class DFlashHead(MTPHead):
    """A DFlash drafter's native context, drafting for every sequence of one engine."""

    kind = "dflash"

    def __init__(self, context, *, owned_model=None, block_size: int, mask_token: int, n_features: int,
                 max_draft: Optional[int] = None, hybrid: bool = False):
        # A block holds the picked token and its drafts: at most block_size - 1 of them (llama.cpp clamps n_max so)
        limit = block_size - 1 if max_draft is None else min(max_draft, block_size - 1)
        super().__init__(context, owned_model=owned_model, max_draft=limit, hybrid=hybrid)
        self.block_size = block_size
        self.mask_token = mask_token
        self.n_features = n_features   # len(target_layers) * the target's n_embd

    def drafter(self, seq: int, history: Sequence[int], costs) -> "DFlashDrafter":
        return DFlashDrafter(self, seq, history, costs)

    def inject(self, seq: int, features: np.ndarray) -> None:
        """Store the K and V of ``features`` (the target's rows, in order) at
        the positions after what ``seq`` holds, in n_batch chunks."""
        step = self._ctx.n_batch
        for i in range(0, len(features), step):
            chunk = features[i:i + step]
            marks = np.full(len(chunk), -1, dtype=np.int32)   # cells of features, not of tokens
            try:
                self._ctx.decode_embeddings(chunk, marks, [seq] * len(chunk))
            except ElelemError as error:
                if not self._drop_idle(seq, len(chunk)):
                    raise
                log.debug("DFlash drafter: %s; dropped idle sequences", error)
                self._ctx.decode_embeddings(chunk, marks, [seq] * len(chunk))
            self.evaluated += len(chunk)

    def block_logits(self, seq: int, token: int, n: int) -> np.ndarray:
        """The logits of a block of ``token`` and ``n`` masks after what
        ``seq`` holds, every row; the block's cells are dropped after."""
        held = len(self._held[seq])
        block = [int(token)] + [self.mask_token] * n
        try:
            logits = self._ctx.decode(block, [seq] * len(block), True, causal=False)
        except ElelemError as error:
            if not self._drop_idle(seq, len(block)):
                raise
            log.debug("DFlash drafter: %s; dropped idle sequences", error)
            logits = self._ctx.decode(block, [seq] * len(block), True, causal=False)
        self._ctx.seq_rm(seq, held)
        return logits

    def draft(self, seq: int, history: Sequence[int], rows: dict[int, np.ndarray], n: int,
              window: Optional[int] = None) -> list[int]:
        """Bring sequence ``seq`` to ``history`` (its last token not yet
        evaluated by the target: positions ``0 .. L-2`` injected from the
        target's rows), then ``n`` drafts from one block.  ``window`` is
        MTPHead's; this drafter injects every row it has not (a block reads them all)."""
        with self._lock:
            n = min(n, self.max_draft)
            if self.closed or n <= 0 or not history:
                return []
            held = self._held.setdefault(seq, [])   # held[P]: the token whose target row was injected at P
            self._last_used[seq] = time.monotonic()
            length = len(history) - 1
            start = 0
            while start < min(len(held), length) and held[start] == history[start]:
                start += 1
            if start < len(held):
                del held[start:]
                self._ctx.seq_rm(seq, start)
            t0 = time.perf_counter()
            if start < length:
                features, missing = target_rows(rows, range(start, length), self.n_features)
                self.missing_rows += missing
                self.inject(seq, features)
                held.extend(history[start:length])
            t1 = time.perf_counter()
            logits = self.block_logits(seq, history[-1], n)
            seconds = time.perf_counter() - t1
            self.evaluated += n + 1
            self.step_seconds += time.perf_counter() - t0
            # The planner prices each draft as a head step: the block's time shared by its drafts.
            self._record_step(seconds / n)
            return [int(t) for t in np.argmax(logits[1:], axis=1)]


class DFlashDrafter(MTPDrafter):
    """Drafts for one generation from a :class:`DFlashHead`; the rows it
    observes are the target's feature rows (its layers' inputs)."""

    kind = "dflash"
