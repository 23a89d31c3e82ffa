"""Step planning: what the engine's next step evaluates.

A step is one batch of up to ``n_batch`` tokens over every sequence that has
work: the next token of each generating request, prompt chunks of requests
being prefilled, an image's embeddings (a step of their own), and the drafts
that generating requests verify after their next token (speculative.py), as
many as pay for the wider step (step_costs.py).  ``StepPlanning`` is the
engine's part that builds it: its methods run under the engine's lock, by the
thread that is about to run the step.  What the step's rows then give is
settled in step_settle.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ..errors import InvalidArgumentError, KVCacheFullError
from .media import MediaTable, next_prompt_run
from .request import Request
from .step_costs import StepCosts, plan_drafts


#: Generated tokens a consumer may leave unread before its request pauses:
#: a stream that is not being read stops computing after a few steps.
MAX_AHEAD = 8


@dataclass
class Chunk:
    """One request's tokens in a step, and where their rows and drafts are."""

    request: Request
    n: int                              # tokens taken from request.pending
    rows: list[int] = field(default_factory=list)  # their rows in the step's logits
    drafts: list[int] = field(default_factory=list)  # guesses evaluated after them
    base: int = 0                       # positions the sequence held before the step
    first: int = 0                      # the step's row of its first token ...
    draft_first: int = 0                # ... and of its first draft


@dataclass
class Plan:
    """A step: its chunks, and the batch Context.decode takes."""

    chunks: list[Chunk]
    tokens: list[int]
    seqs: list[int]
    outputs: list[bool]
    # Every token is a generated one (no prompt in the step): the core gives
    # each row its one-token step's numbers, at any width (Context.decode).
    generated: bool = False
    # Some request drafts with an MTP head, which reads the step's hidden states.
    keep_hidden: bool = False
    # A step of one image's embeddings (tokens holds their ids; media.py), and
    # whether its rows attend to each other causally.
    embd: Optional[np.ndarray] = None
    causal: bool = True
    # Its grid (columns, rows) and the index of its first row, where the text model places it in 2D.
    grid: Optional[tuple[int, int]] = None
    grid_offset: int = 0


