"""Token-level constraints: only let the sampler pick tokens that keep the output valid.

:class:`TokenConstraint` drives one constrained reply.  It is a list of
phases -- tokens forced as they are (``<tool_call>\\n``), then JSON that a
:class:`~elelem.sampling.json_automaton.JsonAutomaton` accepts, then more forced
tokens -- and it picks every token of the reply through :meth:`sample`.

Speed is the point, because this runs once per generated token:

* each token's text is computed once per tokenizer (:class:`TokenTexts`),
  with the ids grouped by first character for the rare full scan;
* the sampler first picks a token from the untouched logits, as it would
  without a constraint; when that token is valid (the usual case: the
  model already wants to write the JSON) it is taken at once, at the cost of
  walking a few characters through the automaton;
* only when it is invalid are the highest logits tested, best first, in
  growing batches, and the sampler draws again from the valid ones.  When
  none of the top ones fits, every token whose first character the automaton
  allows is tested -- slow, but rare;
* token walks are cached per automaton state.

Drawing first and re-drawing from the valid tokens only when the first draw
was invalid is rejection sampling: the token comes from the sampler's
distribution restricted to the valid tokens, the same as masking first.
"""
from __future__ import annotations

import weakref
from typing import Optional, Sequence

import numpy as np

from .json_automaton import JsonAutomaton, State

_TOP_BATCHES = (8, 64, 512)  # how many of the best tokens to test before a full scan
_CACHE_STATES = 4096


class TokenTexts:
    """The text of every token id (None for tokens that cannot appear in JSON:
    control tokens, and pieces that are not whole UTF-8 characters)."""

    _by_tokenizer: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self, texts: Sequence[Optional[str]]):
        self.texts = list(texts)
        by_first: dict[str, list[int]] = {}
        for token_id, text in enumerate(self.texts):
            if text:
                by_first.setdefault(text[0], []).append(token_id)
        self.by_first_char = {ch: np.asarray(ids, dtype=np.int64) for ch, ids in by_first.items()}

    @classmethod
    def of(cls, tokenizer) -> "TokenTexts":
        """The texts of ``tokenizer``'s vocabulary, computed once per tokenizer."""
        cached = cls._by_tokenizer.get(tokenizer)
        if cached is None:
            cached = cls(_token_texts(tokenizer))
            cls._by_tokenizer[tokenizer] = cached
        return cached


def _token_texts(tokenizer) -> list[Optional[str]]:
    from ..text.tokenizer.pieces import build_pieces
    # The plain pieces (control tokens give b""), taken per id without the
    # leading-space handling decode() applies to the first token of a text.
    pieces = build_pieces(tokenizer._vocab)[0]
    texts: list[Optional[str]] = []
    for piece in pieces:
        try:
            texts.append(piece.decode("utf-8") or None)
        except UnicodeDecodeError:
            texts.append(None)
    return texts


class Forced:
    """A phase that emits fixed tokens, whatever the logits say."""

    def __init__(self, token_ids: Sequence[int]):
        self.token_ids = list(token_ids)


class TokenConstraint:
    """Picks each token of a reply made of :class:`Forced` phases and JSON automata."""

    def __init__(self, phases: Sequence[object], token_texts: TokenTexts):
        self._phases = [p for p in phases if not (isinstance(p, Forced) and not p.token_ids)]
        self._texts = token_texts.texts
        self._by_first = token_texts.by_first_char
        self._phase = 0
        self._forced_at = 0
        self._state: Optional[State] = None
        self._enter_phase()
        # state -> {token id: next state or None}, per automaton
        self._walks: dict[tuple[int, State], dict[int, Optional[State]]] = {}
        self.full_scans = 0  # how often the slow path ran (for benchmarks and tests)
        self.redraws = 0

    @property
    def complete(self) -> bool:
        """True once every phase is done: the reply must end here."""
        return self._phase >= len(self._phases)

    def sample(self, sampler, logits: np.ndarray, recent: Sequence[int]) -> int:
        """The next token: forced, or drawn by ``sampler`` among the valid ones."""
        phase = self._phases[self._phase]
        if isinstance(phase, Forced):
            token = phase.token_ids[self._forced_at]
            self._forced_at += 1
            if self._forced_at == len(phase.token_ids):
                self._next_phase()
            return token
        token = sampler.sample(logits, recent)
        state = self._walk(phase, token)
        if state is None:
            self.redraws += 1
            valid = self._valid_tokens(phase, logits)
            masked = np.full_like(logits, -np.inf)
            masked[valid] = logits[valid]
            token = sampler.sample(masked, recent)
            state = self._walk(phase, token)
        self._state = state
        if state == ():
            self._next_phase()
        return token

    # -- internals -------------------------------------------------------------

    def _enter_phase(self) -> None:
        self._forced_at = 0
        if not self.complete and isinstance(self._phases[self._phase], JsonAutomaton):
            self._state = self._phases[self._phase].initial

    def _next_phase(self) -> None:
        self._phase += 1
        self._enter_phase()

    def _walk(self, automaton: JsonAutomaton, token: int) -> Optional[State]:
        key = (self._phase, self._state)
        walks = self._walks.get(key)
        if walks is None:
            if len(self._walks) > _CACHE_STATES:
                self._walks.clear()
            walks = self._walks[key] = {}
        try:
            return walks[token]
        except KeyError:
            pass
        text = self._texts[token] if 0 <= token < len(self._texts) else None
        result = automaton.advance_text(self._state, text) if text else None
        walks[token] = result
        return result

    def _valid_tokens(self, automaton: JsonAutomaton, logits: np.ndarray) -> np.ndarray:
        finite = np.isfinite(logits)
        tested = 0
        for batch in _TOP_BATCHES:
            batch = min(batch, logits.size)
            best = np.argpartition(-logits, batch - 1)[:batch]
            best = best[np.argsort(-logits[best], kind="stable")][tested:]
            valid = [int(t) for t in best if finite[t] and self._walk(automaton, int(t)) is not None]
            if valid:
                return np.asarray(valid, dtype=np.int64)
            tested = batch
        # Slow path: every token whose first character the automaton takes.
        self.full_scans += 1
        valid = []
        for ch, ids in self._by_first.items():
            if automaton.advance(self._state, ch) is None:
                continue
            valid.extend(int(t) for t in ids if self._walk(automaton, int(t)) is not None)
        if not valid:
            raise RuntimeError("no token of the vocabulary continues the constrained JSON")
        return np.asarray(valid, dtype=np.int64)
