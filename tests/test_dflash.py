"""DFlash drafters (elelem.model.archs.dflash, elelem.engine.dflash): the
target's layer inputs and the drafter's block logits bit for bit those of
llama.cpp run live on the same synthetic target and drafter (flash
attention off on both sides, and on on both; a drafter borrowing the
target's token table and output, and one with its own); greedy generation
with the drafter drafting bit for bit the generation without; bad files and
pairings refused before anything runs.

llama.cpp drives DFlash only through common/speculative.cpp (not in the
Python bindings), so the reference script does its steps by hand: the
target's prompt with its layer inputs kept, their injection into the
drafter's cache as one embedding batch, one non-causal block of the target's
next token and the mask tokens.  What is compared: the target's last logits,
the features, and every row of the block's logits."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import elelem
import elelem.engine.mtp as mtp_module
from elelem.api.draft import open_draft
from elelem.cli.info_cmd import describe
from elelem.engine.dflash import DFlashHead
from elelem.engine.step_costs import StepCosts
from elelem.server.metrics import Metrics
from llamacpp_reference import Reference, elelem_kernel_options, run_script, skip_or_fail
from synthetic import TinyConfig, write_model
from synthetic_dflash import DFlashConfig, write_dflash
from vocab_metadata import vocab_writer

TARGET = TinyConfig(arch="llama", n_layer=8, n_embd=64, n_head=4, n_head_kv=2, n_vocab=49152, seed=51)
DRAFTERS = {
    "borrowed": DFlashConfig(seed=52),            # the target's token table and output, as real files
    "own": DFlashConfig(seed=53, own=True, n_layer=1, block_size=5, mask_token=100),
    # a drafter for an M-RoPE target (Qwen3.5's): every rotated pair in the temporal section, as converted
    "mrope": DFlashConfig(seed=54, extra_keys=(("dflash.rope.dimension_sections", [8, 0, 0, 0]),)),
}
PROMPT = [1, 5, 9, 20, 33, 7, 2, 11, 300, 4000, 17, 23]


@pytest.fixture(scope="module")
def dflash_files(smollm_path, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dflash")
    vocab = vocab_writer(smollm_path)
    paths = {"target": folder / "target.gguf"}
    write_model(paths["target"], TARGET, extra_metadata=vocab)
    for name, cfg in DRAFTERS.items():
        paths[name] = folder / f"dflash-{name}.gguf"
        write_dflash(paths[name], cfg, extra_metadata=vocab)
    return paths


def _reference(files: dict, name: str, flash: bool) -> dict:
    cfg = DRAFTERS[name]
    layers = ",".join(map(str, cfg.target_layers))
    args = ["--target", str(files["target"]), "--drafter", str(files[name]), "--layers", layers,
            "--tokens", ",".join(map(str, PROMPT)), "--block", str(cfg.block_size), "--mask", str(cfg.mask_token),
            "--out", "{out}/dflash.json"]
    args += ["--flash-attn"] if flash else []
    live = run_script("make_dflash_reference.py", args,
                      [str(flash), str(PROMPT), layers, str(cfg.block_size), str(cfg.mask_token)],
                      [files["target"], files[name]], ["dflash.json"])
    if live is None:
        skip_or_fail(Reference.not_built())
    return live["dflash.json"]


def _f32(rows) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


def _head(llm, path) -> DFlashHead:
    head = open_draft(str(path), target_gguf=llm.gguf, target_n_vocab=llm.spec.hparams["n_vocab"],
                      context=llm.engine.context, repack=True, use_mmap=True, amx=False, target_spec=llm.spec)
    assert isinstance(head, DFlashHead)
    return head


@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_block_matches_llamacpp_exactly(dflash_files, name, flash):
    """The target's layer inputs, then the drafter's injection of them and
    one block: every row's logits bit for bit llama.cpp's."""
    ref = _reference(dflash_files, name, flash)
    cfg = DRAFTERS[name]
    options = dict(elelem_kernel_options(), flash_attn=flash)
    with elelem.LLM(dflash_files["target"], n_threads=2, kv_size=256, speculative=False, **options) as llm:
        head = _head(llm, dflash_files[name])
        try:
            ctx = llm.engine.context
            assert ctx.feature_layers == cfg.target_layers
            assert (head.block_size, head.mask_token, head.max_draft) == \
                (cfg.block_size, cfg.mask_token, cfg.block_size - 1)
            logits = ctx.decode(PROMPT, 0, True, keep_hidden=True)
            np.testing.assert_array_equal(logits[-1], _f32(ref["target_last_logits"]))
            np.testing.assert_array_equal(ctx.last_hidden, _f32(ref["features"]))
            head._held[0] = []
            head.inject(0, ctx.last_hidden)
            head._held[0] = list(PROMPT)
            assert ref["block"][0] == int(np.argmax(logits[-1]))
            block = head.block_logits(0, ref["block"][0], cfg.block_size - 1)
            np.testing.assert_array_equal(block, _f32(ref["block_logits"]))
            assert head._ctx.cache.seq_length_of(0) == len(PROMPT)   # the block's cells are dropped
            # the block's rows see each other both ways: causally, its first row would differ
            causal = head._ctx.decode(ref["block"], [0] * cfg.block_size, True)
            head._ctx.seq_rm(0, len(PROMPT))
            assert not np.array_equal(causal[0], block[0])
        finally:
            head.close()


# -- drafting through the engine (small vocabularies: no llama.cpp here) ------------------

SMALL_TARGETS = {
    "llama": TinyConfig(arch="llama", n_layer=8, n_embd=64, n_head=4, n_head_kv=2, n_vocab=512, seed=61),
    "qwen35": TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=8, n_vocab=512, seed=63),
}
SMALL_DRAFTER = DFlashConfig(n_vocab=512, own=True, seed=62, block_size=6, mask_token=3)


@pytest.fixture(scope="module")
def small_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dflash-small")
    paths = {"drafter": folder / "dflash.gguf", "drafter-mrope": folder / "dflash-mrope.gguf"}
    write_dflash(paths["drafter"], SMALL_DRAFTER)
    # Qwen3.5's drafters carry M-RoPE sections, all in the temporal one
    write_dflash(paths["drafter-mrope"],
                 SMALL_DRAFTER.but(extra_keys=(("dflash.rope.dimension_sections", [8, 0, 0, 0]),)))
    for name, cfg in SMALL_TARGETS.items():
        paths[name] = folder / f"{name}.gguf"
        write_model(paths[name], cfg)
    return paths


def _open(path, **kw):
    return elelem.LLM(path, n_threads=1, n_seq_max=4, kv_size=1024, amx=False, **kw)


def _head_only(llm, monkeypatch):
    """Drafts from the drafter alone, as many as allowed, verified whatever steps cost."""
    monkeypatch.setattr(mtp_module, "plan_draft_length", lambda rate, costs, cost, limit, rollback=0.0: limit)
    engine = llm.engine
    engine.step_costs = StepCosts.flat()
    engine.new_drafter = lambda seq, history: engine.mtp.drafter(seq, history, engine.step_costs)


@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
@pytest.mark.parametrize("arch", list(SMALL_TARGETS))
def test_greedy_output_with_dflash_drafts_is_the_output_without(small_files, monkeypatch, arch, flash):
    """Refused drafts roll a hybrid target's recurrent state back too."""
    target, drafter = small_files[arch], small_files["drafter-mrope" if arch == "qwen35" else "drafter"]
    prompt = np.random.default_rng(7).integers(1, 512, 9).tolist()
    with _open(target, speculative=False, flash_attn=flash) as llm:
        plain = llm.generate_tokens(prompt, 50)
    with _open(target, draft_model=str(drafter), flash_attn=flash) as llm:
        assert isinstance(llm.engine.mtp, DFlashHead) and llm.engine.draft is None
        _head_only(llm, monkeypatch)
        drafted = llm.generate_tokens(prompt, 50)
        again = llm.generate_tokens(prompt[:5], 20)        # a second generation on the same drafter
        stats = llm.engine.drafter_stats()
    assert drafted == plain
    assert stats["dflash"]["drafted"] >= 20, stats
    with _open(target, speculative=False, flash_attn=flash) as llm:
        assert llm.generate_tokens(prompt[:5], 20) == again


