"""Sampling with drafts draws from the target's distribution, for every
drafter: prompt lookup, a draft model, an MTP head, an EAGLE-3 head (one
that borrows its target's token table and output), a Gemma 4 drafter and a
DFlash drafter (borrowing too).

Each drafter proposes greedy guesses (one token each, not a distribution);
the engine draws each token from the target's own distribution and keeps a
guess only when the draw is that guess (engine.py ``_pick_verified``): for a
one-token proposal that is the speculative-sampling rule (kept with
probability p(d), else a draw from p without d).  What is checked here is
what comes out: over N_SAMPLES seeds, the first N_NEW tokens sampled with
drafts (verified whatever the step costs, kept and refused often) against
the target's exact distribution of those N_NEW tokens (every prefix's logits
through the sampler's own filtered_distribution), by a chi-square goodness of
fit on their joint, whose false-failure rate is FALSE_FAILURE_RATE for a
correct engine.  The seeds are fixed, so each run gives the same verdict.

Checked by hand (the engine patched for the run, not kept): with the rule
broken as "keep the guess with probability p(d), else draw again from p"
(d not removed: the classic mistake) every drafter here fails, by 2 to 3.5
times the critical value on the first two tokens; with every guess kept,
by 30 to 100 times; the same rule written out correctly (keep with p(d),
else draw from p without d) passes.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import elelem
import elelem.engine.mtp as mtp_module
from elelem.engine.step_costs import StepCosts
from elelem.sampling.sampler import SamplingParams, filtered_distribution
from synthetic import TinyConfig, write_model
from synthetic_dflash import DFlashConfig, write_dflash
from synthetic_eagle3 import Eagle3Config, write_eagle3_head
from synthetic_gemma4_assistant import AssistantConfig, write_assistant
from test_speculative import stream_ids

#: The chance that a correct engine fails one drafter's test (for its fixed seeds: once in 10^4 seed sets).
FALSE_FAILURE_RATE = 1e-4
LIVE = 6              # every model's vocabulary: the guesses are often right, often wrong
N_NEW = 3             # the tokens drawn per seed: the second is the first a guess can be, the third the first
                      # drawn from a guess's row
N_SAMPLES = 1000
MIN_EXPECTED = 5.0    # cells expected fewer times are pooled into one (the chi-square approximation's rule)
HOT = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, LIVE, 40)]   # every bigram: prompt lookup drafts

LLAMA = TinyConfig(n_vocab=LIVE, seed=61)
MODELS = {
    "prompt lookup": (LLAMA, None),
    "draft model": (LLAMA, LLAMA.but(seed=62, n_layer=1)),
    "mtp": (TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=63, mtp="agree",
                       n_vocab=LIVE), None),
    "eagle3": (TinyConfig(arch="llama", n_layer=8, n_embd=64, n_head=4, n_head_kv=2, n_vocab=LIVE, seed=64),
               Eagle3Config(n_vocab=LIVE, n_vocab_draft=LIVE, seed=65, drop=("token_embd.weight", "output.weight"))),
    "assistant": (TinyConfig(arch="gemma4", head_dim=32, head_dim_swa=16, n_layer=6, n_swa=8, n_head_kv=1,
                             n_head_kv_global=2, n_kv_shared=3, softcap=30.0, seed=66, n_vocab=LIVE),
                  AssistantConfig(n_embd=48, n_embd_out=64, head_dim=32, head_dim_swa=16, n_swa=8, seed=67,
                                  n_vocab=LIVE)),
    "dflash": (TinyConfig(arch="llama", n_layer=8, n_embd=64, n_head=4, n_head_kv=2, n_vocab=LIVE, seed=68),
               # no token table, no tokenizer (as the target): the vocabulary's size from dflash.vocab_size
               DFlashConfig(n_vocab=LIVE, seed=69, block_size=4, mask_token=LIVE - 1,
                            extra_keys=(("dflash.vocab_size", LIVE),))),
}


def chi2_survival(x: float, df: int) -> float:
    """P(X >= x) for a chi-square X of ``df`` (integer) degrees of freedom, in closed form."""
    half = x / 2.0
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= half / k
            total += term
        return math.exp(-half) * total
    total, term = math.erfc(math.sqrt(half)), math.sqrt(half) * math.exp(-half) / math.gamma(1.5)
    for k in range(1, (df - 1) // 2 + 1):
        total += term
        term *= half / (k + 0.5)
    return total


def chi2_critical(df: int, rate: float) -> float:
    """The x whose survival is ``rate`` (bisection: the survival falls with x)."""
    lo, hi = 0.0, float(df) + 100.0 * math.sqrt(df) + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if chi2_survival(mid, df) > rate else (lo, mid)
    return hi


def test_the_critical_values_are_the_chi_square_distributions():
    # tabulated: chi-square quantiles at 1 - 1e-3 (df 5: 20.515; df 10: 29.588) and 1 - 1e-4 (df 1: 15.137)
    assert chi2_critical(5, 1e-3) == pytest.approx(20.515, abs=1e-3)
    assert chi2_critical(10, 1e-3) == pytest.approx(29.588, abs=1e-3)
    assert chi2_critical(1, 1e-4) == pytest.approx(15.137, abs=1e-3)


def _sample(llm, seed: int):
    """The N_NEW tokens drawn after PROMPT with drafts, and the stream (its draft counts)."""
    return stream_ids(llm, PROMPT, SamplingParams(**HOT, seed=seed), N_NEW, True)


def exact_distribution(llm) -> dict[tuple, float]:
    """The target's probability of each N_NEW tokens after PROMPT, without drafts."""
    params = SamplingParams(**HOT)
    out: dict[tuple, float] = {}

    def walk(prefix: tuple, p: float) -> None:
        if len(prefix) == N_NEW:
            out[prefix] = p
            return
        llm.reset()
        ids, probs = filtered_distribution(llm.eval(PROMPT + list(prefix)), params)
        for token, q in zip(ids.tolist(), probs.tolist()):
            walk(prefix + (token,), p * q)

    walk((), 1.0)
    llm.reset()
    return out


