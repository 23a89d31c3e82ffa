"""Gemma 4's images against llama.cpp's libmtmd, live, on the same files and pixels.

A synthetic gemma4v projector (tests/support/synthetic_mmproj.py, in the
layout of the converter's Gemma4VisionAudioModel, with clippable-linear
bounds that bind) over a synthetic gemma4 text model with per-layer token
embeddings and a sliding window shorter than an image, carrying Gemma 4's
own vocabulary and chat template.  Images as raw RGB pixels (libmtmd's
mtmd_bitmap_init takes pixels): odd sizes, one pixel, huge aspect ratios
each way, and one past the most image tokens, so that every branch of mtmd's
variable-resolution sizing (calc_size_preserved_ratio: rounded, scaled up,
scaled down) and its bicubic resize is exercised.

Tolerance: none.  The encoder is clip_graph_gemma4v op for op on the same
ggml, with flash attention or without; equal embeddings also say the
preprocessed pixels were equal.  The text logits after an image are compared
bit for bit: the image a step of its own attending both ways within itself
(mtmd_decode_use_non_causal: this text width is not E2B's or E4B's) in the
sliding layers only, the global layers staying causal (llama.cpp's
LLAMA_NON_CAUSAL_TYPE_SWA_ONLY for gemma4), its per-layer inputs from the
padding token's row, as llama.cpp's gemma4 graph takes them for embeddings.
"""
from __future__ import annotations

import numpy as np
import pytest

from image_inputs import floats as _floats, pixels as _pixels, png_url as _png_url
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, write_model
from synthetic_mmproj import TinyProjector, write_projector

PROJ = TinyProjector(projector_type="gemma4v", n_embd=32, n_head=4, n_ff=64, n_layer=2, image_size=224,
                     patch_size=4, n_merge=2, n_embd_out=64, pos_size=256, seed=5,
                     image_mean=(0.48, 0.46, 0.41), image_std=(0.27, 0.26, 0.28),
                     clamps=(("v.blk.0.ffn_down", "output_max", 0.3), ("v.blk.0.ffn_down", "output_min", -0.3),
                             ("v.blk.1.attn_q", "input_min", -0.5), ("mm.input_projection", "input_max", 0.8)))
