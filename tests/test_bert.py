"""BERT-family encoders (``bert``, ``nomic-bert``, ``nomic-bert-moe``) on tiny synthetic models:
against the NumPy reference (tests/support/synthetic_bert.py) and against llama.cpp's
embeddings of the same files (tests/support/fixtures/make_bert_fixtures.py, run live
under this machine's reference build, or its stored fixture where the kernel
fingerprint matches).

Against llama.cpp the per-token rows agree to 7e-7 and the pooled vectors to
1.7e-5 (measured): the same ggml ops, with K and V read from an F32 cache
where llama.cpp reads them from the step, which can change a float32
summation order but not the values' precision.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import elelem
from elelem.errors import ContextLimitError, InvalidArgumentError, ModelShapeError
from llamacpp_reference import THREADS
from synthetic_bert import BertConfig, reference_hidden, write_bert

sys.path.insert(0, str(Path(__file__).parent / "support" / "fixtures"))
from make_bert_fixtures import CONFIGS, TOKEN_IDS  # noqa: E402  (importable without llama_cpp)

LLAMACPP_ATOL = 5e-5
# ggml's GELU reads a float16 table indexed by its input rounded to float16,
# which the reference reproduces; but an input within float32 rounding of a
# float16 boundary can pick the neighbouring entry (a ~1e-3 relative step),
# seen as up to 2.6e-4 after three layers.  A wrong op is off by O(0.1).
REFERENCE_ATOL = 1e-3


@pytest.fixture(scope="module")
def bert_models(tmp_path_factory) -> Path:
    """The directory with <name>.gguf for every config of make_bert_fixtures.py."""
    tmp = tmp_path_factory.mktemp("bert")
    for name, cfg in CONFIGS.items():
        write_bert(tmp / f"{name}.gguf", cfg)
    return tmp


@pytest.fixture(scope="module")
def llamacpp_bert(llamacpp, bert_models) -> dict:
    out = llamacpp.bert_embeddings(bert_models, list(CONFIGS))
    assert out["header"]["token_ids"] == TOKEN_IDS
    return out["configs"]


def _open(path, **kw):
    return elelem.LLM(path, n_threads=THREADS, **kw)


@pytest.mark.parametrize("cfg", [
    BertConfig(),
    BertConfig(arch="nomic-bert"),
    BertConfig(fused_qkv=True, n_layer=3, seed=3),
    BertConfig(arch="nomic-bert", fused_qkv=False, n_head=2, seed=4),
    BertConfig(causal=None, seed=5),          # no attention.causal key: causal, as llama.cpp assumes
    BertConfig(n_token_types=1, seed=6),
    BertConfig(arch="nomic-bert-moe", n_layer=4, seed=8),
    BertConfig(arch="nomic-bert-moe", n_layer=3, n_expert=3, n_expert_used=1, seed=9),
], ids=["bert", "nomic", "bert_fused", "nomic_separate", "bert_causal", "one_token_type", "nomic_moe",
        "nomic_moe_top1"])
def test_hidden_states_match_the_numpy_reference(tmp_path, cfg):
    weights = write_bert(tmp_path / "m.gguf", cfg)
    tokens = [2, 18, 20, 19, 21, 5, 6, 7, 3]
    with _open(tmp_path / "m.gguf") as llm:
        got = llm.engine.embed(tokens)
    want = reference_hidden(weights, cfg, tokens)
    assert got.shape == (len(tokens), cfg.n_embd) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=REFERENCE_ATOL, rtol=0)


def test_a_causal_bert_differs_from_the_bidirectional_one(tmp_path):
    # The mask is what makes an encoder: the same weights read causally give other states
    # (and the reference above checks each against its own mask).
    write_bert(tmp_path / "bi.gguf", BertConfig())
    write_bert(tmp_path / "causal.gguf", BertConfig(causal=True))
    with _open(tmp_path / "bi.gguf") as a, _open(tmp_path / "causal.gguf") as b:
        bi, causal = a.engine.embed(TOKEN_IDS), b.engine.embed(TOKEN_IDS)
    assert (np.abs(bi - causal).max(axis=1) > 1e-2).all()


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(CONFIGS))
def test_per_token_embeddings_match_llamacpp(bert_models, llamacpp_bert, name):
    with _open(bert_models / f"{name}.gguf") as llm:
        got = llm.engine.embed(TOKEN_IDS)
    want = np.array(llamacpp_bert[name]["per_token"], dtype=np.float32)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=LLAMACPP_ATOL, rtol=0)


def test_sequences_in_one_step_see_only_themselves(tmp_path):
    """Two texts batched into one step give each one's states alone: the
    bidirectional mask still keeps sequences apart."""
    write_bert(tmp_path / "m.gguf", BertConfig(arch="nomic-bert"))
    a, b = [2, 5, 6, 7, 3], [2, 18, 20, 19, 21, 14, 3]
    with _open(tmp_path / "m.gguf") as llm:
        alone_a, alone_b = llm.engine.embed(a), llm.engine.embed(b)
        ctx = llm.engine.context
        s, t = llm.engine.open_sequence(), llm.engine.open_sequence()
        rows = ctx.decode(a + b, [s] * len(a) + [t] * len(b), True, embeddings=True)
        ctx.cache.seq_rm(s, 0)
        ctx.cache.seq_rm(t, 0)
    np.testing.assert_allclose(rows[:len(a)], alone_a, atol=1e-5)
    np.testing.assert_allclose(rows[len(a):], alone_b, atol=1e-5)


def test_an_encoder_refuses_generation_and_logits(tmp_path):
    write_bert(tmp_path / "m.gguf", BertConfig())
    with _open(tmp_path / "m.gguf") as llm:
        with pytest.raises(InvalidArgumentError, match="encoder"):
            llm.generate_tokens([2, 5, 6], max_tokens=2)
        with pytest.raises(InvalidArgumentError, match="encoder"):
            llm.engine.context.decode([2, 5, 6], 0)
        ctx = llm.engine.context
        seq = llm.engine.open_sequence()
        ctx.decode([2, 5], seq, True, embeddings=True)
        with pytest.raises(InvalidArgumentError, match="one step"):
            ctx.decode([6], seq, True, embeddings=True)   # would see only half its sequence
        ctx.cache.seq_rm(seq, 0)
        np.testing.assert_allclose(llm.engine.embed(TOKEN_IDS), llm.engine.embed(TOKEN_IDS))  # still serves


def test_a_sequence_longer_than_a_step_is_a_clear_error(tmp_path):
    write_bert(tmp_path / "m.gguf", BertConfig())
    with _open(tmp_path / "m.gguf", n_ctx=64, n_batch=16) as llm:
        assert llm.engine.n_batch == 64   # an encoder's step holds its whole context
        with pytest.raises(ContextLimitError):
            llm.engine.embed([5] * 65)
        assert llm.engine.embed([5] * 64).shape == (64, 32)


def test_the_cache_is_float32_unless_asked(tmp_path):
    write_bert(tmp_path / "m.gguf", BertConfig())
    with _open(tmp_path / "m.gguf") as llm:
        assert llm.engine.context.cache.type_k == "f32"
    with _open(tmp_path / "m.gguf", kv_type="f16") as llm:
        assert llm.engine.context.cache.type_k == "f16"


def _drop(*names):
    def edit(w):
        for n in names:
            del w[n]
    return edit


@pytest.mark.parametrize("cfg, edit, match", [
    (BertConfig(), _drop("token_embd_norm.bias"), "token_embd_norm.bias"),
    (BertConfig(), _drop("position_embd.weight"), "position_embd.weight"),
    (BertConfig(), _drop("blk.1.layer_output_norm.weight"), "layer_output_norm"),
    (BertConfig(), _drop("blk.0.attn_k.weight"), "attn_q, attn_k and attn_v"),
    (BertConfig(), _drop("blk.0.attn_v.bias"), "biases"),
    (BertConfig(arch="nomic-bert"), _drop("blk.0.ffn_gate.weight"), "ffn_gate"),
    (BertConfig(arch="nomic-bert"),
     lambda w: w.__setitem__("blk.0.attn_q.weight", np.zeros((32, 32), np.float32)), "fused attn_qkv and also"),
    (BertConfig(), lambda w: w.__setitem__("token_types.weight", np.zeros((3, 32), np.float32)), "token_types"),
    (BertConfig(arch="nomic-bert-moe"), _drop("blk.1.ffn_up_exps.weight"), "blk.1.ffn_up_exps"),
    (BertConfig(arch="nomic-bert-moe"), _drop("blk.0.ffn_up.weight"), "blk.0.ffn_up"),
    (BertConfig(arch="nomic-bert-moe"),
     lambda w: w.__setitem__("blk.1.ffn_gate_inp.weight", np.zeros((5, 32), np.float32)), "ffn_gate_inp"),
])
def test_malformed_encoders_are_refused_with_the_tensor_named(tmp_path, cfg, edit, match):
    write_bert(tmp_path / "m.gguf", cfg, edit=edit)
    with pytest.raises(ModelShapeError, match=match):
        elelem.LLM(tmp_path / "m.gguf")


def test_missing_encoder_hyperparameters_are_refused(tmp_path):
    write_bert(tmp_path / "m.gguf", BertConfig(), encoder_keys=False)
    with pytest.raises(ModelShapeError, match="layer_norm_epsilon"):
        elelem.LLM(tmp_path / "m.gguf")


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(CONFIGS))
def test_texts_tokenize_and_pool_as_llamacpp(bert_models, llamacpp_bert, name):
    """The whole path of a text: WordPiece with [CLS]/[SEP], the encoder, the
    model's pooling (mean, or cls for bert_cls_fused) and normalization."""
    from make_bert_fixtures import TEXTS
    ref = llamacpp_bert[name]
    with _open(bert_models / f"{name}.gguf", embedding=True) as llm:
        assert llm.pooling == {1: "mean", 2: "cls"}[CONFIGS[name].pooling]
        assert [llm.tokenize(t) for t in TEXTS] == ref["text_ids"]
        pooled = llm.embed(TEXTS)
        normalized = llm.embed(TEXTS, normalize=True)
        response = llm.create_embedding(TEXTS)
    # A text's float32 sums can take another order than llama.cpp's, and one
    # GELU input can then cross a float16 boundary of ggml's table: on Sapphire
    # Rapids one text of bert_cls_fused is 4.6e-4 off.  So REFERENCE_ATOL here.
    np.testing.assert_allclose(np.array(pooled), np.array(ref["pooled"]), atol=REFERENCE_ATOL, rtol=0)
    np.testing.assert_allclose(np.array(normalized), np.array(ref["pooled_normalized"]), atol=REFERENCE_ATOL, rtol=0)
    assert [d["embedding"] for d in response["data"]] == pooled
    assert response["usage"]["prompt_tokens"] == sum(len(ids) for ids in ref["text_ids"])


