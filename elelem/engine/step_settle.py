"""Settling a step: what the rows of a step's logits do to its requests.

Once the native step has run, each request of the step takes its tokens out
of ``pending``; a generating request picks its next token from its row, or
walks the rows of its verified drafts (speculative.py) and keeps the longest
run its own picks confirm, the cells of the refused ones going back; a
request that wants logits gets its rows.  A failed step left the cache as it
was, and ends the requests it hit.  ``StepSettling`` is the engine's part
that does it: its methods run under the engine's lock, by the thread that ran
the step (step_plan.py planned it).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from .request import Request
from .state_cache import StateCache
from .step_plan import Chunk, Plan


class StepSettling:
    """Engine methods that settle a step (mixed into Engine, which owns the state they use)."""

    if TYPE_CHECKING:  # the Engine's state and methods these use
        _ctx: Any  # elelem._core.Context
        _active: list[Request]
        _last_used: dict[int, float]
        _abort_for_cancel: bool
        states: StateCache
        n_ctx: int
        steps: int
        batched_tokens: int
        shared_steps: int
        drafted_tokens: int
        accepted_tokens: int
        drafter_tokens: dict[str, list[int]]

        def _retire(self, request: Request) -> None: ...
        def _drop(self, request: Request, error: Optional[BaseException]) -> None: ...
        def _offer_finished(self) -> None: ...


    def _settle(self, plan: Plan, logits: Optional[np.ndarray], error: Optional[BaseException],
                own: Request) -> None:
        hidden = self._ctx.last_hidden if plan.keep_hidden and error is None else None
        for chunk in plan.chunks:
            chunk.request.in_step = False
        if error is not None:
            self._settle_failure(plan, error, own)
            return
        assert logits is not None, "a step that did not fail has its logits"
        self.steps += 1
        self.batched_tokens += len(plan.tokens)
        self.shared_steps += len(plan.chunks) > 1
        now = time.monotonic()
        for chunk in plan.chunks:
            request = chunk.request
            self._last_used[request.seq] = now
            del request.pending[:chunk.n]
            request.evaluated += chunk.n
            if not request.decoding and self._ctx.cache.hybrid and (
                    not request.pending or self._ctx.cache.seq_length_of(request.seq) == request.checkpoint):
                self.states.keep(request.seq)
            if request.cancelled:
                self._keep_drafts(chunk, 0)
                self._drop(request, request.cancel_error)
                continue
            if not chunk.rows:
                continue
            rows = logits[chunk.rows]
            if request.pick is None:
                request.logit_rows.append(rows)
                if not request.pending:
                    self._retire(request)
                continue
            kept = 0
            if chunk.drafts:
                kept = self._pick_verified(chunk, rows)
            else:
                self._pick_next(request, rows[-1], self._ctx.cache.seq_length_of(request.seq))
            if hidden is not None and getattr(request.drafter, "wants_hidden", False):
                # The rows the sequence keeps: its tokens', then its confirmed drafts'.
                request.drafter.observe(chunk.base, np.concatenate(
                    [hidden[chunk.first:chunk.first + chunk.n], hidden[chunk.draft_first:chunk.draft_first + kept]]))
        self._offer_finished()

    def _pick_next(self, request: Request, logits: np.ndarray, held: int, draft: Optional[int] = None) -> bool:
        """Pick the token after ``held`` positions.  True when it is ``draft``,
        already evaluated, whose row the caller goes on to; otherwise the
        token is queued to be evaluated next, or the request ends."""
        pick = request.pick
        assert pick is not None, "only a request that picks its tokens gets here"
        try:
            token, go_on = pick(logits)
        except BaseException as exc:  # noqa: B902 -- the consumer gets it
            self._drop(request, exc)
            return False
        if token is not None and request.streamed:
            request.generated.append(token)
        if token is None or not go_on or held >= (request.n_ctx or self.n_ctx):
            self._retire(request)
            return False
        request.max_new = max(0, request.max_new - 1)
        request.decoding = True
        if draft is not None and token == draft:
            return True
        request.pending = [token]
        return False

    def _pick_verified(self, chunk: Chunk, rows: np.ndarray) -> int:
        """Walk the rows of a token and its drafts: pick after each, in order,
        going on while the pick is the next draft, so that the picker sees
        exactly what decoding token by token would show it."""
        drafts = chunk.drafts
        kept = 0
        for i, row in enumerate(rows):
            draft = drafts[i] if i < len(drafts) else None
            if not self._pick_next(chunk.request, row, chunk.base + i + 1, draft):
                break
            kept += 1
        self._keep_drafts(chunk, kept)
        return kept

    def _keep_drafts(self, chunk: Chunk, kept: int) -> None:
        """Keep the cells of the first ``kept`` drafts and trim the rest."""
        if not chunk.drafts:
            return
        request = chunk.request
        if request in self._active and request.pending:
            # A hybrid model's refused drafts are in its recurrent state: it goes
            # back to the snapshot before the step, and the tokens kept since
            # then are evaluated again in the next step, before the next token.
            replay = self._ctx.rewind(request.seq, chunk.base + 1 + kept)
            request.pending[:0] = replay
            request.evaluated -= len(replay)
        else:
            self._ctx.seq_rm(request.seq, chunk.base + 1 + kept)
        request.evaluated += kept
        request.drafted += len(chunk.drafts)
        request.accepted += kept
        self.drafted_tokens += len(chunk.drafts)
        self.accepted_tokens += kept
        counts = self.drafter_tokens.setdefault(getattr(request.drafter, "kind", "prompt lookup"), [0, 0])
        counts[0] += len(chunk.drafts)
        counts[1] += kept
        request.drafter.record(kept, len(chunk.drafts))

    def _settle_failure(self, plan: Plan, error: BaseException, own: Request) -> None:
        """A step failed and left the cache as it was.  An abort made for a
        cancel ends the cancelled requests only; Ctrl-C ends the driver's own
        request; any other error ends every request of the step."""
        if isinstance(error, KeyboardInterrupt) and self._abort_for_cancel:
            self._abort_for_cancel = False
            for chunk in plan.chunks:
                if chunk.request.cancelled:
                    self._drop(chunk.request, chunk.request.cancel_error)
            return
        victims = [own] if isinstance(error, KeyboardInterrupt) else [c.request for c in plan.chunks] + [own]
        for request in victims:
            self._drop(request, error)
