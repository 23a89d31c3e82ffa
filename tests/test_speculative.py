"""Speculative decoding (prompt lookup): the drafter, and the engine's verification.

The property under test: with speculation, generation emits exactly what
decoding token by token emits.  On the tiny f32 synthetic models there are no
near-ties for batched arithmetic to flip, so greedy output must be identical,
token for token, stop conditions included, and a seeded sampler must draw the
same text.  Sampling is also checked statistically (chi-square), with
different seeds on each side, so that the test would catch a wrong acceptance
rule even where the seeded comparison happened to agree.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import elelem
from elelem.api.generation import GenerationTarget, TextStream
from elelem.engine.speculative import Acceptance, PromptLookup
from elelem.engine.step_costs import PRIOR_EXPONENT, StepCosts, plan_drafts
from elelem.sampling.sampler import SamplingParams
from synthetic import TinyConfig

CONFIG = TinyConfig()
# Random tiny models fall into loops, which the drafter then copies; the first
# prompt also repeats itself, the second does not.
PROMPTS = ([1, 5, 9, 13, 5, 9, 13, 5, 9, 20, 30], [3, 70, 41, 8, 66, 12, 90, 27, 54])


# -- the drafter ----------------------------------------------------------------

def test_the_drafter_copies_what_followed_the_latest_longest_match():
    history = [7, 1, 2, 3, 4, 5, 9, 1, 2, 8, 8, 1, 2]
    lookup = PromptLookup(history, max_draft=3, ngram_sizes=(3, 2))
    # (1, 2) occurs at 1 and 7; the latest is followed by 8, 8, 1.
    assert lookup.propose(8) == [8, 8, 1]
    assert lookup.propose(2) == [8, 8]
    history += [8]  # now (2, 8) also ends at 9, and the 3-gram (1, 2, 8) at 9 is the longest match
    assert lookup.propose(8) == [8, 1, 2]


def test_the_drafter_copies_the_occurrence_whose_context_agrees_furthest_back():
    # (5, 6) occurs at 2 and 9; the history ends like the older one, after 1, 2,
    # so the older occurrence's continuation (7, 8) is the span being copied.
    history = [1, 2, 5, 6, 7, 8, 0, 3, 4, 5, 6, 9, 9, 1, 2, 5, 6]
    assert PromptLookup(history, ngram_sizes=(2,)).propose(2) == [7, 8]
    history[13:15] = [3, 4]  # now it ends like the newer one
    assert PromptLookup(history, ngram_sizes=(2,)).propose(2) == [9, 9]


def test_the_drafter_never_matches_the_history_with_itself():
    assert PromptLookup([4, 5, 6]).propose(8) == []
    assert PromptLookup([4, 5, 4, 5]).propose(8) == [4, 5]  # (4, 5) at 0 is followed by 4, 5


def test_acceptance_falls_with_refusals_and_recovers_with_confirmations():
    acceptance = Acceptance()
    assert acceptance.rate == pytest.approx(0.5)  # the prior
    for _ in range(10):
        acceptance.record(0, 4)  # nothing confirmed
    low = acceptance.rate
    assert low < 0.15
    acceptance.record(8, 8)  # a whole draft confirmed: no refusal seen
    assert acceptance.rate > 0.5
    acceptance.record(16, 16)  # old refusals fade
    high = acceptance.rate
    assert high > 0.8
    acceptance.record(3, 8)
    assert low < acceptance.rate < high


def test_an_unverified_proposal_is_checked_against_the_tokens_that_follow():
    history = [1, 2, 3, 1, 2]
    lookup = PromptLookup(history)
    proposal = lookup.propose(8)
    assert proposal == [3, 1, 2]
    lookup.unverified(proposal)
    before = lookup.acceptance.rate
    history += [3, 1]  # two emitted tokens, both as proposed
    lookup.propose(8)
    confirmed = lookup.acceptance.rate
    assert confirmed > before
    history += [9]  # the third differs: one refusal, and the watch ends
    lookup.propose(8)
    assert lookup.acceptance.rate < confirmed
    history += [3]
    settled = lookup.acceptance.rate
    lookup.propose(8)
    assert lookup.acceptance.rate == settled  # nothing watched any more


def test_step_costs_interpolate_between_measured_widths():
    costs = StepCosts()
    assert costs.relative(8) == pytest.approx(8 ** PRIOR_EXPONENT)  # nothing measured: the prior
    costs.record(1, 0.020)
    costs.record(9, 0.060)
    assert costs.relative(5) == pytest.approx(2.0)  # 40 ms, halfway
    assert costs.relative(18) == pytest.approx(3.0 * 2 ** PRIOR_EXPONENT)  # past the widest: the prior's shape
    costs.record(9, 0.100)  # a running average, not the last value
    assert 3.0 < costs.relative(9) < 5.0


def test_drafts_are_verified_only_where_they_pay():
    # A 2-core CPU's shape (benchmarks/widen.py): 1, 1.8, 2.5 (4 tokens), 3.6 (8), 7.2 (32)
    cpu = StepCosts(fixed=lambda n: 1.0 if n == 1 else 1.8 * (n / 2) ** 0.5)
    assert plan_drafts(1, [(0.3, 8)], cpu, 64) == [0]        # free text: no drafts
    assert plan_drafts(1, [(0.97, 32)], cpu, 64) == [32]     # a file copied: all of them
    assert plan_drafts(1, [(0.97, 32)], cpu, 10) == [10]     # within the step's budget
    assert plan_drafts(1, [(0.97, 0)], cpu, 64) == [0]
    flat = StepCosts.flat()
    assert plan_drafts(1, [(0.3, 8)], flat, 64) == [8]       # where width is free, any chance pays
    # Several sequences: the likelier drafts first, as many as raise tokens per second.
    counts = plan_drafts(4, [(0.95, 16), (0.2, 16), (0.9, 16)], cpu, 64)
    assert counts[1] == 0 and counts[0] >= counts[2] > 0


# -- greedy: identical tokens -----------------------------------------------------

@pytest.fixture(scope="module")
def pair(tiny_model):
    """The same tiny f32 model opened with and without speculation."""
    path, _ = tiny_model(CONFIG)
    plain = elelem.LLM(path, kv_type="f32", n_threads=1, speculative=False)
    fast = elelem.LLM(path, kv_type="f32", n_threads=1, speculative=True)
    # Verify every proposal, whatever steps cost on this machine: the tests below
    # need drafts, accepted and refused, to check that they change nothing.
    fast.engine.step_costs = StepCosts.flat()
    yield plain, fast
    plain.close()
    fast.close()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_and_cache_are_those_of_plain_decoding(pair, prompt):
    plain, fast = pair
    before = fast.engine.accepted_tokens
    for max_tokens in (1, 2, 7, 40, 90):
        want = plain.generate_tokens(prompt, max_tokens)
        assert fast.generate_tokens(prompt, max_tokens) == want
        # rejected drafts were trimmed: the cache holds what plain decoding left
        assert fast.cached_tokens == plain.cached_tokens
        assert fast.n_past == plain.n_past == len(prompt) + len(want) - 1
    assert fast.engine.accepted_tokens > before  # the loops were drafted, and confirmed


def test_a_stop_id_inside_an_accepted_draft_ends_the_generation_there(pair):
    plain, fast = pair
    full = plain.generate_tokens(PROMPTS[0], 60)
    for stop in set(full[20:40]):  # tokens of the loop: each one is met inside a draft
        want = plain.generate_tokens(PROMPTS[0], 60, stop_ids=[stop])
        assert fast.generate_tokens(PROMPTS[0], 60, stop_ids=[stop]) == want
        assert fast.cached_tokens == plain.cached_tokens


def test_drafts_are_cut_before_a_token_that_ends_the_generation(pair, monkeypatch):
    # No row after an end token is ever used: verifying it and what follows would be waste.
    plain, fast = pair
    full = plain.generate_tokens(PROMPTS[0], 60)
    prompt = PROMPTS[0] + full[:30]  # the model's loop is in the prompt: drafts copy it
    rest = plain.generate_tokens(prompt, 30)
    stop = next(t for t in rest[2:] if t in prompt and t not in rest[:2])  # drafted before it is picked
    verified = []
    make = fast.engine.new_drafter

    def new_drafter(seq, history):
        drafter = make(seq, history)
        propose, record, proposed = drafter.propose, drafter.record, []

        def proposing(limit):
            proposed[:] = propose(limit)
            return list(proposed)

        def recording(accepted, drafted):
            verified.append(proposed[:drafted])
            record(accepted, drafted)
        drafter.propose, drafter.record = proposing, recording
        return drafter
    monkeypatch.setattr(fast.engine, "new_drafter", new_drafter)
    want = plain.generate_tokens(prompt, 30, stop_ids=[stop])
    assert fast.generate_tokens(prompt, 30, stop_ids=[stop]) == want
    assert verified and not any(stop in drafts for drafts in verified)


def test_steps_of_generated_tokens_ask_for_the_decode_kernels(pair, monkeypatch):
    # A prompt keeps the batch kernels (llama.cpp's rounding for it); a step
    # that holds only picked tokens and drafts asks for one-token kernels.
    _, fast = pair
    ctx, calls = fast.engine.context, []

    class Recording:
        def __getattr__(self, name):
            return getattr(ctx, name)

        def decode(self, tokens, seqs, outputs=None, decode_kernels=False, **options):
            calls.append((len(tokens), decode_kernels))
            return ctx.decode(tokens, seqs, outputs, decode_kernels=decode_kernels, **options)
    monkeypatch.setattr(fast.engine, "_ctx", Recording())
    fast.reset()
    fast.generate_tokens(PROMPTS[0], 40)
    assert calls[0] == (len(PROMPTS[0]), False)
    assert len(calls) > 1 and all(kernels for _, kernels in calls[1:])
    assert any(n > 1 for n, _ in calls[1:])  # drafts were verified in some of them


def test_the_end_of_the_context_stops_as_without_drafts(pair):
    plain, fast = pair
    n_ctx = len(PROMPTS[0]) + 30
    with plain.new_session(n_ctx=n_ctx) as a, fast.new_session(n_ctx=n_ctx) as b:
        want = a.generate_tokens(PROMPTS[0], 100)
        assert b.generate_tokens(PROMPTS[0], 100) == want
        assert len(want) == 31 and b.n_past == a.n_past == n_ctx


# -- sampling: the model's distribution ---------------------------------------------

class _IdsText:
    """A tokenizer for a model without a vocabulary: a token's text is its id."""

    eog_ids = frozenset()

    def stream_decoder(self):
        return self

    def feed(self, token):
        return f"{token} "

    def flush(self):
        return ""


