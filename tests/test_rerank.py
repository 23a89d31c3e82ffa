"""Reranking (rank pooling) and last-token pooling, on tiny synthetic models in
the converter's layout (tests/support/synthetic_rerank.py):

* a bge-reranker-shaped cross-encoder (``bert`` with ``cls`` / ``cls.output``)
  and one whose head projects directly (F16 head, no dense layer), against
  llama.cpp live: the ids of llama-server's rerank prompt, and the rank
  outputs of ``Llama(embedding=True, pooling_type=RANK)``
  (tests/support/fixtures/make_rerank_fixtures.py);
* a Qwen3-Reranker-shaped ``qwen3`` (the LM head's yes/no rows as
  ``cls.output``, its rerank template) and a Qwen3-Embedding-shaped one
  (last-token pooling, EOS added) on the sdist's Qwen2 vocabulary, the same way;
* each against the NumPy reference of its head;
* ``LLM.rerank``'s order and ``top_n``, and what it refuses.
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import elelem
from elelem.api.rerank import rerank_ids
from elelem.errors import InvalidArgumentError, ModelShapeError
import llamacpp_sdist as sdist
import synthetic_bert
from llamacpp_reference import THREADS, Reference, run_script, skip_or_fail
from synthetic import add_shape_keys, reference_hidden, write_model
from synthetic_rerank import BgeConfig, bge_score, qwen3_config, qwen3_score, write_bge, write_qwen3_reranker
from vocab_metadata import read_vocab_metadata, vocab_writer

sys.path.insert(0, str(Path(__file__).parent / "support" / "fixtures"))
from make_rerank_fixtures import CASES, N_CTX, TEXTS  # noqa: E402  (importable without llama_cpp)

BGE = {"bge": BgeConfig(), "bge_direct_f16": BgeConfig(
    bert=synthetic_bert.BertConfig(pooling=None, fused_qkv=True, n_layer=3, n_ctx_train=512, seed=12), dense=False, head_type="f16")}
# The same ggml ops as llama.cpp's (the head's matmuls are plain ggml_mul_mat); K and V read back from
# the cache may sum in another order (see tests/test_bert.py), nothing more.
LLAMACPP_RTOL, LLAMACPP_ATOL = 1e-4, 2e-5
REFERENCE_ATOL = 2e-3   # float64 NumPy against float32 ggml (GELU's float16 table, tests/test_bert.py)


def _open(path, **kw):
    kw.setdefault("n_ctx", N_CTX)
    return elelem.LLM(path, n_threads=THREADS, flash_attn=False, **kw)


@pytest.fixture(scope="module")
def bge_models(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("bge")
    return tmp, {name: write_bge(tmp / f"{name}.gguf", cfg) for name, cfg in BGE.items()}


def _live(models_dir: Path, names: list[str]) -> dict:
    out = run_script("make_rerank_fixtures.py", ["--models-dir", str(models_dir), "--out", "{out}/rerank.json"],
                     [], [models_dir / f"{n}.gguf" for n in names], ["rerank.json"])
    if out is None:
        skip_or_fail(Reference.not_built())
    return out["rerank.json"]["configs"]


def _pairs():
    return [(q, d) for q, docs in CASES for d in docs]


# ------------------------------------------------------------------ bge-reranker-shaped


@pytest.mark.parametrize("name", list(BGE))
def test_cross_encoder_scores_match_llama_cpp(bge_models, name):
    models_dir, _ = bge_models
    ref = _live(models_dir, list(BGE))[name]
    with _open(models_dir / f"{name}.gguf") as llm:
        assert llm.pooling == "none"   # no pooling key, as the converter writes a cross-encoder
        for case in ref["cases"]:
            ids = rerank_ids(llm.assets, case["query"], case["document"])
            assert ids == case["ids"]
            got = llm.engine.rank(ids)
            assert got.shape == (ref["n_cls_out"],) and got.dtype == np.float32
            np.testing.assert_allclose(got, case["outputs"], rtol=LLAMACPP_RTOL, atol=LLAMACPP_ATOL)


@pytest.mark.parametrize("name", list(BGE))
def test_cross_encoder_scores_match_the_numpy_reference(bge_models, name):
    models_dir, weights = bge_models
    with _open(models_dir / f"{name}.gguf") as llm:
        for query, document in _pairs():
            ids = rerank_ids(llm.assets, query, document)
            assert ids[0] == llm.tokenizer.bos_id and llm.tokenizer.special_id("sep") in ids   # [CLS] q [SEP] d
            np.testing.assert_allclose(llm.engine.rank(ids), bge_score(weights[name], BGE[name], ids),
                                       atol=REFERENCE_ATOL, rtol=0)


@pytest.mark.real_model   # the sdist's vocabulary
def test_cross_encoder_on_a_unigram_vocabulary_matches_llama_cpp(tmp_path):
    """bge-reranker-v2-m3's shape: XLM-RoBERTa's t5 vocabulary, whose rerank prompt is
    <s> query </s> document </s> (BOS and EOS added; no SEP: this file has no add_sep_token)."""
    vocab_path = sdist.vocab_path("nomic-bert-moe")
    n_vocab = len(dict((k, v) for k, v, *_ in read_vocab_metadata(vocab_path))["tokenizer.ggml.tokens"])
    cfg = BgeConfig(bert=synthetic_bert.BertConfig(pooling=None, n_token_types=1, n_ctx_train=512, seed=13))
    weights = write_bge(tmp_path / "bge_m3_vocab.gguf", cfg, (n_vocab, vocab_writer(vocab_path)))
    ref = _live(tmp_path, ["bge_m3_vocab"])["bge_m3_vocab"]
    with _open(tmp_path / "bge_m3_vocab.gguf") as llm:
        for case in ref["cases"]:
            ids = rerank_ids(llm.assets, case["query"], case["document"])
            assert ids == case["ids"] and ids[0] == 0 and ids.count(2) == 2
            got = llm.engine.rank(ids)
            np.testing.assert_allclose(got, case["outputs"], rtol=LLAMACPP_RTOL, atol=LLAMACPP_ATOL)
            np.testing.assert_allclose(got, bge_score(weights, cfg, ids), atol=REFERENCE_ATOL, rtol=0)


def test_rerank_orders_by_score_and_cuts_to_top_n(bge_models):
    models_dir, weights = bge_models
    query, documents = CASES[0]
    with _open(models_dir / "bge.gguf") as llm:
        scores = [float(llm.engine.rank(rerank_ids(llm.assets, query, d))[0]) for d in documents]
        results = llm.rerank(query, documents)
        assert [r["index"] for r in results] == sorted(range(len(documents)), key=lambda i: -scores[i])
        assert [r["relevance_score"] for r in results] == sorted(scores, reverse=True)
        assert llm.rerank(query, documents, top_n=2) == results[:2]
        assert llm.rerank(query, documents, top_n=0) == []
        assert llm.rerank(query, [documents[1]] * 3) == [{"index": i, "relevance_score": scores[1]} for i in range(3)]
        # the cache is left as it was: generation state of the default session untouched
        assert llm.engine.context.cache.n_used == 0
        for bad, match in [((query, []), "documents"), ((query, "one string"), "documents"),
                           ((query, [1, 2]), "documents"), ((None, documents), "query")]:
            with pytest.raises(InvalidArgumentError, match=match):
                llm.rerank(*bad)
        with pytest.raises(InvalidArgumentError, match="top_n"):
            llm.rerank(query, documents, top_n=-1)


def test_rank_pooling_in_embed_gives_the_head_outputs(bge_models):
    models_dir, _ = bge_models
    with _open(models_dir / "bge.gguf", pooling="rank") as llm:
        assert llm.pooling == "rank"
        text = "the cat sat"
        want = llm.engine.rank(llm.assets.tokenize(text))
        assert llm.embed(text) == pytest.approx(want.tolist(), rel=0, abs=0)


def test_a_model_without_a_head_cannot_rank(tmp_path):
    path = tmp_path / "bert.gguf"
    synthetic_bert.write_bert(path, synthetic_bert.BertConfig())
    with _open(path, n_ctx=128) as llm:
        with pytest.raises(InvalidArgumentError, match="classification head"):
            llm.rerank("the cat", ["the mat"])
    with pytest.raises(InvalidArgumentError, match="classification head"):
        _open(path, n_ctx=128, pooling="rank")


def test_a_head_must_match_its_labels(tmp_path):
    two = write_bge(tmp_path / "two.gguf", BgeConfig(labels=("a", "b"))) and tmp_path / "two.gguf"
    with _open(two) as llm:   # two labels, two rows: two outputs
        assert llm.engine.rank(llm.assets.tokenize("the cat")).shape == (2,)
    cfg = BgeConfig()
    writer = gguf.GGUFWriter(str(tmp_path / "mismatch.gguf"), "bert")
    add_shape_keys(writer, cfg.bert)
    synthetic_bert._add_encoder_keys(writer, cfg.bert)
    writer.add_classifier_output_labels(["a", "b", "c"])
    for name, arr in synthetic_bert.make_weights(cfg.bert).items():
        writer.add_tensor(name, arr)
    writer.add_tensor("cls.output.weight", np.zeros((2, cfg.bert.n_embd), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelShapeError, match="cls.output.weight"):
        _open(tmp_path / "mismatch.gguf")


# ------------------------------------------------------------------ Qwen3-Reranker and Qwen3-Embedding


@pytest.fixture(scope="module")
def qwen3_models(tmp_path_factory) -> tuple[Path, dict]:
    """Qwen3-shaped files on the sdist's Qwen2 vocabulary (llama.cpp needs a real one for the template)."""
    vocab_path = sdist.vocab_path("qwen2")
    tokens = dict((k, v) for k, v, *_ in read_vocab_metadata(vocab_path))["tokenizer.ggml.tokens"]
    tmp = tmp_path_factory.mktemp("qwen3")
    cfg = qwen3_config(len(tokens))
    yes_no = (tokens.index("yes"), tokens.index("no"))
    out = {"qwen3": (cfg, write_qwen3_reranker(tmp / "qwen3.gguf", cfg, yes_no, vocab_writer(vocab_path)))}
    embed_cfg = cfg.but(seed=22, extra_keys=(("{arch}.pooling_type", 3),))

    def embed_vocab(writer):
        vocab_writer(vocab_path)(writer)
        writer.add_add_eos_token(True)   # Qwen3-Embedding's tokenizer appends <|endoftext|>
    out["qwen3_embed"] = (embed_cfg, write_model(tmp / "qwen3_embed.gguf", embed_cfg, embed_vocab))
    return tmp, out


