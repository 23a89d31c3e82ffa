"""One unit of work on one sequence: tokens to evaluate, then, optionally, generation.

A :class:`Request` is made by the API layer and handed to the
:class:`~elelem.engine.engine.Engine`, which steps it together with every
other active request.  Two kinds:

* evaluation: ``tokens`` are evaluated after what the sequence holds and the
  logits of the last one (or of all) are kept;
* generation: ``prompt`` is the whole sequence wanted; at admission the
  engine reuses the longest prefix the cache already holds (its own, or
  forked from another sequence) and evaluates the rest.  After each
  evaluation, ``pick(logits)`` chooses the next token; it is queued for the
  consumer and evaluated at the next step, until ``pick`` says stop.  With a
  ``drafter`` (:class:`~elelem.engine.speculative.PromptLookup`), guessed
  tokens are evaluated with it and kept as far as ``pick`` confirms them.

All mutable state is guarded by the engine's lock; the consumer reads the
queue through the engine.
"""
from __future__ import annotations

import collections
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from .prompt_cache import CacheHit

#: ``pick(logits) -> (token or None, go_on)``: the token to emit (None: none),
#: and whether to evaluate it and continue.
#: The most generated tokens a request keeps cells for in advance.  Keeping
#: its whole budget would let one ``max_tokens=None`` request hold the cache.
RESERVED_NEW = 256

Picker = Callable[[np.ndarray], "tuple[Optional[int], bool]"]


class Request:
    """Work on sequence ``seq``; see the module docstring."""

    def __init__(self, seq: int, *, tokens: Sequence[int] = (), prompt: Optional[Sequence[int]] = None,
                 all_logits: bool = False, pick: Optional[Picker] = None, n_ctx: Optional[int] = None,
                 streamed: bool = False, max_new: int = 0, drafter=None, ends: Iterable[int] = (),
                 lora: Optional[tuple[float, ...]] = None):
        self.seq = seq
        # The scale of each of the context's LoRA adapters for this request's
        # tokens; None: the engine's (Engine.lora_scales) when it is admitted.
        self.lora = lora
        self.prompt = list(prompt) if prompt is not None else None
        self.pending: list[int] = list(tokens)   # still to evaluate, in order
        self.all_logits = all_logits
        self.pick = pick
        self.n_ctx = n_ctx                        # the sequence may hold at most this many positions
        # Tokens a generation may still add after its pending ones: the engine
        # keeps cells for them, so a running request never starves for cells.
        self.max_new = max_new
        # Picked tokens wait here for a consumer reading them one by one
        # (Engine.next_token); without one (``streamed`` False) they are not kept.
        self.streamed = streamed
        self.generated: collections.deque[int] = collections.deque()
        self.logit_rows: list[np.ndarray] = []    # evaluation: the logits kept
        self.evaluated = 0                        # tokens this request evaluated and kept
        # Speculative decoding: proposes tokens to verify with the next one
        # (generation only; None drafts nothing).
        self.drafter = drafter
        # Tokens whose pick ends the generation: no row after one is ever used,
        # so a draft is cut before the first of them.
        self.ends = frozenset(ends)
        self.decoding = False                     # its prompt is evaluated: what it evaluates now it picked
        self.drafted = 0                          # draft tokens verified
        self.accepted = 0                         # of those, the ones kept
        self.reused = 0                           # prompt tokens found in the cache
        self.checkpoint = 0                       # a hybrid prompt's position to keep a snapshot at (0: none)
        # The prompt cache's best entry for the prompt, read from disk by the
        # submitting thread before it takes the engine's lock: (hit, entry) or None.
        self.prefetched: Optional[tuple[CacheHit, tuple[np.ndarray, np.ndarray]]] = None
        self.prefetch_tried = False
        self.admitted = False
        self.admitted_at = 0                      # admission order (the newest yields first when cells run out)
        self.done = False
        self.error: Optional[BaseException] = None
        self.cancelled = False
        self.cancel_error: Optional[BaseException] = None  # what the consumer sees after a cancel
        self.in_step = False                      # part of the step now running

    @property
    def cells_needed(self) -> int:
        """Cells kept for this request at admission: its pending tokens and
        its generation budget, up to RESERVED_NEW of it."""
        return len(self.pending) + min(self.max_new, RESERVED_NEW)

    @property
    def wants_more(self) -> bool:
        return not self.done and bool(self.pending)

    def logits(self) -> np.ndarray:
        """An evaluation's result: ``(n_vocab,)`` for the last token, or every row."""
        if self.all_logits:
            return np.concatenate(self.logit_rows, axis=0)
        return self.logit_rows[-1][-1]

    def finish(self, error: Optional[BaseException] = None) -> None:
        self.done = True
        self.pending = []
        if error is not None and self.error is None:
            self.error = error
