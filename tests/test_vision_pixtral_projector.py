"""Pixtral projector files (Mistral Small 3.x, Devstral, Ministral 3): the reader's
checks, the sizes, the encoder against a NumPy reference (its 2D RoPE with interleaved
frequencies, Mistral Small 3.1's patch merger, the [IMG_BREAK] rows), and damaged files.
The embeddings themselves are compared with libmtmd's, bit for bit, in
tests/test_vision_pixtral.py."""
from __future__ import annotations

import numpy as np
import pytest

from elelem import errors
from elelem.model.projector import read_projector
from elelem.vision.images import Image
from elelem.vision.preprocess import target_size
from synthetic_mmproj import TinyProjector, write_projector

# pixtral-12b's layout (no merger, adapter biases) and Mistral Small 3.1's (2 x 2 merger, no biases).
PIXTRAL = TinyProjector(projector_type="pixtral", n_embd=32, n_head=4, n_ff=48, n_layer=2, patch_size=4,
                        image_size=64, n_embd_out=64, n_merge=1, eps=1e-5, seed=3)
MERGED = PIXTRAL.but(n_merge=2, mm_bias=False, seed=4)


@pytest.mark.parametrize("cfg", [PIXTRAL, MERGED], ids=["pixtral", "merged"])
def test_the_reader_reads_the_converters_pixtral_layout(tmp_path, cfg):
    path = tmp_path / "pixtral.gguf"
    write_projector(path, cfg)
    spec = read_projector(path)
    h = spec.hparams
    assert spec.projector_type == "pixtral"
    assert (h["n_merge"], h["norm"], h["ffn_op"], h["rope_theta"], h["rope_2d_interleaved"]) == \
        (cfg.n_merge, "rms", "silu", 10000.0, True)
    assert spec.kind.image_begin == "" and spec.kind.image_end == "[IMG_END]"
    assert not spec.kind.attends_both_ways(64)   # mtmd_decode_use_non_causal: causal
    g = spec.global_tensors
    assert g["img_break"] == "v.token_embd.img_break" and g["pre_ln_w"] == "v.pre_ln.weight"
    assert (g["mm_0_w"], g["mm_1_w"]) == ("mm.1.weight", "mm.2.weight")
    assert (g["mm_patch_merger"] is not None) == (cfg.n_merge > 1) == (g["mm_input_norm"] is not None)
    assert (g["mm_0_b"] is not None) == cfg.mm_bias
    assert spec.layer_tensors[0]["gate_w"] == "v.blk.0.ffn_gate.weight"
    assert spec.image_mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))


BAD = [
    (MERGED.but(drop=("mm.patch_merger.weight",)), errors.ModelShapeError, "mm.patch_merger.weight"),
    (MERGED.but(drop=("mm.input_norm.weight",)), errors.ModelShapeError, "mm.input_norm.weight"),
    (MERGED.but(drop_keys=("clip.vision.spatial_merge_size",)), errors.ModelShapeError,
     "spatial_merge_size is 1"),
    (PIXTRAL.but(drop=("v.token_embd.img_break",)), errors.ModelShapeError, "v.token_embd.img_break"),
    (PIXTRAL.but(cut=(("v.token_embd.img_break", 0, 32),)), errors.ModelShapeError, "v.token_embd.img_break"),
    (PIXTRAL.but(cut=(("mm.2.weight", 0, 48),)), errors.ModelShapeError, "mm.2.weight"),
    (PIXTRAL.but(cut=(("mm.1.weight", 1, 16),)), errors.ModelShapeError, "mm.1.weight"),
    (PIXTRAL.but(cut=(("mm.1.bias", 0, 8),)), errors.ModelShapeError, "mm.1.bias"),
    (MERGED.but(cut=(("mm.patch_merger.weight", 1, 64),)), errors.ModelShapeError, "mm.patch_merger.weight"),
    (PIXTRAL.but(drop=("v.blk.1.ffn_up.weight",)), errors.ModelShapeError, "v.blk.1.ffn_up.weight"),
    (PIXTRAL.but(keys=(("clip.vision.spatial_merge_size", 0),)), errors.GGUFMetadataError, "spatial_merge_size"),
]


