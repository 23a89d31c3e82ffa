"""LFM2-VL's projector (lfm2): SigLIP2 NaFlex at any size, its tiles and thumbnail, and the text
around them, against libmtmd live on the same files and pixels.

A synthetic lfm2 projector (tests/support/synthetic_mmproj.py, the layout of the converter's
LFM2VLModel: patch kernel F16, a 16 x 16 position table F32 resized to each image's patch grid,
a pixel unshuffle, a LayerNorm and a GELU MLP) over a synthetic lfm2 text model (short
convolutions and attention) carrying SmolLM2's vocabulary plus LFM2-VL's image tokens.  Images as
raw RGB pixels: odd sizes, one pixel and huge aspect ratios (scaled to between 64 and 256
tokens), the table's own size, and two past twice the most tokens, which libmtmd cuts into
512-pixel tiles (a 2 x 2 grid, a 6 x 1 grid) plus a thumbnail.

Tolerance: none: the same resizes (bilinear, mtmd's fixed point), the same graph on the same
ggml (ggml_interpolate's antialiased bilinear for the positions), flash attention on and off;
the chunks compared id for id, the logits after the image bit for bit, the greedy tokens equal.
"""
from __future__ import annotations

import numpy as np
import pytest

from elelem import errors
from elelem.model.projector import read_projector
from image_inputs import floats as _floats, pixels as _pixels, png_url_with_alpha as _png_url
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, write_model
from synthetic_mmproj import TinyProjector, write_projector
from vocab_metadata import vocab_size, vocab_writer

PROJ = TinyProjector(projector_type="lfm2", n_embd=32, n_head=4, n_ff=64, n_layer=2, image_size=256,
                     patch_size=16, n_merge=2, n_embd_out=64, seed=17,
                     image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
ADDED = ("<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
         *(f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11)))
# (height, width)
SIZES = [(37, 23), (5, 300), (300, 7), (1, 1), (256, 256), (200, 600), (700, 800), (300, 1800)]
PROMPT = "<|im_start|>user\nWhat is in<__media__> this picture?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def projector_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lfm2") / "mmproj.gguf"
    return path, write_projector(path, PROJ)


def test_the_reader_reads_the_converters_layout(projector_file):
    path, _ = projector_file
    spec = read_projector(path)
    assert spec.projector_type == "lfm2" and spec.kind.slices == "lfm2"
    assert spec.global_tensors["mm_norm_w"] == "mm.input_norm.weight"
    assert spec.global_tensors["mm_0_w"] == "mm.1.weight" and spec.global_tensors["mm_1_w"] == "mm.2.weight"
    assert spec.hparams["dynamic_size"] and not spec.kind.attends_both_ways(64)