# Six live tokens (the rest banned), spread by a high temperature: every
# bigram occurs in the prompt, so every step drafts, and drafts are both
# accepted and rejected often.
LIVE = 6
SPREAD = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0,
              logit_bias={t: float("-inf") for t in range(LIVE, CONFIG.n_vocab)})
SAMPLE_PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, LIVE, 120)]
N_NEW = 4


def stream_ids(llm, prompt, params, max_tokens, speculative):
    """The tokens a TextStream generates on the LLM's default sequence, and the stream."""
    target = GenerationTarget(llm.engine, llm._default()._seq, llm.n_ctx, llm.n_vocab, threading.RLock())
    stream = TextStream(target, _IdsText(), prompt, params, max_tokens, (), speculative=speculative)
    return [int(t) for t in stream.text().split()], stream


def sampled(llm, seed, speculative):
    return stream_ids(llm, SAMPLE_PROMPT, SamplingParams(**SPREAD, seed=seed), N_NEW, speculative)


def assert_seeded_draws_match(plain, fast, sample, seeds=range(20)) -> None:
    """``sample(llm, seed, speculative)`` draws the same tokens on both, drafts both kept and rejected."""
    accepted = rejected = 0
    for seed in seeds:
        want, _ = sample(plain, seed, False)
        got, stream = sample(fast, seed, True)
        assert got == want
        accepted += stream.accepted_tokens
        rejected += stream.drafted_tokens - stream.accepted_tokens
    assert accepted > 0 and rejected > 0


