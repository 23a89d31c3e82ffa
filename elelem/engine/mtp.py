"""Drafting with the model's own multi-token-prediction (MTP) head.

Qwen3.5/3.6 files carry, after the model's layers, a block trained to guess
the token after next (elelem.model.mtp).  Position ``p`` of the head takes
the token ``x[p]`` and the target's final normed hidden state ``h[p-1]`` of
the position before it, and its logits guess ``x[p+1]``.  So a draft is:
the token the target just picked (``x[L]``, not evaluated yet) with the
target's last hidden state ``h[L-1]`` gives ``d1``; ``d1`` with the head's
own hidden state gives ``d2``; and so on -- llama.cpp's draft-mtp
(common/speculative.cpp, ``common_speculative_impl_draft_mtp``).

:class:`MTPHead` owns the head's native context (its one attention layer's
K and V, one sequence per target sequence: the same ids).  A head sequence
holds only positions whose pairs used the target's own hidden states; the
positions a draft added are trimmed after each verification, and the head
evaluates the confirmed tokens again with the target's states at the next
draft (as llama.cpp's process() does).  The engine gives each generation's
:class:`MTPDrafter` the hidden state of every row the target evaluated for
it (``observe``); a row the target never evaluated in this generation (a
prefix reused from the cache) is taken as zeros, which changes how often
drafts are confirmed, never the text: the target verifies every draft as it
verifies prompt-lookup ones (see :mod:`elelem.engine.speculative`).

How many tokens to draft is planned from measured costs (:func:`
~elelem.engine.step_costs.plan_draft_length`): a head step against a target
step, and the width the verification adds.  Where drafting does not pay,
the drafter probes now and then (one token, after a pause that doubles while
probes fail), so that a head that starts to agree is noticed.  A probe is
watched, not verified: its guess is compared with the token the target picks
next, so that a refused one costs no wider step and, on a hybrid model, no
rewind.  And it must stay cheap: a head sequence more than PROBE_WINDOW
tokens behind is not brought through all of them (the whole prompt, at a
generation's first probe) but starts again from the last PROBE_WINDOW tokens
of the history.  Its attention then sees that window and what follows; RoPE
depends on positions only through their differences, so the window held at
head positions from 0 is the window as seen at its own positions.  Drafting
goes on from there once probes are confirmed (the head's context is what
its own cells hold; the target's hidden state carries the rest).
"""
from __future__ import annotations

import logging
import time
from typing import Optional, Protocol, Sequence

import numpy as np

from ..errors import ElelemError
from .draft_context import DraftContext
from .speculative import Acceptance
from .step_costs import SMOOTHING, StepCosts, plan_draft_length

log = logging.getLogger("elelem")

#: The most tokens the head drafts per step (each costs a step of the head).
DEFAULT_MAX_DRAFT = 8
#: A head step's cost against a one-token target step, before one is measured.
PRIOR_HEAD_COST = 0.25
#: Probes where drafting does not pay: the first after this many tokens, the
#: pause doubling after each probe that is refused, up to MAX_PROBE_PAUSE.
FIRST_PROBE_PAUSE = 8
MAX_PROBE_PAUSE = 256
#: The most history tokens a probe brings the head through (see the module's docstring).
PROBE_WINDOW = 16
#: Hidden rows a drafter keeps while it does not draft; older ones are dropped (zeros if ever needed).
MAX_KEPT_ROWS = 4096


