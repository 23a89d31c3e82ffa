"""Token-level constraints: only let the sampler pick tokens that keep the output valid.

:class:`TokenConstraint` drives one constrained reply.  It is a list of
phases -- tokens forced as they are (:class:`Forced`: ``<tool_call>\\n``),
then text a :class:`~elelem.sampling.grammar.Grammar` accepts, then more
forced tokens -- and it picks every token of the reply through
:meth:`TokenConstraint.sample`.

In a grammar phase, llguidance computes the mask of the tokens that may
come next (:class:`~elelem.sampling.grammar.GrammarMatcher`); every other
logit becomes ``-inf`` and the sampler's whole chain (penalties, top-k,
top-p, temperature) runs on what is left, so the token is drawn from the
sampler's distribution over the valid tokens.  An end-of-generation token
is allowed only where the grammar is complete; once nothing more can follow,
the phase ends by itself.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy as np

from ..errors import InvalidArgumentError
from .grammar import Grammar, GrammarMatcher, GrammarTokenizer


_BAN = np.array([-np.inf, 0.0], dtype=np.float32)  # added to a logit: indexed by "is it allowed"


def _masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A copy of ``logits`` with every token not ``allowed`` at ``-inf``.

    Two ways, whichever is cheaper on 151k tokens: copy the few allowed logits
    (the usual case between JSON values), or add -inf/0 by table look-up
    (inside strings most tokens are allowed; np.where is slower on such masks)."""
    allowed = allowed[:logits.size]
    if np.count_nonzero(allowed) * 8 < allowed.size:
        ids = np.flatnonzero(allowed)
        masked = np.full_like(logits, -np.inf)
        masked[ids] = logits[ids]
        return masked
    return logits + np.take(_BAN.astype(logits.dtype, copy=False), allowed.view(np.uint8))


class Forced:
    """A phase that emits fixed tokens, whatever the logits say."""

    def __init__(self, token_ids: Sequence[int]):
        self.token_ids = list(token_ids)


Phase = Union[Forced, Grammar]


class TokenConstraint:
    """Picks each token of a reply made of :class:`Forced` phases and grammars.

    Every grammar is compiled against ``tokenizer`` here, so a bad one
    raises before any compute."""

    def __init__(self, phases: Sequence[Phase], tokenizer: GrammarTokenizer):
        self._phases = [p if isinstance(p, Forced) else GrammarMatcher(p, tokenizer)
                        for p in phases if not (isinstance(p, Forced) and not p.token_ids)]
        self._eog = tokenizer.eog_ids
        self._pieces = tokenizer.pieces
        self._phase = 0
        self._forced_at = 0

    def copy(self) -> "TokenConstraint":
        """An independent constraint at the same position (to try text on without committing to it)."""
        twin = object.__new__(TokenConstraint)
        twin.__dict__.update(self.__dict__)
        twin._phases = [p.copy() if isinstance(p, GrammarMatcher) else p for p in self._phases]
        return twin

    def fast_forward(self, text: str, encode: Callable[[str], list[int]]) -> bool:
        """Take ``text``, already written, as the start of the reply: True when the phases allow
        it (forced tokens spelling it, or a grammar accepting it), else False (the state is then
        undefined: try on a :meth:`copy`).  ``encode`` turns text into ids, control tokens included."""
        while text:
            if self.complete:
                return False
            phase = self._phases[self._phase]
            if isinstance(phase, Forced):
                forced = b"".join(self._pieces[t] for t in phase.token_ids[self._forced_at:]).decode(
                    "utf-8", "replace")
                if text.startswith(forced):
                    text = text[len(forced):]
                    self._next_phase()
                    continue
                if not forced.startswith(text):
                    return False
                rest = encode(forced[len(text):])
                if rest:
                    self._phases[self._phase], self._forced_at = Forced(rest), 0
                else:
                    self._next_phase()
                return True
            if not phase.consume_all(encode(text)):
                return False
            if phase.done:
                self._next_phase()
            return True
        return True

    @property
    def complete(self) -> bool:
        """True once every phase is done: the reply must end here."""
        return self._phase >= len(self._phases)

    def next_forced(self) -> Optional[int]:
        """The token the constraint forces next, or None where a grammar chooses."""
        if self.complete:
            return None
        phase = self._phases[self._phase]
        return phase.token_ids[self._forced_at] if isinstance(phase, Forced) else None

    def sample(self, sampler, logits: np.ndarray, recent: Sequence[int]) -> int:
        """The next token: forced, or drawn by ``sampler`` among the valid ones."""
        phase = self._phases[self._phase]
        if isinstance(phase, Forced):
            token = phase.token_ids[self._forced_at]
            self._forced_at += 1
            if self._forced_at == len(phase.token_ids):
                self._next_phase()
            return token
        masked = _masked(logits, phase.allowed())
        if masked.max() == -np.inf:
            raise InvalidArgumentError("no token the grammar allows next has a finite logit "
                                       "(logit_bias bans them all)")
        token = sampler.sample(masked, recent)
        if token in self._eog:
            if self._phase + 1 < len(self._phases):
                # The grammar is complete and the model ends it: go on with the next phase.
                self._next_phase()
                return self.sample(sampler, logits, recent)
            return token  # the end of the reply
        phase.consume(token)
        if phase.done:
            self._next_phase()
        return token

    def _next_phase(self) -> None:
        self._phase += 1
        self._forced_at = 0