@pytest.mark.parametrize("cfg,error,message", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_a_bad_pixtral_file_raises_an_error_naming_the_key_or_tensor(tmp_path, cfg, error, message):
    path = tmp_path / "bad.gguf"
    write_projector(path, cfg)
    with pytest.raises(error, match=message.replace(".", r"\.")):
        read_projector(path)


@pytest.mark.parametrize("size,merge,want", [
    ((37, 23), 1, (36, 24)),        # rounded to whole patches
    ((1, 1), 1, (12, 12)),          # scaled up to 8 tokens at least (9 patches of 4)
    ((200, 150), 1, (144, 108)),    # scaled down to 1024 tokens at most (972)
    ((300, 5), 2, (304, 8)),        # whole 2 x 2 merge windows of 4-pixel patches
])
def test_pixtral_sizes_keep_the_aspect_ratio_within_8_to_1024_tokens(tmp_path, size, merge, want):
    path = tmp_path / "p.gguf"
    write_projector(path, PIXTRAL.but(n_merge=merge))
    spec = read_projector(path)
    w, h = target_size(Image.from_pixels(np.zeros((size[1], size[0], 3), np.uint8)), spec)
    assert (w, h) == want
    align = 4 * merge
    assert 8 <= (w // align) * (h // align) <= 1024


@pytest.mark.parametrize("cfg", [PIXTRAL, MERGED], ids=["pixtral", "merged"])
@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_pixtral_encoder_matches_the_numpy_reference(tmp_path, cfg, flash_attn, tolerance=2e-3):
    """Within 2e-3 of the outputs' largest magnitude (measured: 9e-8 to 1.2e-3, the most
    with the merger and flash attention): what is left is float32 summation,
    ggml's GELU table and, with flash attention, K and V in F16.  The reference's own
    2D RoPE (rows then columns, frequencies interleaved), unfold order and break rows:
    a RoPE by columns first is off by a quarter of the outputs' magnitude (measured:
    0.22 to 0.25), and a break in another place by a whole row.  A wide image (5 x 3
    tokens after merging): rows and columns differ, so a transposed grid shows."""
    core = pytest.importorskip("elelem._core")
    from synthetic_mmproj import pixtral_vit_reference
    path = tmp_path / "pixtral.gguf"
    weights = write_projector(path, cfg)
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors)
    side = 4 * cfg.n_merge
    pixels = np.random.default_rng(1).uniform(-1, 1, (3, side * 3, side * 5)).astype(np.float32)
    got = vm.encode(pixels, 2, flash_attn)
    want = pixtral_vit_reference(cfg, weights, pixels)
    assert got.shape == want.shape == (5 * 3 + 2, 64) == (vm.n_output_tokens(side * 5, side * 3), 64)
    np.testing.assert_array_equal(got[5], weights["v.token_embd.img_break"])   # after the first row
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= tolerance, err
    vm.close()


def test_the_numpy_references_2d_rope_is_two_half_width_ropes():
    """The reference's RoPE against its definition: the first half of each head is a
    half-width RoPE of the rows (base^(-2i / (d/2))), the second half the same of the
    columns with every frequency times base^(-2/d)."""
    from synthetic_mmproj import rope_2d_interleaved
    rng = np.random.default_rng(0)
    d, base = 16, 10000.0
    x = rng.standard_normal((6, 2, d))
    rows, cols = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 0, 1, 0, 1])

    def rope(v, pos, scale):
        out = v.copy()
        for i in range(v.shape[-1] // 2):
            theta = pos[:, None] * scale * base ** (-2.0 * i / v.shape[-1])
            a, b = v[..., 2 * i], v[..., 2 * i + 1]
            out[..., 2 * i], out[..., 2 * i + 1] = a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)
        return out

    want = np.concatenate([rope(x[..., :d // 2], rows, 1.0), rope(x[..., d // 2:], cols, base ** (-2.0 / d))], -1)
    np.testing.assert_allclose(rope_2d_interleaved(x, rows, cols, base), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cfg", [PIXTRAL, MERGED], ids=["pixtral", "merged"])
def test_damaged_pixtral_projector_files_raise_elelem_errors_only(tmp_path, cfg):
    """Bytes of the header, keys and tensor table overwritten (seeded, the fuzz seed 11):
    reading raises an ElelemError or succeeds, and a file that reads encodes without a crash."""
    core = pytest.importorskip("elelem._core")
    from elelem.gguf import read_gguf
    from elelem.vision import Projector
    path = tmp_path / "good.gguf"
    write_projector(path, cfg)
    good = path.read_bytes()
    header = read_gguf(path).data_offset
    image = Image.from_pixels(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    rng = np.random.default_rng(11)
    opened = 0
    for case in range(150):   # most bytes of a header this small are structure: a few files in 100 open
        data = bytearray(good)
        for _ in range(rng.integers(1, 4)):
            data[rng.integers(header)] = rng.integers(256)
        bad = tmp_path / f"bad{case}.gguf"
        bad.write_bytes(bytes(data))
        try:
            projector = Projector(bad, n_threads=2)
        except errors.ElelemError:
            continue
        opened += 1
        try:
            projector.encode(image)
        except errors.ElelemError:
            pass
        projector.close()
    assert 0 < opened < 150
    del core