@pytest.mark.parametrize("cfg, message", [
    (PROJ.but(drop=("mm.2.bias",)), "mm.2.bias"),
    (PROJ.but(cut=(("mm.1.weight", 1, 100),)), "mm.1.weight"),
    (PROJ.but(cut=(("v.position_embd.weight", 0, 250),)), "v.position_embd.weight"),
    (PROJ.but(cut=(("mm.input_norm.bias", 0, 7),)), "mm.input_norm.bias"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_file_raises_an_error_naming_the_tensor(tmp_path, cfg, message):
    path = tmp_path / "bad.gguf"
    write_projector(path, cfg)
    with pytest.raises(errors.ModelShapeError, match=message):
        read_projector(path)


def test_tiling_follows_mtmds_rules():
    from elelem.vision.slices import lfm2_grid, lfm2_should_tile, lfm2_target_ratios
    ratios = lfm2_target_ratios()
    assert ratios[:2] == [(1, 2), (2, 1)] and len(ratios) == len(set(ratios)) == 26
    assert not lfm2_should_tile(600, 200, 16, 32, 256 * 32 * 32)
    assert lfm2_should_tile(800, 700, 16, 32, 256 * 32 * 32)
    assert lfm2_grid(800, 700) == (2, 2) and lfm2_grid(1800, 300) == (6, 1)


def _ids(llm, text: str, images) -> list[int]:
    """elelem's ids for ``text`` with its markers made images, as chat() builds them."""
    return llm.images.model_prompt_ids(llm.assets, text, images)


def _flatten(chunks) -> list:
    """libmtmd's chunks as a list of token ids and image lengths, elelem's ids the same way."""
    out: list = []
    for chunk in chunks:
        out += chunk["text"] if "text" in chunk else [("image", chunk["image"])]
    return out


def _elelem_flat(ids: list[int]) -> list:
    from elelem.engine.media import image_run
    out: list = []
    i = 0
    while i < len(ids):
        n = image_run(ids[i:])
        if n:
            out.append(("image", n))
            i += n
        else:
            out.append(ids[i])
            i += 1
    return out


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    text = TinyConfig(arch="lfm2", n_vocab=vocab_size(smollm_path) + len(ADDED), head_dim=16, n_layer=3,
                      tied=True, seed=19)
    tmp = tmp_path_factory.mktemp("vision_lfm2")
    write_model(tmp / "text.gguf", text, extra_metadata=vocab_writer(smollm_path, ADDED))
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
def test_embeddings_and_the_text_around_them_equal_libmtmds(files, reference):
    import elelem
    from elelem.vision import Image

    flash, ref = reference
    model, mmproj, images = files
    with elelem.LLM(model, mmproj=mmproj, n_ctx=4096, n_threads=THREADS) as llm:
        projector = llm.images.projector
        projector.flash_attn = flash == "on"
        for path, record in zip(images, ref["images"]):
            image = Image.from_pixels(np.load(path))
            got = projector.encode(image).embeddings
            want = _floats(record["embeddings"])
            assert want.size == got.size, f"{path.name}: {got.shape[0]} rows, libmtmd {want.size // 64}"
            diff = np.abs(got.astype(np.float64) - want.reshape(got.shape))
            assert diff.max() == 0.0, f"{path.name} (flash attention {flash}): max |diff| {diff.max():.3g}"
            assert _elelem_flat(_ids(llm, "<__media__>", [image])) == _flatten(record["chunks"]), path.name


@pytest.mark.real_model
def test_logits_and_greedy_tokens_after_an_image_equal_llamacpps(files, reference):
    import elelem
    from elelem.vision import Image

    flash, ref = reference
    model, mmproj, images = files
    record = ref["prompts"][0]
    with elelem.LLM(model, mmproj=mmproj, n_ctx=4096, kv_type="f16", n_threads=THREADS, speculative=False,
                    **elelem_kernel_options()) as llm:
        llm.images.projector.flash_attn = flash == "on"
        ids = _ids(llm, PROMPT, [Image.from_pixels(np.load(images[0]))])
        assert _elelem_flat(ids) == _flatten(record["chunks"])
        assert record["n_past"] == len(ids)
        logits = llm.prefill(ids)
        diff = np.abs(logits.astype(np.float64) - _floats(record["logits"]))
        assert diff.max() == 0.0, f"max |diff| {diff.max():.3g}"
        greedy = record["greedy"]
        ends = [i for i, t in enumerate(greedy) if t in llm.eos_ids]
        greedy = greedy[:ends[0]] if ends else greedy
        assert llm.generate_tokens(ids, len(record["greedy"])) == greedy


@pytest.mark.real_model
def test_a_conversation_with_the_same_image_reuses_its_embeddings_and_gives_a_fresh_models_reply(files):
    """An agent sends the same (tiled) screenshot each turn: the second turn encodes nothing,
    and what it reuses of the first (the recurrent state's snapshots, the KV cells) gives the
    reply a model that never saw the first turn gives."""
    import elelem

    model, mmproj, images = files
    url = _png_url(np.load(images[6]))
    first = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                          {"type": "text", "text": "What is wrong here?"}]}]
    with elelem.LLM(model, mmproj=mmproj, n_ctx=4096, n_threads=THREADS) as llm:
        reply = llm.chat(first, max_tokens=3, temperature=0)
        squares = llm.images.projector.n_encoded
        assert squares == 2 * 2 + 1
        second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And now?"}]
        again = llm.chat(second, max_tokens=4, temperature=0)
        assert llm.images.projector.n_encoded == squares
    with elelem.LLM(model, mmproj=mmproj, n_ctx=4096, n_threads=THREADS) as fresh:
        assert fresh.chat(second, max_tokens=4, temperature=0) == again
