"""Gemma 4's drafter files (gemma4-assistant): the drafter's logits and
hidden states bit for bit those of llama.cpp's draft context run live on the
same synthetic pair (its cache the target's, flash attention off and on),
broken files refused, and drafting through the engine: greedy output bit for
bit the output without drafts, a drafter that agrees kept, and the drafter
shown by ``elelem info`` and ``/metrics``.

The synthetic target is Gemma 4 like E2B (sliding layers of head 16, global
ones of head 32; the last three layers reuse the K/V of layers 1 and 2), the
drafter a sliding and a global layer over its last two layers' cells."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import elelem
import elelem.engine.mtp as mtp_module
from elelem.cli.info_cmd import describe
from elelem.engine.assistant import AssistantDrafter, AssistantHead
from elelem.engine.step_costs import StepCosts
from elelem.errors import ModelShapeError
from elelem.server.metrics import Metrics
from llamacpp_reference import Reference, elelem_kernel_options, run_script, skip_or_fail
from synthetic import TinyConfig, make_weights, write_model
from synthetic_gemma4_assistant import (AssistantConfig, agreeing_assistant_weights, quiet_target,
                                        write_assistant, write_gemma4_target)
from vocab_metadata import vocab_writer

# Targets of SmolLM2's vocabulary, so that llama.cpp loads them.
TARGET = TinyConfig(arch="gemma4", head_dim=32, head_dim_swa=16, n_layer=6, n_swa=8, n_head_kv=1,
                    n_head_kv_global=2, n_kv_shared=3, softcap=30.0, seed=41,
                    n_vocab=49152)
ASSISTANT = AssistantConfig(n_embd=48, n_embd_out=64, head_dim=32, head_dim_swa=16, n_swa=8, seed=42, n_vocab=49152)
PROMPT = [1, 5, 9, 20, 33, 7, 2, 11, 300, 4000, 17, 23]
CHAIN = 3


@pytest.fixture(scope="module")
def pair(smollm_path, tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("gemma4-assistant")
    vocab = vocab_writer(smollm_path)
    write_model(folder / "target.gguf", TARGET, extra_metadata=vocab)
    write_assistant(folder / "assistant.gguf", ASSISTANT, extra_metadata=vocab)
    return folder / "target.gguf", folder / "assistant.gguf"


def _reference(target: Path, assistant: Path, flash: bool) -> dict:
    args = ["--model", str(target), "--assistant", str(assistant), "--tokens", ",".join(map(str, PROMPT)),
            "--chain", str(CHAIN), "--out", "{out}/assistant.json"] + (["--flash-attn"] if flash else [])
    live = run_script("make_gemma4_assistant_reference.py", args, [str(flash), str(PROMPT), str(CHAIN)],
                      [target, assistant], ["assistant.json"])
    if live is None:
        skip_or_fail(Reference.not_built())
    return live["assistant.json"]


def _f32(rows) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
def test_drafter_logits_match_llamacpp_exactly(pair, flash):
    """The target's prompt (every row's hidden state kept), then CHAIN
    drafter steps at the next position over the target's cells: logits and
    hidden states bit for bit llama.cpp's."""
    target, assistant = pair
    ref = _reference(target, assistant, flash)
    options = dict(elelem_kernel_options(), flash_attn=flash)
    with elelem.LLM(target, n_threads=2, kv_size=256, kv_type="f16", speculative=False, draft_model=assistant,
                    **options) as llm:
        ctx, head = llm.engine.context, llm.engine.mtp
        assert isinstance(head, AssistantHead)
        logits = ctx.decode(PROMPT, 0, True, keep_hidden=True)
        hidden = ctx.last_hidden
        np.testing.assert_array_equal(logits, _f32(ref["logits"]))
        np.testing.assert_array_equal(hidden, _f32(ref["hidden"]))
        token, h = int(np.argmax(logits[-1])), hidden[-1:]
        rows, states = [], []
        for want in ref["chain_tokens"]:
            assert token == want
            rows.append(head._ctx.draft_step([token], [0], [len(PROMPT)], h)[0])
            h = head._ctx.last_hidden.copy()
            states.append(h[0])
            token = int(np.argmax(rows[-1]))
        np.testing.assert_array_equal(np.stack(rows), _f32(ref["draft_logits"]))
        np.testing.assert_array_equal(np.stack(states), _f32(ref["draft_hidden"]))


# -- drafting through the engine (a small vocabulary: no llama.cpp here) ----------------------

SMALL_TARGET = TARGET.but(n_vocab=512, seed=51)
SMALL_ASSISTANT = ASSISTANT.but(n_vocab=512, seed=52)
AGREE_ASSISTANT = ASSISTANT.but(n_vocab=512, n_embd=80)


@pytest.fixture(scope="module")
def engine_pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("gemma4-assistant-engine")
    out = {}
    write_model(folder / "target.gguf", SMALL_TARGET)
    write_assistant(folder / "random.gguf", SMALL_ASSISTANT)
    out["disagree"] = folder / "target.gguf", folder / "random.gguf"
    quiet = quiet_target(make_weights(SMALL_TARGET), SMALL_TARGET.n_layer)
    write_gemma4_target(folder / "quiet.gguf", SMALL_TARGET, quiet)
    agree = agreeing_assistant_weights(AGREE_ASSISTANT, quiet)
    write_assistant(folder / "agree.gguf", AGREE_ASSISTANT.but(weights=agree))
    out["agree"] = folder / "quiet.gguf", folder / "agree.gguf"
    return out


@pytest.fixture
def always_draft(monkeypatch):
    monkeypatch.setattr(mtp_module, "plan_draft_length", lambda rate, costs, cost, limit, rollback=0.0: limit)


def _open(path, **kw):
    return elelem.LLM(path, n_threads=1, n_seq_max=2, kv_size=512, amx=False, **kw)


