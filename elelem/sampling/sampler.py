"""Choosing the next token from a row of logits.

The chain follows the one llama-cpp-python builds for ``create_completion``
(its ``_init_sampler``), so the same parameters behave the same way:

1. **logit bias** -- ``logit_bias`` is added to the raw logits (llama-cpp-python
   applies it as a logits processor, which runs before the penalties);
2. **penalties** -- over the last ``repeat_last_n`` tokens: the repeat penalty
   divides positive logits and multiplies negative ones, then
   ``count * frequency_penalty + presence_penalty`` is subtracted;
3. **top-k** -- keep the ``top_k`` highest logits;
4. **typical** -- keep the locally typical tokens (``typical_p``);
5. **top-p** -- keep the smallest most-probable set with mass >= ``top_p``;
6. **min-p** -- keep tokens with ``p >= min_p * p_max``;
7. **temperature** -- divide the surviving logits by ``temperature``;
8. **dist** -- draw from the softmax of what is left.

As in llama.cpp, steps 4-6 look at the softmax of the *surviving* candidates at
temperature 1: the temperature only reshapes the final draw. A temperature of
0 replaces steps 3-8 with a plain argmax (greedy decoding, no randomness).
Every filter keeps at least one token (llama-cpp-python's ``min_keep``).

Everything is vectorized with numpy: the penalties touch only the entries of
recently seen tokens, top-k is O(n_vocab), and the later filters work only on
the candidates top-k kept. Ties between equal logits go to the lower token id,
so results are reproducible.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from ..errors import InvalidArgumentError, InvalidTokenError

__all__ = [
    "SamplingParams",
    "Sampler",
    "filtered_distribution",
    "apply_logit_bias",
    "apply_penalties",
    "top_k_ids",
    "typical_filter",
    "top_p_filter",
    "min_p_filter",
    "softmax",
]

#: Every filter keeps at least this many candidates (llama-cpp-python uses 1).
MIN_KEEP = 1

# top-k over a large vocabulary first finds a cheap lower bound for the k-th
# largest logit from every _SUBSAMPLE_STRIDE-th entry, so only a few hundred
# candidates need partitioning instead of the whole row.
_SUBSAMPLE_STRIDE = 64
_SUBSAMPLE_MIN_VOCAB = 16_384

# The prefix filters (top-p, typical) sort this many candidates first and only
# widen the search when that prefix does not reach the wanted mass.
_PREFIX_FIRST_GUESS = 1024


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens; the defaults are llama-cpp-python's ``create_completion`` defaults.

    Attributes:
        temperature: 0.8. Divides the logits before the draw; 0 means greedy (argmax).
        top_k: 40. Keep the k most likely tokens; 0 disables the filter.
        top_p: 0.95. Nucleus sampling: keep the smallest set of most likely tokens
            whose probability mass is >= top_p; 1.0 disables it. In (0, 1].
        min_p: 0.05. Keep tokens at least ``min_p`` times as likely as the most
            likely one; 0 disables it. In [0, 1].
        typical_p: 1.0 (disabled). Locally typical sampling. In (0, 1].
        repeat_penalty: 1.0 (disabled). Divides positive and multiplies negative
            logits of recently seen tokens. Must be > 0.
        repeat_last_n: 64. How many of the most recent tokens the penalties look
            at; 0 disables the penalties, -1 means all the tokens given.
        frequency_penalty: 0.0. Subtracted once per occurrence in the window.
        presence_penalty: 0.0. Subtracted once if the token occurs in the window.
        logit_bias: empty. Token id -> value added to its logit; ``-inf`` bans
            the token outright.
        seed: None. Seed of the random generator; None draws a fresh one.
            The same seed gives the same sequence of samples.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None

    def __post_init__(self) -> None:
        temperature = _real("temperature", self.temperature)
        if temperature < 0:
            raise InvalidArgumentError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
        top_k = _integer("top_k", self.top_k)
        if top_k < 0:
            raise InvalidArgumentError(f"top_k must be >= 0 (0 disables it), got {top_k}")
        top_p = _real("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {top_p}")
        min_p = _real("min_p", self.min_p)
        if not 0.0 <= min_p <= 1.0:
            raise InvalidArgumentError(f"min_p must be in [0, 1], got {min_p}")
        typical_p = _real("typical_p", self.typical_p)
        if not 0.0 < typical_p <= 1.0:
            raise InvalidArgumentError(f"typical_p must be in (0, 1], got {typical_p}")
        repeat_penalty = _real("repeat_penalty", self.repeat_penalty)
        if repeat_penalty <= 0:
            raise InvalidArgumentError(f"repeat_penalty must be > 0 (1 disables it), got {repeat_penalty}")
        repeat_last_n = _integer("repeat_last_n", self.repeat_last_n)
        if repeat_last_n < -1:
            raise InvalidArgumentError(
                f"repeat_last_n must be >= -1 (-1: all tokens, 0: no penalties), got {repeat_last_n}"
            )
        frequency_penalty = _real("frequency_penalty", self.frequency_penalty)
        presence_penalty = _real("presence_penalty", self.presence_penalty)
        seed = self.seed
        if seed is not None:
            seed = _integer("seed", seed)
            if seed < 0:
                raise InvalidArgumentError(f"seed must be >= 0 or None, got {seed}")

        # Normalize to plain Python numbers (numpy scalars, ints for floats) and
        # freeze the bias mapping, so a params object can be shared safely.
        for name, value in (
            ("temperature", temperature),
            ("top_k", top_k),
            ("top_p", top_p),
            ("min_p", min_p),
            ("typical_p", typical_p),
            ("repeat_penalty", repeat_penalty),
            ("repeat_last_n", repeat_last_n),
            ("frequency_penalty", frequency_penalty),
            ("presence_penalty", presence_penalty),
            ("logit_bias", MappingProxyType(_logit_bias(self.logit_bias))),
            ("seed", seed),
        ):
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        """True when sampling is a deterministic argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def penalizes(self) -> bool:
        """True when any of the repetition penalties would change a logit."""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )

    def check_vocab(self, n_vocab: int) -> None:
        """Raise :class:`InvalidTokenError` if ``logit_bias`` names an id outside ``[0, n_vocab)``."""
        bad = sorted(token for token in self.logit_bias if token >= n_vocab)
        if bad:
            raise InvalidTokenError(
                f"logit_bias names token id {bad[0]}, outside the vocabulary [0, {n_vocab})"
            )