def test_a_seeded_sampler_draws_the_same_tokens_with_drafts(pair):
    assert_seeded_draws_match(*pair, sampled)


# Chi-square critical value for 5 degrees of freedom (6 tokens) at p = 0.001:
# a correct implementation fails one position in a thousand runs at most.
CHI2_CRITICAL_5DOF = 20.515
N_SAMPLES = 400


def assert_frequencies_match(plain, fast, sample, n_samples: int, min_rejected: int) -> None:
    """The N_NEW tokens ``sample`` draws (of LIVE) are distributed alike with and
    without drafts (other seeds on each side), drafts being kept and rejected often."""
    drafted, accepted = fast.engine.drafted_tokens, fast.engine.accepted_tokens
    counts = np.zeros((2, N_NEW, LIVE))
    for side, (llm, speculative, seeds) in enumerate(((plain, False, range(n_samples)),
                                                        (fast, True, range(10**6, 10**6 + n_samples)))):
        for seed in seeds:
            tokens, _ = sample(llm, seed, speculative)
            assert len(tokens) == N_NEW
            counts[side, np.arange(N_NEW), tokens] += 1
    drafted, accepted = fast.engine.drafted_tokens - drafted, fast.engine.accepted_tokens - accepted
    assert accepted > n_samples // 4 and drafted - accepted > min_rejected, (drafted, accepted)
    for position in range(N_NEW):
        table = counts[:, position]
        table = table[:, table.sum(axis=0) > 0]
        expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
        statistic = ((table - expected) ** 2 / expected).sum()
        assert statistic < CHI2_CRITICAL_5DOF, (position, table)


