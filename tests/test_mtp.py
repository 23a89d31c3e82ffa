"""Drafting with a model's multi-token-prediction head (elelem.engine.mtp):
greedy output bit for bit the output without drafts, sampled output the
same under one seed and alike in distribution, drafting and plain sequences
batched each exact, the draft planner turning a head that never agrees off,
and the per-generation choice between prompt lookup and the head.  The
head's logits against llama.cpp: tests/test_mtp_head.py."""
from __future__ import annotations

import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import elelem
import elelem.engine.mtp as mtp_module
from elelem.api.generation import GenerationTarget, TextStream
from elelem.cli.info_cmd import describe
from elelem.engine.mtp import DrafterChoice, MTPDrafter
from elelem.engine.step_costs import StepCosts, plan_draft_length
from elelem.sampling.sampler import SamplingParams
from elelem.server.metrics import Metrics
from elelem.gguf.reader import read_gguf
from elelem.model.mtp import is_companion
from synthetic import TinyConfig, make_weights, write_model
from test_speculative import LIVE, N_NEW, _IdsText, assert_frequencies_match, assert_seeded_draws_match, stream_ids

# -- drafting through the engine (small vocabularies: no llama.cpp here) ------------------

AGREE = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=21, mtp="agree",
                   n_vocab=512)
DISAGREE = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=22, mtp=True,
                      n_vocab=512)
AGREE_MOE = TinyConfig(arch="qwen35moe", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=23, mtp="agree",
                       n_vocab=512)
AGREE_GLM = TinyConfig(arch="glm4moe", head_dim=32, n_rot=16, n_layer=3, wtype="q8_0", seed=24, mtp="agree",
                       n_vocab=512)
AGREE_NEXT = TinyConfig(arch="qwen3next", head_dim=32, n_rot=8, n_layer=4, wtype="q8_0", seed=25, mtp="agree",
                        n_vocab=512)


def _open(path, **kw):
    return elelem.LLM(path, n_threads=1, n_seq_max=4, kv_size=1024, amx=False, **kw)


@pytest.fixture
def always_draft(monkeypatch):
    """Every proposal drafts as many tokens as allowed, whatever steps cost
    here, and the engine verifies them all: the tests below need drafts,
    kept and refused, to check that they change nothing."""
    monkeypatch.setattr(mtp_module, "plan_draft_length", lambda rate, costs, cost, limit, rollback=0.0: limit)


def _mtp_only(llm):
    """Drafts from the head alone (prompt lookup would take the repeats of
    these tiny models' greedy text), verified whatever steps cost."""
    engine = llm.engine
    engine.step_costs = StepCosts.flat()
    engine.new_drafter = lambda seq, history: engine.mtp.drafter(seq, history, engine.step_costs)


@pytest.mark.parametrize("cfg", [AGREE, DISAGREE, AGREE_MOE, AGREE_GLM, AGREE_NEXT],
                         ids=["agree", "disagree", "agree-moe", "agree-glm4moe", "agree-qwen3next"])
def test_greedy_output_with_mtp_drafts_is_the_output_without(tiny_model, cfg, always_draft):
    path, _ = tiny_model(cfg)
    prompt = np.random.default_rng(cfg.seed).integers(1, cfg.n_vocab, 9).tolist()
    with _open(path, speculative=False) as llm:
        plain = llm.generate_tokens(prompt, 60)
    with _open(path) as llm:
        assert llm.engine.mtp is not None
        _mtp_only(llm)
        drafted = llm.generate_tokens(prompt, 60)
        stats = llm.engine.drafter_stats()
        replayed = llm.engine.context.n_replayed
    assert drafted == plain
    # A refused draft rewinds the recurrent state to the snapshot before its
    # step; the token before it is evaluated again with the next one, in no step of its own.
    assert replayed == 0
    assert stats["mtp"]["drafted"] >= 20, stats
    if cfg.mtp == "agree":   # the head agrees: most drafts are kept
        assert stats["mtp"]["acceptance_rate"] > 0.7, stats
    else:
        assert stats["mtp"]["acceptance_rate"] < 0.3, stats


def test_the_planner_turns_a_disagreeing_head_off(tiny_model):
    """Measured costs (not a flat GPU): a head whose drafts are refused is
    only probed now and then, its probes growing rarer."""
    path, _ = tiny_model(DISAGREE)
    prompt = np.random.default_rng(5).integers(1, DISAGREE.n_vocab, 9).tolist()
    with _open(path) as llm:
        engine = llm.engine
        engine.new_drafter = lambda seq, history: engine.mtp.drafter(seq, history, engine.step_costs)
        llm.generate_tokens(prompt, 120)
        stats = engine.drafter_stats()
    assert stats.get("mtp", {"drafted": 0})["drafted"] <= 6, stats