def test_positions_past_the_learned_table_are_refused(tmp_path):
    """BERT's positions are rows of a table of n_ctx_train: a longer context
    is refused when the model opens, and a step past it before it computes."""
    write_bert(tmp_path / "m.gguf", BertConfig(causal=True))   # causal: a sequence may grow step by step
    with pytest.raises(ContextLimitError, match="learned positions"):
        elelem.LLM(tmp_path / "m.gguf", n_ctx=129)
    with _open(tmp_path / "m.gguf", kv_size=256) as llm:
        ctx = llm.engine.context
        seq = llm.engine.open_sequence()
        ctx.decode([5] * 100, seq, True, embeddings=True)
        with pytest.raises(ContextLimitError, match="position table"):
            ctx.decode([6] * 40, seq, True, embeddings=True)
        assert llm.engine.length(seq) == 100   # the refused step left the cache as it was
        ctx.decode([6] * 28, seq, True, embeddings=True)   # up to the last learned position


@pytest.mark.real_model
def test_the_compat_shim_embeds_an_encoder_as_llama_cpp_python(bert_models, llamacpp_bert):
    """llama-cpp-python's own calls, unchanged: its default n_ctx=512 is past
    the model's 128 learned positions, so the shim clamps it (elelem.LLM refuses)."""
    from elelem.compat import Llama
    from make_bert_fixtures import TEXTS
    llm = Llama(model_path=str(bert_models / "bert.gguf"), embedding=True, n_threads=THREADS, verbose=False)
    try:
        assert llm.n_ctx() == 128
        np.testing.assert_allclose(np.array(llm.embed(TEXTS)), np.array(llamacpp_bert["bert"]["pooled"]),
                                   atol=LLAMACPP_ATOL, rtol=0)
        assert llm.tokenize(TEXTS[0].encode()) == llamacpp_bert["bert"]["text_ids"][0]
        with pytest.raises(InvalidArgumentError, match="encoder"):
            llm("the cat", max_tokens=2)
    finally:
        llm.close()
