"""SmolVLM's projector (idefics3): slices, the encoder, and the text between the slices,
against a NumPy reference and against llama.cpp's libmtmd live, on the same files and pixels.

A synthetic idefics3 projector (tests/support/synthetic_mmproj.py, in the layout of the
converter's SmolVLMModel: SigLIP, a pixel shuffle, one linear) over a synthetic llama text
model carrying SmolLM2's vocabulary plus SmolVLM's added tokens (<fake_token_around_image>,
<global-img>, <row_R_col_C>).  The preprocessor's longest edge (80) is more than twice the
encoder's square (34), so every image is cut into up to 3 x 3 slices plus an overview; images
as raw RGB pixels (libmtmd's mtmd_bitmap_init takes pixels) of odd sizes, one pixel, huge
aspect ratios each way, and one already the longest edge.

Tolerance against libmtmd: none.  Each square goes through mtmd's Lanczos resizes and crops
(elelem/vision/slices.py, elelem/vision/resize.py) and clip_graph_siglip's idefics3 graph op
for op on the same ggml, so equal embeddings also say each square's pixels were equal.  The
chunks of an image alone (the text between its squares) and of a chat prompt are compared id
for id, the logits after the image bit for bit, the greedy tokens equal, flash attention on
and off.
"""
from __future__ import annotations

import numpy as np
import pytest

from elelem import errors
from elelem.model.projector import read_projector
from image_inputs import floats as _floats, pixels as _pixels, png_url_with_alpha as _png_url
from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import TinyConfig, write_model
from synthetic_mmproj import TinyProjector, idefics3_reference, pixel_shuffle, write_projector
from vocab_metadata import vocab_size, vocab_writer

# Squares of 34 pixels in patches of 4: 8 x 8 patches and 2 pixels never read, as SmolVLM2's 384 in 14s.
PROJ = TinyProjector(projector_type="idefics3", n_embd=32, n_head=4, n_ff=64, n_layer=2, image_size=34,
                     patch_size=4, n_merge=2, n_embd_out=64, longest_edge=80, seed=11,
                     image_mean=(0.48, 0.46, 0.41), image_std=(0.27, 0.26, 0.28))
ADDED = ("<fake_token_around_image>", "<global-img>",
         *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))
# (height, width): odd sizes, huge aspect ratios each way, one pixel, the encoder's square, the longest edge.
SIZES = [(37, 23), (5, 300), (300, 7), (1, 1), (34, 34), (80, 61), (64, 48)]
# What chat() renders for MESSAGES without a template of the file's own (ChatML), the image as libmtmd's marker.
PROMPT = "<|im_start|>user\nWhat is in<__media__> this picture?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def projector_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("idefics3") / "mmproj.gguf"
    return path, write_projector(path, PROJ)


# -- the reader, the slices and the encoder, without llama.cpp -------------------------------

def test_the_reader_reads_the_converters_layout(projector_file):
    path, _ = projector_file
    spec = read_projector(path)
    assert spec.projector_type == "idefics3" and spec.kind.slices == "idefics3"
    assert spec.hparams["longest_edge"] == 80 and spec.hparams["n_merge"] == 2
    assert spec.global_tensors["mm_input_proj"] == "mm.model.fc.weight"
    assert spec.tokens_per_square == PROJ.n_tokens == 16
    assert spec.n_image_tokens == (3 * 3 + 1) * 16      # 3 x 3 slices at most, and the overview
    assert not spec.kind.attends_both_ways(64)           # mtmd_decode_use_non_causal: causal