@pytest.mark.real_model   # the sdist's vocabulary
def test_qwen3_reranker_scores_match_llama_cpp_and_the_reference(qwen3_models):
    models_dir, models = qwen3_models
    cfg, weights = models["qwen3"]
    ref = _live(models_dir, ["qwen3", "qwen3_embed"])["qwen3"]
    assert ref["n_cls_out"] == 2
    with _open(models_dir / "qwen3.gguf") as llm:
        assert llm.pooling == "rank"
        for case in ref["cases"]:
            ids = rerank_ids(llm.assets, case["query"], case["document"])
            assert ids == case["ids"]
            got = llm.engine.rank(ids)
            np.testing.assert_allclose(got, case["outputs"], rtol=LLAMACPP_RTOL, atol=LLAMACPP_ATOL)
            assert got.sum() == pytest.approx(1.0, abs=1e-6)   # P(yes), P(no)
            np.testing.assert_allclose(got, qwen3_score(weights, cfg, ids), atol=REFERENCE_ATOL, rtol=0)
        query, documents = CASES[0]
        results = llm.rerank(query, documents, top_n=3)
        scores = {c["document"]: c["outputs"][0] for c in ref["cases"] if c["query"] == query}
        assert [documents[r["index"]] for r in results] == sorted(documents, key=lambda d: -scores[d])[:3]