def _assistant_only(llm):
    engine = llm.engine
    engine.step_costs = StepCosts.flat()
    engine.new_drafter = lambda seq, history: engine.mtp.drafter(seq, history, engine.step_costs)


@pytest.mark.parametrize("kind", ["agree", "disagree"])
@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
def test_greedy_output_with_drafts_is_the_output_without(engine_pairs, kind, flash, always_draft):
    target, assistant = engine_pairs[kind]
    prompt = np.random.default_rng(7).integers(1, 512, 9).tolist()
    with _open(target, speculative=False, flash_attn=flash) as llm:
        plain = llm.generate_tokens(prompt, 60)
    with _open(target, draft_model=assistant, flash_attn=flash) as llm:
        assert isinstance(llm.engine.mtp, AssistantHead)
        _assistant_only(llm)
        drafted = llm.generate_tokens(prompt, 60)
        stats = llm.engine.drafter_stats()["assistant"]
    assert drafted == plain
    assert stats["drafted"] >= 20, stats
    if kind == "agree":
        assert stats["acceptance_rate"] > 0.9, stats
    else:
        assert stats["acceptance_rate"] < 0.3, stats


@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
def test_a_sequence_drafts_over_its_own_cells_only(engine_pairs, flash):
    """Another sequence's cells in the shared cache change nothing of a
    sequence's drafts; sequences drafting in one step get their own rows."""
    target, assistant = engine_pairs["disagree"]
    rng = np.random.default_rng(11)
    a, b = rng.integers(1, 512, 13).tolist(), rng.integers(1, 512, 9).tolist()
    with _open(target, draft_model=assistant, flash_attn=flash) as llm:
        ctx, drafter = llm.engine.context, llm.engine.mtp._ctx
        ctx.decode(b, 1, keep_hidden=True)
        hb = ctx.last_hidden[-1:].copy()
        alone = drafter.draft_step([7], [1], [len(b)], hb)
        ctx.decode(a, 0, keep_hidden=True)
        ha = ctx.last_hidden[-1:].copy()
        np.testing.assert_array_equal(drafter.draft_step([7], [1], [len(b)], hb), alone)
        first = drafter.draft_step([5], [0], [len(a)], ha)
        both = drafter.draft_step([5, 7], [0, 1], [len(a), len(b)], np.concatenate([ha, hb]))
    np.testing.assert_allclose(both, np.concatenate([first, alone]), rtol=0, atol=1e-4 * np.abs(alone).max())


def test_the_drafter_is_chosen_beside_prompt_lookup(engine_pairs):
    target, assistant = engine_pairs["agree"]
    with _open(target, draft_model=assistant) as llm:
        drafter = llm.engine.new_drafter(0, [5, 6, 7])
        assert isinstance(drafter.mtp, AssistantDrafter) and drafter.kind == "assistant"


def test_info_and_metrics_show_the_drafter(engine_pairs):
    target, assistant = engine_pairs["agree"]
    facts = describe(assistant)
    assert facts["supported"] and facts["drafter_for"] == "gemma4" and facts["drafters"] == []
    with _open(target, draft_model=assistant) as llm:
        _assistant_only(llm)
        llm.generate_tokens([1, 2, 3], 30)
        served = SimpleNamespace(id="tiny", llm=llm, in_flight=0, idle_sessions=0, queued=0, offload=None)
        text = Metrics().render([served])
        stats = llm.engine.drafter_stats()["assistant"]
    drafted = re.search(r'^elelem_draft_tokens_total\{model="tiny",drafter="assistant"\} (\d+)$', text, re.M)
    assert drafted and int(drafted.group(1)) == stats["drafted"] > 0


# -- bad files: a clear error before any compute -------------------------------------

@pytest.mark.parametrize("cfg, message", [
    (SMALL_ASSISTANT.but(drop=("nextn.pre_projection.weight",)), r"'nextn\.pre_projection\.weight' is missing"),
    (SMALL_ASSISTANT.but(drop=("blk.1.layer_output_scale.weight",)), r"'blk\.1\.layer_output_scale\.weight' is missing"),
    (SMALL_ASSISTANT.but(cut=(("nextn.post_projection.weight", 0, 32),)), r"nextn\.post_projection\.weight"),
    (SMALL_ASSISTANT.but(extra_keys=(("{arch}.nextn_predict_layers", 1),)), r"nextn_predict_layers = 1 must equal"),
    (SMALL_ASSISTANT.but(extra_keys=(("{arch}.embedding_length_out", 48),)), r"embedding_length_out = 48"),
], ids=["no-pre-projection", "no-layer-scale", "post-projection-width", "nextn-count", "same-width"])
def test_a_broken_drafter_file_is_refused(engine_pairs, tmp_path, cfg, message):
    target, _ = engine_pairs["disagree"]
    path = tmp_path / "broken.gguf"
    write_assistant(path, cfg)
    with pytest.raises(ModelShapeError, match=message):
        elelem.LLM(target, n_threads=1, kv_size=256, draft_model=path)


def test_a_drafter_whose_heads_do_not_fit_its_target_is_refused(engine_pairs, tmp_path):
    target, _ = engine_pairs["disagree"]
    path = tmp_path / "wide.gguf"
    write_assistant(path, SMALL_ASSISTANT.but(head_dim=64))
    with pytest.raises(ModelShapeError, match="cannot read its target's layer 5"):
        elelem.LLM(target, n_threads=1, kv_size=256, draft_model=path)


def test_a_drafter_alone_is_not_a_model(engine_pairs):
    _, assistant = engine_pairs["disagree"]
    with pytest.raises(elelem.errors.ElelemError, match="drafter"):
        elelem.LLM(assistant, n_threads=1, kv_size=256)