@pytest.mark.parametrize("cfg, error, message", [
    (PROJ.but(drop=("mm.model.fc.weight",)), errors.ModelShapeError, "mm.model.fc.weight"),
    (PROJ.but(cut=(("mm.model.fc.weight", 1, 100),)), errors.ModelShapeError, "mm.model.fc.weight"),
    (PROJ.but(cut=(("mm.model.fc.weight", 0, 48),)), errors.ModelShapeError, "mm.model.fc.weight"),
    (PROJ.but(drop=("v.position_embd.weight",)), errors.ModelShapeError, "v.position_embd.weight"),
    (PROJ.but(cut=(("v.blk.1.attn_k.bias", 0, 5),)), errors.ModelShapeError, "v.blk.1.attn_k.bias"),
    (PROJ.but(drop_keys=("clip.vision.preproc_image_size",)), errors.GGUFMetadataError, "preproc_image_size"),
    (PROJ.but(keys=(("clip.vision.preproc_image_size", 0),)), errors.GGUFMetadataError, "preproc_image_size"),
    (PROJ.but(keys=(("clip.vision.projector.scale_factor", 3),)), errors.GGUFMetadataError, "image_size"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_file_raises_an_error_naming_the_key_or_tensor(tmp_path, cfg, error, message):
    path = tmp_path / "bad.gguf"
    write_projector(path, cfg)
    with pytest.raises(error, match=message):
        read_projector(path)


def test_pixel_shuffle_reference_puts_each_block_in_one_row():
    """The NumPy reference of the op, checked by hand on a 4 x 2 grid of 1-wide patches."""
    grid = np.arange(8, dtype=np.float64).reshape(8, 1)        # patch (x, y) holds y * 4 + x
    out = pixel_shuffle(grid, 4, 2, 2)
    # blocks (0, 0) and (1, 0); in each, dx fastest then dy
    assert out.tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]


@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_idefics3_encoder_matches_the_numpy_reference(projector_file, flash_attn, tolerance=1e-3):
    """Within 1e-3 of the outputs' largest magnitude, for the reasons tests/test_vision_projector.py
    gives for gemma3 (the same SigLIP; F16 buckets of GELU's table and of the matmuls'
    activations).  A pixel shuffle in another order moves whole rows: differences of the
    outputs' own size."""
    core = pytest.importorskip("elelem._core")
    path, weights = projector_file
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors)
    for seed in range(2):
        pixels = np.random.default_rng(seed).uniform(-1, 1, (3, 34, 34)).astype(np.float32)
        got = vm.encode(pixels, 2, flash_attn)
        want = idefics3_reference(PROJ, weights, pixels)
        assert got.shape == (16, 64)
        assert np.abs(got - want).max() <= tolerance * np.abs(want).max(), np.abs(got - want).max()
    vm.close()


def test_slicing_follows_mtmds_sizes():
    from elelem.vision.slices import idefics3_sizes
    # The longer side made the longest edge, the other truncated then made even; slices to cover.
    assert idefics3_sizes(23, 37, 80, 34) == ((50, 80), (2, 3))
    assert idefics3_sizes(300, 5, 80, 34) == ((80, 2), (3, 1))
    assert idefics3_sizes(1, 1, 80, 34) == ((80, 80), (3, 3))
    assert idefics3_sizes(64, 32, 64, 32) == ((64, 32), (2, 1))
    assert idefics3_sizes(61, 80, 80, 34) == ((62, 80), (2, 3))   # 80 * (61 / 80): 61, odd, rounded up to 62
    with pytest.raises(errors.InvalidArgumentError, match="too thin"):
        idefics3_sizes(1, 200, 80, 34)   # libmtmd asserts in its resize here


def test_a_sliced_image_is_encoded_once_and_refuses_a_single_square(projector_file):
    pytest.importorskip("elelem._core")
    from elelem.vision import Image, Projector
    from elelem.vision.slices import Piece
    path, _ = projector_file
    image = Image.from_pixels(_pixels(37, 23))
    with Projector(path, n_threads=2) as projector:
        encoded = projector.encode_image(image)
        assert len(encoded.squares) == 2 * 3 + 1 and projector.n_encoded == 7
        assert len({sq.digest[:16] for sq in encoded.squares}) == 7     # each square its own ids
        assert encoded.layout[:2] == ["<fake_token_around_image><row_1_col_1>", 0]
        assert encoded.layout[-5:] == [Piece("\n\n"), Piece("<fake_token_around_image>"), Piece("<global-img>"), 6,
                                       Piece("<fake_token_around_image>")]
        assert projector.encode_image(Image.from_pixels(image.pixels.copy())) is encoded
        assert projector.encode(image).n_tokens == 7 * 16 and projector.n_encoded == 7
        with pytest.raises(errors.InvalidArgumentError, match="squares"):
            projector.pixels(image)
        with pytest.raises(errors.InvalidArgumentError, match="too thin"):
            projector.encode_image(Image.from_pixels(_pixels(1, 200)))


def test_damaged_idefics3_files_raise_elelem_errors_only(projector_file, tmp_path):
    """Bytes of the header, keys and tensor table overwritten (seed 9): reading raises an
    ElelemError or succeeds, and a file that reads opens and encodes without a crash."""
    core = pytest.importorskip("elelem._core")
    from elelem.gguf import read_gguf
    path, _ = projector_file
    good = path.read_bytes()
    header = read_gguf(path).data_offset
    rng = np.random.default_rng(9)
    opened = 0
    for case in range(150):
        data = bytearray(good)
        for _ in range(rng.integers(1, 4)):
            data[rng.integers(header)] = rng.integers(256)
        bad = tmp_path / f"bad{case}.gguf"
        bad.write_bytes(bytes(data))
        try:
            spec = read_projector(bad)
            vm = core.open_vision_model(str(bad), spec.projector_type, spec.hparams, spec.global_tensors,
                                        spec.layer_tensors, clamps=spec.clamps)
        except errors.ElelemError:
            continue
        opened += 1
        try:
            vm.encode(np.zeros((3, spec.image_size, spec.image_size), np.float32))
        except errors.InvalidArgumentError:
            pass
        vm.close()
    assert opened < 150


# -- against libmtmd -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    n_vocab = vocab_size(smollm_path) + len(ADDED)
    text = TinyConfig(arch="llama", n_vocab=n_vocab, n_embd=64, n_head=4, n_head_kv=2, n_layer=2, n_ff=128,
                      tied=True, seed=13)
    tmp = tmp_path_factory.mktemp("vision_idefics3")
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


@pytest.mark.real_model
def test_square_embeddings_and_the_text_between_them_equal_libmtmds(files, reference):
    import elelem
    from elelem.vision import Image

    flash, ref = reference
    model, mmproj, images = files
    with elelem.LLM(model, mmproj=mmproj, n_ctx=2048, n_threads=THREADS) as llm:
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
def test_logits_and_greedy_tokens_after_a_sliced_image_equal_llamacpps(files, reference):
    import elelem
    from elelem.vision import Image

    flash, ref = reference
    model, mmproj, images = files
    record = ref["prompts"][0]
    with elelem.LLM(model, mmproj=mmproj, n_ctx=2048, kv_type="f16", n_threads=THREADS, speculative=False,
                    **elelem_kernel_options()) as llm:
        assert not llm.engine.media.bidirectional
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

        # The same through chat(): the image as an RGBA PNG data URL, the prompt rendered and cut as llama.cpp's
        # server does; the image's squares found in the projector's cache and the KV cache's cells kept or not.
        llm.reset()
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "What is in"},
            {"type": "image_url", "image_url": {"url": _png_url(np.load(images[0]))}},
            {"type": "text", "text": " this picture?"}]}]
        reply = llm.create_chat_completion(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert reply["usage"]["prompt_tokens"] == record["n_past"]
        assert reply["usage"]["completion_tokens"] == len(greedy)
        llm.reset()
        text = llm.chat(messages, max_tokens=len(record["greedy"]), temperature=0)
        assert text == llm.detokenize(greedy).decode("utf-8", "replace")
