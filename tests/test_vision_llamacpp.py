"""Images against llama.cpp's libmtmd, live, on the same files and pixels.

A synthetic gemma3 projector (tests/support/synthetic_mmproj.py, the
converter's layout) over a synthetic gemma3 text model carrying SmolLM2's
vocabulary; images given as raw RGB pixels of odd sizes (libmtmd's
mtmd_bitmap_init takes pixels, so no decoder stands between the sides).
libmtmd's side is tests/support/fixtures/make_vision_fixtures.py under the
reference build (scripts/reference_llamacpp.py, built with libmtmd).

Tolerance: none.  The encoder is clip.cpp's graph op for op on the same ggml,
with its flash attention (K and V cast to F16) or without; the preprocessing
is mtmd's resize arithmetic (elelem/vision/resize.py), so equal embeddings
also say the pixels were equal (a pixel one level off moves every embedding
of its patch, and the pooled token, in the low bits).  The text logits after
an image are compared bit for bit too: the image is a step of its own,
attending both ways within itself (mtmd_decode_use_non_causal), as
mtmd_helper_eval_chunks evaluates it.
"""
from __future__ import annotations

import numpy as np
import pytest

from image_inputs import floats as _floats, pixels as _pixels, png_url as _png_url
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, write_model
from synthetic_mmproj import TinyProjector, write_projector
from vocab_metadata import vocab_size, vocab_writer

PROJ = TinyProjector(n_embd_out=64)
TEXT = TinyConfig(arch="gemma3", n_vocab=49152, n_embd=64, head_dim=32, n_layer=3, n_swa=8, tied=True)
# Odd sizes, a huge aspect ratio in each direction, one pixel, and the encoder's own size (no resize).
SIZES = [(37, 23), (5, 300), (300, 7), (1, 1), (32, 32), (64, 48)]
PROMPT = "<|im_start|>user\nWhat is in<__media__> this picture?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    assert vocab_size(smollm_path) == TEXT.n_vocab
    tmp = tmp_path_factory.mktemp("vision_llamacpp")
    write_model(tmp / "text.gguf", TEXT, extra_metadata=vocab_writer(smollm_path))
    write_projector(tmp / "mmproj.gguf", PROJ)
    images = []
    for h, w in SIZES:
        np.save(tmp / f"image_{h}x{w}.npy", _pixels(h, w))
        images.append(tmp / f"image_{h}x{w}.npy")
    return tmp / "text.gguf", tmp / "mmproj.gguf", images


@pytest.fixture(scope="module", params=["on", "off"])
def reference(request, llamacpp, files):
    model, mmproj, images = files
    return request.param, llamacpp.vision(model, mmproj, images, [PROMPT], request.param)


@pytest.mark.real_model
def test_image_embeddings_equal_libmtmds(files, reference):
    from elelem.vision import Image, Projector

    flash, ref = reference
    _, mmproj, images = files
    with Projector(mmproj, n_threads=THREADS, flash_attn=flash == "on") as projector:
        for path, record in zip(images, ref["images"]):
            got = projector.encode(Image.from_pixels(np.load(path))).embeddings
            want = _floats(record["embeddings"]).reshape(got.shape)
            diff = np.abs(got.astype(np.float64) - want)
            assert diff.max() == 0.0, f"{path.name} (flash attention {flash}): max |diff| {diff.max():.3g}"


@pytest.mark.real_model
def test_logits_and_greedy_tokens_after_an_image_equal_llamacpps(files, reference):
    """The prompt as mtmd_tokenize cut it (its chunks), the image's ids from
    elelem's projector, evaluated by the engine: the last logits bit for bit,
    then the greedy path."""
    import elelem
    from elelem.vision import Image

    flash, ref = reference
    model, mmproj, images = files
    record = ref["prompts"][0]
    with elelem.LLM(model, mmproj=mmproj, n_ctx=256, kv_type="f16", n_threads=THREADS, speculative=False,
                    **elelem_kernel_options()) as llm:
        llm.images.projector.flash_attn = flash == "on"
        embedded = llm.images.projector.encode(Image.from_pixels(np.load(images[0])))
        ids = []
        for chunk in record["chunks"]:
            if "text" in chunk:
                ids += chunk["text"]
            else:
                assert chunk["image"] == embedded.n_tokens == PROJ.n_tokens
                ids += llm.engine.media.add(embedded.digest, embedded.embeddings)
        assert record["n_past"] == len(ids)
        logits = llm.prefill(ids)
        want = _floats(record["logits"])
        diff = np.abs(logits.astype(np.float64) - want)
        assert diff.max() == 0.0, f"max |diff| {diff.max():.3g}"
        greedy = record["greedy"]
        ends = [i for i, t in enumerate(greedy) if t in llm.eos_ids]
        greedy = greedy[:ends[0]] if ends else greedy   # generation stops at an end token, not returned
        assert llm.generate_tokens(ids, len(record["greedy"])) == greedy

        # The same through chat(): the image as a data URL, the prompt rendered and cut as llama.cpp's server does.
        llm.reset()
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "What is in"},
            {"type": "image_url", "image_url": {"url": _png_url(np.load(images[0]))}},
            {"type": "text", "text": " this picture?"}]}]
        text = llm.chat(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert text == llm.detokenize(greedy).decode("utf-8", "replace")


@pytest.mark.real_model
def test_the_same_image_twice_is_encoded_and_evaluated_once(files):
    """An agent's conversation sends the same screenshot in each turn: the
    second request finds its embeddings cached and its cells in the KV cache."""
    import elelem

    model, mmproj, images = files
    url = _png_url(np.load(images[0]))
    with elelem.LLM(model, mmproj=mmproj, n_ctx=256, n_threads=THREADS) as llm:
        turn = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is wrong here?"}]}]
        reply = llm.chat(turn, max_tokens=3, temperature=0)
        assert llm.images.projector.n_encoded == 1 and llm.engine.media.images_evaluated == 1
        evaluated = llm.engine.prompt_tokens_evaluated
        turn += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And now?"}]
        llm.chat(turn, max_tokens=3, temperature=0)
        assert llm.images.projector.n_encoded == 1          # the pixels' hash found its embeddings
        assert llm.engine.media.images_evaluated == 1       # and the prefix its cells
        assert llm.engine.prompt_tokens_evaluated - evaluated < 20
