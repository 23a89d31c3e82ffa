"""Prompt-lookup drafting for speculative decoding.

A coding agent's answers copy long spans of their prompt (a file rewritten
with one change).  :class:`PromptLookup` guesses the next tokens by finding
the last few tokens of the history (prompt plus what was generated) earlier
in it, and proposing what followed them there.  Where those tokens occur
more than once (a line such as ``part = self.parts[sku]`` in several
methods), the occurrence whose context agrees furthest back with the
history's wins: it is the span being copied.  The engine evaluates the
guesses together with the real next token in one batch and keeps the
longest prefix the model's own choices confirm (see ``step_settle.py``).

Why the output does not change -- greedy or sampled: the engine calls the
request's picker once per emitted token, in order, on the logits of exactly
the history that token-by-token decoding would have, and accepts a draft
only when the picked token *is* the draft.  For a one-hot draft (prompt
lookup proposes a token, not a distribution) that is the speculative-
sampling rule itself: the draft ``d`` is accepted with probability ``p(d)``,
and on a rejection the token comes from ``p`` with ``d`` removed and
renormalized -- which is what "draw from ``p``, accept when it equals ``d``"
gives.  It even draws the same random numbers as decoding without drafts,
so a seeded sampler gives the same text.  What can differ is arithmetic
only: a batch of several tokens runs ggml's gemm kernels where one token
runs gemv, so logits differ -- in the last float bits with an f32 KV cache,
by up to ~0.15 (measured, SmolLM2) with f16 -- and where two tokens are that
close (a near-tie) the pick can flip.  The same holds already whenever
streams share a step (continuous batching).

Adaptive: a draft token widens the step, which on a CPU costs nearly as much
as decoding it.  Each drafter keeps an estimate of how often its tokens are
confirmed (:class:`Acceptance`), and the engine verifies only as many as pay
for the wider step (``step_costs.plan_drafts``), so text that never repeats
its context gets no drafts and is not slowed down.  Proposals the engine does
not verify are still checked against the tokens that follow ("shadow"
checks, free), so the estimate recovers when copying starts again.
"""
from __future__ import annotations

from typing import Optional, Sequence

#: The most tokens drafted per step: the engine's plan (step_costs.plan_drafts)
#: decides how many of them a step verifies (measured in benchmarks/speculative.py).
DEFAULT_MAX_DRAFT = 32
#: N-gram lengths matched, longest first: a longer match predicts better.
NGRAM_SIZES = (4, 3, 2)
#: Of an n-gram's occurrences, the newest this many are compared, each over at
#: most CONTEXT_COMPARED tokens before it: bounds the work of one proposal.
CANDIDATES_COMPARED = 32
CONTEXT_COMPARED = 64
#: Draft-model drafting (DraftPace): verifications in a row that accept nothing
#: before drafting pauses, and for how many emitted tokens it pauses the first
#: time; the pause doubles with every further run, up to MAX_PAUSE.
MISSES_BEFORE_PAUSE = 3
FIRST_PAUSE = 16
MAX_PAUSE = 256
#: Acceptance: the prior (a rate of 1/2 worth two tokens of evidence), and how
#: fast old evidence fades (per token checked: about the last 1/(1-DECAY)).
PRIOR_RATE = 0.5
PRIOR_WEIGHT = 2.0
DECAY = 0.95


class Acceptance:
    """The chance that a drafter's next draft token is confirmed, given that
    the ones before it were (a geometric model of how far drafts run), from
    recent evidence: each token checked is a confirmation or a refusal."""

    def __init__(self) -> None:
        self._confirmed = 0.0
        self._refused = 0.0
        # A proposal not verified: (its start in the history, its tokens, how many are checked).
        self._watched: Optional[tuple[int, list[int], int]] = None

    @property
    def rate(self) -> float:
        confirmed = self._confirmed + PRIOR_RATE * PRIOR_WEIGHT
        return confirmed / (self._confirmed + self._refused + PRIOR_WEIGHT)

    def confirm(self, n: int = 1) -> None:
        # n confirmations in a row, each fading the evidence before it by DECAY.
        fade = DECAY ** n
        self._confirmed = self._confirmed * fade + (1.0 - fade) / (1.0 - DECAY)
        self._refused *= fade

    def refuse(self) -> None:
        self._confirmed *= DECAY
        self._refused = self._refused * DECAY + 1.0

    def record(self, accepted: int, drafted: int) -> None:
        """A verification: the first ``accepted`` of ``drafted`` tokens were confirmed."""
        self.confirm(accepted)
        if accepted < drafted:
            self.refuse()

    def watch(self, history: Sequence[int], proposal: Sequence[int]) -> None:
        """``proposal`` was not verified: check it against the tokens that
        will follow ``history`` (one proposal at a time)."""
        if self._watched is None and proposal:
            self._watched = (len(history), list(proposal), 0)

    def check(self, history: Sequence[int]) -> None:
        """Count what the watched proposal got right among the tokens emitted since."""
        if self._watched is None:
            return
        start, proposal, checked = self._watched
        emitted = history[start + checked:start + len(proposal)]
        for i, token in enumerate(emitted, checked):
            if token != proposal[i]:
                self.refuse()
                self._watched = None
                return
            self.confirm()
        checked += len(emitted)
        self._watched = None if checked == len(proposal) else (start, proposal, checked)


