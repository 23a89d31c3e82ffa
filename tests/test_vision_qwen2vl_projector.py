"""Qwen2-VL and Qwen2.5-VL projector files: the reader's checks, libmtmd's
smart resize and the encoder's inputs (pure Python), the encoders against a
NumPy reference, and damaged files.  The embeddings themselves are compared with libmtmd's,
bit for bit, in tests/test_vision_qwen2vl.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from elelem import errors
from elelem.model.projector import read_projector
from elelem.vision.qwen import encoder_inputs, smart_size
from synthetic_mmproj import TinyProjector, write_projector

QWEN2 = TinyProjector(projector_type="qwen2vl_merger", n_embd=32, n_head=4, n_ff=48, n_layer=2, patch_size=8,
                      image_size=64, n_embd_out=64)
QWEN25 = QWEN2.but(projector_type="qwen2.5vl_merger", n_layer=4)


def test_the_reader_reads_the_converters_qwen2vl_layout(tmp_path):
    path = tmp_path / "qwen2vl.gguf"
    write_projector(path, QWEN2)
    spec = read_projector(path)
    assert spec.projector_type == "qwen2vl_merger"
    h = spec.hparams
    # feed_forward_length holds the text width (the converter's renaming); the layers' width is the tensors'.
    assert (h["n_ff"], h["n_merge"], h["norm"], h["n_wa_pattern"], h["ffn_op"]) == (48, 2, "layer", 0, "gelu_quick")
    assert spec.kind.image_begin == "<|vision_start|>" and spec.kind.image_end == "<|vision_end|>"
    assert spec.kind.dynamic_size and spec.kind.mrope and not spec.kind.non_causal and spec.kind.resize == "bicubic"
    g = spec.global_tensors
    assert (g["patch_embd_1"], g["mm_0_w"], g["mm_1_b"]) == ("v.patch_embd.weight.1", "mm.0.weight", "mm.2.bias")
    assert g["pos_embd"] is None and g["patch_bias"] is None and g["post_ln_b"] == "v.post_ln.bias"
    assert spec.layer_tensors[0]["gate_w"] is None and spec.layer_tensors[0]["ln1_b"] == "v.blk.0.ln1.bias"


def test_the_reader_reads_qwen25vl_windows_rms_norms_and_gates(tmp_path):
    path = tmp_path / "qwen25vl.gguf"
    write_projector(path, QWEN25)
    spec = read_projector(path)
    h = spec.hparams
    assert (h["norm"], h["n_wa_pattern"], h["ffn_op"], h["n_ff"]) == ("rms", 2, "silu", 48)
    assert spec.layer_tensors[3]["gate_w"] == "v.blk.3.ffn_gate.weight"
    assert spec.layer_tensors[0]["ln1_b"] is None and spec.global_tensors["post_ln_b"] is None


@pytest.mark.parametrize("cfg, error, message", [
    (QWEN2.but(drop=("v.patch_embd.weight.1",)), errors.ModelShapeError, "v.patch_embd.weight.1"),
    (QWEN2.but(drop=("mm.0.weight",)), errors.ModelShapeError, "mm.0.weight"),
    (QWEN2.but(cut=(("mm.2.weight", 0, 32),)), errors.ModelShapeError, "mm.2.weight"),
    (QWEN2.but(cut=(("mm.0.bias", 0, 7),)), errors.ModelShapeError, "mm.0.bias"),
    (QWEN2.but(drop=("v.blk.0.ffn_up.weight",)), errors.ModelShapeError, "ffn_up"),
    (QWEN25.but(cut=(("v.blk.2.ffn_gate.weight", 0, 40),)), errors.ModelShapeError, "v.blk.2.ffn_gate.weight"),
    (QWEN25.but(drop_keys=("clip.vision.n_wa_pattern",)), errors.GGUFMetadataError, "n_wa_pattern"),
    (QWEN2.but(keys=(("clip.vision.spatial_merge_size", 3),)), errors.GGUFMetadataError, "spatial_merge_size"),
    (QWEN2.but(keys=(("clip.vision.attention.head_count", 16),)), errors.GGUFMetadataError, "multiple of 4"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_qwen_file_raises_an_error_naming_the_key_or_tensor(tmp_path, cfg, error, message):
    path = tmp_path / "bad.gguf"
    write_projector(path, cfg)
    with pytest.raises(error, match=message):
        read_projector(path)


@pytest.mark.parametrize("size, want", [
    ((1024, 768), (1036, 756)),      # a screenshot: each side rounded to 28
    ((1, 1), (84, 84)),              # under 8 tokens' pixels: scaled up
    ((10000, 20), (9996, 28)),       # a sliver: its short side never under 28
    ((5000, 4000), (1988, 1596)),    # past 4096 tokens' pixels: scaled down
])
def test_smart_size_is_mtmds(size, want):
    """clip.cpp's Qwen-VL limits at patch 14: 8 .. 4096 merged tokens (28 x 28 pixels each)."""
    align = 28
    got = smart_size(*size, align, 8 * align * align, 4096 * align * align)
    assert got == want
    assert got[0] % align == 0 and got[1] % align == 0