def test_sampled_token_frequencies_match_plain_decoding(pair):
    assert_frequencies_match(*pair, sampled, N_SAMPLES, min_rejected=N_SAMPLES)


def test_streams_count_their_drafts(pair):
    plain, fast = pair
    want, off = stream_ids(plain, PROMPTS[0], SamplingParams(temperature=0), 60, False)
    got, stream = stream_ids(fast, PROMPTS[0], SamplingParams(temperature=0), 60, True)
    assert got == want and off.drafted_tokens == 0
    assert 0 < stream.accepted_tokens <= stream.drafted_tokens


# -- a real model, rewriting code -----------------------------------------------------

CODE = """def total_price(items, discount=0.0):
    total = 0.0
    for item in items:
        price = item["price"]
        quantity = item.get("quantity", 1)
        total += price * quantity
    if discount:
        total = total * (1.0 - discount)
    return round(total, 2)
"""


@pytest.mark.real_model
def test_smollm2_rewriting_code_gives_the_same_text_with_fewer_steps(smollm_path):
    # An f32 cache: with f16, a batch and a single token differ by up to ~0.15
    # in the logits (README), enough to flip a near-tie somewhere in a long answer.
    messages = [{"role": "user", "content": "Rewrite this function, renaming `items` to `entries`. "
                 "Reply with the whole function only.\n\n```python\n" + CODE + "```"}]
    with elelem.LLM(smollm_path, n_ctx=1024, n_threads=1, kv_type="f32", speculative=True) as llm:
        # Every proposal verified: on a small CPU a wide step of this model costs
        # nearly its width in single steps, and the engine would rightly draft little.
        llm.engine.step_costs = StepCosts.flat()
        steps = llm.engine.steps
        plain = llm.chat_stream(messages, max_tokens=64, temperature=0, speculative=False)
        want = plain.text()
        plain_steps, steps = llm.engine.steps - steps, llm.engine.steps
        fast = llm.chat_stream(messages, max_tokens=64, temperature=0)
        assert fast.text() == want
        assert fast.accepted_tokens > 16 and llm.engine.steps - steps < plain_steps - 16
