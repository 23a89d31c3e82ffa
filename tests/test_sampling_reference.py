"""Every sampling option, checked against a reference sampler on SmolLM2's own logits.

The reference (:func:`reference_distribution`) is written from llama.cpp's
samplers (llama-sampler.cpp of llama-cpp-python 0.3.36, in the chain
llama-cpp-python builds: logit bias, penalties, top-k, typical, top-p, min-p,
temperature, dist), in plain float64 Python over a fully sorted candidate
list: no partial sorts, no prefix guesses, nothing shared with
elelem.sampling.sampler.  Three links are checked, so a generated token is known to
come from the right distribution without a statistical test on the model:

1. elelem's candidate set and probabilities equal the reference's, for each
   option alone and all of them together, on logits from ``LLM.eval``;
2. ``Sampler`` draws only from that set, in proportion;
3. ``generate`` with a seed picks exactly the token a ``Sampler`` with that
   seed picks from the same logits (so the options reach the sampler, the
   seed is honoured and different seeds differ); greedy decoding with the
   repetition penalties follows the reference step by step, with the
   penalty window on both sides of the token it must hit.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import elelem
from elelem.sampling.sampler import Sampler, SamplingParams, filtered_distribution

pytestmark = pytest.mark.real_model

PROMPT = "The three primary colors are"
# A prompt with period 3 (" red", " green", " blue"): the model's next token,
# " blue", sits 3 tokens back, so a penalty window of 3 must demote it and a
# window of 2 must not.
PERIODIC = "red green blue red green blue red green blue red green"

NEUTRAL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0,
               repeat_last_n=64, frequency_penalty=0.0, presence_penalty=0.0, logit_bias={})
# Each option alone (the others neutral), then llama-cpp-python's defaults, then all at once.
OPTIONS = {
    "temperature": dict(temperature=0.7),
    "hot": dict(temperature=1.6),
    "top_k": dict(top_k=7),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.02),
    "typical_p": dict(typical_p=0.5),
    "repeat_penalty": dict(repeat_penalty=1.3, repeat_last_n=4),
    "frequency_penalty": dict(frequency_penalty=0.7, repeat_last_n=-1),
    "presence_penalty": dict(presence_penalty=1.1),
    "logit_bias": dict(logit_bias={"ban": -math.inf, "boost": 6.0}),
    "defaults": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "all": dict(temperature=0.9, top_k=30, top_p=0.9, min_p=0.01, typical_p=0.95, repeat_penalty=1.2,
                repeat_last_n=3, frequency_penalty=0.3, presence_penalty=0.2, logit_bias={"ban": -math.inf}),
}


def reference_distribution(logits: np.ndarray, recent: list[int], *, temperature: float, top_k: int, top_p: float,
                           min_p: float, typical_p: float, repeat_penalty: float, repeat_last_n: int,
                           frequency_penalty: float, presence_penalty: float, logit_bias: dict) -> dict[int, float]:
    """token id -> probability of being sampled next."""
    # Logits are float32 in llama.cpp's token array, so a biased or penalized
    # logit is stored back as float32; the probabilities are then float64 here.
    as_stored = lambda value: float(np.float32(value))  # noqa: E731
    z = [float(x) for x in logits]
    for token, bias in logit_bias.items():
        z[token] = as_stored(z[token] + bias)
    window = [] if repeat_last_n == 0 else recent if repeat_last_n < 0 else recent[-repeat_last_n:]
    for token, count in Counter(window).items():
        value = z[token] * repeat_penalty if z[token] <= 0 else z[token] / repeat_penalty
        z[token] = as_stored(value - (count * frequency_penalty + presence_penalty))
    if temperature == 0:
        return {max(range(len(z)), key=lambda i: (z[i], -i)): 1.0}
    by_logit = sorted((i for i in range(len(z)) if z[i] > -math.inf), key=lambda i: (-z[i], i))
    candidates = by_logit[:top_k] if top_k > 0 else by_logit

    def probabilities(ids):
        top = max(z[i] for i in ids)
        weights = [math.exp(z[i] - top) for i in ids]
        total = sum(weights)
        return [w / total for w in weights]

    if typical_p < 1.0 and len(candidates) > 1:
        p = probabilities(candidates)
        entropy = -sum(q * math.log(q) for q in p if q > 0)
        gap = [abs(-math.log(q) - entropy) if q > 0 else math.inf for q in p]
        order = sorted(range(len(candidates)), key=lambda j: (gap[j], j))
        mass, keep = 0.0, len(order)
        for n, j in enumerate(order, 1):
            mass += p[j]
            if mass > typical_p:
                keep = n
                break
        candidates = sorted((candidates[j] for j in order[:keep]), key=lambda i: (-z[i], i))
    if top_p < 1.0 and len(candidates) > 1:
        mass, keep = 0.0, len(candidates)
        for n, q in enumerate(probabilities(candidates), 1):
            mass += q
            if mass >= top_p:
                keep = n
                break
        candidates = candidates[:keep]
    if min_p > 0.0 and len(candidates) > 1:
        floor = max(z[i] for i in candidates) + math.log(min_p)
        candidates = [i for i in candidates if z[i] >= floor]
    scaled = {i: z[i] / temperature for i in candidates}
    top = max(scaled.values())
    weights = {i: math.exp(v - top) for i, v in scaled.items()}
    total = sum(weights.values())
    return {i: w / total for i, w in weights.items()}


@pytest.fixture(scope="module")
def llm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=256, n_threads=1) as model:
        yield model


@pytest.fixture(scope="module")
def first_step(llm):
    """(prompt ids, the logits after them), evaluated the way generation does: one prefill."""
    ids = llm.tokenize(PROMPT, special=True)
    llm.reset()
    return ids, llm.eval(ids).copy()


def options_for(name: str, logits: np.ndarray) -> dict:
    """OPTIONS[name] over NEUTRAL, with the bias placeholders bound to this row's 1st and 5th choices."""
    opts = {**NEUTRAL, **OPTIONS[name]}
    order = np.argsort(-logits, kind="stable")
    slots = {"ban": int(order[0]), "boost": int(order[4])}
    opts["logit_bias"] = {slots[key]: value for key, value in opts["logit_bias"].items()}
    return opts