def test_smart_size_stays_in_the_pixel_budget_and_near_the_aspect_ratio():
    rng = np.random.default_rng(0)
    align, lo, hi = 16, 8 * 256, 1024 * 256
    for _ in range(500):
        w, h = (int(v) for v in rng.integers(1, 3000, 2))
        nw, nh = smart_size(w, h, align, lo, hi)
        assert nw % align == 0 and nh % align == 0 and nw >= align and nh >= align
        assert nw * nh <= hi or (nw == align or nh == align)
        if min(w, h) >= 4 * align and max(w, h) / min(w, h) < 10:
            assert abs(math.log((nw / nh) / (w / h))) < 0.5


def test_encoder_positions_follow_the_merge_blocks():
    inputs = encoder_inputs(32, 16, 8)   # 4 x 2 patches: two merge blocks side by side
    pos = inputs["positions"].reshape(4, -1)
    assert pos[0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]           # rows
    assert pos[1].tolist() == [0, 1, 0, 1, 2, 3, 2, 3]           # columns
    assert (pos[2] == pos[0]).all() and (pos[3] == pos[1]).all()
    assert set(inputs) == {"positions"}


def test_window_inputs_group_each_window_and_keep_it_to_itself():
    # 8 x 6 merged tokens, windows of 112 / 8 / 2 = 7: two windows across, one down.
    inputs = encoder_inputs(16 * 8, 16 * 6, 8, n_wa_pattern=2)
    idx, inv, mask = inputs["window_idx"], inputs["inv_window_idx"], inputs["window_mask"]
    assert (inv[idx] == np.arange(48)).all()
    assert inv[:7].tolist() == list(range(7)) and inv[7:14].tolist() == list(range(8, 15))
    allowed = mask == 0
    assert allowed[:4 * 42, :4 * 42].all() and allowed[4 * 42:, 4 * 42:].all()
    assert not allowed[:4 * 42, 4 * 42:].any() and not allowed[4 * 42:, :4 * 42].any()
    # The positions are those of the raster order, moved with their blocks.
    plain = encoder_inputs(16 * 8, 16 * 6, 8)["positions"].reshape(4, 48, 4)
    moved = inputs["positions"].reshape(4, 48, 4)
    assert (moved[:, idx] == plain).all()


def test_the_encoder_refuses_sizes_off_the_grid_and_wrong_inputs(tmp_path):
    core = pytest.importorskip("elelem._core")
    path = tmp_path / "qwen25vl.gguf"
    write_projector(path, QWEN25)
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors)
    with pytest.raises(errors.InvalidArgumentError, match="a multiple of 16"):
        vm.encode(np.zeros((3, 32, 40), np.float32))
    inputs = encoder_inputs(48, 32, 8, 2)
    with pytest.raises(errors.InvalidArgumentError, match="positions"):
        vm.encode(np.zeros((3, 32, 48), np.float32), 2, True, {**inputs, "positions": inputs["positions"][:-1]})
    with pytest.raises(errors.InvalidArgumentError, match="no input 'nope'"):
        vm.encode(np.zeros((3, 32, 48), np.float32), 2, True, {**inputs, "nope": inputs["positions"]})
    out = vm.encode(np.zeros((3, 32, 48), np.float32), 2, True, inputs)
    assert out.shape == (6, 64) and np.isfinite(out).all()
    vm.close()


@pytest.mark.parametrize("cfg", [QWEN2, QWEN25], ids=["qwen2vl", "qwen25vl"])
def test_damaged_qwen_projector_files_raise_elelem_errors_only(tmp_path, cfg):
    """Bytes of the header, keys and tensor table overwritten (seeded): reading
    raises an ElelemError or succeeds, and a file that reads encodes without a crash."""
    core = pytest.importorskip("elelem._core")
    from elelem.gguf import read_gguf
    from elelem.vision import Image, Projector
    path = tmp_path / "good.gguf"
    write_projector(path, cfg)
    good = path.read_bytes()
    header = read_gguf(path).data_offset
    rng = np.random.default_rng(7)
    image = Image.from_pixels(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8))
    opened = 0
    for case in range(100):
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
    assert 0 < opened < 100
    del core


@pytest.mark.parametrize("cfg", [QWEN2, QWEN25], ids=["qwen2vl", "qwen25vl"])
@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_qwen_encoders_match_the_numpy_reference(tmp_path, cfg, flash_attn, tolerance=2e-3):
    """Within 2e-3 of the outputs' largest magnitude (measured: 5.1e-4 to 7.0e-4):
    what is left is float32 summation, ggml's GELU tables (an input landing in
    the next F16 bucket) and, with flash attention, K and V in F16.  A wrong
    rotary section, window or merge order gives differences of the outputs'
    own size (no window mask: 0.5).  libmtmd's
    embeddings are matched bit for bit in tests/test_vision_qwen2vl.py."""
    core = pytest.importorskip("elelem._core")
    from synthetic_mmproj import qwen_vit_reference
    path = tmp_path / "qwen.gguf"
    weights = write_projector(path, cfg)
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors)
    # 9 x 8 merged tokens: two windows across and two down for Qwen2.5-VL's 7 x 7.
    pixels = np.random.default_rng(1).uniform(-1, 1, (3, 16 * 8, 16 * 9)).astype(np.float32)
    inputs = encoder_inputs(16 * 9, 16 * 8, 8, spec.hparams["n_wa_pattern"])
    got = vm.encode(pixels, 2, flash_attn, inputs)
    want = qwen_vit_reference(cfg, weights, pixels, inputs)
    assert got.shape == want.shape == (72, 64)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= tolerance, err
    vm.close()