class MTPHead(DraftContext):
    """The MTP head's native context, drafting for every sequence of one engine."""

    kind = "mtp"

    def __init__(self, context, *, owned_model=None, max_draft: Optional[int] = None, hybrid: bool = False):
        super().__init__(context, owned_model=owned_model,
                         max_draft=DEFAULT_MAX_DRAFT if max_draft is None else max_draft)
        self.hybrid = hybrid
        self.n_embd = context.model.hparams["n_embd"]
        self.step_seconds = 0.0                  # statistics: the time the head's steps took,
        self.missing_rows = 0                    # and pairs taken with zeros for h
        self._step_cost: Optional[float] = None  # seconds of a one-token head step (running average)
        # seq -> the history position of the head sequence's position 0 (a probe's window; 0 without one)
        self._window_start: dict[int, int] = {}

    def drafter(self, seq: int, history: Sequence[int], costs: StepCosts) -> "MTPDrafter":
        return MTPDrafter(self, seq, history, costs)

    def rollback_cost(self, costs: StepCosts) -> float:
        """What a refused draft adds against a one-token target step: a hybrid
        target's recurrent state goes back to the snapshot before the step, and
        its next step evaluates the token before the drafts again (a row more)."""
        return max(0.0, costs.relative(2) - 1.0) if self.hybrid else 0.0

    def relative_cost(self, costs: StepCosts) -> float:
        """A one-token head step against a one-token target step."""
        target = costs.seconds(1)
        if self._step_cost is None or target is None:
            return PRIOR_HEAD_COST
        return self._step_cost / target

    # -- used by MTPDrafter, under the engine's lock ------------------------------

    def draft(self, seq: int, history: Sequence[int], rows: dict[int, np.ndarray], n: int,
              window: Optional[int] = None) -> list[int]:
        """Bring head sequence ``seq`` to ``history`` (its last token not yet
        evaluated by the target), then ``n`` greedy drafts.  With ``window``
        (a probe), a head more than ``window`` tokens behind starts again from
        the last ``window`` tokens of the history instead."""
        with self._lock:
            if self.closed or n <= 0:
                return []
            held = self._held.setdefault(seq, [])
            self._last_used[seq] = time.monotonic()
            length = len(history)
            first = self._window_start.get(seq, 0) if held else 0   # history position of held[0]
            start = 0   # in history positions
            while start < min(len(held), length - first) and held[start] == history[first + start]:
                start += 1
            start += first
            if start == length:      # it holds the last token too: evaluate that again for its logits
                start -= 1
            if window is not None and length - start > max(1, window):
                start = first = length - max(1, window)
                del held[:]
                self._ctx.seq_rm(seq, 0)
            elif start - first < len(held):
                del held[start - first:]
                self._ctx.seq_rm(seq, start - first)
            self._window_start[seq] = first
            hidden = np.zeros((length - start, self.n_embd), dtype=np.float32)
            for i, p in enumerate(range(start - 1, length - 1)):   # h of the position before each token
                row = rows.get(p)
                if row is not None:
                    hidden[i] = row
                elif p >= 0:
                    self.missing_rows += 1
            tokens = list(history[start:])
            logits, h = self._evaluate(seq, tokens, hidden)
            drafts = [int(np.argmax(logits))]
            while len(drafts) < n:
                t0 = time.perf_counter()
                logits, h = self._evaluate(seq, drafts[-1:], h[None, :])
                self._record_step(time.perf_counter() - t0)
                drafts.append(int(np.argmax(logits)))
            return drafts

    def _evaluate(self, seq: int, tokens: list[int], hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Evaluate ``tokens`` with their hidden states after what ``seq`` holds,
        in n_batch chunks; the last row's logits and hidden state."""
        step = self._ctx.n_batch
        held = self._held[seq]
        t0 = time.perf_counter()
        logits = None
        for i in range(0, len(tokens), step):
            chunk = tokens[i:i + step]
            try:
                logits = self._decode(seq, chunk, hidden[i:i + step])
            except ElelemError as error:
                if not self._drop_idle(seq, len(chunk)):
                    raise
                log.debug("MTP head: %s; dropped idle head sequences", error)
                logits = self._decode(seq, chunk, hidden[i:i + step])
            held.extend(chunk)
            self.evaluated += len(chunk)
        self.step_seconds += time.perf_counter() - t0
        assert logits is not None, "the head evaluates at least one token"
        return logits[-1], self._ctx.last_hidden[-1].copy()

    def _decode(self, seq: int, tokens: list[int], hidden: np.ndarray) -> np.ndarray:
        return self._ctx.decode(tokens, seq, None, hidden_in=hidden, keep_hidden=True,
                                decode_kernels=len(tokens) == 1)

    def _record_step(self, seconds: float) -> None:
        old = self._step_cost
        self._step_cost = seconds if old is None else old + SMOOTHING * (seconds - old)

    def keep(self, seq: int, n: int) -> None:
        """Trim sequence ``seq`` to the first ``n`` positions of its history."""
        super().keep(seq, max(0, n - self._window_start.get(seq, 0)))


class DraftingHead(Protocol):
    """What an :class:`MTPDrafter` drafts from: an :class:`MTPHead`, or a
    drafter file's head (elelem.engine.assistant.AssistantHead)."""

    max_draft: int

    def rollback_cost(self, costs: StepCosts) -> float: ...

    def draft(self, seq: int, history: Sequence[int], rows: dict[int, np.ndarray], n: int,
              window: Optional[int] = None) -> list[int]: ...

    def relative_cost(self, costs: StepCosts) -> float: ...

    def keep(self, seq: int, n: int) -> None: ...


class MTPDrafter:
    """Drafts for one generation from an :class:`MTPHead` (PromptLookup's interface)."""

    kind = "mtp"
    wants_hidden = True

    def __init__(self, head: DraftingHead, seq: int, history: Sequence[int], costs: StepCosts):
        self.head = head
        self.seq = seq
        self.history = history
        self.costs = costs
        self.acceptance = Acceptance()
        self._probe: Optional[tuple[int, int]] = None   # a watched probe: (its position in history, its guess)
        self._rows: dict[int, np.ndarray] = {}   # position -> the target's hidden state there
        self._base = 0                 # len(history) when the last drafts were proposed
        self._probe_wait = 0
        self._next_probe = FIRST_PROBE_PAUSE
        self._failed = False

    def observe(self, start: int, rows: np.ndarray) -> None:
        """The target evaluated positions ``start..start + len(rows) - 1`` of
        this generation's sequence; ``rows`` are their final normed hidden states."""
        for i in range(len(rows)):
            self._rows[start + i] = rows[i]
        if len(self._rows) > MAX_KEPT_ROWS:
            for p in sorted(self._rows)[:len(self._rows) - MAX_KEPT_ROWS]:
                del self._rows[p]

    def _check_probe(self) -> None:
        """Compare the watched probe's guess with the token emitted there, once there is one."""
        if self._probe is None or len(self.history) <= self._probe[0]:
            return
        at, guess = self._probe
        self._probe = None
        if self.history[at] == guess:
            self.acceptance.confirm()
            self._next_probe = FIRST_PROBE_PAUSE
            self._probe_wait = 0
        else:
            self.acceptance.refuse()

    def propose(self, limit: int) -> list[int]:
        self._check_probe()
        limit = min(limit, self.head.max_draft)
        if limit <= 0 or self._failed:
            return []
        n = plan_draft_length(self.acceptance.rate, self.costs, self.head.relative_cost(self.costs), limit,
                              self.head.rollback_cost(self.costs))
        probing = n == 0
        if probing:
            if self._probe is not None:   # the last probe is not checked yet
                return []
            if self._probe_wait > 0:
                self._probe_wait -= 1
                return []
            n = 1
            self._probe_wait = self._next_probe
            self._next_probe = min(MAX_PROBE_PAUSE, 2 * self._next_probe)
        self._base = len(self.history)
        try:
            drafts = self.head.draft(self.seq, self.history, self._rows, n,
                                     window=PROBE_WINDOW if probing else None)
        except ElelemError as error:  # e.g. a head cache too small: go on without drafts
            log.warning("the MTP head failed (%s); this generation goes on without it", error)
            self._failed = True
            return []
        for p in [p for p in self._rows if p < self._base - 1]:   # evaluated by the head for good
            del self._rows[p]
        if probing and drafts:   # watched: the head drops it as it drops a proposal not verified
            self._probe = (self._base, drafts[0])
            self.head.keep(self.seq, self._base)
            return []
        return drafts

    def record(self, accepted: int, drafted: int) -> None:
        """``accepted`` of ``drafted`` tokens were confirmed.  The head keeps
        the positions up to the verified token's: those after it paired the
        head's own hidden states, and are evaluated again with the target's."""
        self.acceptance.record(accepted, drafted)
        if accepted > 0:
            self._next_probe = FIRST_PROBE_PAUSE
        self.head.keep(self.seq, self._base)

    def unverified(self, proposal: Sequence[int]) -> None:
        """The engine verified none of ``proposal``: drop it from the head."""
        self.head.keep(self.seq, self._base)


class DrafterChoice:
    """Per generation, prompt lookup or the MTP head, whichever is expected to
    keep more of its drafts: prompt lookup's proposal where it has one and its
    tokens have been confirmed at least as often, else the head's.  Prompt
    lookup's proposals not taken are watched (shadow-checked, free), so its
    estimate follows the text either way."""

    wants_hidden = True

    def __init__(self, lookup, mtp: MTPDrafter):
        self.lookup = lookup
        self.mtp = mtp
        self.chosen = mtp

    @property
    def kind(self) -> str:
        return "prompt lookup" if self.chosen is self.lookup else self.mtp.kind

    @property
    def acceptance(self) -> Acceptance:
        return self.chosen.acceptance

    def observe(self, start: int, rows: np.ndarray) -> None:
        self.mtp.observe(start, rows)

    def propose(self, limit: int) -> list[int]:
        proposal = self.lookup.propose(limit)
        if proposal and self.lookup.acceptance.rate >= self.mtp.acceptance.rate:
            self.chosen = self.lookup
            return proposal
        if proposal:
            self.lookup.unverified(proposal)
        self.chosen = self.mtp
        return self.mtp.propose(limit)

    def record(self, accepted: int, drafted: int) -> None:
        self.chosen.record(accepted, drafted)

    def unverified(self, proposal: Sequence[int]) -> None:
        self.chosen.unverified(proposal)