@pytest.mark.parametrize("cfg", [AGREE, DISAGREE], ids=["agree", "disagree"])
def test_a_probe_brings_the_head_through_a_window_not_the_whole_prompt(tiny_model, cfg):
    """Measured costs: a generation's first draft is a probe, and a probe
    evaluates at most PROBE_WINDOW history tokens through the head (a long
    prompt was most of what a refused probe cost), its guess watched, not
    verified.  The text is the text without drafts; an agreeing head's probes
    are confirmed from the window."""
    path, _ = tiny_model(cfg)
    prompt = np.random.default_rng(6).integers(1, cfg.n_vocab, 300).tolist()
    with _open(path, speculative=False) as llm:
        plain = llm.generate_tokens(prompt, 40)
    with _open(path) as llm:
        engine = llm.engine
        engine.new_drafter = lambda seq, history: engine.mtp.drafter(seq, history, engine.step_costs)
        drafter = engine.mtp.drafter
        seen = []
        engine.mtp.drafter = lambda *a: seen.append(drafter(*a)) or seen[-1]
        drafted = llm.generate_tokens(prompt, 40)
        stats = engine.drafter_stats().get("mtp", {"drafted": 0})
        evaluated = engine.mtp.evaluated
    assert drafted == plain
    assert evaluated >= 1
    # The first probe: at most PROBE_WINDOW tokens; then a token or a few at a
    # time (the tokens since the last probe, drafts), from the window on.
    assert evaluated <= mtp_module.PROBE_WINDOW + 40 + stats["drafted"], (evaluated, stats)
    rate = seen[0].acceptance.rate
    if cfg.mtp == "agree":
        assert rate > 0.5, rate           # probes confirmed (0.5: the prior)
    else:
        assert rate < 0.5, rate           # probes refused
        assert stats["drafted"] == 0, stats


def test_plan_draft_length_weighs_rate_costs_and_rollback():
    flat = StepCosts.flat()
    assert plan_draft_length(0.9, flat, 0.1, 8) == 8               # cheap width, good drafts: all of them
    assert plan_draft_length(0.05, flat, 0.3, 8) == 0              # bad drafts cost their steps
    assert plan_draft_length(0.9, flat, 0.1, 8, rollback_cost=1.0) > 0
    assert plan_draft_length(0.3, flat, 0.05, 8, rollback_cost=1.0) == 0   # refusals rewind a hybrid
    cpu = StepCosts(fixed=lambda n: 1.0 + 0.8 * (n - 1))           # each token of width costs 80%
    assert plan_draft_length(0.9, cpu, 0.1, 8) == 0
    assert plan_draft_length(0.9, flat, 0.1, 0) == 0


def test_the_choice_takes_prompt_lookup_where_it_does_at_least_as_well(tiny_model):
    path, _ = tiny_model(AGREE)
    with _open(path) as llm:
        history = [5, 6, 7, 8, 5, 6, 7]
        drafter = llm.engine.new_drafter(0, history)
        assert isinstance(drafter, DrafterChoice) and isinstance(drafter.mtp, MTPDrafter)
        assert drafter.propose(4) == [8, 5, 6, 7] and drafter.kind == "prompt lookup"
        drafter.record(0, 4)                                 # refused: the head's turn next time
        drafter.lookup.acceptance.refuse()
        drafter.propose(4)
        assert drafter.kind == "mtp"


def test_drafting_and_plain_sequences_batched_are_each_exact(tiny_model, always_draft):
    path, _ = tiny_model(AGREE)
    prompts = [np.random.default_rng(s).integers(1, AGREE.n_vocab, 7 + s).tolist() for s in range(3)]
    with _open(path, speculative=False) as llm:
        want = [llm.generate_tokens(p, 40) for p in prompts]
    with _open(path) as llm:
        _mtp_only(llm)
        sessions = [llm.new_session() for _ in prompts]
        got = [None] * len(prompts)
        for _ in range(5):   # until they share a step (a tiny model may finish alone), each try checked
            barrier = threading.Barrier(len(prompts))
            steps = llm.engine.shared_steps

            def run(i):
                barrier.wait()
                if i == 1:   # a plain stream beside the drafting ones
                    target = GenerationTarget(llm.engine, sessions[i]._seq, llm.n_ctx, llm.n_vocab,
                                              threading.RLock())
                    stream = TextStream(target, _IdsText(), prompts[i], SamplingParams(temperature=0), 40, (),
                                        speculative=False)
                    got[i] = [int(t) for t in stream.text().split()]
                else:
                    got[i] = sessions[i].generate_tokens(prompts[i], 40)

            for session in sessions:
                session.reset()
            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert got == want
            if llm.engine.shared_steps > steps:
                break
        assert llm.engine.shared_steps > steps and llm.engine.drafter_stats()["mtp"]["drafted"] > 0
        for session in sessions:
            session.close()