def test_info_and_metrics_show_the_drafter(small_files, monkeypatch):
    facts = describe(small_files["drafter"])
    assert facts["architecture"] == "dflash" and facts["supported"]
    assert "layers 1, 3, 5, 7" in facts["draft_head"] and "blocks of 6" in facts["draft_head"]
    with _open(small_files["llama"], draft_model=str(small_files["drafter"])) as llm:
        _head_only(llm, monkeypatch)
        llm.generate_tokens([1, 2, 3], 30)
        served = SimpleNamespace(id="tiny", llm=llm, in_flight=0, idle_sessions=0, queued=0, offload=None)
        text = Metrics().render([served])
        stats = llm.engine.drafter_stats()["dflash"]
    drafted = int(re.search(r'^elelem_draft_tokens_total\{model="tiny",drafter="dflash"\} (\d+)$', text,
                            re.M).group(1))
    accepted = int(re.search(r'^elelem_draft_tokens_accepted_total\{model="tiny",drafter="dflash"\} (\d+)$',
                             text, re.M).group(1))
    assert drafted == stats["drafted"] > 0 and accepted == stats["accepted"]


def test_a_drafter_is_not_a_model_of_its_own(small_files):
    with pytest.raises(elelem.errors.UnsupportedArchitectureError, match="draft_model"):
        _open(small_files["drafter"])


