"""Drafting with a smaller model of the same vocabulary (``LLM(draft_model=...)``).

A :class:`DraftModel` owns a native context of its own over the small model:
one draft sequence per sequence of the target engine (the same ids), so that
concurrent requests never share draft state.  Per generation,
:class:`ModelDrafter` has :class:`~elelem.engine.speculative.PromptLookup`'s
interface: ``propose(limit)`` brings its sequence up to the generation's
history (evaluating only the tokens it does not hold yet), then decodes up to
``limit`` tokens greedily; ``record(accepted, drafted)`` trims its cache back
to what the target kept, and ``unverified(proposal)`` to the history when the
engine verified none of them.  The target verifies the drafts exactly as it does
prompt-lookup ones, so the output stays the target model's own: a draft
model changes the speed, never the text (a draft is a one-hot guess, see
:mod:`elelem.engine.speculative`).

The engine calls both methods under its lock, between two of its steps, so
the draft context is used by one thread at a time.
"""
from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

import numpy as np

from ..errors import ElelemError, VocabularyMismatchError
from .draft_context import DraftContext
from .speculative import Acceptance, DraftPace

#: The most tokens a draft model proposes per step: each costs a forward pass
#: of it, made before the engine knows how many it will verify.
DEFAULT_MAX_DRAFT = 8

log = logging.getLogger("elelem")

_TOKENS_KEY = "tokenizer.ggml.tokens"


def check_same_vocabulary(target_gguf, target_n_vocab: int, draft_gguf, draft_n_vocab: int) -> None:
    """Raise :class:`VocabularyMismatchError` unless the draft model's token
    ids mean what the target's do: the same size and the same token texts."""
    if target_n_vocab != draft_n_vocab:
        raise VocabularyMismatchError(
            f"the draft model {draft_gguf.path} has {draft_n_vocab} tokens and the model {target_gguf.path} "
            f"{target_n_vocab}: a draft model needs the same vocabulary")
    target_tokens, draft_tokens = target_gguf.get(_TOKENS_KEY), draft_gguf.get(_TOKENS_KEY)
    if (target_tokens is None) != (draft_tokens is None):
        raise VocabularyMismatchError(
            f"only one of {target_gguf.path} and the draft model {draft_gguf.path} has a vocabulary "
            f"({_TOKENS_KEY})")
    if target_tokens is None:
        return  # bare models (no tokenizer): ids are all they have, and their counts agree
    for i, (ours, theirs) in enumerate(zip(target_tokens, draft_tokens)):
        if ours != theirs:
            raise VocabularyMismatchError(
                f"token {i} is {ours!r} in {target_gguf.path} but {theirs!r} in the draft model "
                f"{draft_gguf.path}: a draft model needs the same vocabulary")


class DraftModel(DraftContext):
    """A small model's native context, drafting for every sequence of one engine.

    ``context`` has as many sequences as the target's; ``owned_model`` (the
    native model, when this object opened it) is closed with it.
    """

    def __init__(self, context, *, owned_model=None, max_draft: Optional[int] = None):
        super().__init__(context, owned_model=owned_model,
                         max_draft=DEFAULT_MAX_DRAFT if max_draft is None else max_draft)

    @property
    def n_seq_max(self) -> int:
        return self._ctx.n_seq_max

    def drafter(self, seq: int, history: Sequence[int]) -> "ModelDrafter":
        """The drafter of one generation on target sequence ``seq``; ``history``
        is read live, as PromptLookup reads it."""
        return ModelDrafter(self, seq, history)

    # -- used by ModelDrafter, under the engine's lock ---------------------------

    def draft(self, seq: int, history: Sequence[int], n: int) -> list[int]:
        """Bring draft sequence ``seq`` to ``history``, then ``n`` greedy tokens."""
        with self._lock:
            if self.closed:
                return []
            self._last_used[seq] = time.monotonic()
            held = self._catch_up_start(seq, history)
            logits = self._decode(seq, list(history[held:]))
            drafts = [int(np.argmax(logits))]
            while len(drafts) < n:
                logits = self._decode(seq, drafts[-1:])
                drafts.append(int(np.argmax(logits)))
            return drafts

    def _catch_up_start(self, seq: int, history: Sequence[int]) -> int:
        """Trim ``seq`` to its longest prefix of ``history`` -- short of the last
        token, whose logits are needed -- and return that length."""
        held = self._held.setdefault(seq, [])
        n = min(len(held), len(history) - 1)
        i = 0
        while i < n and held[i] == history[i]:
            i += 1
        if i < len(held):
            del held[i:]
            self._ctx.seq_rm(seq, i)
        return i

    def _decode(self, seq: int, tokens: list[int]) -> np.ndarray:
        """Evaluate ``tokens`` after what ``seq`` holds, in n_batch chunks; the last logits."""
        held = self._held[seq]
        step = self._ctx.n_batch
        logits: Optional[np.ndarray] = None
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            logits = self._decode_chunk(seq, chunk)
            held.extend(chunk)
            self.evaluated += len(chunk)
        if logits is None:
            raise ValueError("nothing to evaluate: the draft model needs at least one token")
        return logits[-1]

    def _decode_chunk(self, seq: int, chunk: list[int]) -> np.ndarray:
        try:
            return self._ctx.decode(chunk, seq)
        except ElelemError as error:
            if not self._drop_idle(seq, len(chunk)):
                raise
            log.debug("draft model: %s; dropped idle draft sequences", error)
            return self._ctx.decode(chunk, seq)


class ModelDrafter:
    """Drafts for one generation from a :class:`DraftModel` (PromptLookup's interface)."""

    kind = "draft model"

    def __init__(self, model: DraftModel, seq: int, history: Sequence[int]):
        self.model = model
        self.seq = seq
        self.history = history
        self.pace = DraftPace(model.max_draft)
        self.acceptance = Acceptance()
        self._base = 0                # len(history) when the last drafts were proposed
        self._failed = False

    def propose(self, limit: int) -> list[int]:
        """Up to ``min(limit, max_draft)`` tokens the draft model predicts after the history."""
        self.acceptance.check(self.history)
        limit = self.pace.limit(limit)
        if limit <= 0 or self._failed:
            return []
        self._base = len(self.history)
        try:
            return self.model.draft(self.seq, self.history, limit)
        except ElelemError as error:  # e.g. a draft cache too small: go on without drafts
            log.warning("the draft model failed (%s); this generation goes on without it", error)
            self._failed = True
            return []

    def record(self, accepted: int, drafted: int) -> None:
        """``accepted`` of ``drafted`` tokens were confirmed: keep those in the draft cache."""
        self.pace.record(accepted, drafted)
        self.acceptance.record(accepted, drafted)
        self.model.keep(self.seq, self._base + accepted)

    def unverified(self, proposal: Sequence[int]) -> None:
        """The engine verified none of ``proposal`` (it would not pay): drop it
        from the draft cache, watch it, and count it a miss, so that the draft
        model stops spending passes the engine declines."""
        self.pace.record(0, len(proposal))
        self.acceptance.watch(self.history, proposal)
        self.model.keep(self.seq, self._base)
