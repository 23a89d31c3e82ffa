"""Qwen2-VL and Qwen2.5-VL images against llama.cpp's libmtmd, live, on the same files and pixels.

Synthetic qwen2vl and qwen25vl projectors (tests/support/synthetic_mmproj.py,
the converter's Qwen2VLVisionModel layout: two temporal conv slices, split
Q/K/V, the merger as mm.0 / mm.2; Qwen2.5-VL with RMSNorms, a gated SiLU MLP
and window attention in every layer but each 2nd) over a synthetic qwen2vl
text model (multi-section RoPE) carrying SmolLM2's vocabulary.  Images are
given as raw RGB pixels of odd sizes and extreme aspect ratios (libmtmd's
mtmd_bitmap_init takes pixels).  libmtmd's side is
tests/support/fixtures/make_vision_fixtures.py under the reference build.

Tolerance: none.  The encoder is clip_graph_qwen2vl op for op on the same
ggml, with flash attention or without; the pixels are mtmd's smart resize
(bicubic) and normalisation, so equal embeddings also say the pixels and the
grid were equal.  After an image the text logits are compared bit for bit:
the image's rows take M-RoPE's 2D positions, the text after it the position
max(columns, rows) past the image's start, as mtmd_helper_eval_chunks places them.
"""
from __future__ import annotations

import numpy as np
import pytest

from image_inputs import floats as _floats, png_url as _png_url
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, write_model
from synthetic_mmproj import TinyProjector, write_projector
from vocab_metadata import vocab_size, vocab_writer

# patch 8: Qwen2.5-VL's 112-pixel windows are 7 x 7 merged tokens, so the larger images hold several.
PROJ = {t: TinyProjector(projector_type=t, n_embd=32, n_head=4, n_ff=48, n_layer=4, patch_size=8, image_size=64,
                         n_embd_out=64) for t in ("qwen2vl_merger", "qwen2.5vl_merger")}
# RMSNorm's epsilon 1e-30, which changes no float32 sum of squares: llama.cpp's qwen2vl
# (llama_model_qwen2vl::load_arch_hparams, in this version) never reads
# attention.layer_norm_rms_epsilon and normalises with 0, where elelem takes the file's
# value (1e-6 in the released models); with 1e-30 both sides compute the same bits.
TEXT = TinyConfig(arch="qwen2vl", n_vocab=49152, n_embd=64, n_head=4, n_head_kv=2, n_layer=2, tied=True,
                  rms_eps=1e-30)
# Odd sizes (under the minimum of 8 merged tokens: scaled up), extreme aspect ratios, one pixel,
# a grey image, and sizes spanning several attention windows.
SIZES = [(37, 23), (5, 300), (300, 7), (1, 1), (64, 48), (150, 200), (129, 257)]
PROMPT = "<|im_start|>user\nWhat is in<__media__> this picture?<|im_end|>\n<|im_start|>assistant\n"
# Two images (the second one's rows start where the first one's positions end), and none (M-RoPE's text positions).
PROMPTS = [PROMPT, "<|im_start|>user\nCompare<__media__> with<__media__>.<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nNo picture here.<|im_end|>\n<|im_start|>assistant\n"]