def marginal(table: dict, view: tuple) -> dict:
    """``table`` (draws of N_NEW tokens -> count or probability) summed down to the tokens at ``view``."""
    out: dict = {}
    for cell, value in table.items():
        key = tuple(cell[i] for i in view)
        out[key] = out.get(key, 0) + value
    return out


def goodness_of_fit(counts: dict[tuple, int], expected_p: dict[tuple, float], n: int) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom, cells expected fewer
    than MIN_EXPECTED times pooled (with anything drawn outside the support)."""
    big = {cell: p * n for cell, p in expected_p.items() if p * n >= MIN_EXPECTED}
    observed = [counts.get(cell, 0) for cell in big]
    expected = list(big.values())
    rest_expected = n - sum(expected)
    rest_observed = n - sum(observed)
    if rest_expected > 1e-9:
        observed.append(rest_observed)
        expected.append(rest_expected)
    elif rest_observed:
        return math.inf, len(expected) - 1
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return statistic, len(expected) - 1


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[Path, Path | None]]:
    folder = tmp_path_factory.mktemp("drafting-distribution")
    out = {}
    for kind, (target_cfg, drafter_cfg) in MODELS.items():
        target = folder / f"{kind.replace(' ', '-')}.gguf"
        write_model(target, target_cfg)
        drafter = None
        if isinstance(drafter_cfg, TinyConfig):
            drafter = folder / f"{kind.replace(' ', '-')}-draft.gguf"
            write_model(drafter, drafter_cfg)
        elif isinstance(drafter_cfg, Eagle3Config):
            drafter = folder / "eagle3-head.gguf"
            write_eagle3_head(drafter, drafter_cfg)
        elif isinstance(drafter_cfg, AssistantConfig):
            drafter = folder / "assistant-head.gguf"
            write_assistant(drafter, drafter_cfg)
        elif isinstance(drafter_cfg, DFlashConfig):
            drafter = folder / "dflash-head.gguf"
            write_dflash(drafter, drafter_cfg)
        out[kind] = target, drafter
    return out


def _open(path, **kw):
    return elelem.LLM(path, n_threads=1, n_seq_max=2, kv_size=256, amx=False, **kw)


def _drafting(llm, kind: str, monkeypatch) -> None:
    """Drafts from ``kind`` alone, as many as allowed, verified whatever steps cost."""
    engine = llm.engine
    engine.step_costs = StepCosts.flat()
    if kind in ("mtp", "eagle3", "assistant", "dflash"):
        assert engine.mtp is not None and engine.mtp.kind == kind
        monkeypatch.setattr(mtp_module, "plan_draft_length", lambda rate, costs, cost, limit, rollback=0.0: limit)
        engine.new_drafter = lambda seq, history: engine.mtp.drafter(seq, history, engine.step_costs)
    elif kind == "draft model":
        assert engine.draft is not None


@pytest.mark.parametrize("kind", list(MODELS))
def test_sampled_tokens_with_drafts_follow_the_targets_distribution(files, kind, monkeypatch):
    target, drafter = files[kind]
    with _open(target, speculative=False) as plain:
        expected = exact_distribution(plain)
    assert sum(expected.values()) == pytest.approx(1.0)
    with _open(target, **({"draft_model": str(drafter)} if drafter else {})) as llm:
        _drafting(llm, kind, monkeypatch)
        counts: dict[tuple, int] = {}
        drafted = accepted = 0
        for seed in range(N_SAMPLES):
            drawn, stream = _sample(llm, seed)
            tokens = tuple(drawn)
            assert len(tokens) == N_NEW
            counts[tokens] = counts.get(tokens, 0) + 1
            drafted += stream.drafted_tokens
            accepted += stream.accepted_tokens
        stats = llm.engine.drafter_stats()
    assert set(stats) == {kind}, stats
    # two views of the draws, each at half the rate: the first two tokens (the second may be a
    # guess kept), and the second and third (the third drawn from a kept guess's row)
    for view in ((0, 1), (1, 2)):
        statistic, df = goodness_of_fit(marginal(counts, view), marginal(expected, view), N_SAMPLES)
        assert statistic < chi2_critical(df, FALSE_FAILURE_RATE / 2), (view, statistic, df, sorted(counts.items()))
    # guesses kept and refused often: both branches of the rule were exercised (DFlash's random
    # block drafter keeps the fewest, 73 of 1000)
    assert accepted > N_SAMPLES // 20 and drafted - accepted > N_SAMPLES // 20, (drafted, accepted)
