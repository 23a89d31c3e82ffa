"""What a step costs by its width, and how many drafted tokens a step should verify.

Verifying a draft token widens the step.  Whether that pays depends on the
machine: on a GPU a step of 16 tokens costs about what one costs, while on a
2-core CPU a second token can add 80% (measured on an AMD EPYC with AVX-512,
Qwen2.5-Coder-0.5B: 19 ms for one token, 35 ms for two, 60 ms for eight).
So the engine measures its own steps (:class:`StepCosts`) and plans each
step's drafts to maximize the expected useful tokens per second
(:func:`plan_drafts`), given each drafter's estimated chance that a draft
token is confirmed (``speculative.Acceptance``).  Text that its drafts do not
predict gets no drafts -- so it is not slowed down -- and long confirmed runs
(a file rewritten with one change) get long drafts where wide steps are cheap.
"""
from __future__ import annotations

import bisect
from typing import Callable, Optional, Sequence

#: The shape assumed for widths not yet measured: cost(n) ~ n ** PRIOR_EXPONENT
#: times the cost of the nearest measured width.  Between a GPU (~0) and a
#: small CPU (Qwen2.5-Coder-0.5B on 2 cores: ~0.45 from 2 to 32 tokens; SmolLM2's
#: Q4_1, with no batched kernel, ~0.9); a measurement replaces it at once.
PRIOR_EXPONENT = 0.5
#: Weight of a new measurement in a width's running average.
SMOOTHING = 0.25
#: A drafter that pays for its drafts drafts only where that is expected to be this much faster.
MIN_DRAFT_GAIN = 0.05


class StepCosts:
    """Running averages of step time by width (tokens in the step), for steps
    whose every row gives logits -- decoding and verification, what a draft
    plan chooses between.  Prompt chunks, whose rows mostly give none, are not
    recorded.  ``relative(n)`` is what ``n`` tokens cost against one token."""

    def __init__(self, fixed: Optional[Callable[[int], float]] = None):
        self._fixed = fixed
        self._seconds: dict[int, float] = {}
        self._widths: list[int] = []           # sorted keys of _seconds

    @classmethod
    def flat(cls) -> "StepCosts":
        """Every width costs the same: every draft pays (tests; an idealized GPU)."""
        return cls(fixed=lambda n: 1.0)

    def record(self, width: int, seconds: float) -> None:
        if self._fixed is not None or width < 1 or seconds <= 0:
            return
        old = self._seconds.get(width)
        if old is None:
            bisect.insort(self._widths, width)
            self._seconds[width] = seconds
        else:
            self._seconds[width] = old + SMOOTHING * (seconds - old)

    def seconds(self, width: int) -> Optional[float]:
        """The estimated time of a step of ``width`` tokens (None: nothing measured yet)."""
        if self._fixed is not None:
            return self._fixed(width)
        widths = self._widths
        if not widths:
            return None
        known = self._seconds.get(width)
        if known is not None:
            return known
        i = bisect.bisect_left(widths, width)
        if 0 < i < len(widths):  # between two measured widths: linear
            lo, hi = widths[i - 1], widths[i]
            a, b = self._seconds[lo], self._seconds[hi]
            return a + (b - a) * (width - lo) / (hi - lo)
        nearest = widths[0] if i == 0 else widths[-1]
        return self._seconds[nearest] * (width / nearest) ** PRIOR_EXPONENT

    def relative(self, width: int, base: int = 1) -> float:
        """cost(width) / cost(base); the prior shape where nothing is measured."""
        a, b = self.seconds(width), self.seconds(base)
        if a is None or b is None:
            return (width / base) ** PRIOR_EXPONENT
        return a / b

    def table(self) -> dict[int, float]:
        """The measured widths and their average seconds (for stats and benchmarks)."""
        return dict(self._seconds)


def plan_drafts(base_tokens: int, offers: Sequence[tuple[float, int]], costs: StepCosts,
                budget: int) -> list[int]:
    """How many tokens of each offer to verify in a step that already holds
    ``base_tokens`` tokens (one per decoding sequence, plus prompt chunks).

    ``offers[i]`` is ``(rate, n)``: a drafter's ``n`` proposed tokens and its
    estimate of the chance that each is confirmed once the ones before it are,
    so its ``j``-th token is kept with probability ``rate ** j``.  Every base
    token counts as one useful token, every draft token as its chance; the
    plan takes the most probable draft tokens first, as many as maximize
    useful tokens per unit of step time, at most ``budget`` in all.
    """
    if base_tokens < 1:
        return [0] * len(offers)
    chances = sorted(((rate ** j, i) for i, (rate, n) in enumerate(offers) if rate > 0
                      for j in range(1, n + 1)), reverse=True)[:max(0, budget)]
    # Useful tokens per unit of time, in units of the base step's own rate (1.0).
    best_m, best = 0, 1.0
    value = float(base_tokens)
    for m, (chance, _) in enumerate(chances, 1):
        value += chance
        rate = value / base_tokens / costs.relative(base_tokens + m, base_tokens)
        if rate > best:
            best_m, best = m, rate
    counts = [0] * len(offers)
    for _, i in chances[:best_m]:
        counts[i] += 1
    return counts


def plan_draft_length(rate: float, costs: StepCosts, draft_cost: float, limit: int,
                      rollback_cost: float = 0.0) -> int:
    """How many tokens a drafter that pays for each one should draft (0: none).

    Drafting ``k`` tokens costs ``k`` of the drafter's steps (``draft_cost``
    each, against a one-token step of the target), widens the target's step
    from 1 to ``1 + k`` tokens, and where a draft is refused costs
    ``rollback_cost`` more (a hybrid model's recurrent state is rewound to
    the snapshot before the step, and the next step evaluates the kept tokens
    again: a few rows more); it is expected to give
    ``1 + rate + ... + rate ** k`` tokens (each draft is kept with
    probability ``rate`` once the ones before it were).  The ``k`` in
    ``0..limit`` with the most tokens per unit of time, where that beats
    decoding alone by MIN_DRAFT_GAIN (measured step times are noisy); else 0.
    """
    best_k, best = 0, 1.0 + MIN_DRAFT_GAIN
    value, chance = 1.0, 1.0
    for k in range(1, max(0, limit) + 1):
        chance *= rate
        value += chance
        cost = max(1.0, costs.relative(1 + k)) + k * draft_cost + (1.0 - chance) * rollback_cost
        if value / cost > best:
            best_k, best = k, value / cost
    return best_k
