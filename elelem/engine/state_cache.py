"""Recurrent models' states in memory: where conversations can resume.

A hybrid model's recurrent state holds every position it has seen and cannot
be cut back, so a prompt that parts from what a sequence holds resumes only
where a copy of that state was kept: the context keeps one where each prompt
ended (``Context.keep_snapshot``), which an agent's next turn resumes from
when the chat template rewrites the answer (Qwen3.5's strips the reasoning).
When another conversation takes the sequence, its cells go too; before they
do, the engine *parks* the state it would resume from here -- the K and V of
its positions and the recurrent state at their end, as ``Context.seq_state``
gives them -- and a later prompt sharing that prefix loads it instead of
evaluating it.

One budget bounds the kept snapshots and the parked states together
(``LLM(state_cache_mb=...)``); past it the parked states go first, least
recently used first, then the snapshots.
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
    """Parked sequence states, keyed by their tokens, least recently used first."""

    def __init__(self):
        self._entries: "OrderedDict[tuple[int, ...], np.ndarray]" = OrderedDict()
        self.nbytes = 0
        self.parked = 0          # statistics: states parked, and loaded back
        self.loaded = 0
        self.loaded_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: Sequence[int], limit: int) -> Optional[tuple[int, ...]]:
        """The longest parked token sequence that is a prefix of ``prompt``'s
        first ``limit`` positions (a recurrent state resumes only at its end)."""
        best = None
        for tokens in self._entries:
            if len(tokens) <= limit and (best is None or len(tokens) > len(best)) \
                    and tuple(prompt[:len(tokens)]) == tokens:
                best = tokens
        return best

    def take(self, tokens: tuple[int, ...]) -> np.ndarray:
        """A parked state (marked used: evicted last)."""
        self._entries.move_to_end(tokens)
        self.loaded += 1
        self.loaded_tokens += len(tokens)
        return self._entries[tokens]

    def park(self, tokens: Sequence[int], state: np.ndarray) -> None:
        key = tuple(int(t) for t in tokens)
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = state
        self.nbytes += state.nbytes
        self.parked += 1

    def evict_oldest(self) -> bool:
        """Drop the least recently used state; False when none is left."""
        if not self._entries:
            return False
        tokens, state = self._entries.popitem(last=False)
        self.nbytes -= state.nbytes
        log.debug("state cache: evicting a parked state of %d positions (%.1f MiB)", len(tokens), state.nbytes / 2**20)
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