@pytest.mark.parametrize("change,error,match", [
    (dict(drop=("fc.weight",)), elelem.errors.ModelShapeError, "fc.weight"),
    (dict(drop=("blk.1.attn_k_norm.weight",)), elelem.errors.ModelShapeError, "attn_k_norm"),
    (dict(cut=(("blk.0.attn_q.weight", 0, 32),)), elelem.errors.ModelShapeError, "attn_q"),
    (dict(drop=("enc.output_norm.weight",)), elelem.errors.ModelShapeError, "enc.output_norm"),
    (dict(mask_token=4096), elelem.errors.ModelShapeError, "mask_token_id"),
    (dict(block_size=1), elelem.errors.ModelShapeError, "block_size"),
    (dict(target_layers=tuple(range(1, 18, 2))), elelem.errors.ModelShapeError, "target_layers"),
    (dict(extra_keys=(("dflash.selector_rank", 8),)), elelem.errors.ModelShapeError, "DFlash2"),
    (dict(extra_keys=(("dflash.attention.causal", True),)), elelem.errors.ModelShapeError, "causal"),
    (dict(extra_keys=(("dflash.rope.dimension_sections", [4, 4, 0, 0]),)), elelem.errors.ModelShapeError,
     "temporal one alone"),
    (dict(n_embd_target=96), elelem.errors.UnsupportedArchitectureError, "width 96"),
    (dict(target_layers=(1, 3, 5, 8)), elelem.errors.UnsupportedArchitectureError, "layers"),
], ids=["no-fc", "no-k-norm", "short-q", "no-hidden-norm", "mask", "block", "too-many-layers", "dflash2", "causal",
        "split-sections", "wide-target", "deep-target"])
def test_drafters_that_do_not_fit_are_refused(small_files, tmp_path, change, error, match):
    bad = tmp_path / "bad.gguf"
    write_dflash(bad, SMALL_DRAFTER.but(**change))
    with pytest.raises(error, match=match):
        _open(small_files["llama"], draft_model=str(bad))


def test_a_drafter_without_tables_needs_a_vocabulary(small_files, tmp_path):
    """No token_embd and no tokenizer: nothing sizes its vocabulary."""
    bare = tmp_path / "bare.gguf"
    write_dflash(bare, SMALL_DRAFTER.but(own=False))
    with pytest.raises(elelem.errors.ModelShapeError, match="tokenizer.ggml.tokens"):
        _open(small_files["llama"], draft_model=str(bare))


def test_a_target_without_layer_inputs_is_refused(tmp_path, small_files):
    gemma = tmp_path / "gemma3.gguf"
    write_model(gemma, TinyConfig(arch="gemma3", n_layer=8, n_vocab=512, n_swa=16, seed=64))
    with pytest.raises(elelem.errors.UnsupportedArchitectureError, match="DFlash"):
        _open(gemma, draft_model=str(small_files["drafter"]))
