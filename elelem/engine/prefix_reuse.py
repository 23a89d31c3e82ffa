"""Prefix reuse: what of a new prompt the engine need not evaluate.

A request's prompt is matched against what the cache already holds: its own
sequence's cells, another sequence's (forked: the cells are shared), a
hybrid model's parked states (state_cache.py) and the prompt cache on disk
(prompt_cache.py).  The prefix taken is cut where the rest, evaluated as a
prompt, gets the logits of evaluating the whole prompt afresh (the 4-column
grid of repacked matmuls, the step classes of exact_tail), or, on a hybrid
model, where a snapshot holds the recurrent state.  ``PrefixReuse`` is the
engine's part that does it: its methods run under the engine's lock.

Cells hold what the LoRA adapters of their evaluation made of them: a prompt
reuses only cells evaluated at its own adapter scales (``Request.lora``; the
engine keeps each sequence's in ``_seq_lora``), and the parked states and the
prompt cache on disk, which keep no scales, serve and take only sequences
without adapters.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from .media import outside_images
from .prompt_cache import CacheHit, PromptCache
from .request import Request
from .state_cache import StateCache

log = logging.getLogger("elelem")

#: A reused prefix is a multiple of this many positions.  ggml's repacked
#: matmuls (Q4_0/Q4_K/IQ4_NL on x86, Q2_K with AVX-512) take a prompt's
#: columns 4 at a time (gemm) and the last n % 4 one by one (gemv), which
#: round differently; a prefix cut on that grid leaves the rest of the prompt
#: on the grid its evaluation afresh would use, so reuse gives the fresh
#: logits bit for bit (a Qwen2.5-Coder prompt's last logits were 0.13-0.35
#: apart otherwise).
REUSE_ALIGNMENT = 4
#: A new request waits a step for a prefix that another request admitted with
#: it is about to evaluate, when that saves at least this many positions: many
#: requests sharing a system prompt evaluate it once and fork it, rather than
#: every one evaluating it in the same step.
MIN_SHARED_WAIT = 16


class PrefixReuse:
    """Engine methods for prefix reuse (mixed into Engine, which owns the state they use)."""

    if TYPE_CHECKING:  # the Engine's state and method these use
        _ctx: Any  # elelem._core.Context
        _cv: threading.Condition
        states: StateCache
        prompt_cache: Optional[PromptCache]
        _active: list[Request]
        _free_seqs: list[int]
        _last_used: dict[int, float]
        _fresh_rows: dict[int, int]
        _seq_lora: dict[int, Any]
        lora_scales: tuple[float, ...]
        _finished_seqs: list[int]
        prompt_tokens: int
        prompt_tokens_evaluated: int

        def _make_room(self, need: int, running: set[int]) -> int: ...

    def _reuse_prefix(self, request: Request, prompt: list[int]) -> bool:
        """Bring a new request's sequence to the longest prefix of its prompt
        that can be had without evaluating it -- its own cells, another
        sequence's (forked), a parked recurrent state, the prompt cache on
        disk -- and set what is left to evaluate (``request.pending``).
        False: another request is about to evaluate a longer shared prefix;
        wait a step and fork it."""
        cache = self._ctx.cache
        # Re-evaluate at least two tokens of a longer prompt: ggml computes a lone
        # token with other kernels than a batch (gemv, not gemm), and a prompt whose
        # last token alone were re-evaluated could get other logits -- and at a
        # near-tie another greedy answer -- than the prompt evaluated afresh.
        limit = _reuse_limit(prompt)
        key = request.lora
        own, donor, shared = self._prefix_in_memory(request.seq, prompt, limit, key)
        if self._prefix_coming(request, prompt, limit, shared):
            return False
        loaded = 0
        if not any(key or ()):   # no adapter: what the state and prompt caches hold is for it
            loaded = self._load_parked(request, prompt, limit, own, donor, shared)
            loaded = loaded or self._load_cached_prefix(request, prompt, limit, shared)
        if not loaded and cache.seq_length_of(request.seq) < own:   # cut for a load that found no room
            own, donor, shared = self._prefix_in_memory(request.seq, prompt, limit, key)
        if loaded:
            shared = loaded
            fresh = 0   # a state from disk: how its positions were evaluated is not kept
        else:
            source = request.seq if donor is None else donor
            fresh = min(self._fresh_rows.get(source, 0), shared)
            if cache.hybrid:   # where a state was kept: the exact tail's cut would go back turns
                own, donor, shared = self._at_resume_points(request.seq, own, donor, shared)
            elif shared and shared == fresh:
                own, donor, shared = self._cut_for_fresh_logits(prompt, own, donor, shared)
            # Never inside an image: its rows are evaluated together (media.py).
            own, shared = outside_images(prompt, own), outside_images(prompt, shared)
            if donor is not None and shared <= own:
                donor, shared = None, own
            source = request.seq if donor is None else donor
            fresh = min(self._fresh_rows.get(source, 0), shared)
            if donor is not None:  # a prefix another sequence holds: share its cells
                self._cut(request.seq, 0)
                self._ctx.seq_cp(donor, request.seq, shared)
            else:
                self._cut(request.seq, own)
        self._seq_lora[request.seq] = key
        # Evaluated here as a prompt: afresh, or after positions that were.
        self._fresh_rows[request.seq] = len(prompt) if fresh == shared else fresh
        request.reused = shared
        request.pending = prompt[shared:]
        self.prompt_tokens += len(prompt)
        self.prompt_tokens_evaluated += len(request.pending)
        if cache.hybrid:
            request.checkpoint = self._checkpoint(len(prompt), shared)
        return True

    def _cut_for_fresh_logits(self, prompt: list[int], own: int, donor: Optional[int], shared: int):
        """``(own, donor, shared)`` cut so that ``prompt``, whose reused
        positions were all evaluated as a prompt, gets the logits of its fresh
        evaluation: the last exact_tail tokens of its last run of tokens
        evaluated again, and a prefix forked from a donor cut to
        Context.fork_alignment.  An image is a step of its own (media.py), so
        the fresh evaluation's last steps are the tokens after the last image,
        their columns on the grid from its end: the turn an agent adds after
        a screenshot re-evaluates its own tokens, not the screenshot."""
        n, after = len(prompt), _after_last_image(prompt)
        own = min(own, after + _aligned(n - after - self.exact_tail(n - after)))
        if donor is not None:
            shared = self._forkable(n, shared, after)
            if shared <= own:
                donor = None
        return own, donor, (shared if donor is not None else own)

    def _at_resume_points(self, seq: int, own: int, donor: Optional[int],
                          shared: int) -> tuple[int, Optional[int], int]:
        """``(own, donor, shared)`` of a hybrid model cut to where the
        sequences' recurrent states can be set without evaluating tokens
        again (Context.resume_point): the positions past it are evaluated
        with the rest of the prompt, in its steps -- a replay of them in a
        step of its own would round them otherwise.  A resume point off
        REUSE_ALIGNMENT's grid (a prompt's end, mostly) is taken as it is:
        the step after it groups its columns from there, where a fresh
        evaluation would group them from the grid, which may round its last
        digits otherwise; the one alternative, an earlier snapshot, would
        evaluate hundreds of positions again on each turn of a chat."""
        own = self._ctx.resume_point(seq, own)
        if donor is not None:
            shared = self._ctx.resume_point(donor, shared)
            if shared <= own:
                donor = None
        return own, donor, (shared if donor is not None else own)

    def _forkable(self, n: int, shared: int, after: int = 0) -> int:
        """The positions of a prefix of ``shared`` positions that an ``n``-token
        prompt forks from a sequence that evaluated them as a prompt, for the
        logits of its fresh evaluation (_cut_for_fresh_logits; ``after``: where
        its last run of tokens begins, after its last image)."""
        tail = self.exact_tail(n - after)
        shared = min(shared, after + _aligned(n - after - tail))
        if tail >= self._ctx.fork_alignment:
            shared -= shared % self._ctx.fork_alignment
        return shared

    def exact_tail(self, n: int) -> int:
        """The fewest last positions of an ``n``-token prompt to evaluate again
        for its logits to be those of evaluating it afresh, when the cache
        holds its other positions as a fresh evaluation left them: as many as
        put the step in the same class as the fresh evaluation's last step of
        n_batch or fewer (Context.width_thresholds).  A Qwen2.5-Coder prompt's
        last two tokens alone, after 300 evaluated together, got logits 0.03
        away with flash attention (its one-row kernel, not the tiled one of 64
        rows); that once turned a repeated greedy request into another answer."""
        last_step = n - (n - 1) // self._ctx.n_batch * self._ctx.n_batch
        return max((w for w in self._ctx.width_thresholds if w <= last_step), default=1)

    def _prefix_in_memory(self, seq: int, prompt: list[int], limit: int,
                          key: Any) -> tuple[int, Optional[int], int]:
        """``(own, donor, shared)``: the prefix of ``prompt`` sequence ``seq``
        holds, and the longest one any sequence holds (``donor``: which other
        one, or None), at most ``limit`` positions, of cells evaluated at the
        LoRA scales ``key``.  Under the lock."""
        cache = self._ctx.cache
        # A hybrid model's prefix ends where a snapshot is (_at_resume_points), on the grid or not.
        grid = (lambda n: n) if cache.hybrid else (lambda n: outside_images(prompt, _aligned(n)))
        own = grid(min(_common_prefix(cache.seq_tokens(seq), prompt), limit)) if self._lora_of(seq) == key else 0
        donor, shared = None, own
        # A hybrid model's donor is worth the positions its state can be forked at.
        worth = self._ctx.resume_point if cache.hybrid else (lambda _, n: n)
        best = worth(seq, own)
        for other in self._last_used:
            if other != seq and self._lora_of(other) == key:
                n = grid(min(_common_prefix(cache.seq_tokens(other), prompt), limit))
                if worth(other, n) > best:
                    donor, shared, best = other, n, worth(other, n)
        return own, donor, shared

    def _prefix_coming(self, request: Request, prompt: list[int], limit: int, held: int) -> bool:
        """Whether another admitted request's prompt shares at least
        MIN_SHARED_WAIT more positions with ``request``'s than the ``held``
        ones the cache offers (or a prefetched prompt-cache entry), and has
        yet to evaluate them.  Under the lock."""
        if request.prefetched is not None:
            held = max(held, request.prefetched[0].n)
        cache = self._ctx.cache
        for other in self._active:
            if (other is request or not other.admitted or other.done or other.prompt is None
                    or other.lora != request.lora):
                continue
            n = _aligned(min(_common_prefix(other.prompt, prompt), limit))
            if not cache.hybrid:  # what the fork will take of it (_admit): a prompt's positions
                n = self._forkable(len(prompt), n)
            elif n < len(other.prompt):  # a recurrent state forks where it has a snapshot: its prompt's end
                n = 0
            if n - held >= MIN_SHARED_WAIT and cache.seq_length_of(other.seq) < n:
                return True
        return False

    def _prefetch_cached_prefix(self, request: Request) -> None:
        """Read the prompt cache's best entry for a new request's prompt, in
        the caller's thread and outside the engine's lock, so that the other
        streams do not stall on the disk (tens of ms for a long prompt).
        Whether it is used is decided at admission (_load_cached_prefix)."""
        request.prefetch_tried = True
        disk = self.prompt_cache
        if disk is None or request.prompt is None or request.admitted or any(request.lora or ()):
            return
        limit = _reuse_limit(request.prompt)
        hit = disk.lookup(request.prompt, limit)   # the index: in memory, under the cache's own lock
        if hit is None:
            return
        with self._cv:  # brief: what memory offers (a chat's next turn holds its prefix already)
            held = self._prefix_in_memory(request.seq, request.prompt, limit, request.lora)[2]
        if hit.n - held < disk.min_tokens:
            return
        entry = disk.read(hit)
        request.prefetched = (hit, entry) if entry is not None else None

    def _load_cached_prefix(self, request: Request, prompt: list[int], limit: int, held: int) -> int:
        """Load the longest prefix of ``prompt`` the prompt cache holds, when
        it beats the ``held`` positions the cache in memory offers by at
        least ``min_tokens``; returns the positions loaded (0: none)."""
        disk = self.prompt_cache
        prefetched, request.prefetched = request.prefetched, None
        if disk is None or limit - held < disk.min_tokens:
            return 0
        hit: Optional[CacheHit]
        entry: Optional[tuple[np.ndarray, np.ndarray]]
        if prefetched is not None:
            hit, entry = prefetched
        else:  # not prefetched (a request driven by another thread's call): read it here
            hit = disk.lookup(prompt, limit)
            entry = None
        if hit is None:
            return 0
        n = _aligned(hit.n)
        if self._ctx.cache.hybrid and hit.n == hit.stored:
            n = hit.n   # a recurrent state is a whole sequence's: loaded whole or not at all
        if n - held < disk.min_tokens or (self._ctx.cache.hybrid and n != hit.stored):
            return 0
        entry = entry if entry is not None else disk.read(hit)
        if entry is None:
            return 0
        self._cut(request.seq, 0)
        running = {r.seq for r in self._active if r.admitted} | {request.seq}
        if self._make_room(n, running) < n:
            return 0
        self._ctx.seq_load(request.seq, prompt[:n], entry[1], hit.stored)
        self.states.keep(request.seq)   # a hybrid turn that parts from this one resumes here
        disk.record_hit(n)
        log.debug("prompt cache: loaded %d of %d prompt tokens from %s", n, len(prompt), hit.path.name)
        return n

    def _offer_finished(self) -> None:
        """Offer the sequences whose requests ended in this step to the prompt
        cache (after the step's unconfirmed drafts are trimmed)."""
        seqs, self._finished_seqs = self._finished_seqs, []
        disk = self.prompt_cache
        if disk is None:
            return
        cache = self._ctx.cache
        for seq in seqs:
            if seq in self._free_seqs or cache.seq_length_of(seq) < disk.min_tokens or self._lora_of(seq) != self._no_lora:
                continue
            tokens = cache.seq_tokens(seq)
            if not disk.holds(tokens):
                disk.store(tokens, self._ctx.seq_state(seq))
            # A hybrid state loads whole: its prompt's end too, where the next turn resumes.
            for end in self.states.kept_ends(seq, len(tokens)):
                if end >= disk.min_tokens and not disk.holds(tokens[:end]):
                    state = self._ctx.snapshot_state(seq, end)
                    if state is not None:
                        disk.store(tokens[:end], state)

    def _checkpoint(self, n: int, start: int) -> int:
        """Where an ``n``-token prompt evaluated from ``start`` ends a step of
        its own to keep a snapshot (0: nowhere): the last point before its
        end from which its tail is evaluated as the step class and tiles of
        its unsplit evaluation would (_forkable), so that its logits do not
        change.  A later prompt that parts from this one within its last
        tokens -- a chat template's next turn that re-renders the
        generation prompt (Qwen3.5's opens ``<think>`` there, and drops it
        from history) -- resumes there rather than turns back."""
        if not self.states.enabled:
            return 0
        point = self._forkable(n, n)
        return point if point - start >= self.exact_tail(n) else 0

    def _cut(self, seq: int, keep: int) -> None:
        """Trim ``seq`` to ``keep`` positions for another prompt, parking the
        states a hybrid sequence loses (StateCache.park; not a sequence's with
        LoRA adapters: a parked state keeps no scales)."""
        if self._lora_of(seq) == self._no_lora:
            self.states.park(seq, keep)
        self._ctx.seq_rm(seq, keep)
        self.states.fit()

    def _load_parked(self, request: Request, prompt: list[int], limit: int, own: int,
                     donor: Optional[int], shared: int) -> int:
        """Load the longest parked state that ``prompt`` extends, when it
        beats what the sequences in memory offer; returns its positions (0: none)."""
        if not len(self.states):
            return 0
        key = self.states.lookup(prompt, limit)
        if key is None:
            return 0
        held = max(self._ctx.resume_point(request.seq, own),
                   self._ctx.resume_point(donor, shared) if donor is not None else 0)
        if len(key) <= held:
            return 0
        state = self.states.take(key)
        self._cut(request.seq, 0)
        running = {r.seq for r in self._active if r.admitted} | {request.seq}
        if self._make_room(len(key), running) < len(key):
            return 0
        self.states.load(request.seq, key, state)
        log.debug("state cache: resumed %d of %d prompt tokens from a parked state", len(key), len(prompt))
        return len(key)


    def _lora_of(self, seq: int) -> Any:
        """The LoRA scales sequence ``seq``'s cells were evaluated at (Request.lora):
        none (all 0) until a request says otherwise; MIXED_LORA after scales changed mid-sequence."""
        return self._seq_lora.get(seq, self._no_lora)

    @property
    def _no_lora(self) -> tuple[float, ...]:
        return (0.0,) * len(self.lora_scales)


#: The LoRA key of a sequence whose cells were evaluated at several adapter
#: scales (an evaluation appended at others): no prompt reuses them.
MIXED_LORA = ("mixed",)


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _aligned(n: int) -> int:
    return n - n % REUSE_ALIGNMENT


def _after_last_image(prompt: list[int]) -> int:
    """The position after ``prompt``'s last image id (negative, media.py): where its last
    run of tokens begins; 0 without an image, or where the prompt ends with one (which the
    reuse limit then evaluates again, whole)."""
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] < 0:
            return i + 1 if i + 1 < len(prompt) else 0
    return 0


def _reuse_limit(prompt) -> int:
    """The most positions of ``prompt`` that may come from a cache (see _admit)."""
    return max(0, len(prompt) - 2)
