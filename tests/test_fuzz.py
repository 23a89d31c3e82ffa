"""The fuzzing harness's CI portion (tests/fuzzing, scripts/fuzz.py).

* The harness itself: crash, hang and unexpected-exception detection and
  attribution inside a batch, deterministic cases, the GGUF field map.
* Short seeded campaigns: GGUF files mutated from the synthetic seeds (and,
  with ``real_model``, from SmolLM2), the tokenizer on random bytes and
  Unicode, and random or mutated chat templates.
* Every saved crasher in tests/fixtures/crashers/ replayed.

A campaign may hit a bug that already has an ``"open"`` crasher fixture: that
is reported as an expected failure (xfail) rather than a new one; any failure
with a new signature fails the test, and its input is in the message.  Long
campaigns: ``scripts/fuzz.py``.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from fuzzing import crashers  # noqa: E402
from fuzzing.driver import Case, Summary, run_batch, run_campaign  # noqa: E402
from fuzzing.outcomes import CRASH, HANG, PASS, REJECTED, UNEXPECTED  # noqa: E402

CI_SEED = 20240601
GGUF_CASES = 300
REAL_GGUF_CASES = 24
TOKENIZER_CASES = 300
TEMPLATE_CASES = 300
# Synthetic cases take milliseconds (seconds under ASan); a hang costs this much.
CASE_TIMEOUT_S = 15


def open_signatures() -> dict[str, str]:
    """Signature -> fixture name of every crasher that is not fixed yet."""
    out = {}
    for path in crashers.all_fixtures():
        fixture = crashers.load(path)
        if fixture.get("status") == "open":
            out[fixture["signature"]] = path.name
    return out


def check_campaign(summary: Summary, expected_cases: int) -> None:
    assert summary.iterations == expected_cases
    known = open_signatures()
    new, seen_known = [], set()
    for failure in summary.failures:
        sig = crashers.signature(failure)
        if sig in known:
            seen_known.add(known[sig])
        else:
            new.append(f"{failure.title()}\n  signature: {sig}\n  ops: {failure.info.get('ops')}\n"
                       f"  {failure.outcome.detail[-1500:]}")
    assert not new, (f"{len(new)} new failures (run scripts/fuzz.py --target {summary.target} --seed "
                     f"{summary.seed} --iterations {expected_cases} to save them as fixtures):\n" + "\n".join(new))
    if seen_known:
        pytest.xfail(f"known open crashers still reproduce: {', '.join(sorted(seen_known))}")


# -- the harness -------------------------------------------------------------------


def test_runner_attributes_crashes_hangs_and_exceptions_inside_a_batch(tmp_path):
    actions = ["ok", "abort", "ok", "reject", "segv", "raise", "hang", "ok"]
    cases = []
    for i, action in enumerate(actions):
        path = tmp_path / f"case-{i}.txt"
        path.write_text(action)
        cases.append(Case(i, path, {}))
    results = run_batch("selftest", cases, tmp_path, case_timeout=3.0)
    statuses = [outcome.status for _, outcome, _ in results]
    assert [case.index for case, _, _ in results] == list(range(len(actions)))
    assert statuses == [PASS, CRASH, PASS, REJECTED, CRASH, UNEXPECTED, HANG, PASS]
    assert "SIGABRT" in results[1][1].error
    assert "SIGSEGV" in results[4][1].error or "SIGABRT" in results[4][1].error  # ASan turns SEGV into abort
    assert results[5][1].error == "TypeError" and "nobody expected this" in results[5][1].detail


def test_gguf_cases_are_deterministic_and_start_from_valid_seeds(tmp_path):
    from elelem.gguf_reader import read_gguf
    from fuzzing.gguf_target import GGUFCases

    writer = GGUFCases(tmp_path / "seeds")
    for base in writer.mutator.bases:
        gguf = read_gguf(base.path)
        layout = base.layout
        assert len(layout.kv_starts) == len(gguf.metadata) and len(layout.tensor_starts) == len(gguf.tensors)
        assert layout.data_offset == gguf.data_offset
        dims = [f for f in layout.fields if f.role == "dim"]
        assert [struct.unpack_from(f.fmt, base.header, f.offset)[0] for f in dims] == \
            [ne for t in gguf.tensors.values() for ne in t.shape]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for index in range(20):
        first, info = writer.write(CI_SEED, index, tmp_path / "a")
        again, _ = writer.write(CI_SEED, index, tmp_path / "b")
        assert first.read_bytes() == again.read_bytes(), info["ops"]


def test_the_mutator_survives_its_own_mutations(tmp_path):
    # Operators run one after another on the same bytes: a later one must cope
    # with whatever an earlier one did to a length or a count.
    from fuzzing.gguf_mutator import Mutator
    from fuzzing.gguf_target import GGUFCases

    mutator: Mutator = GGUFCases(tmp_path / "seeds").mutator
    for index in range(3000):
        mutator.make(CI_SEED + 1, index)


def test_fixture_form_rebuilds_the_same_file(tmp_path):
    from fuzzing.gguf_target import GGUFCases, write_fixture_input

    writer = GGUFCases(tmp_path / "seeds")
    for index in range(10):
        path, info = writer.write(CI_SEED, index, tmp_path)
        rebuilt = write_fixture_input(info["input"], tmp_path / "rebuilt.gguf")
        assert rebuilt.read_bytes() == path.read_bytes()


# -- short campaigns ---------------------------------------------------------------


def test_gguf_mutations_of_synthetic_models(tmp_path):
    from fuzzing.gguf_target import GGUFCases

    summary = run_campaign(GGUFCases(tmp_path / "seeds"), seed=CI_SEED, iterations=GGUF_CASES, batch_size=50,
                           case_timeout=CASE_TIMEOUT_S, confirm=False)
    # The campaign must reach past the reader: into ggml, the tokenizer and the template.
    assert summary.stage_counts["model:pass"] > 10 and summary.stage_counts["template:pass"] > 10
    check_campaign(summary, GGUF_CASES)


@pytest.mark.real_model
def test_gguf_mutations_of_a_real_model(tmp_path, smollm_path):
    from fuzzing.gguf_target import GGUFCases

    writer = GGUFCases(tmp_path / "seeds", synthetic=False, real=("smollm2-135m",))
    summary = run_campaign(writer, seed=CI_SEED, iterations=REAL_GGUF_CASES, batch_size=REAL_GGUF_CASES,
                           case_timeout=120, confirm=False)
    check_campaign(summary, REAL_GGUF_CASES)


def test_tokenizer_on_random_input_tiny_vocabularies():
    from fuzzing.tokenizer_target import TINY_VOCABS, TokenizerCases

    summary = run_campaign(TokenizerCases(list(TINY_VOCABS)), seed=CI_SEED, iterations=TOKENIZER_CASES // 3,
                           batch_size=TOKENIZER_CASES, case_timeout=CASE_TIMEOUT_S, confirm=False)
    check_campaign(summary, TOKENIZER_CASES // 3)


@pytest.mark.real_model
def test_tokenizer_on_random_input_real_vocabularies(qwen_path, smollm_path, gemma_path):
    from fuzzing.tokenizer_target import TokenizerCases

    vocabs = [Path(p).name for p in (qwen_path, smollm_path, gemma_path)]
    summary = run_campaign(TokenizerCases(vocabs), seed=CI_SEED, iterations=TOKENIZER_CASES,
                           batch_size=TOKENIZER_CASES, case_timeout=CASE_TIMEOUT_S, confirm=False)
    check_campaign(summary, TOKENIZER_CASES)


def test_random_and_mutated_chat_templates():
    from fuzzing.template_target import TemplateCases

    summary = run_campaign(TemplateCases(), seed=CI_SEED, iterations=TEMPLATE_CASES, batch_size=TEMPLATE_CASES,
                           case_timeout=CASE_TIMEOUT_S, confirm=False)
    assert summary.counts[PASS] > 20  # some templates must actually render
    check_campaign(summary, TEMPLATE_CASES)


# -- saved crashers ---------------------------------------------------------------


def _fixture_params():
    params = []
    for path in crashers.all_fixtures():
        fixture = crashers.load(path)
        marks = []
        if fixture["target"] == "gguf":
            from fuzzing.gguf_target import needs_real_model
            if needs_real_model(fixture["input"]):
                marks.append(pytest.mark.real_model)
        elif fixture["target"] == "tokenizer" and not fixture["input"]["vocab"].startswith("tiny-"):
            marks.append(pytest.mark.real_model)
        if fixture.get("status") == "open":
            # Strict, so whoever fixes the bug is told to mark it fixed; but not
            # for a failure that is about time, which a faster machine may hide.
            timing = fixture["seen"]["error"] == "slow"
            marks.append(pytest.mark.xfail(strict=not timing, reason=f"open: {fixture['signature']}"))
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params or [pytest.param(None, marks=pytest.mark.skip(reason="no crasher fixtures"), id="none")]


@pytest.mark.parametrize("fixture_path", _fixture_params())
def test_saved_crasher_no_longer_fails(fixture_path, tmp_path):
    fixture = crashers.load(fixture_path)
    case_path = crashers.write_case(fixture, tmp_path)
    if case_path is None:
        pytest.skip("needs a packaged model that is not in the cache")
    # A fixed hang returns at once; an open one is cut short (it is expected to fail).
    timeout = 10 if fixture["seen"]["status"] == "hang" else 120
    [(_, outcome, _)] = run_batch(fixture["target"], [Case(0, case_path, {})], tmp_path, case_timeout=timeout)
    assert not outcome.failed, f"{outcome.status} {outcome.stage} {outcome.error}\n{outcome.detail[-2000:]}"