def elelem_distribution(logits, recent, opts) -> dict[int, float]:
    ids, probs = filtered_distribution(logits, SamplingParams(**opts), recent)
    return dict(zip(ids.tolist(), probs.tolist()))


@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_candidates_and_their_probabilities_match_the_reference(first_step, name):
    ids, logits = first_step
    opts = options_for(name, logits)
    want = reference_distribution(logits, ids, **opts)
    got = elelem_distribution(logits, ids, opts)
    assert set(got) == set(want), (sorted(set(got) ^ set(want))[:10], len(got), len(want))
    assert [got[t] for t in want] == pytest.approx(list(want.values()), rel=1e-9, abs=1e-15)
    # Each option changes the outcome on these logits, so a dropped option cannot pass as the neutral chain.
    assert want != reference_distribution(logits, ids, **NEUTRAL)


@pytest.mark.parametrize("name", ["top_k", "top_p", "min_p", "typical_p", "all"])
def test_the_sampler_draws_only_from_the_candidates_and_in_proportion(first_step, name):
    ids, logits = first_step
    opts = options_for(name, logits)
    want = reference_distribution(logits, ids, **opts)
    n = 1200
    sampler = Sampler(SamplingParams(**opts, seed=11))
    draws = Counter(sampler.sample(logits, ids) for _ in range(n))
    assert set(draws) <= set(want), sorted(set(draws) - set(want))
    # The five likeliest tokens one by one, the rest as one bucket: each within
    # 4 standard deviations of its reference probability.
    top = sorted(want, key=want.get, reverse=True)[:5]
    buckets = [(draws[t], want[t]) for t in top]
    buckets.append((n - sum(draws[t] for t in top), 1.0 - sum(want[t] for t in top)))
    for count, p in buckets:
        assert abs(count / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (count / n, p)


def _sampled_after_prompt(llm, prompt_ids, opts, seed) -> int:
    """The first token ``generate`` picks: read back from the cache (max_tokens=2 evaluates it)."""
    stream = llm.stream(prompt_ids, max_tokens=2, seed=seed, **opts)
    stream.text()
    if stream.completion_tokens == 0:
        return -1  # an end-of-generation token, which is never cached
    return llm.cached_tokens[len(prompt_ids)]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_generate_picks_the_token_a_seeded_sampler_picks(llm, first_step, name):
    ids, logits = first_step
    opts = options_for(name, logits)
    want = reference_distribution(logits, ids, **opts)
    support = set(want)
    picked = []
    for seed in range(5):
        expected = Sampler(SamplingParams(**opts, seed=seed)).sample(logits, ids)
        token = _sampled_after_prompt(llm, ids, opts, seed)
        assert token == expected, (seed, token, expected)
        assert token in support
        picked.append(token)
    if max(want.values()) < 0.6:
        assert len(set(picked)) > 1, picked  # other seeds, other draws


@pytest.mark.parametrize("repeat_last_n", [2, 3, -1, 0])
@pytest.mark.parametrize("penalties", [dict(repeat_penalty=1.1), dict(frequency_penalty=1.5),
                                       dict(presence_penalty=1.5), dict(repeat_penalty=1.3, presence_penalty=0.3)],
                         ids=["repeat", "frequency", "presence", "repeat+presence"])
def test_greedy_generation_with_penalties_follows_the_reference(llm, repeat_last_n, penalties):
    ids = llm.tokenize(PERIODIC, special=True)
    opts = {**NEUTRAL, "temperature": 0.0, "repeat_last_n": repeat_last_n, **penalties}
    # Token by token, as the replay below: PERIODIC repeats itself, so speculation would
    # verify drafts in a batch, whose logits differ from a lone token's by up to ~0.15
    # (gemm vs gemv), and step 2 here is a near-tie (0.09 apart with repeat_penalty 1.1).
    stream = llm.stream(ids, max_tokens=6, speculative=False, **opts)
    stream.text()
    generated = llm.cached_tokens[len(ids):]  # all but the last, which is never evaluated
    assert len(generated) == stream.completion_tokens - 1 >= 3
    # Replay teacher-forced, evaluated as generation does (prefill, then one token at a time).
    llm.reset()
    logits = first = llm.eval(ids).copy()
    seen = list(ids)
    for token in generated:
        [want] = reference_distribution(logits, seen, **opts)
        assert token == want, (len(seen) - len(ids), token, want)
        seen.append(token)
        logits = llm.eval([token])
    # The window decides the first step: " blue", the model's choice, is 3
    # tokens back, so it is demoted only when the window reaches it.
    blue = llm.tokenize(" blue")[-1]
    assert int(np.argmax(first)) == blue
    assert (generated[0] != blue) == (repeat_last_n in (3, -1)), generated