def _real(name: str, value: object) -> float:
    # bool is an int subclass; True as a temperature is a bug, not a number.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidArgumentError(f"{name} must be finite, got {number}")
    return number


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _logit_bias(bias: Mapping[int, float] | None) -> dict[int, float]:
    if bias is None:
        return {}
    if not isinstance(bias, Mapping):
        raise InvalidArgumentError(f"logit_bias must be a mapping of token id to bias, got {type(bias).__name__}")
    checked: dict[int, float] = {}
    for key, value in bias.items():
        # OpenAI-style requests carry the ids as JSON object keys, i.e. strings.
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, numbers.Integral):
            raise InvalidTokenError(f"logit_bias keys must be token ids, got {key!r}")
        if key < 0:
            raise InvalidTokenError(f"logit_bias names token id {key}, which is negative")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InvalidArgumentError(f"logit_bias[{key}] must be a number, got {value!r}")
        number = float(value)
        # -inf is the documented way to ban a token; +inf or NaN would poison the softmax.
        if math.isnan(number) or number == math.inf:
            raise InvalidArgumentError(f"logit_bias[{key}] must be finite or -inf, got {number}")
        checked[int(key)] = number
    return checked


# --- the filters: small pure functions over numpy arrays ---------------------


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities (float64) of a 1-D array of finite logits."""
    shifted = np.exp(logits.astype(np.float64, copy=False) - logits.max())
    return shifted / shifted.sum()


def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """A copy of ``logits`` with ``bias`` added; ``logits`` itself is left alone."""
    if not bias:
        return logits
    ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    values = np.fromiter(bias.values(), dtype=np.float64, count=len(bias))
    biased = logits.copy()
    biased[ids] = biased[ids] + values
    return biased


def apply_penalties(
    logits: np.ndarray,
    recent_tokens: Sequence[int] | np.ndarray,
    *,
    repeat_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    last_n: int = 64,
) -> np.ndarray:
    """A copy of ``logits`` with the repetition penalties applied (llama.cpp's rules).

    Only the entries of tokens among the last ``last_n`` of ``recent_tokens``
    change: a positive logit is divided by ``repeat_penalty`` and a negative one
    multiplied (dividing a negative logit would make the token *more* likely),
    then ``count * frequency_penalty + presence_penalty`` is subtracted.
    """
    if last_n == 0 or len(recent_tokens) == 0:
        return logits
    if repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0:
        return logits
    window = np.asarray(recent_tokens if last_n < 0 else recent_tokens[-last_n:])
    if window.ndim != 1 or not np.issubdtype(window.dtype, np.integer):
        raise InvalidTokenError("recent_tokens must be a sequence of integer token ids")
    ids, counts = np.unique(window, return_counts=True)
    if ids[0] < 0 or ids[-1] >= logits.size:
        bad = ids[0] if ids[0] < 0 else ids[-1]
        raise InvalidTokenError(f"recent token id {bad} is outside the vocabulary [0, {logits.size})")
    values = logits[ids].astype(np.float64)
    if repeat_penalty != 1.0:
        values = np.where(values <= 0, values * repeat_penalty, values / repeat_penalty)
    values -= counts * frequency_penalty + presence_penalty
    penalized = logits.copy()
    penalized[ids] = values
    return penalized


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the ``k`` largest logits (all ids when ``k`` is 0 or >= the vocabulary).

    O(n): a strided subsample gives a cheap lower bound of the k-th largest
    value, so only the few entries above it are partitioned. Among equal
    logits at the cut, the lower ids win. The ids come back in no particular order.
    """
    n = logits.size
    if k <= 0 or k >= n:
        return np.arange(n)
    pool = _top_k_pool(logits, k)
    values = logits[pool]
    kth_value = np.partition(values, values.size - k)[values.size - k]
    above = pool[values > kth_value]
    tied = pool[values == kth_value][: k - above.size]  # pool is ascending, so lowest ids first
    return np.concatenate((above, tied))


def _top_k_pool(logits: np.ndarray, k: int) -> np.ndarray:
    # Ids of a superset of the top k, in ascending order. The j-th largest value
    # of any subsample has at least j entries >= it in the whole row, so its
    # pool is a valid superset as soon as it holds >= k ids; a small j usually
    # does, and j = k always does.
    n = logits.size
    sample = logits[::_SUBSAMPLE_STRIDE]
    if n < _SUBSAMPLE_MIN_VOCAB or k > sample.size:
        return np.arange(n)
    hopeful_rank = min(k, 2 * k // _SUBSAMPLE_STRIDE + 2)
    for rank in (hopeful_rank, k):
        bound = np.partition(sample, sample.size - rank)[sample.size - rank]
        pool = np.flatnonzero(logits >= bound)
        if pool.size >= k:
            return pool
    raise AssertionError("unreachable: the k-th largest sampled value bounds the top k")


def typical_filter(ids: np.ndarray, logits: np.ndarray, typical_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy.

    Tokens are ranked by ``|-log p - H|`` and the smallest such prefix whose
    mass *exceeds* ``typical_p`` is kept (llama.cpp's strict comparison).
    As in llama.cpp, ``p`` is the softmax (``exp / sum``, the same numbers
    top-p uses) and the surprise is the log of it: taking ``p`` as
    ``exp(log_softmax)`` instead rounds differently, and where the mass lands
    exactly on ``typical_p`` (equal logits: 0.1 + 0.1 + 0.1 against 0.3) that
    keeps a different number of tokens.
    """
    if typical_p >= 1.0 or ids.size <= MIN_KEEP:
        return ids, logits
    probs = softmax(logits)
    with np.errstate(divide="ignore"):  # a probability that underflowed to 0: infinitely surprising
        log_probs = np.log(probs)
    entropy = -(probs * np.where(probs > 0, log_probs, 0.0)).sum()
    keep = _smallest_prefix(np.abs(-log_probs - entropy), probs, typical_p, strict=True)
    return ids[keep], logits[keep]


def top_p_filter(ids: np.ndarray, logits: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Nucleus sampling: keep the smallest most-probable set whose mass is >= ``top_p``."""
    if top_p >= 1.0 or ids.size <= MIN_KEEP:
        return ids, logits
    keep = _smallest_prefix(-logits, softmax(logits), top_p, strict=False)
    return ids[keep], logits[keep]


def min_p_filter(ids: np.ndarray, logits: np.ndarray, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep tokens with ``p >= min_p * p_max``, i.e. ``logit >= max_logit + log(min_p)``.

    The most likely token always passes, so at least one token is kept.
    """
    if min_p <= 0.0 or ids.size <= MIN_KEEP:
        return ids, logits
    keep = logits >= logits.max() + math.log(min_p)
    return ids[keep], logits[keep]


def _smallest_prefix(key: np.ndarray, probs: np.ndarray, mass: float, *, strict: bool) -> np.ndarray:
    # Positions of the shortest run of entries, taken in ascending `key` order,
    # whose probabilities add up to `mass` (> when strict, >= otherwise), and at
    # least MIN_KEEP of them. Sorting everything is O(n log n), so sort the
    # first few smallest keys and widen only if they fall short of `mass`.
    n = key.size
    guess = min(n, _PREFIX_FIRST_GUESS)
    while True:
        if guess >= n:
            part = np.arange(n)
        else:
            part = np.sort(np.argpartition(key, guess - 1)[:guess])
        order = part[np.argsort(key[part], kind="stable")]
        cumulative = np.cumsum(probs[order])
        reached = cumulative > mass if strict else cumulative >= mass
        reached[: MIN_KEEP - 1] = False
        hits = np.flatnonzero(reached)
        if hits.size:
            return order[: hits[0] + 1]
        if guess >= n:
            # Rounding kept the total just under `mass`: everything stays.
            return order
        guess = min(n, guess * 8)


# --- the chain ---------------------------------------------------------------


def _as_logits(logits: np.ndarray) -> np.ndarray:
    array = np.asarray(logits)
    if array.ndim != 1 or array.size == 0:
        raise InvalidArgumentError(f"logits must be a non-empty 1-D array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise InvalidArgumentError(f"logits must be floating point, got dtype {array.dtype}")
    return array


def _checked_max(logits: np.ndarray) -> float:
    # np.max propagates NaN, so one reduction catches NaN, +inf and a fully banned row.
    top = float(logits.max())
    if math.isnan(top) or top == math.inf:
        raise InvalidArgumentError("logits must be finite (or -inf for banned tokens); got NaN or +inf")
    if top == -math.inf:
        raise InvalidArgumentError("every token has a logit of -inf; there is nothing to sample")
    return top


def filtered_distribution(
    logits: np.ndarray,
    params: SamplingParams,
    recent_tokens: Sequence[int] | np.ndarray = (),
) -> tuple[np.ndarray, np.ndarray]:
    """The candidates the sampler draws from: ``(ids, probs)``.

    ``ids`` (int64) are the token ids that survive the chain and ``probs``
    (float64, summing to 1) their final probabilities after the temperature,
    ordered from most to least likely (ties: lower id first). With temperature
    0 the answer is the single argmax token with probability 1.
    ``logits`` is never modified.
    """
    logits = _as_logits(logits)
    params.check_vocab(logits.size)
    work = apply_logit_bias(logits, params.logit_bias)
    if params.penalizes:
        work = apply_penalties(
            work,
            recent_tokens,
            repeat_penalty=params.repeat_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            last_n=params.repeat_last_n,
        )
    _checked_max(work)
    if params.greedy:
        return np.array([int(np.argmax(work))], dtype=np.int64), np.ones(1)

    ids = top_k_ids(work, params.top_k).astype(np.int64, copy=False)
    candidate_logits = work[ids].astype(np.float64)
    alive = candidate_logits > -np.inf  # banned tokens have no mass; drop them early
    if not alive.all():
        ids, candidate_logits = ids[alive], candidate_logits[alive]
    ids, candidate_logits = typical_filter(ids, candidate_logits, params.typical_p)
    ids, candidate_logits = top_p_filter(ids, candidate_logits, params.top_p)
    ids, candidate_logits = min_p_filter(ids, candidate_logits, params.min_p)
    probs = softmax(candidate_logits / params.temperature)
    order = np.lexsort((ids, -probs))
    return ids[order], probs[order]


class Sampler:
    """Draws tokens with :class:`SamplingParams`, owning a seeded numpy ``Generator``.

    One sampler per generation: two samplers built with the same seed and fed
    the same logits return the same tokens.
    """

    def __init__(self, params: SamplingParams | None = None, *, n_vocab: int | None = None) -> None:
        self.params = params if params is not None else SamplingParams()
        if n_vocab is not None:
            self.params.check_vocab(n_vocab)
        self._rng = np.random.default_rng(self.params.seed)

    def reseed(self, seed: int | None) -> None:
        """Restart the random sequence (None: a fresh random one)."""
        if seed is not None:
            seed = _integer("seed", seed)
            if seed < 0:
                raise InvalidArgumentError(f"seed must be >= 0 or None, got {seed}")
        self._rng = np.random.default_rng(seed)

    def sample(self, logits: np.ndarray, recent_tokens: Sequence[int] | np.ndarray = ()) -> int:
        """The next token id, given this step's logits and the tokens seen so far.

        ``recent_tokens`` is the prompt plus what was generated (only the last
        ``repeat_last_n`` matter). A step left with a single candidate (always
        so when greedy) draws no random number, so it leaves the random
        sequence where it was.
        """
        ids, probs = filtered_distribution(logits, self.params, recent_tokens)
        if ids.size == 1:
            return int(ids[0])
        cumulative = np.cumsum(probs)
        point = self._rng.random() * cumulative[-1]
        # side="right" never lands on a zero-probability entry.
        index = int(np.searchsorted(cumulative, point, side="right"))
        return int(ids[min(index, ids.size - 1)])
