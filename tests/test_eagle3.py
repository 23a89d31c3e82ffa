"""EAGLE-3 drafter heads (elelem.model.archs.eagle3, elelem.engine.eagle3):
the target's three layer inputs, the head's fused g, and the head's logits
and pre-norm states bit for bit those of llama.cpp run live on the same
synthetic target and head (flash attention off on both sides, and on on
both; with a draft vocabulary mapped through d2t, and with norm_before_fc
and norm_before_residual); greedy generation with the head drafting bit for
bit the generation without; bad heads and unsupported pairings refused."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import elelem
import elelem.engine.mtp as mtp_module
from elelem._core import eagle3_fuse
from elelem.api.draft import open_draft
from elelem.cli.info_cmd import describe
from elelem.engine.eagle3 import Eagle3Head
from elelem.engine.step_costs import StepCosts
from elelem.server.metrics import Metrics
from llamacpp_reference import Reference, elelem_kernel_options, run_script, skip_or_fail
from synthetic import TinyConfig, write_model
from synthetic_eagle3 import Eagle3Config, write_eagle3_head
from vocab_metadata import vocab_writer

# The targets: Llama, and the Qwen3.5 hybrid (Gated DeltaNet layers, attention every fourth), with
# 8 layers (the converter's default layers for them: 2, 4, 5), SmolLM2's vocabulary so that
# llama.cpp loads them.
TARGETS = {
    "llama": TinyConfig(arch="llama", n_layer=8, n_embd=64, n_head=4, n_head_kv=2, n_vocab=49152, seed=31),
    "qwen35": TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=8, n_vocab=49152, seed=34),
    # Q4_0 matmul weights: the output a borrowing head uses is the target's repacked copy, as in llama.cpp
    "llama-q4_0": TinyConfig(arch="llama", n_layer=8, n_embd=64, n_head=4, n_head_kv=2, n_vocab=49152, seed=37,
                             wtype="q4_0"),
}
HEADS = {
    "d2t": Eagle3Config(seed=32),     # a draft vocabulary of 1024 target ids
    "normed": Eagle3Config(seed=33, n_vocab_draft=49152, norm_before_fc=True, norm_before_residual=True),
    # Llama 3.1's layout: no token table (the target's), its own output over a draft vocabulary
    "no-embd": Eagle3Config(seed=35, drop=("token_embd.weight",)),
    # neither a token table nor an output: the target's both, over the whole vocabulary
    "no-embd-no-output": Eagle3Config(seed=36, n_vocab_draft=49152, drop=("token_embd.weight", "output.weight")),
}
PROMPT = [1, 5, 9, 20, 33, 7, 2, 11, 300, 4000, 17, 23]
CHAIN = 3        # draft steps after the seed, each from the head's own pre-norm state


@pytest.fixture(scope="module")
def eagle3_files(smollm_path, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("eagle3")
    vocab = vocab_writer(smollm_path)
    paths = {}
    for name, cfg in TARGETS.items():
        paths[name] = folder / f"{name}.gguf"
        write_model(paths[name], cfg, extra_metadata=vocab)
    for name, cfg in HEADS.items():
        paths[name] = folder / f"eagle3-{name}.gguf"
        write_eagle3_head(paths[name], cfg, extra_metadata=vocab)
    return paths


def _reference(files: dict, target: str, name: str, flash: bool) -> dict:
    layers = ",".join(map(str, HEADS[name].target_layers))
    args = ["--target", str(files[target]), "--head", str(files[name]), "--layers", layers,
            "--tokens", ",".join(map(str, PROMPT)), "--chain", str(CHAIN), "--out", "{out}/eagle3.json"]
    args += ["--flash-attn"] if flash else []
    live = run_script("make_eagle3_reference.py", args, [str(flash), str(PROMPT), str(CHAIN), layers],
                      [files[target], files[name]], ["eagle3.json"])
    if live is None:
        skip_or_fail(Reference.not_built())
    return live["eagle3.json"]


def _f32(rows) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


def _head(llm, path) -> Eagle3Head:
    head = open_draft(str(path), target_gguf=llm.gguf, target_n_vocab=llm.spec.hparams["n_vocab"],
                      context=llm.engine.context, repack=True, use_mmap=True, amx=False, target_spec=llm.spec)
    assert isinstance(head, Eagle3Head)
    return head


@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
@pytest.mark.parametrize("target,name", [("llama", "d2t"), ("llama", "normed"), ("qwen35", "d2t"),
                                         ("llama", "no-embd"), ("llama", "no-embd-no-output"),
                                         ("qwen35", "no-embd-no-output"), ("llama-q4_0", "no-embd-no-output")])
def test_head_matches_llamacpp_exactly(eagle3_files, target, name, flash):
    """The target's layer inputs, g, then the head on the prompt's pairs
    (x[p+1], g[p]) and the seed, and CHAIN steps on its own states: every
    row's logits (mapped through d2t) and pre-norm state bit for bit llama.cpp's."""
    ref = _reference(eagle3_files, target, name, flash)
    options = dict(elelem_kernel_options(), flash_attn=flash)
    with elelem.LLM(eagle3_files[target], n_threads=2, kv_size=256, speculative=False, **options) as llm:
        head = _head(llm, eagle3_files[name])
        try:
            ctx, hctx = llm.engine.context, head._ctx
            assert ctx.feature_layers == HEADS[name].target_layers
            logits = ctx.decode(PROMPT, 0, True, keep_hidden=True)
            np.testing.assert_array_equal(logits[-1], _f32(ref["target_last_logits"]))
            np.testing.assert_array_equal(ctx.last_hidden, _f32(ref["features"]))
            g = eagle3_fuse(hctx, ctx.last_hidden)
            np.testing.assert_array_equal(g, _f32(ref["g"]))
            following = PROMPT[1:] + [int(np.argmax(logits[-1]))]
            assert following == ref["following"]
            rows = [hctx.decode(following, 0, True, hidden_in=g, keep_hidden=True)]
            states = [hctx.last_hidden]
            for token in ref["chain_tokens"]:
                assert token == head.target_id(rows[-1][-1])
                rows.append(hctx.decode([token], 0, True, hidden_in=states[-1][-1:], keep_hidden=True,
                                        decode_kernels=True))
                states.append(hctx.last_hidden)
            d2t = head.d2t if head.d2t is not None else np.arange(rows[0].shape[1])
            assert ref["head_ids"] == sorted(d2t.tolist())   # llama.cpp's -inf everywhere else
            np.testing.assert_array_equal(np.concatenate(rows)[:, np.argsort(d2t)], _f32(ref["head_logits"]))
            np.testing.assert_array_equal(np.concatenate(states), _f32(ref["head_states"]))
        finally:
            head.close()


# -- drafting through the engine (small vocabularies: no llama.cpp here) ------------------

SMALL_TARGETS = {
    "llama": TinyConfig(arch="llama", n_layer=8, n_embd=64, n_head=4, n_head_kv=2, n_vocab=512, seed=41),
    "qwen35": TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=8, n_vocab=512, seed=43),
}
SMALL_HEAD = Eagle3Config(n_vocab=512, n_vocab_draft=128, seed=42)
# no token table and no output: the target's both (the vocabulary's size from eagle3.vocab_size)
BORROWING_HEAD = SMALL_HEAD.but(n_vocab_draft=512, seed=44, drop=("token_embd.weight", "output.weight"))


@pytest.fixture(scope="module")
def small_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("eagle3-small")
    paths = {"head": folder / "eagle3.gguf", "borrowing": folder / "eagle3-borrowing.gguf"}
    write_eagle3_head(paths["head"], SMALL_HEAD)
    write_eagle3_head(paths["borrowing"], BORROWING_HEAD)
    for name, cfg in SMALL_TARGETS.items():
        paths[name] = folder / f"{name}.gguf"
        write_model(paths[name], cfg)
    return paths


@pytest.fixture(scope="module")
def small_pair(small_files) -> tuple[Path, Path]:
    return small_files["llama"], small_files["head"]


def _open(path, **kw):
    return elelem.LLM(path, n_threads=1, n_seq_max=4, kv_size=1024, amx=False, **kw)


def _head_only(llm, monkeypatch):
    """Drafts from the head alone, as many as allowed, verified whatever steps cost."""
    monkeypatch.setattr(mtp_module, "plan_draft_length", lambda rate, costs, cost, limit, rollback=0.0: limit)
    engine = llm.engine
    engine.step_costs = StepCosts.flat()
    engine.new_drafter = lambda seq, history: engine.mtp.drafter(seq, history, engine.step_costs)


@pytest.mark.parametrize("flash", [False, True], ids=["flash-off", "flash-on"])
@pytest.mark.parametrize("arch,kind", [("llama", "head"), ("qwen35", "head"), ("llama", "borrowing"),
                                       ("qwen35", "borrowing")])
def test_greedy_output_with_eagle3_drafts_is_the_output_without(small_files, monkeypatch, arch, kind, flash):
    """Refused drafts roll a hybrid target's recurrent state back too; a head
    borrowing the target's token table and output drafts as well."""
    target, head = small_files[arch], small_files[kind]
    prompt = np.random.default_rng(5).integers(1, 512, 9).tolist()
    with _open(target, speculative=False, flash_attn=flash) as llm:
        plain = llm.generate_tokens(prompt, 50)
    with _open(target, draft_model=str(head), flash_attn=flash) as llm:
        assert isinstance(llm.engine.mtp, Eagle3Head) and llm.engine.draft is None
        _head_only(llm, monkeypatch)
        drafted = llm.generate_tokens(prompt, 50)
        again = llm.generate_tokens(prompt[:5], 20)        # a second generation on the same head
        stats = llm.engine.drafter_stats()
    assert drafted == plain
    assert stats["eagle3"]["drafted"] >= 20, stats
    with _open(target, speculative=False, flash_attn=flash) as llm:
        assert llm.generate_tokens(prompt[:5], 20) == again


