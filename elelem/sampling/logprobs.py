"""Log-probabilities of generated tokens (``logprobs`` in the completion APIs).

They are the model's own distribution -- the log-softmax of the raw logits of
the step that produced the token, before any sampling setting (temperature,
top-k, penalties, a grammar) -- which is what llama-cpp-python and OpenAI
report.  The arithmetic follows llama-cpp-python's ``logits_to_logprobs``:
float32, the maximum subtracted first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError

#: The most alternatives one token may list (OpenAI's limit for top_logprobs).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]     # the n likeliest tokens, likeliest first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float32)
    peak = np.max(logits)
    shifted = logits - (peak if np.isfinite(peak) else np.float32(0))
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted)))


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """``token``'s log-probability under ``logits``, and the ``n_top`` likeliest tokens'."""
    logprobs = log_softmax(logits)
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        best = np.argpartition(-logprobs, n_top - 1)[:n_top] if n_top < logprobs.size else np.arange(logprobs.size)
        best = best[np.lexsort((best, -logprobs[best]))]        # likeliest first; ties by id
        top = tuple((int(i), float(logprobs[i])) for i in best)
    return TokenLogprob(int(token), float(logprobs[token]), top)


def checked_top_count(value, name: str) -> int:
    """How many alternatives ``name`` asks for: an integer in [0, MAX_TOP_LOGPROBS]."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidArgumentError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}")
    return value


def chat_logprobs_count(logprobs, top_logprobs) -> "int | None":
    """OpenAI's chat options: ``logprobs`` (a bool) turns them on, with
    ``top_logprobs`` alternatives (0 when not given); None when off."""
    if logprobs not in (None, True, False):
        raise InvalidArgumentError(f"logprobs must be a boolean, got {logprobs!r}")
    if not logprobs:
        if top_logprobs not in (None, 0):
            raise InvalidArgumentError("top_logprobs needs logprobs=True")
        return None
    return 0 if top_logprobs is None else checked_top_count(top_logprobs, "top_logprobs")
