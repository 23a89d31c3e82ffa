"""Speculative decoding with a draft model (``LLM(draft_model=...)``), on tiny f32 models.

The drafts come from another model, but the engine verifies them as it does
prompt-lookup drafts, so the output must be the target's own: a model that
drafts for itself proposes exactly the target's greedy tokens (every draft
accepted), a different draft model changes nothing but the step count, and
sampling keeps the model's distribution.  A draft model whose token ids mean
something else is refused.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import elelem
from elelem.engine.step_costs import StepCosts
from elelem.errors import VocabularyMismatchError
from elelem.sampling.sampler import SamplingParams
from synthetic import TinyConfig, write_model
from test_speculative import (LIVE, N_NEW, PROMPTS, assert_frequencies_match, assert_seeded_draws_match,
                              stream_ids)

CONFIG = TinyConfig()
OTHER_WEIGHTS = CONFIG.but(seed=7, n_layer=1)  # same vocabulary, other predictions


def _opened(path, *options):
    """One f32 LLM over ``path`` per dict of options, yielded together, then closed."""
    llms = [elelem.LLM(path, kv_type="f32", n_threads=1, **o) for o in options]
    for llm in llms:
        # Verify every draft, whatever steps cost here: the tests need them to run.
        llm.engine.step_costs = StepCosts.flat()
    yield tuple(llms)
    for llm in llms:
        llm.close()


@pytest.fixture(scope="module")
def models(tiny_model):
    """The tiny model plain, drafting for itself, and drafted for by another model."""
    path, _ = tiny_model(CONFIG)
    other, _ = tiny_model(OTHER_WEIGHTS)
    yield from _opened(path, dict(speculative=False), dict(draft_model=path), dict(draft_model=other))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_model_drafting_for_itself_is_always_right(models, prompt):
    plain, itself, _ = models
    engine = itself.engine
    drafted, accepted, evaluated = engine.drafted_tokens, engine.accepted_tokens, engine.draft.evaluated
    lengths = (1, 2, 7, 40, 90)
    for max_tokens in lengths:
        want = plain.generate_tokens(prompt, max_tokens)
        assert itself.generate_tokens(prompt, max_tokens) == want
        assert itself.cached_tokens == plain.cached_tokens  # nothing of the drafts is left behind
    drafted, accepted = engine.drafted_tokens - drafted, engine.accepted_tokens - accepted
    assert drafted > 40 and accepted == drafted
    # The draft sequence is trimmed to what the target kept and catches up from
    # there: it never evaluates a token of a call twice.
    assert engine.draft.evaluated - evaluated <= sum(len(prompt) + n for n in lengths)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_another_draft_model_changes_the_steps_not_the_tokens(models, prompt):
    plain, _, drafted = models
    engine = drafted.engine
    before = engine.drafted_tokens - engine.accepted_tokens
    for max_tokens in (7, 60):
        assert drafted.generate_tokens(prompt, max_tokens) == plain.generate_tokens(prompt, max_tokens)
        assert drafted.cached_tokens == plain.cached_tokens
    assert engine.drafted_tokens - engine.accepted_tokens > before  # it was wrong at times: drafts were rejected


def test_concurrent_streams_each_draft_on_a_sequence_of_their_own(models):
    plain, itself, _ = models
    want = [plain.generate_tokens(p, 50) for p in PROMPTS]
    sessions = [itself.new_session() for _ in PROMPTS]
    # A tiny model takes a few steps of a fraction of a millisecond for a whole
    # answer, so a thread can finish before the others join: try a few times
    # until they share a step, each try checked.
    for _ in range(5):
        for session in sessions:
            session.reset()
        barrier = threading.Barrier(len(PROMPTS))
        results = [None] * len(PROMPTS)

        def run(i):
            barrier.wait()
            results[i] = sessions[i].generate_tokens(PROMPTS[i], 50)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        steps = itself.engine.shared_steps
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == want
        if itself.engine.shared_steps > steps:
            break
    assert itself.engine.shared_steps > steps  # they did run in the same steps
    for session in sessions:
        session.close()


# Sampling: models of LIVE tokens only, spread by a high temperature, so that
# the draft model's greedy guesses are often right and often wrong.
SMALL = CONFIG.but(n_vocab=LIVE)
SMALL_DRAFT = SMALL.but(seed=7, n_layer=1)
HOT = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
SAMPLE_PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, LIVE, 120)]


@pytest.fixture(scope="module")
def small(tiny_model):
    path, _ = tiny_model(SMALL)
    draft, _ = tiny_model(SMALL_DRAFT)
    yield from _opened(path, dict(speculative=False), dict(draft_model=draft))


def sampled(llm, seed, speculative):
    return stream_ids(llm, SAMPLE_PROMPT, SamplingParams(**HOT, seed=seed), N_NEW, speculative)


def test_a_seeded_sampler_draws_the_same_tokens_with_a_draft_model(small):
    assert_seeded_draws_match(*small, sampled)


def test_sampled_token_frequencies_match_plain_decoding(small):
    assert_frequencies_match(*small, sampled, 300, min_rejected=300 // 4)


def test_streams_report_the_draft_models_tokens(models):
    plain, itself, _ = models
    want, _ = stream_ids(plain, PROMPTS[0], SamplingParams(temperature=0), 60, False)
    got, stream = stream_ids(itself, PROMPTS[0], SamplingParams(temperature=0), 60, True)
    assert got == want
    assert stream.accepted_tokens == stream.drafted_tokens > 20


def test_an_open_llm_can_draft_and_keeps_its_weights(models, tiny_model):
    plain, _, _ = models
    path, _ = tiny_model(CONFIG)
    with elelem.LLM(path, kv_type="f32", n_threads=1, draft_model=plain) as shared:
        assert shared.generate_tokens(PROMPTS[1], 30) == plain.generate_tokens(PROMPTS[1], 30)
        assert shared.engine.accepted_tokens > 0
    assert plain.generate_tokens(PROMPTS[1], 3)  # closing the target left the draft LLM open


# -- refused draft models ---------------------------------------------------------

def test_a_draft_model_of_another_vocabulary_size_is_refused(tiny_model):
    path, _ = tiny_model(CONFIG)
    other, _ = tiny_model(CONFIG.but(n_vocab=CONFIG.n_vocab + 32))
    with pytest.raises(VocabularyMismatchError, match="128 tokens .* 96"):
        elelem.LLM(path, draft_model=other)


def _with_tokens(texts):
    def add(writer):
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(texts)
    return add


def test_a_draft_model_whose_tokens_mean_other_things_is_refused(tmp_path):
    texts = [f"t{i}" for i in range(CONFIG.n_vocab)]
    swapped = list(texts)
    swapped[40], swapped[41] = swapped[41], swapped[40]
    paths = {}
    for name, vocabulary in (("a", texts), ("b", list(texts)), ("swapped", swapped)):
        paths[name] = tmp_path / f"{name}.gguf"
        write_model(paths[name], CONFIG, extra_metadata=_with_tokens(vocabulary))
    with elelem.LLM(paths["a"], n_threads=1, draft_model=paths["b"]) as llm:  # the same texts: accepted
        assert llm.engine.draft is not None
    with pytest.raises(VocabularyMismatchError, match="token 40 is 't40' .* 't41'"):
        elelem.LLM(paths["a"], draft_model=paths["swapped"])
    write_model(tmp_path / "bare.gguf", CONFIG)
    with pytest.raises(VocabularyMismatchError, match="only one of"):
        elelem.LLM(paths["a"], draft_model=tmp_path / "bare.gguf")


def test_the_cli_opens_models_with_its_speculation_switches(tiny_model):
    from elelem.cli.loading import open_llm
    from elelem.cli.parser import build_parser
    path, _ = tiny_model(CONFIG)
    parser = build_parser()
    with open_llm(parser.parse_args(["run", "-m", str(path), "--no-speculative", "hi"])) as llm:
        assert llm.engine.speculative is False and llm.engine.draft is None
    with open_llm(parser.parse_args(["run", "-m", str(path), "--draft-model", str(path), "hi"])) as llm:
        assert llm.engine.speculative is True and llm.engine.draft is not None
