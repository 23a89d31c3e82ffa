"""Lazy constraints: free text until a trigger appears, then a grammar for the rest.

This is llama.cpp's lazy grammar (``grammar_lazy`` with ``grammar_triggers``
in common/chat.cpp), for tool calls: the model writes what it likes until it
writes a format's marker (``<tool_call>``, ``[TOOL_CALLS]``, the start of a
bare JSON call...); from there on a :class:`~.constrained.TokenConstraint`
holds it to a valid call.

* Text before the trigger is sampled exactly as without a constraint,
  except that with ``require_call`` (``tool_choice`` ``"required"`` or a
  named function) the end-of-generation tokens are banned: the reply cannot
  end before a call starts.  Nor can it ramble on: after ``free_tokens``
  tokens past the reasoning (:data:`FREE_TOKENS`, enough for a preamble such
  as "I'll look up the weather."), the first trigger's call is forced, as
  a model that was never taught the format would otherwise write text to
  ``max_tokens`` (llama.cpp leaves that text unbounded).
* The trigger may end in the middle of a token, and it may be spelled over
  several tokens: the text from the trigger's start to the end of the
  token that completed it is fed to the call's phases
  (:meth:`~.constrained.TokenConstraint.fast_forward`).  A token whose text
  the call cannot continue is banned and another one drawn, so what is
  written after a trigger is always a valid call.
* With ``reasoning`` (the template's think tags), a trigger counts only
  after the reasoning has closed, as the reply's parser reads it.
* With ``parallel`` (``parallel_tool_calls``: off by default, as in
  llama.cpp's server, where OpenAI's API defaults to on), a finished call
  may be followed by another call (its marker) or the end, and nothing
  else, as llama.cpp's ``tool_call+`` grammars; without it the reply ends
  after its one call.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from .constrained import Phase, TokenConstraint
from .grammar import GrammarTokenizer

#: How far into the reply (after any reasoning) a trigger ``at_start`` may still match.
_START_WINDOW = 256
#: Tokens of free text a required call may follow (past any reasoning) before it is forced.
FREE_TOKENS = 24
#: How many sampled tokens may be banned in one step before the step gives up on a trigger.
_MAX_REDRAWS = 64


class Trigger:
    """Where a call starts in free text (a regular expression), and its phases from there.

    ``pattern`` is searched in the reply's text; the call's text starts at the
    match (or at its first group, when it has one).  ``at_start``: the match
    must begin the reply (after any reasoning; the pattern may allow leading
    whitespace itself)."""

    def __init__(self, pattern: str, phases: Sequence[Phase], *, at_start: bool = False):
        self.pattern = re.compile(pattern)
        self.phases = list(phases)
        self.at_start = at_start

    @classmethod
    def word(cls, text: str, phases: Sequence[Phase]) -> "Trigger":
        """A trigger that is ``text`` itself, anywhere in the reply."""
        return cls(re.escape(text), phases)


@dataclass(frozen=True)
class ReasoningSpan:
    """The reasoning markup of the reply: ``start``/``end`` tags; ``open`` when the prompt opened
    it already; ``implicit_ends`` are markers that also close it (Qwen3's ``<tool_call>``)."""

    start: str
    end: str
    open: bool = False
    implicit_ends: tuple[str, ...] = ()


class LazyConstraint:
    """Picks each token of a reply: freely until one of ``triggers`` is written, then by its phases.

    Every trigger's grammars are compiled here, so a bad one raises before any compute."""

    def __init__(self, triggers: Sequence[Trigger], tokenizer: GrammarTokenizer,
                 encode: Callable[[str], list[int]], *, require_call: bool,
                 reasoning: Optional[ReasoningSpan] = None, free_tokens: int = FREE_TOKENS,
                 parallel: bool = False):
        self._triggers = [(t, TokenConstraint(t.phases, tokenizer)) for t in triggers]
        self._encode = encode
        self._pieces = tokenizer.pieces
        self._eog = np.array(sorted(tokenizer.eog_ids), dtype=np.int64)
        self._require = require_call
        self._free_left = free_tokens  # (require_call) tokens of free text left past the reasoning
        self._reasoning = reasoning
        self._reasoning_open = reasoning is not None and reasoning.open
        self._text = ""
        self._pending = b""      # the bytes of a character still incomplete
        self._region: Optional[int] = None if reasoning is not None else 0  # where triggers count
        self._longest = max((len(t.pattern.pattern) for t, _ in self._triggers), default=1)
        self._active: Optional[TokenConstraint] = None
        self._parallel = parallel
        self._between_calls = False  # (parallel) a call has just finished
        self.calls = 0               # calls finished

    @property
    def triggered(self) -> bool:
        """Whether a call has started (its phases pick the tokens now)."""
        return self._active is not None

    @property
    def complete(self) -> bool:
        """True once the call is done and no other may follow (not ``parallel``): the reply ends here."""
        return self._active is not None and self._active.complete and not self._parallel

    def sample(self, sampler, logits: np.ndarray, recent: Sequence[int]) -> int:
        if self._active is not None and self._active.complete:  # (parallel) another call or the end
            self.calls += 1
            self._active = None
            self._between_calls = True
        if self._between_calls:
            return self._next_call_or_end(sampler, logits, recent)
        if self._active is None and self._require and self._free_left <= 0:
            self._active = self._triggers[0][1].copy()  # the format's own marker, then the call
        if self._active is not None:
            return self._active.sample(sampler, logits, recent)
        free = logits.copy() if self._require else logits
        if self._require:
            free[self._eog[self._eog < free.size]] = -np.inf
        for _ in range(_MAX_REDRAWS):
            token = sampler.sample(free, recent)
            if self._take(token):
                return token
            if free is logits:
                free = logits.copy()
            free[token] = -np.inf  # its text starts a call that the call's phases cannot continue
        raise RuntimeError("no token continues the tool call its trigger started")

    # -- internals ---

    def _next_call_or_end(self, sampler, logits: np.ndarray, recent: Sequence[int]) -> int:
        """After a call (``parallel``): an end-of-generation token, or the format's marker
        starting another call."""
        call = self._triggers[0][1].copy()
        start = call.next_forced()
        allowed = self._eog[self._eog < logits.size]
        if start is not None:
            allowed = np.append(allowed, start)
        masked = np.full_like(logits, -np.inf)
        masked[allowed] = logits[allowed]
        if masked.max() == -np.inf:
            masked[allowed] = 0.0  # (logit_bias banned them all) any of them, rather than none
        token = sampler.sample(masked, recent)
        if token != start:
            return token
        self._between_calls = False
        self._active = call
        return call.sample(sampler, logits, recent)

    def _take(self, token: int) -> bool:
        """Append ``token``'s text, starting a call if it completes a trigger; False (nothing
        appended) when it completes a trigger whose call cannot go on from that text."""
        if token < 0 or token >= len(self._pieces) or token in self._eog:
            return True
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        added = decoder.decode(self._pending + self._pieces[token])
        text = self._text + added
        found = self._find_trigger(text)
        if found is not None:
            start, constraint = found
            attempt = constraint.copy()
            if not attempt.fast_forward(text[start:], self._encode):
                return False
            self._active = attempt
        self._text, self._pending = text, decoder.getstate()[0]
        if self._region is not None:
            self._free_left -= 1
        return True

    def _find_trigger(self, text: str) -> Optional[tuple[int, TokenConstraint]]:
        region = self._reasoning_closed(text)
        if region is None:
            return None
        best: Optional[tuple[int, TokenConstraint]] = None
        window = max(region, len(self._text) - self._longest)  # the text before was searched already
        for trigger, constraint in self._triggers:
            if trigger.at_start:
                if len(text) - region > _START_WINDOW:
                    continue
                match = trigger.pattern.match(text, region)
            else:
                match = trigger.pattern.search(text, window)
            if match is not None:
                start = match.start(1) if trigger.pattern.groups else match.start()
                if best is None or start < best[0]:
                    best = (start, constraint)
        return best

    def _reasoning_closed(self, text: str) -> Optional[int]:
        """Where the text after the reasoning starts (None: the reasoning has not closed yet)."""
        if self._region is not None:
            return self._region
        span = self._reasoning
        if span is None:  # unreachable: without a reasoning span the region is 0 from the start
            return 0
        if not self._reasoning_open:
            stripped = text.lstrip()
            if not stripped or span.start.startswith(stripped):
                return None  # maybe the start of a reasoning block
            if not stripped.startswith(span.start):
                self._region = 0
                return 0
            self._reasoning_open = True
        ends = [(i + len(span.end), i) for i in [text.find(span.end)] if i >= 0]
        ends += [(i, i) for i in (text.find(m) for m in span.implicit_ends) if i >= 0]
        if not ends:
            return None
        self._region = min(ends, key=lambda e: e[1])[0]
        return self._region