def _pixels(h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(h * 1000 + w)
    smooth = rng.integers(0, 256, (max(1, h // 4 + 1), max(1, w // 4 + 1), 3)).astype(np.float64)
    px = np.kron(smooth, np.ones((4, 4, 1)))[:h, :w] + rng.normal(0, 12, (h, w, 3))
    px = np.clip(px, 0, 255).astype(np.uint8)
    if (h, w) == (64, 48):
        px[:] = px[:, :, :1]   # grey, as a decoder gives a greyscale file
    return px


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    assert vocab_size(smollm_path) == TEXT.n_vocab
    tmp = tmp_path_factory.mktemp("vision_qwen2vl")
    write_model(tmp / "text.gguf", TEXT, extra_metadata=vocab_writer(smollm_path))
    for ptype, cfg in PROJ.items():
        write_projector(tmp / f"{ptype}.gguf", cfg)
    images = []
    for h, w in SIZES:
        np.save(tmp / f"image_{h}x{w}.npy", _pixels(h, w))
        images.append(tmp / f"image_{h}x{w}.npy")
    return tmp / "text.gguf", tmp, images


@pytest.fixture(scope="module", params=[("qwen2vl_merger", "on"), ("qwen2.5vl_merger", "on"),
                                        ("qwen2.5vl_merger", "off")], ids=lambda p: f"{p[0]}-fa-{p[1]}")
def reference(request, llamacpp, files):
    model, tmp, images = files
    ptype, flash = request.param
    return ptype, flash, llamacpp.vision(model, tmp / f"{ptype}.gguf", images, PROMPTS, flash)


@pytest.mark.real_model
def test_image_embeddings_equal_libmtmds(files, reference):
    from elelem.vision import Image, Projector

    ptype, flash, ref = reference
    _, tmp, images = files
    with Projector(tmp / f"{ptype}.gguf", n_threads=THREADS, flash_attn=flash == "on") as projector:
        for path, record in zip(images, ref["images"]):
            got = projector.encode(Image.from_pixels(np.load(path)))
            want = _floats(record["embeddings"])
            assert got.embeddings.size == want.size, f"{path.name}: {got.embeddings.shape[0]} tokens, grid {got.grid}"
            assert got.grid[0] * got.grid[1] == got.n_tokens
            diff = np.abs(got.embeddings.astype(np.float64).reshape(-1) - want)
            assert diff.max() == 0.0, f"{path.name} ({ptype}, flash attention {flash}): max |diff| {diff.max():.3g}"


def _prompt_ids(llm, record, images) -> list[int]:
    """The prompt as mtmd_tokenize cut it (its chunks), each image's ids from elelem's projector."""
    from elelem.vision import Image

    ids, k, n_pos = [], 0, 0
    for chunk in record["chunks"]:
        if "text" in chunk:
            ids += chunk["text"]
            n_pos += len(chunk["text"])
            continue
        embedded = llm.images.projector.encode(Image.from_pixels(np.load(images[k])))
        k += 1
        assert chunk["image"] == embedded.n_tokens
        ids += llm.engine.media.add(embedded.digest, embedded.embeddings, embedded.grid)
        n_pos += max(embedded.grid)   # mtmd counts an image as max(columns, rows) positions, not its rows
    assert record["n_past"] == n_pos
    return ids


def _open(files, ptype, flash):
    import elelem

    model, tmp, _ = files
    llm = elelem.LLM(model, mmproj=tmp / f"{ptype}.gguf", n_ctx=512, kv_type="f16", n_threads=THREADS,
                     speculative=False, **elelem_kernel_options())
    llm.images.projector.flash_attn = flash == "on"
    return llm


@pytest.mark.real_model
def test_logits_after_images_equal_llamacpps(files, reference):
    """One image, two, none: the images' rows placed in 2D (M-RoPE), the text
    after each at max(columns, rows) past its start; the last logits bit for bit."""
    ptype, flash, ref = reference
    with _open(files, ptype, flash) as llm:
        diffs = []
        for record in ref["prompts"]:
            llm.reset()
            logits = llm.prefill(_prompt_ids(llm, record, files[2]))
            diff = np.abs(logits.astype(np.float64) - _floats(record["logits"]))
            diffs.append(diff.max())
        assert max(diffs) == 0.0, diffs


@pytest.mark.real_model
def test_greedy_tokens_after_an_image_equal_llamacpps(files, reference):
    """The greedy path after an image; the same through chat(), with Qwen's
    <|vision_start|> ... <|vision_end|> markers around the image as mtmd puts them."""
    ptype, flash, ref = reference
    model, tmp, images = files
    record = ref["prompts"][0]
    with _open(files, ptype, flash) as llm:
        ids = _prompt_ids(llm, record, images)
        greedy = record["greedy"]
        ends = [i for i, t in enumerate(greedy) if t in llm.eos_ids]
        greedy = greedy[:ends[0]] if ends else greedy
        assert llm.generate_tokens(ids, len(record["greedy"])) == greedy

        llm.reset()
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "What is in"},
            {"type": "image_url", "image_url": {"url": _png_url(np.load(images[0]))}},
            {"type": "text", "text": " this picture?"}]}]
        text = llm.chat(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert text == llm.detokenize(greedy).decode("utf-8", "replace")


@pytest.mark.real_model
def test_a_reused_prefix_and_a_saved_state_keep_the_images_positions(files, reference):
    """Past an image the rotary position falls behind the cell's (M-RoPE).
    The prompt evaluated in two requests (the second reusing the first's
    cells, images included), and a text prompt continued from a saved and
    loaded state, give llama.cpp's logits: each cell keeps the position of
    the token after it, and a state carries it."""
    ptype, flash, ref = reference
    record = ref["prompts"][1]   # two images
    want = _floats(record["logits"])
    with _open(files, ptype, flash) as llm:
        ids = _prompt_ids(llm, record, files[2])
        cut = len(ids) - 3   # in the text after the second image
        llm.prefill(ids[:cut])
        images = llm.engine.media.images_evaluated
        logits = llm.prefill(ids)
        assert llm.engine.media.images_evaluated == images   # the images' cells were reused
        assert np.abs(logits.astype(np.float64) - want).max() == 0.0
        # A saved state (text only: states refuse image ids) keeps the cells' positions too.
        text_record = ref["prompts"][2]
        ids = _prompt_ids(llm, text_record, files[2])
        llm.reset()
        llm.prefill(ids[:-3])
        state = llm.save_state()
    with _open(files, ptype, flash) as fresh:   # cells that never held these positions
        fresh.load_state(state)
        logits = fresh.prefill(ids)
        assert np.abs(logits.astype(np.float64) - _floats(text_record["logits"])).max() == 0.0