@pytest.mark.real_model
def test_qwen3_reranker_scores_the_same_across_steps(qwen3_models):
    """A causal reranker's prompt may take several steps: only the last row is read."""
    models_dir, _ = qwen3_models
    query, documents = CASES[0]
    with _open(models_dir / "qwen3.gguf") as whole, _open(models_dir / "qwen3.gguf", n_batch=16) as chunked:
        ids = rerank_ids(whole.assets, query, documents[0])
        assert len(ids) > 3 * 16
        np.testing.assert_allclose(chunked.engine.rank(ids), whole.engine.rank(ids), rtol=1e-5, atol=1e-6)


@pytest.mark.real_model
def test_qwen3_embedding_last_token_pooling_matches_llama_cpp(qwen3_models):
    models_dir, models = qwen3_models
    cfg, weights = models["qwen3_embed"]
    ref = _live(models_dir, ["qwen3", "qwen3_embed"])["qwen3_embed"]
    with _open(models_dir / "qwen3_embed.gguf") as llm:
        assert llm.pooling == "last"
        for text, ids, want in zip(TEXTS, ref["ids"], ref["embeddings"]):
            assert llm.assets.tokenize(text) == ids and ids[-1] == llm.tokenizer.eos_id
            got = llm.embed(text)
            np.testing.assert_allclose(got, want, rtol=LLAMACPP_RTOL, atol=LLAMACPP_ATOL)
            np.testing.assert_allclose(got, reference_hidden(weights, cfg, ids)[-1], atol=REFERENCE_ATOL, rtol=0)