def test_info_and_metrics_show_the_head(small_pair, monkeypatch):
    target, head = small_pair
    facts = describe(head)
    assert facts["architecture"] == "eagle3" and facts["supported"]
    assert "layers 2, 4, 5" in facts["draft_head"] and "uses the target's" not in facts["draft_head"]
    with _open(target, draft_model=str(head)) as llm:
        _head_only(llm, monkeypatch)
        llm.generate_tokens([1, 2, 3], 30)
        served = SimpleNamespace(id="tiny", llm=llm, in_flight=0, idle_sessions=0, queued=0, offload=None)
        text = Metrics().render([served])
        stats = llm.engine.drafter_stats()["eagle3"]
    drafted = int(re.search(r'^elelem_draft_tokens_total\{model="tiny",drafter="eagle3"\} (\d+)$', text,
                            re.M).group(1))
    assert drafted == stats["drafted"] > 0


def test_a_head_is_not_a_model_of_its_own(small_pair):
    with pytest.raises(elelem.errors.UnsupportedArchitectureError, match="draft_model"):
        _open(small_pair[1])


def test_heads_that_do_not_fit_are_refused(small_pair, tmp_path):
    target, _ = small_pair
    wide = tmp_path / "wide.gguf"
    write_eagle3_head(wide, SMALL_HEAD.but(n_embd_target=96))
    with pytest.raises(elelem.errors.UnsupportedArchitectureError, match="width 96"):
        _open(target, draft_model=str(wide))
    deep = tmp_path / "deep.gguf"
    write_eagle3_head(deep, SMALL_HEAD.but(target_layers=(2, 4, 8)))
    with pytest.raises(elelem.errors.UnsupportedArchitectureError, match="layers"):
        _open(target, draft_model=str(deep))
    unnormed = tmp_path / "unnormed.gguf"
    write_eagle3_head(unnormed, SMALL_HEAD.but(norm_before_fc=True, drop=("enc.output_norm.weight",)))
    with pytest.raises(elelem.errors.ModelShapeError, match="enc.output_norm"):
        _open(target, draft_model=str(unnormed))
    no_output = tmp_path / "no-output.gguf"   # its d2t maps 128 ids, the target's output has 512
    write_eagle3_head(no_output, SMALL_HEAD.but(drop=("output.weight",)))
    with pytest.raises(elelem.errors.ModelShapeError, match=r"d2t must be I64 \(512\)"):
        _open(target, draft_model=str(no_output))
    narrow = tmp_path / "narrow.gguf"         # the target's token table is 64 wide
    write_eagle3_head(narrow, BORROWING_HEAD.but(n_embd=32, n_ff=64))
    with pytest.raises(elelem.errors.ModelShapeError, match="token_embd.weight of its own and its target's is 64"):
        _open(target, draft_model=str(narrow))
    no_d2t = tmp_path / "no-d2t.gguf"
    write_eagle3_head(no_d2t, SMALL_HEAD.but(drop=("d2t",)))
    with pytest.raises(elelem.errors.ModelShapeError, match="d2t"):
        _open(target, draft_model=str(no_d2t))


