"""Embeddings for decoder models: the final normed hidden
state of each token, pooled as the GGUF says (or as asked).

Tiny synthetic models: against the NumPy reference of the forward pass,
across batch boundaries.  Real models: against llama-cpp-python's
``Llama(embedding=True).embed`` on this machine
(tests/support/fixtures/make_embedding_fixtures.py).
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.api.embeddings import model_pooling
from elelem.errors import ContextLimitError, InvalidArgumentError
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, reference_hidden

TOKENS = [5, 17, 42, 9, 3, 77, 61, 30, 2, 8, 11, 90, 45]


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_token_embeddings_are_the_final_hidden_states(tiny_model, arch):
    cfg = TinyConfig(arch=arch, head_dim=32 if arch == "gemma3" else None, n_swa=4 if arch == "gemma3" else 0,
                     tied=arch == "gemma3", n_layer=3 if arch == "gemma3" else 2)
    path, weights = tiny_model(cfg)
    with elelem.LLM(path, kv_type="f32", n_threads=1, n_batch=5) as llm:   # 13 tokens: three steps
        rows = llm.engine.embed(TOKENS)
        assert rows.shape == (len(TOKENS), cfg.n_embd) and rows.dtype == np.float32
        expected = reference_hidden(weights, cfg, TOKENS)
        np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-4 * np.abs(expected).max())
        # nothing is left behind: the sequence it used is free again, and generation still works
        assert llm.engine.context.cache.n_used == llm.engine.context.cache.seq_length_of(0)
        logits = llm.eval(TOKENS[:4])
        assert logits.shape == (cfg.n_vocab,)


def test_pooling_comes_from_the_metadata_or_the_caller(tiny_model):
    for value, name in [(1, "mean"), (2, "cls"), (3, "last")]:
        path, _ = tiny_model(TinyConfig(extra_keys=(("{arch}.pooling_type", value),)))
        with elelem.LLM(path, n_threads=1) as llm:
            assert llm.pooling == name
    path, _ = tiny_model(TinyConfig())
    with elelem.LLM(path, n_threads=1) as llm:
        assert llm.pooling == "none"                      # decoders carry no pooling key: llama.cpp's default
    with elelem.LLM(path, n_threads=1, pooling="last") as llm:
        assert llm.pooling == "last"
    with pytest.raises(InvalidArgumentError, match="pooling"):
        elelem.LLM(path, n_threads=1, pooling="max")
    rank, _ = tiny_model(TinyConfig(extra_keys=(("{arch}.pooling_type", 4),)))
    with pytest.raises(InvalidArgumentError, match="pooling_type = 4"):
        elelem.LLM(rank, n_threads=1)


NAMES = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]


@pytest.mark.real_model
@pytest.mark.parametrize("name", NAMES)
def test_embeddings_match_llamacpp(llamacpp, name):
    from conftest import packaged_model
    path = packaged_model(name)
    reference = llamacpp.embeddings(name, path)
    texts = reference["texts"]
    with elelem.LLM(path, n_ctx=512, n_threads=THREADS, **elelem_kernel_options()) as llm:
        per_token = np.array(llm.embed(texts[0]))
        theirs = np.array(reference["per_token_first_text"])
        assert per_token.shape == theirs.shape
        # One text, evaluated alone by both: the same kernels, the same numbers.
        np.testing.assert_allclose(per_token, theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())
    with elelem.LLM(path, n_ctx=512, n_threads=THREADS, pooling="mean", **elelem_kernel_options()) as llm:
        mean = np.array(llm.embed(texts))
        np.testing.assert_allclose(mean[0], theirs.mean(axis=0), rtol=0, atol=1e-4 * np.abs(theirs).max())
        # llama.cpp embedded the three texts in one batch of three sequences: other matmul
        # shapes, so rounding differs (measured: cosine >= 0.9997, Gemma's third text).
        ref = np.array(reference["mean"])
        cosine = (mean * ref).sum(1) / np.linalg.norm(mean, axis=1) / np.linalg.norm(ref, axis=1)
        assert cosine.min() > 0.999


@pytest.fixture(scope="module")
def smollm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=64, n_threads=2, pooling="mean") as llm:
        yield llm


@pytest.mark.real_model
def test_create_embedding_has_llama_cpp_pythons_shape(smollm):
    response = smollm.create_embedding(["a cat", "a dog sleeps"])
    assert set(response) == {"object", "data", "model", "usage"} and response["object"] == "list"
    assert [d["index"] for d in response["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 576 for d in response["data"])
    n_tokens = len(smollm.tokenize("a cat", special=False)) + len(smollm.tokenize("a dog sleeps", special=False))
    assert response["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    single = smollm.create_embedding("a cat")
    assert single["data"][0]["embedding"] == response["data"][0]["embedding"]


@pytest.mark.real_model
def test_normalized_embeddings_and_their_similarities(smollm):
    cat, kitten, code = (np.array(v) for v in smollm.embed(["a cat", "a kitten", "import numpy as np"],
                                                           normalize=True))
    for v in (cat, kitten, code):
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-9)
    assert cat @ kitten > cat @ code
    raw = np.array(smollm.embed("a cat"))
    np.testing.assert_allclose(raw / np.linalg.norm(raw), cat, atol=1e-12)


@pytest.mark.real_model
def test_long_and_bad_inputs(smollm):
    long = "word " * 200                                    # > n_ctx=64 tokens
    vectors, count = smollm.embed(long, return_count=True)
    assert count == 64 and len(vectors) == 1
    with pytest.raises(ContextLimitError, match="truncate"):
        smollm.embed(long, truncate=False)
    for bad in ["", [], [1, 2], b"bytes"]:
        with pytest.raises(InvalidArgumentError):
            smollm.embed(bad)


def test_model_pooling_refuses_bad_metadata():
    with pytest.raises(InvalidArgumentError, match="qwen2.pooling_type"):
        model_pooling({"qwen2.pooling_type": "mean"}, "qwen2", None)