# Sampling: LIVE tokens, spread by a high temperature, a head that agrees with
# the model's most likely token -- so its drafts are kept and refused often.
SMALL = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=31, mtp="agree",
                   n_vocab=LIVE)
HOT = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
SAMPLE_PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, LIVE, 40)]


@pytest.fixture(scope="module")
def small(tiny_model):
    path, _ = tiny_model(SMALL)
    with _open(path, speculative=False) as plain, _open(path) as fast:
        _mtp_only(fast)
        yield plain, fast


def sampled(llm, seed, speculative):
    return stream_ids(llm, SAMPLE_PROMPT, SamplingParams(**HOT, seed=seed), N_NEW, speculative)


def test_a_seeded_sampler_draws_the_same_tokens_with_mtp_drafts(small, always_draft):
    assert_seeded_draws_match(*small, sampled)


def test_sampled_token_frequencies_match_plain_decoding(small, always_draft):
    """A chi-square test per position at p = 0.001 (test_speculative's): a
    correct engine fails it once in a thousand runs per position at most."""
    assert_frequencies_match(*small, sampled, 300, min_rejected=300 // 4)


def test_info_and_metrics_show_the_drafters_and_their_rates(tiny_model):
    path, _ = tiny_model(AGREE)
    drafters = describe(path)["drafters"]
    assert drafters[0] == "prompt lookup" and drafters[1].startswith("mtp")
    with _open(path, mtp=False) as llm:
        assert llm.engine.mtp is None
    with _open(path) as llm:
        _mtp_only(llm)
        llm.generate_tokens([1, 2, 3], 30)
        served = SimpleNamespace(id="tiny", llm=llm, in_flight=0, idle_sessions=0, queued=0, offload=None)
        text = Metrics().render([served])
        stats = llm.engine.drafter_stats()["mtp"]
    drafted = int(re.search(r'^elelem_draft_tokens_total\{model="tiny",drafter="mtp"\} (\d+)$', text, re.M).group(1))
    kept = int(re.search(r'^elelem_draft_tokens_accepted_total\{model="tiny",drafter="mtp"\} (\d+)$', text,
                         re.M).group(1))
    rate = float(re.search(r'^elelem_draft_acceptance_rate\{model="tiny",drafter="mtp"\} (\S+)$', text,
                           re.M).group(1))
    assert drafted == stats["drafted"] > 0 and kept == stats["accepted"]
    assert abs(rate - kept / drafted) < 1e-4


def test_a_companion_mtp_file_drafts_as_the_head_in_the_model_file(tiny_model, tmp_path, always_draft):
    """The head as llama.cpp's converter publishes it apart (--mtp: the
    model's metadata, the NextN block, embeddings and output, none of the
    model's layers), given as the draft model: the same head, the same text."""
    path, _ = tiny_model(AGREE)
    trunk = tuple(n for n in make_weights(AGREE) if n.startswith("blk.") and int(n.split(".")[1]) < AGREE.n_layer)
    companion = tmp_path / "mtp-agree.gguf"
    write_model(companion, AGREE.but(drop=trunk))
    assert is_companion(read_gguf(companion)) and not is_companion(read_gguf(path))
    prompt = np.random.default_rng(3).integers(1, AGREE.n_vocab, 9).tolist()
    hidden = np.random.default_rng(4).standard_normal((4, AGREE.n_embd)).astype(np.float32)
    with _open(path, speculative=False) as llm:
        plain = llm.generate_tokens(prompt, 40)
    with _open(path) as own, _open(path, draft_model=str(companion)) as llm:
        assert llm.engine.draft is None and llm.engine.mtp is not None
        np.testing.assert_array_equal(llm.engine.mtp._ctx.decode(prompt[:4], 0, True, hidden_in=hidden),
                                      own.engine.mtp._ctx.decode(prompt[:4], 0, True, hidden_in=hidden))
        _mtp_only(llm)
        assert llm.generate_tokens(prompt, 40) == plain
        assert llm.engine.drafter_stats()["mtp"]["acceptance_rate"] > 0.7