def test_fusing_checks_its_rows(small_pair):
    target, head = small_pair
    with _open(target, draft_model=str(head)) as llm:
        hctx = llm.engine.mtp._ctx
        with pytest.raises(elelem.errors.InvalidArgumentError, match="features must be"):
            eagle3_fuse(hctx, np.zeros((2, 10), np.float32))
        with pytest.raises(elelem.errors.InvalidArgumentError, match="NaN"):
            eagle3_fuse(hctx, np.full((1, 3 * 64), np.nan, np.float32))
        with pytest.raises(elelem.errors.InvalidArgumentError, match="not an EAGLE-3 head"):
            eagle3_fuse(llm.engine.context, np.zeros((1, 3 * 64), np.float32))
        with pytest.raises(elelem.errors.InvalidArgumentError, match="feature layers"):
            llm.engine.context.set_feature_layers([2, 4, 8])


def test_a_borrowing_head_shares_the_targets_tensors_and_closes_with_it(small_files):
    """The head's model points at the target's tensors (no copy: its own file
    has none) and keeps the target's model; with that closed, the head refuses
    to run rather than read unmapped weights."""
    assert "uses the target's token table and output" in describe(small_files["borrowing"])["draft_head"]
    with _open(small_files["llama"], speculative=False) as llm:
        head = _head(llm, small_files["borrowing"])
        try:
            assert head._ctx.model.lender is llm._model
            assert not head._ctx.model.is_closed
            llm._model.close()
            assert head._ctx.model.is_closed
            with pytest.raises(elelem.errors.ClosedError, match="whose weights this drafter uses"):
                head._ctx.decode([1, 2], 0, True, hidden_in=np.zeros((2, 64), np.float32))
        finally:
            head.close()