class StepPlanning:
    """Engine methods that plan a step (mixed into Engine, which owns the state they use)."""

    if TYPE_CHECKING:  # the Engine's state and methods these use
        _ctx: Any  # elelem._core.Context
        _active: list[Request]
        _prompt_turn: bool
        _interrupted: Optional[BaseException]
        media: MediaTable
        n_ctx: int
        step_costs: StepCosts

        @property
        def kv_size(self) -> int: ...
        def _admit(self, request: Request) -> None: ...
        def _make_room(self, need: int, running: set[int]) -> int: ...
        def _drop(self, request: Request, error: Optional[BaseException]) -> None: ...

    def _plan(self, run_ahead: bool = False) -> Optional[Plan]:
        """The next batch: one token of every generating request first, then
        prompt chunks, up to n_batch tokens and the free cells."""
        for request in list(self._active):
            if not request.admitted:
                self._admit(request)
        budget = self._ctx.n_batch
        runnable = [r for r in self._active
                    if r.admitted and r.wants_more and (run_ahead or len(r.generated) < MAX_AHEAD)]
        if not runnable:
            return None
        runnable.sort(key=lambda r: len(r.pending) > 1)  # decoding requests first, stable otherwise
        prompting = [r for r in runnable if not r.decoding]
        if prompting and len(prompting) < len(runnable):
            # Streams' generated tokens take the one-token kernels, prompts the
            # batch ones (Context.decode's decode_kernels); in one step every row
            # would take the prompt's, and a running stream whose step a new
            # prompt joined would part from its solo tokens at a near-tie.  So
            # steps of the two kinds alternate (a prompt chunk waits one step of
            # generated tokens, which then reads the weights once more).
            self._prompt_turn = not self._prompt_turn
            runnable = prompting if self._prompt_turn else [r for r in runnable if r.decoding]
        if not runnable[0].decoding:
            # A prompt step is split by sequence where its kernels depend on its
            # width (attention tiles, repacked and tiled matmuls) for at most
            # Context.max_prompt_runs sequences: the others wait a step.
            runnable = runnable[:self._ctx.max_prompt_runs]
        budget = min(budget, self._make_room(len(runnable), {r.seq for r in runnable}))
        if budget == 0:
            # Generations grew past the cells kept for them and nothing idle is
            # left to drop: end the newest, so that the others can go on.
            newest = max(runnable, key=lambda r: r.admitted_at)
            self._drop(newest, KVCacheFullError(
                f"the KV cache ({self.kv_size} cells) is full: {len(runnable)} running sequences hold every "
                f"cell; open the model with a larger kv_size, or run fewer requests at once"))
            return self._plan(run_ahead)
        chunks: list[Chunk] = []
        tokens: list[int] = []
        seqs: list[int] = []
        outputs: list[bool] = []
        n_outputs = 0
        drafting = []                   # chunks of generating requests that may verify drafts
        embd = None
        grid, grid_offset = None, 0
        for request in runnable:
            if budget == 0 or embd is not None:
                break
            n = min(len(request.pending), budget)
            if not request.decoding:   # an image's embeddings are a step of their own (media.py)
                n, image = next_prompt_run(request.pending, n)
                if image and chunks:
                    continue
                if image:
                    try:
                        embd = self.media.rows(request.pending[:n])
                        grid, grid_offset = self.media.placement(request.pending[:n])
                    except InvalidArgumentError as error:
                        self._drop(request, error)
                        continue
            if request.checkpoint and not request.decoding:   # a step ends there, for its snapshot
                before = request.checkpoint - self._ctx.cache.seq_length_of(request.seq)
                # An image's rows split there too (causal rows give the same either way), unless they
                # attend to each other both ways: then the image stays whole.
                if 0 < before < n and not (embd is not None and self.media.bidirectional):
                    n = before
                    if embd is not None:
                        embd = embd[:n]
            budget -= n
            chunk = Chunk(request, n, first=len(tokens), base=self._ctx.cache.seq_length_of(request.seq))
            ends = n == len(request.pending)
            for i, token in enumerate(request.pending[:n]):
                wanted = request.all_logits or (ends and i == n - 1)
                if wanted:
                    chunk.rows.append(n_outputs)
                    n_outputs += 1
                tokens.append(token)
                seqs.append(request.seq)
                outputs.append(wanted)
            if ends and n == 1 and request.drafter is not None and request.pick is not None:
                drafting.append(chunk)
            request.in_step = True
            chunks.append(chunk)
        if drafting and budget > 0:
            # Each sequence's drafts go after every first token: a sequence's tokens stay in order.
            for chunk in self._plan_drafts(drafting, len(tokens), budget):
                chunk.draft_first = len(tokens)
                for token in chunk.drafts:  # every draft's row: the model's choice after it
                    chunk.rows.append(n_outputs)
                    n_outputs += 1
                    tokens.append(token)
                    seqs.append(chunk.request.seq)
                    outputs.append(True)
        if not chunks:
            return None
        if not n_outputs:  # a step must return some row; the last one is cheap
            outputs[-1] = True
        self.media.images_evaluated += embd is not None
        return Plan(chunks, tokens, seqs, outputs, generated=embd is None and all(c.request.decoding for c in chunks),
                     keep_hidden=any(getattr(c.request.drafter, "wants_hidden", False) for c in chunks),
                     embd=embd, causal=not self.media.bidirectional, grid=grid, grid_offset=grid_offset)

    def _plan_drafts(self, drafting: list[Chunk], base_tokens: int, budget: int) -> list[Chunk]:
        """Ask each drafting request for its guesses, and keep as many as pay
        for the wider step (step_costs.plan_drafts); the chunks given drafts."""
        proposals = [self._drafts(chunk.request, chunk.base, budget) for chunk in drafting]
        offers = [(chunk.request.drafter.acceptance.rate, len(proposal)) for chunk, proposal in zip(drafting, proposals)]
        counts = plan_drafts(base_tokens, offers, self.step_costs, budget)
        given = []
        for chunk, proposal, count in zip(drafting, proposals, counts):
            if count:
                chunk.drafts = proposal[:count]
                given.append(chunk)
            elif proposal:
                chunk.request.drafter.unverified(proposal)
        return given

    def _drafts(self, request: Request, length: int, budget: int) -> list[int]:
        """Guesses to verify after a generating request's next token: within
        the batch, its context (a draft cell past n_ctx could never be kept)
        and its generation budget."""
        limit = request.n_ctx if request.n_ctx is not None else self.n_ctx
        # ``max_new`` picks are left: the next token's row gives the first, and
        # only a draft whose own row is used (not the last pick) can be kept.
        room = min(budget, limit - length - 1, request.max_new - 1)
        if room <= 0:
            return []
        try:
            proposal = request.drafter.propose(room)
        except KeyboardInterrupt as interrupt:  # the step is half planned: raised once it is settled
            self._interrupted = interrupt
            return []
        for i, token in enumerate(proposal):
            if token in request.ends:  # the row before it picks the end; the rest would be wasted
                return proposal[:i]
            if token < 0:              # an image's id (media.py), copied from the history: never a guess
                return proposal[:i]
        return proposal