# Odd sizes, a huge aspect ratio each way, one pixel (all scaled up to the least tokens),
# one within the limits (rounded only) and one past the most tokens (scaled down).
SIZES = [(37, 23), (5, 300), (300, 7), (1, 1), (120, 96), (260, 300)]
MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "What is in"},
                                         {"type": "image_url", "image_url": {"url": "<placeholder>"}},
                                         {"type": "text", "text": " this picture?"}]}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import llamacpp_sdist as sdist
    from vocab_metadata import vocab_size, vocab_writer

    vocab = sdist.vocab_path("gemma-4")
    if not vocab.exists():
        pytest.skip(f"{vocab} is not here (llama.cpp's sdist)")
    text = TinyConfig(arch="gemma4", n_vocab=vocab_size(vocab), n_embd=64, n_head=2, n_head_kv=1, head_dim=32,
                      head_dim_swa=16, n_ff=64, n_layer=4, swa_every=2, n_swa=8, n_embd_per_layer=8,
                      softcap=30.0, tied=True, seed=21)
    tmp = tmp_path_factory.mktemp("vision_gemma4")
    add_vocab = vocab_writer(vocab)
    template = (sdist.templates_dir() / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")

    def add_vocab_and_template(writer):
        add_vocab(writer)
        writer.add_chat_template(template)

    write_model(tmp / "text.gguf", text, extra_metadata=add_vocab_and_template)
    write_projector(tmp / "mmproj.gguf", PROJ)
    images = []
    for h, w in SIZES:
        np.save(tmp / f"image_{h}x{w}.npy", _pixels(h, w))
        images.append(tmp / f"image_{h}x{w}.npy")
    return tmp / "text.gguf", tmp / "mmproj.gguf", images


@pytest.fixture(scope="module")
def prompt(files):
    """The chat template's rendering of MESSAGES with libmtmd's marker for the image (as
    llama.cpp's server makes an image part), less the template's BOS (mtmd_tokenize adds it)."""
    import elelem
    from elelem.api.prompts import render_chat
    model, mmproj, _ = files
    with elelem.LLM(model, n_ctx=64, n_threads=THREADS) as llm:
        marked = [{**MESSAGES[0], "content": [p if p["type"] == "text" else {"type": "text", "text": "<__media__>"}
                                              for p in MESSAGES[0]["content"]]}]
        text = render_chat(llm.chat_template, marked)
    assert text.startswith("<bos>") and text.count("<__media__>") == 1
    return text[len("<bos>"):]


@pytest.fixture(scope="module", params=["on", "off"])
def reference(request, llamacpp, files, prompt):
    model, mmproj, images = files
    return request.param, llamacpp.vision(model, mmproj, images, [prompt], request.param)


@pytest.mark.real_model
def test_image_embeddings_equal_libmtmds(files, reference):
    from elelem.vision import Image, Projector

    flash, ref = reference
    _, mmproj, images = files
    with Projector(mmproj, n_threads=THREADS, flash_attn=flash == "on") as projector:
        assert projector.spec.clamps   # the bounds are read, and (below) bind: libmtmd applies them too
        for path, record in zip(images, ref["images"]):
            got = projector.encode(Image.from_pixels(np.load(path))).embeddings
            want = _floats(record["embeddings"])
            assert want.size == got.size, f"{path.name}: {got.shape[0]} tokens, libmtmd {want.size // 64}"
            diff = np.abs(got.astype(np.float64) - want.reshape(got.shape))
            assert diff.max() == 0.0, f"{path.name} (flash attention {flash}): max |diff| {diff.max():.3g}"


@pytest.mark.real_model
def test_logits_and_greedy_tokens_after_an_image_equal_llamacpps(files, reference):
    """The prompt as mtmd_tokenize cut it (Gemma 4's <|image> and <image|> around the image),
    the image's rows from elelem's projector, evaluated by the engine: the last logits bit
    for bit, the greedy path, and the same through chat() with the image as a data URL."""
    import elelem
    from elelem.vision import Image

    flash, ref = reference
    model, mmproj, images = files
    record = ref["prompts"][0]
    with elelem.LLM(model, mmproj=mmproj, n_ctx=512, kv_type="f16", n_threads=THREADS, speculative=False,
                    **elelem_kernel_options()) as llm:
        assert llm.engine.media.bidirectional
        llm.images.projector.flash_attn = flash == "on"
        embedded = llm.images.projector.encode(Image.from_pixels(np.load(images[0])))
        begin, end = (llm.tokenize(t, add_bos=False, special=True) for t in ("<|image>", "<image|>"))
        assert len(begin) == len(end) == 1   # Gemma 4's special tokens
        ids = []
        for chunk in record["chunks"]:
            if "text" in chunk:
                ids += chunk["text"]
            else:
                assert chunk["image"] == embedded.n_tokens
                assert ids[-1] == begin[0]
                ids += llm.engine.media.add(embedded.digest, embedded.embeddings)
        assert record["n_past"] == len(ids)
        logits = llm.prefill(ids)
        diff = np.abs(logits.astype(np.float64) - _floats(record["logits"]))
        assert diff.max() == 0.0, f"max |diff| {diff.max():.3g}"
        greedy = record["greedy"]
        ends = [i for i, t in enumerate(greedy) if t in llm.eos_ids]
        greedy = greedy[:ends[0]] if ends else greedy
        assert llm.generate_tokens(ids, len(record["greedy"])) == greedy

        llm.reset()
        messages = [{**MESSAGES[0], "content": [
            p if p["type"] == "text" else {"type": "image_url", "image_url": {"url": _png_url(np.load(images[0]))}}
            for p in MESSAGES[0]["content"]]}]
        reply = llm.create_chat_completion(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert reply["usage"]["prompt_tokens"] == record["n_past"]
        assert reply["usage"]["completion_tokens"] == len(greedy)
        llm.reset()
        text = llm.chat(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert text == llm.detokenize(greedy).decode("utf-8", "replace")


# Smaller than any Gemma 4 image (70 tokens at least): libmtmd decodes the image in pieces
# of this many rows (mtmd_helper_decode_image_chunk), each a step attending both ways within
# itself and to every cell before it, but not to the pieces after it.
SMALL_BATCH = 32


@pytest.fixture(scope="module", params=["on", "off"])
def small_batch_reference(request, llamacpp, files, prompt):
    model, mmproj, images = files
    return request.param, llamacpp.vision(model, mmproj, images[:1], [prompt], request.param, n_batch=SMALL_BATCH)


@pytest.mark.real_model
def test_an_image_longer_than_n_batch_is_evaluated_in_pieces_as_llamacpp_does(files, small_batch_reference):
    """An image of 70 rows with n_batch 32 on both sides (llama.cpp's n_ubatch too, which a
    non-causal piece needs): the rows evaluated 32, 32 and 6 at a time, as
    mtmd_helper_eval_chunks cuts them; the last logits bit for bit and the greedy path."""
    import elelem
    from elelem.vision import Image

    flash, ref = small_batch_reference
    model, mmproj, images = files
    assert ref["header"]["n_batch"] == SMALL_BATCH
    record = ref["prompts"][0]
    with elelem.LLM(model, mmproj=mmproj, n_ctx=512, n_batch=SMALL_BATCH, kv_type="f16", n_threads=THREADS,
                    speculative=False, **elelem_kernel_options()) as llm:
        llm.images.projector.flash_attn = flash == "on"
        embedded = llm.images.projector.encode(Image.from_pixels(np.load(images[0])))
        assert embedded.n_tokens > 2 * SMALL_BATCH
        ids = []
        for chunk in record["chunks"]:
            if "text" in chunk:
                ids += chunk["text"]
            else:
                assert chunk["image"] == embedded.n_tokens
                ids += llm.engine.media.add(embedded.digest, embedded.embeddings)
        before = llm.engine.media.images_evaluated
        logits = llm.prefill(ids)
        assert llm.engine.media.images_evaluated - before == -(-embedded.n_tokens // SMALL_BATCH)
        diff = np.abs(logits.astype(np.float64) - _floats(record["logits"]))
        assert diff.max() == 0.0, f"max |diff| {diff.max():.3g}"
        greedy = record["greedy"]
        ends = [i for i, t in enumerate(greedy) if t in llm.eos_ids]
        greedy = greedy[:ends[0]] if ends else greedy
        llm.reset()
        assert llm.generate_tokens(ids, len(record["greedy"])) == greedy
