"""An image's embeddings in a gemma3 text model's sequence, against the NumPy
reference of tests/support/synthetic.py (reference_logits with ``images``):
the rows taken as they are (llama.cpp's gemma3 scales token rows alone), one
cell each, attending to each other both ways (mtmd_decode_use_non_causal),
the sliding window applied as to tokens.  libmtmd itself is the judge in
tests/test_vision_llamacpp.py; this runs without it.
"""
from __future__ import annotations

import numpy as np
import pytest

from synthetic import TinyConfig, reference_logits, write_model
from synthetic_mmproj import TinyProjector, write_projector

CFG = TinyConfig(arch="gemma3", n_embd=64, head_dim=32, n_layer=6, n_swa=6, tied=True)


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    pytest.importorskip("elelem._core")
    import elelem
    from elelem.vision import Image

    tmp = tmp_path_factory.mktemp("vision_text")
    weights = write_model(tmp / "text.gguf", CFG)
    write_projector(tmp / "mmproj.gguf", TinyProjector(n_embd_out=CFG.n_embd))
    llm = elelem.LLM(tmp / "text.gguf", mmproj=tmp / "mmproj.gguf", n_ctx=128, n_threads=2, flash_attn=False,
                     speculative=False)
    px = np.random.default_rng(0).integers(0, 256, (20, 28, 3), dtype=np.uint8)
    embedded = llm.images.projector.encode(Image.from_pixels(px))
    yield llm, weights, embedded
    llm.close()


def test_logits_after_an_image_match_the_numpy_reference(opened):
    llm, weights, embedded = opened
    image = llm.engine.media.add(embedded.digest, embedded.embeddings)
    ids = [5, 7, 9] + image + [11, 13, 17]
    got = llm.prefill(ids)
    want = reference_logits(weights, CFG, ids, images=[(3, embedded.embeddings)])[-1]
    causal = reference_logits(weights, CFG, np.maximum(ids, 0), images=())[-1]  # what a plain token run would give
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-4 * scale
    assert np.abs(causal - want).max() > 1e-2 * scale   # the image rows matter: the check can fail


def test_the_image_attends_both_ways_within_itself(opened):
    """Its rows see the later rows of the image: a causal image gives other logits."""
    llm, weights, embedded = opened
    llm.reset()
    image = llm.engine.media.add(embedded.digest, embedded.embeddings)
    ids = [3] + image + [4, 6]
    got = llm.prefill(ids)
    n = len(embedded.embeddings)
    want = reference_logits(weights, CFG, ids, images=[(1, embedded.embeddings)])[-1]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    core_ctx = llm.engine.context
    llm.reset()
    logits_causal = core_ctx.decode_embeddings(embedded.embeddings, image, np.zeros(n, np.int32), causal=True)
    llm.reset()
    logits_both = core_ctx.decode_embeddings(embedded.embeddings, image, np.zeros(n, np.int32), causal=False)
    llm.reset()
    assert not np.array_equal(logits_causal, logits_both)


def test_bad_embeddings_and_ids_are_refused(opened):
    from elelem import errors
    llm, _, embedded = opened
    ctx = llm.engine.context
    with pytest.raises(errors.InvalidArgumentError, match="embeddings must be"):
        ctx.decode_embeddings(np.zeros((2, 8), np.float32), [-1, -2], [0, 0])
    with pytest.raises(errors.InvalidTokenError, match="negative"):
        ctx.decode_embeddings(np.zeros((2, CFG.n_embd), np.float32), [1, -2], [0, 0])
    with pytest.raises(errors.InvalidArgumentError, match="NaN"):
        ctx.decode_embeddings(np.full((1, CFG.n_embd), np.nan, np.float32), [-1], [0])
    with pytest.raises(errors.InvalidTokenError):
        llm.prefill([1, 2, -12345, 3])   # an image id no image stands behind


def test_a_turn_after_an_image_reuses_it_with_the_logits_of_a_fresh_evaluation(tmp_path):
    """An agent's next turn after a screenshot: the prompt is the last one and a few tokens
    more.  The tail evaluated again for the fresh evaluation's logits is the tokens after the
    image -- which a fresh evaluation runs as a step of their own, after the image's -- not
    the image: it is not evaluated again, and the logits are those of the whole prompt
    evaluated afresh, bit for bit (flash attention on: its tiled kernel's 64 query rows are
    one of the step widths the tail must match)."""
    import elelem
    from elelem.vision import Image

    weights = write_model(tmp_path / "text.gguf", CFG)
    write_projector(tmp_path / "mmproj.gguf", TinyProjector(n_embd_out=CFG.n_embd))
    px = np.random.default_rng(1).integers(0, 256, (30, 20, 3), dtype=np.uint8)
    with elelem.LLM(tmp_path / "text.gguf", mmproj=tmp_path / "mmproj.gguf", n_ctx=256, n_threads=2,
                    flash_attn=True, speculative=False) as llm:
        assert 64 in llm.engine.context.width_thresholds
        embedded = llm.images.projector.encode(Image.from_pixels(px))
        image = llm.engine.media.add(embedded.digest, embedded.embeddings)
        first = list(range(3, 73)) + image + list(range(73, 93))
        second = first + [93, 94, 95, 2, 4, 6]
        llm.prefill(first)
        media = llm.engine.media
        evaluated, before = media.images_evaluated, llm.engine.prompt_tokens_evaluated
        reused = llm.prefill(second)
        assert media.images_evaluated == evaluated                       # the image's cells were kept
        assert llm.engine.prompt_tokens_evaluated - before < len(second) - first.index(image[0])
        llm.reset()
        fresh = llm.prefill(second)
        assert media.images_evaluated == evaluated + 1
    np.testing.assert_array_equal(reused, fresh)
    want = reference_logits(weights, CFG, second, images=[(70, embedded.embeddings)])[-1]
    assert np.abs(fresh - want).max() <= 1e-3 * np.abs(want).max()
