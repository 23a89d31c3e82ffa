"""Recurrent models' states in memory: where conversations can resume.

A hybrid model's recurrent state holds every position it has seen and cannot
be cut back, so a prompt that parts from what a sequence holds resumes only
where a copy of that state was kept.  The engine has the context *keep* one
where each prompt ended and at the prompt's checkpoint, a tile before
(``Context.keep_snapshot``): an agent's next turn resumes there when the
chat template rewrites the answer (Qwen3.5's strips the reasoning) or the
generation prompt.  When another conversation takes the sequence, its cells
go too; before they do, its states there and at its end are *parked* -- the
K and V of the positions and the recurrent state at their end, as
``Context.seq_state`` gives them -- and a later prompt that extends one
loads it instead of evaluating it.

One budget bounds the kept snapshots and the parked states together
(``LLM(state_cache_mb=...)``); past it the parked states go first, least
recently used first, then the snapshots.  Models without recurrent state
keep nothing here: their cells cut back.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Optional, Sequence

import numpy as np

log = logging.getLogger("elelem")

DEFAULT_STATE_CACHE_MB = 2048
#: Shorter prefixes are not parked: evaluating them again is about as fast.
MIN_PARKED_TOKENS = 32


class StateCache:
    """A hybrid context's kept snapshots and parked states, within ``max_bytes``.
    The engine calls it under its lock."""

    def __init__(self, context, max_bytes: int):
        self._ctx = context
        self.max_bytes = max_bytes
        self._parked: "OrderedDict[tuple[int, ...], np.ndarray]" = OrderedDict()
        self.parked_bytes = 0
        self.parked = 0          # statistics: states parked, and loaded back
        self.loaded = 0
        self.loaded_tokens = 0

    @property
    def enabled(self) -> bool:
        return self._ctx.cache.hybrid and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._parked)

    @property
    def used(self) -> int:
        """Bytes of the kept snapshots and the parked states."""
        if not self._ctx.cache.hybrid:
            return 0
        return self.parked_bytes + sum(size for *_, size in self._ctx.kept_snapshots())

    # -- kept snapshots ----------------------------------------------------------

    def keep(self, seq: int) -> None:
        """Keep ``seq``'s recurrent state where it ends now (a prompt's end or checkpoint)."""
        if self.enabled:
            self._ctx.keep_snapshot(seq)
            self.fit()

    def kept_ends(self, seq: int, before: int) -> list[int]:
        """The positions of ``seq``'s last prompt's kept snapshots before
        position ``before`` (its end and its checkpoint), latest first."""
        kept = sorted((pos for _, s, pos, _ in self._ctx.kept_snapshots() if s == seq and pos < before), reverse=True)
        return kept[:2]

    # -- parked states -----------------------------------------------------------

    def park(self, seq: int, keep: int) -> None:
        """Before ``seq`` is cut to ``keep`` positions: park its states at the
        kept ends it loses and at its end (a generation's), for its
        conversation to resume from when it comes back."""
        length = self._ctx.cache.seq_length_of(seq)
        if not self.enabled or keep >= length:
            return
        ends = [n for n in self.kept_ends(seq, length) if n > keep]
        if not ends:   # nothing kept past the cut: a turn that goes on from the prompt's end
            return
        tokens = self._ctx.cache.seq_tokens(seq)
        for n in [length] + ends:
            state = self._ctx.snapshot_state(seq, n)
            if n >= MIN_PARKED_TOKENS and state is not None:
                key = tuple(int(t) for t in tokens[:n])
                old = self._parked.pop(key, None)
                self.parked_bytes += state.nbytes - (old.nbytes if old is not None else 0)
                self._parked[key] = state
                self.parked += 1
        log.debug("sequence %d: parked its states at positions %s", seq, [length] + ends)

    def lookup(self, prompt: Sequence[int], limit: int) -> Optional[tuple[int, ...]]:
        """The longest parked token sequence that is a prefix of ``prompt``'s
        first ``limit`` positions (a recurrent state resumes only at its end)."""
        best = None
        for tokens in self._parked:
            if len(tokens) <= limit and (best is None or len(tokens) > len(best)) \
                    and tuple(prompt[:len(tokens)]) == tokens:
                best = tokens
        return best

    def take(self, tokens: tuple[int, ...]) -> np.ndarray:
        """A parked state, out of the cache: it goes back into a sequence
        (load), which parks it again if another conversation takes it."""
        state = self._parked.pop(tokens)
        self.parked_bytes -= state.nbytes
        return state

    def load(self, seq: int, tokens: tuple[int, ...], state: np.ndarray) -> None:
        """Give empty sequence ``seq`` a state taken from the cache, and keep
        its end for the turns after."""
        self._ctx.seq_load(seq, list(tokens), state)
        self._ctx.keep_snapshot(seq)
        self.loaded += 1
        self.loaded_tokens += len(tokens)

    # -- the budget --------------------------------------------------------------

    def fit(self) -> None:
        """Parked states, then kept snapshots, least recently used first,
        until both fit max_bytes."""
        if not self._ctx.cache.hybrid:
            return
        kept = sorted(self._ctx.kept_snapshots())
        kept_bytes = sum(size for *_, size in kept)
        while self._parked and self.parked_bytes + kept_bytes > self.max_bytes:
            tokens, state = self._parked.popitem(last=False)
            self.parked_bytes -= state.nbytes
            log.debug("state cache: evicting a parked state of %d positions (%.1f MiB)",
                      len(tokens), state.nbytes / 2**20)
        total = self.parked_bytes + kept_bytes
        for _, seq, pos, size in kept:
            if total <= self.max_bytes:
                break
            self._ctx.drop_snapshot(seq, pos)
            total -= size