class PromptLookup:
    """Drafts for one generation, from its live ``history``.

    ``history`` is the caller's list of tokens (prompt, then every token
    emitted so far, the last one being the next to evaluate); it is read,
    never changed, and indexed incrementally as it grows.
    """

    kind = "prompt lookup"

    def __init__(self, history: Sequence[int], *, max_draft: Optional[int] = None,
                 ngram_sizes: Sequence[int] = NGRAM_SIZES):
        max_draft = DEFAULT_MAX_DRAFT if max_draft is None else max_draft  # read now: benchmarks vary it
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.history = history
        self.max_draft = max_draft
        self._sizes = tuple(sorted(set(ngram_sizes), reverse=True))
        # n -> {n-gram: where the tokens that followed each occurrence start, oldest first}
        self._index: dict[int, dict[tuple, list[int]]] = {n: {} for n in self._sizes}
        self._indexed = 0            # continuations history[:_indexed] are indexed
        self.acceptance = Acceptance()

    def propose(self, limit: int) -> list[int]:
        """Up to ``min(limit, max_draft)`` tokens guessed to follow the history."""
        history = self.history
        self.acceptance.check(history)
        limit = min(limit, self.max_draft)
        if limit <= 0:
            return []
        self._extend_index()
        end = len(history)
        for n in self._sizes:
            if end <= n:
                continue
            starts = self._index[n].get(tuple(history[end - n:]))
            if starts:
                start = self._best_match(starts, n)
                return list(history[start:min(start + limit, end)])
        return []

    def _best_match(self, starts: list[int], n: int) -> int:
        """Of the occurrences of the history's last ``n`` tokens, the one whose
        preceding tokens agree longest with the history's own; the newest of
        those.  In a file being copied, a line that occurs twice is told apart
        by the lines before it, which the newest occurrence alone would not."""
        if len(starts) == 1:
            return starts[0]
        history = self.history
        tail = len(history) - n          # the history's tokens before its n-gram end here
        best, best_agreement = starts[-1], -1
        for start in reversed(starts[-CANDIDATES_COMPARED:]):
            before = start - n           # the candidate's tokens before its n-gram end here
            agreement = 0
            while (agreement < CONTEXT_COMPARED and agreement < before
                   and history[before - 1 - agreement] == history[tail - 1 - agreement]):
                agreement += 1
            if agreement > best_agreement:
                best, best_agreement = start, agreement
                if agreement == CONTEXT_COMPARED:
                    break
        return best

    def record(self, accepted: int, drafted: int) -> None:
        """The outcome of one verification: ``accepted`` of ``drafted`` tokens confirmed."""
        self.acceptance.record(accepted, drafted)

    def unverified(self, proposal: Sequence[int]) -> None:
        """The engine verified none of ``proposal`` (it would not pay): watch it."""
        self.acceptance.watch(self.history, proposal)

    def _extend_index(self) -> None:
        # The n-gram ending just before position j is listed with j, for every j
        # whose token is known (j < len): the history's own last n tokens are
        # therefore never matched against themselves.
        history = self.history
        for j in range(max(self._indexed, 1), len(history)):
            for n in self._sizes:
                if j >= n:
                    self._index[n].setdefault(tuple(history[j - n:j]), []).append(j)
        self._indexed = max(self._indexed, len(history))


class DraftPace:
    """How many tokens a draft model may propose at its next step: each costs
    a forward pass of the draft model, so drafting shrinks after a partial
    match and pauses after misses (prompt lookup proposes for free)."""

    def __init__(self, max_draft: int):
        self.max_draft = max_draft
        self._length = max_draft      # this step's draft length: shrinks after a partial match
        self._misses = 0
        self._pause_left = 0
        self._next_pause = FIRST_PAUSE

    def limit(self, limit: int) -> int:
        """The most tokens to draft now (0 while paused); counts a paused step."""
        if self._pause_left > 0:
            self._pause_left -= 1
            return 0
        return min(limit, self._length)

    def record(self, accepted: int, drafted: int) -> None:
        # Each draft token costs about as much as a token decoded (on CPU a batch is
        # compute bound), so after a partial match draft only a little past where it
        # failed, and grow back while drafts are confirmed whole.
        self._length = min(self.max_draft, 2 * self._length) if accepted == drafted else accepted + 1
        if accepted > 0:
            self._misses = 0
            self._next_pause = FIRST_PAUSE
            return
        self._misses += 1
        if self._misses >= MISSES_BEFORE_PAUSE:
            self._misses = 0
            self._pause_left = self._next_pause
            self._next_pause = min(MAX_PAUSE, self._next_pause * 2)
