"""Mistral's images (pixtral projectors over a mistral3 text model) against llama.cpp's
libmtmd, live, on the same files and pixels.

Synthetic pixtral projectors (tests/support/synthetic_mmproj.py, the converter's
LlavaVisionModel layout): pixtral-12b's (no patch merger, adapter biases) and
Mistral Small 3.1's (a 2 x 2 patch merger after an RMSNorm, no biases), each with
its [IMG_BREAK] embedding; over a synthetic mistral3 text model whose attention
temperature grows with the position (so an image's positions count), and a llama
one (Pixtral 12B's and Mistral Small 3.1's text as converted), carrying
SmolLM2's vocabulary ("[IMG_END]" is then plain text, tokenized alike on both
sides).  Images as raw RGB pixels (libmtmd's mtmd_bitmap_init takes pixels) of
odd sizes, one pixel (scaled up to 8 tokens), extreme aspect ratios and one past
1024 tokens (scaled down): every branch of calc_size_preserved_ratio and mtmd's
bicubic resize.

Tolerance: none.  The encoder is clip_graph_pixtral op for op on the same ggml, with
flash attention or without; the embeddings hold the [IMG_BREAK] rows, so equal
embeddings also say the preprocessed pixels, the grid and the breaks were mtmd's.
After an image the text logits are compared bit for bit (causal attention, as
mtmd_decode_use_non_causal says for pixtral), and the greedy tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

from image_inputs import floats as _floats, pixels as _pixels, png_url as _png_url
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, write_model
from synthetic_mmproj import TinyProjector, write_projector
from vocab_metadata import vocab_size, vocab_writer

PIXTRAL = TinyProjector(projector_type="pixtral", n_embd=32, n_head=4, n_ff=48, n_layer=2, patch_size=4,
                        image_size=64, n_embd_out=64, n_merge=1, eps=1e-5, seed=3)
PROJ = {"pixtral": PIXTRAL, "pixtral-merge": PIXTRAL.but(n_merge=2, mm_bias=False, seed=4)}
TEXT = TinyConfig(arch="mistral3", n_vocab=49152, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_layer=2,
                  tied=True, yarn=4.0, yarn_orig_ctx=16, yarn_log_mul=0.5, attn_temp=0.3, seed=9)
# Pixtral 12B's and Mistral Small 3.1's text models are converted as llama.
TEXTS = {"mistral3": TEXT, "llama": TinyConfig(arch="llama", n_vocab=49152, n_embd=64, n_head=4, n_head_kv=2,
                                                n_layer=2, tied=True, seed=10)}
# Odd sizes, a huge aspect ratio each way, one pixel, and one past 1024 tokens (unmerged).
SIZES = [(37, 23), (5, 300), (300, 7), (1, 1), (150, 200)]
PROMPT = "<|im_start|>user\nWhat is in<__media__> this picture?<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [PROMPT, "<|im_start|>user\nCompare<__media__> with<__media__>.<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    assert vocab_size(smollm_path) == TEXT.n_vocab
    tmp = tmp_path_factory.mktemp("vision_pixtral")
    for arch, cfg in TEXTS.items():
        write_model(tmp / f"{arch}.gguf", cfg, extra_metadata=vocab_writer(smollm_path))
    for name, cfg in PROJ.items():
        write_projector(tmp / f"{name}.gguf", cfg)
    images = []
    for h, w in SIZES:
        np.save(tmp / f"image_{h}x{w}.npy", _pixels(h, w))
        images.append(tmp / f"image_{h}x{w}.npy")
    return tmp, images


@pytest.fixture(scope="module", params=[("pixtral", "on", "mistral3"), ("pixtral", "off", "mistral3"),
                                        ("pixtral-merge", "on", "mistral3"), ("pixtral-merge", "off", "mistral3"),
                                        ("pixtral", "on", "llama")], ids=lambda p: f"{p[0]}-fa-{p[1]}-{p[2]}")
def reference(request, llamacpp, files):
    tmp, images = files
    name, flash, arch = request.param
    return name, flash, arch, llamacpp.vision(tmp / f"{arch}.gguf", tmp / f"{name}.gguf", images, PROMPTS, flash)


@pytest.mark.real_model
def test_image_embeddings_equal_libmtmds(files, reference):
    from elelem.vision import Image, Projector

    name, flash, _, ref = reference
    tmp, images = files
    merge = PROJ[name].n_merge
    with Projector(tmp / f"{name}.gguf", n_threads=THREADS, flash_attn=flash == "on") as projector:
        for path, record in zip(images, ref["images"]):
            image = Image.from_pixels(np.load(path))
            got = projector.encode(image).embeddings
            want = _floats(record["embeddings"])
            ny, nx = projector.pixels(image).shape[1:]
            cols, rows = nx // (4 * merge), ny // (4 * merge)
            assert got.shape == (cols * rows + rows - 1, 64)
            assert want.size == got.size, f"{path.name}: {got.shape[0]} tokens, libmtmd {want.size // 64}"
            diff = np.abs(got.astype(np.float64) - want.reshape(got.shape))
            assert diff.max() == 0.0, f"{path.name} ({name}, flash attention {flash}): max |diff| {diff.max():.3g}"


def _prompt_ids(llm, record, images) -> list[int]:
    """The prompt as mtmd_tokenize cut it (its chunks), each image's ids from elelem's projector."""
    from elelem.vision import Image

    ids, k = [], 0
    for chunk in record["chunks"]:
        if "text" in chunk:
            ids += chunk["text"]
            continue
        embedded = llm.images.projector.encode(Image.from_pixels(np.load(images[k])))
        k += 1
        assert chunk["image"] == embedded.n_tokens and embedded.grid is None
        ids += llm.engine.media.add(embedded.digest, embedded.embeddings)
    assert record["n_past"] == len(ids)
    return ids


def _open(files, name, flash, arch):
    import elelem

    tmp, _ = files
    llm = elelem.LLM(tmp / f"{arch}.gguf", mmproj=tmp / f"{name}.gguf", n_ctx=1024, kv_type="f16", n_threads=THREADS,
                     speculative=False, **elelem_kernel_options())
    llm.images.projector.flash_attn = flash == "on"
    return llm


@pytest.mark.real_model
def test_logits_and_greedy_tokens_after_images_equal_llamacpps(files, reference):
    """One image and two (the second's positions after the first's): the last logits bit
    for bit, causal within the image; the greedy path after one; the same through chat()
    with the image as a data URL ("[IMG_END]" after the image, nothing before it)."""
    name, flash, arch, ref = reference
    _, images = files
    with _open(files, name, flash, arch) as llm:
        assert not llm.engine.media.bidirectional
        for record in ref["prompts"]:
            llm.reset()
            logits = llm.prefill(_prompt_ids(llm, record, images))
            diff = np.abs(logits.astype(np.float64) - _floats(record["logits"]))
            assert diff.max() == 0.0, f"max |diff| {diff.max():.3g}"
        record = ref["prompts"][0]
        greedy = record["greedy"]
        ends = [i for i, t in enumerate(greedy) if t in llm.eos_ids]
        greedy = greedy[:ends[0]] if ends else greedy
        llm.reset()
        assert llm.generate_tokens(_prompt_ids(llm, record, images), len(record["greedy"])) == greedy

        llm.reset()
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "What is in"},
            {"type": "image_url", "image_url": {"url": _png_url(np.load(images[0]))}},
            {"type": "text", "text": " this picture?"}]}]
        reply = llm.create_chat_completion(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert reply["usage"]["prompt_tokens"] == record["n_past"]
        llm.reset()
        text = llm.chat(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert text == llm.detokenize(greedy).decode("utf-8", "replace")
