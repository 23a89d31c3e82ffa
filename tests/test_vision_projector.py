"""Projector files (mmproj GGUFs): the reader's checks, and the gemma3 encoder
against a NumPy reference of SigLIP + pooling + projection.

The reference (tests/support/synthetic_mmproj.py: vit_reference) is float64
but for the roundings ggml makes on purpose: the activations of a matmul with
F16 weights rounded to F16, and GELU read from ggml's F16 table.  What is left
is float32 summation order and, with flash attention, K and V rounded to F16
(clip.cpp casts them): the tolerances below say how much each leaves.
"""
from __future__ import annotations

import numpy as np
import pytest

from elelem import errors
from elelem.model.projector import read_projector
from synthetic_mmproj import TinyProjector, vit_reference, write_projector

CFG = TinyProjector()


@pytest.fixture(scope="module")
def projector_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mmproj") / "mmproj.gguf"
    weights = write_projector(path, CFG)
    return path, weights


def test_the_reader_reads_the_converters_layout(projector_file):
    path, _ = projector_file
    spec = read_projector(path)
    assert spec.projector_type == "gemma3"
    assert spec.hparams == {"n_embd": 32, "n_head": 4, "d_head": 8, "n_ff": 64, "n_layer": 2, "n_embd_out": 64,
                            "image_size": 32, "patch_size": 4, "n_merge": 2, "ffn_op": "gelu",
                            "eps": pytest.approx(1e-6)}
    assert spec.n_image_tokens == CFG.n_tokens == 16
    assert spec.kind.image_begin == "<start_of_image>" and spec.kind.non_causal
    assert spec.global_tensors["mm_input_proj"] == "mm.input_projection.weight"
    assert spec.layer_tensors[1]["up_w"] == "v.blk.1.ffn_up.weight"
    assert spec.image_mean == (0.5, 0.5, 0.5)


def test_older_files_with_swapped_ffn_names_are_read_as_clip_cpp_reads_them(tmp_path):
    # fc1 (n_embd -> n_ff) written as ffn_down, fc2 as ffn_up: clip.cpp swaps them back.
    path = tmp_path / "swapped.gguf"
    weights = write_projector(path, CFG)
    import gguf
    renamed = tmp_path / "renamed.gguf"
    writer = gguf.GGUFWriter(str(renamed), "clip")
    reader = gguf.GGUFReader(str(path))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub)
    for name, arr in weights.items():
        new = name.replace("ffn_up", "TMP").replace("ffn_down", "ffn_up").replace("TMP", "ffn_down")
        writer.add_tensor(new, arr.astype(np.float16) if arr.ndim == 2 and "v.blk" in name else arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    spec = read_projector(renamed)
    assert spec.layer_tensors[0]["up_w"] == "v.blk.0.ffn_down.weight"
    assert spec.layer_tensors[0]["down_w"] == "v.blk.0.ffn_up.weight"


@pytest.mark.parametrize("cfg, error, message", [
    (CFG.but(drop=("mm.soft_emb_norm.weight",)), errors.ModelShapeError, "mm.soft_emb_norm.weight"),
    (CFG.but(drop=("v.blk.1.attn_q.weight",)), errors.ModelShapeError, "v.blk.1.attn_q.weight"),
    (CFG.but(cut=(("v.position_embd.weight", 0, 10),)), errors.ModelShapeError, "v.position_embd.weight"),
    (CFG.but(cut=(("v.blk.0.ffn_up.bias", 0, 3),)), errors.ModelShapeError, "v.blk.0.ffn_up.bias"),
    (CFG.but(drop_keys=("clip.vision.block_count",)), errors.GGUFMetadataError, "clip.vision.block_count"),
    (CFG.but(keys=(("clip.vision.patch_size", 5),)), errors.GGUFMetadataError, "clip.vision.image_size"),
    (CFG.but(keys=(("clip.vision.image_std", (0.5, 0.0, 0.5)),)), errors.GGUFMetadataError, "image_std"),
    (CFG.but(keys=(("clip.vision.block_count", 100000),)), errors.GGUFMetadataError, "block_count"),
    (CFG.but(keys=(("clip.projector_type", "qwen2vl"),)), errors.UnsupportedArchitectureError, "qwen2vl"),
    (CFG.but(keys=(("clip.has_vision_encoder", False),)), errors.UnsupportedArchitectureError, "vision encoder"),
    (CFG.but(keys=(("clip.vision.attention.head_count", 3),)), errors.GGUFMetadataError, "head_count"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_file_raises_an_error_naming_the_key_or_tensor(tmp_path, cfg, error, message):
    path = tmp_path / "bad.gguf"
    write_projector(path, cfg)
    with pytest.raises(error, match=message):
        read_projector(path)


def test_a_text_model_is_not_a_projector(tmp_path):
    from synthetic import TinyConfig, write_model
    path = tmp_path / "text.gguf"
    write_model(path, TinyConfig(arch="gemma3"))
    with pytest.raises(errors.UnsupportedArchitectureError, match="not a projector file"):
        read_projector(path)


def _pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (3, CFG.image_size, CFG.image_size)).astype(np.float32)


@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_gemma3_encoder_matches_the_numpy_reference(projector_file, flash_attn, tolerance=1e-3):
    """Within 1e-3 of the outputs' largest magnitude (measured: 4.8e-4 either
    way, 4.0e-4 with F32 weights).  What is left is not the graph but its
    roundings: ggml's GELU reads a table indexed by the F16 rounding of its
    input, and an input computed in float32 there and float64 here lands in
    the next F16 bucket now and then, a step of one F16 ulp; the same for the
    matmuls' F16 activations.  A wrong op, order or shape gives differences
    of the outputs' own size.  libmtmd's embeddings are matched bit for bit
    in tests/test_vision_llamacpp.py."""
    core = pytest.importorskip("elelem._core")
    path, weights = projector_file
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors)
    for seed in range(2):
        pixels = _pixels(seed)
        got = vm.encode(pixels, 2, flash_attn)
        want = vit_reference(CFG, weights, pixels)
        assert got.shape == (16, 64)
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= tolerance * scale, np.abs(got - want).max()
    assert vm.n_encoded == 2
    vm.close()
    with pytest.raises(errors.ClosedError):
        vm.encode(_pixels(0))


def test_the_encoder_refuses_pixels_of_another_shape(projector_file):
    core = pytest.importorskip("elelem._core")
    path, _ = projector_file
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors)
    with pytest.raises(errors.InvalidArgumentError, match=r"\(3, 32, 32\)"):
        vm.encode(np.zeros((3, 32, 36), np.float32))
    with pytest.raises(errors.InvalidArgumentError):
        vm.encode(np.zeros((4, 32, 32), np.float32))
    assert vm.n_encoded == 0


def test_projector_caches_images_by_their_pixels(projector_file):
    pytest.importorskip("elelem._core")
    from elelem.vision import Image, Projector
    path, _ = projector_file
    rng = np.random.default_rng(3)
    a = Image.from_pixels(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    b = Image.from_pixels(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    with Projector(path, n_threads=2) as projector:
        first = projector.encode(a)
        again = projector.encode(Image.from_pixels(a.pixels.copy()))
        other = projector.encode(b)
        assert projector.n_encoded == 2
        assert again is first and first.digest != other.digest
        assert not np.array_equal(first.embeddings, other.embeddings)
        with pytest.raises(errors.InvalidArgumentError, match="not a pair"):
            projector.check_text_model(48)


@pytest.mark.parametrize("kind", ["gemma3", "gemma4v"])
def test_damaged_projector_files_raise_elelem_errors_only(projector_file, tmp_path, kind):
    """Bytes of the header, keys and tensor table overwritten (seeded): reading
    raises an ElelemError or succeeds, and a file that reads opens and encodes
    without a crash."""
    core = pytest.importorskip("elelem._core")
    from elelem.gguf import read_gguf
    path, _ = projector_file
    if kind == "gemma4v":
        path = tmp_path / "gemma4v.gguf"
        write_projector(path, GEMMA4V)
    good = path.read_bytes()
    header = read_gguf(path).data_offset
    rng = np.random.default_rng(5)
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
        side = spec.image_size
        if spec.kind.image_tokens is not None:
            side = spec.hparams["patch_size"] * spec.hparams["n_merge"] * 2
        try:
            vm.encode(np.zeros((3, side, side), np.float32))
        except errors.InvalidArgumentError:
            pass   # a patch size or window the pixels are no longer a multiple of: refused, not crashed
        vm.close()
    assert opened < 150


# -- gemma4v (Gemma 4's projector) -------------------------------------------------------

GEMMA4V = TinyProjector(projector_type="gemma4v", image_size=224, n_merge=3, pos_size=32,
                        clamps=(("v.blk.0.attn_q", "input_max", 2.0), ("mm.input_projection", "output_min", -1.0)))


def test_the_reader_reads_gemma4s_layout(tmp_path):
    path = tmp_path / "gemma4v.gguf"
    write_projector(path, GEMMA4V)
    spec = read_projector(path)
    assert spec.projector_type == "gemma4v" and spec.kind.image_begin == "<|image>" and spec.kind.image_end == "<image|>"
    assert spec.hparams["n_merge"] == 3 and spec.hparams["pos_size"] == 32 and spec.hparams["ffn_op"] == "gelu_quick"
    assert spec.hparams["norm"] == "rms" and spec.hparams["kq_scale"] == 1.0 and spec.hparams["dynamic_size"]
    assert spec.layer_tensors[1]["out_scale"] == "v.blk.1.out_scale.weight"
    assert spec.layer_tensors[0]["q_norm"] == "v.blk.0.attn_q_norm.weight"
    assert spec.global_tensors["std_scale"] == "v.std_scale"
    big = 3.4028234663852886e38
    assert spec.clamps == {"v.blk.0.attn_q.weight": (-big, 2.0, -big, big),
                           "mm.input_projection.weight": (-big, big, -1.0, big)}
    # mtmd_decode_use_non_causal: both ways, but for E2B's and E4B's widths
    assert spec.kind.attends_both_ways(5376) and not spec.kind.attends_both_ways(1536)
    assert not spec.kind.attends_both_ways(2560)


@pytest.mark.parametrize("cfg, error, message", [
    (GEMMA4V.but(drop=("v.blk.1.attn_k_norm.weight",)), errors.ModelShapeError, "v.blk.1.attn_k_norm.weight"),
    (GEMMA4V.but(drop=("v.blk.0.ffn_post_norm.weight",)), errors.ModelShapeError, "ffn_post_norm"),
    (GEMMA4V.but(cut=(("v.position_embd.weight", 0, 1),)), errors.ModelShapeError, "v.position_embd.weight"),
    (GEMMA4V.but(cut=(("mm.input_projection.weight", 1, 8),)), errors.ModelShapeError, "mm.input_projection"),
    (GEMMA4V.but(clamps=(("v.blk.0.attn_q", "input_min", 1.0), ("v.blk.0.attn_q", "input_max", -1.0))),
     errors.ModelShapeError, "empty ranges"),
    (GEMMA4V.but(keys=(("clip.vision.projector.scale_factor", 0),)), errors.GGUFMetadataError, "scale_factor"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_gemma4v_file_raises_an_error_naming_the_tensor(tmp_path, cfg, error, message):
    path = tmp_path / "bad.gguf"
    write_projector(path, cfg)
    with pytest.raises(error, match=message):
        read_projector(path)


def test_the_gemma4v_encoder_takes_sides_of_whole_windows_within_its_position_tables(tmp_path):
    core = pytest.importorskip("elelem._core")
    path = tmp_path / "gemma4v.gguf"
    write_projector(path, GEMMA4V)
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors, clamps=spec.clamps)
    align = GEMMA4V.patch_size * GEMMA4V.n_merge
    out = vm.encode(np.zeros((3, align * 2, align * 3), np.float32))
    assert out.shape == (6, GEMMA4V.n_embd_out) and np.isfinite(out).all()
    with pytest.raises(errors.InvalidArgumentError, match=f"multiple of {align}"):
        vm.encode(np.zeros((3, align * 2, align * 3 + 4), np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="32 patches a side"):
        vm.encode(np.zeros((3, align, align * 11), np.float32))   # 33 patches across
    vm.close()


@pytest.mark.parametrize("size, want", [
    ((37, 23), (132, 84)),       # rounded to whole windows (36 x 24), then scaled up to the least tokens
    ((1, 1), (108, 108)),
    ((120, 96), (120, 96)),      # within the limits: rounded only
    ((1000, 800), (444, 348)),   # scaled down (floored) past the most tokens
    ((20000, 5), (25392, 12)),   # a side never below one window (so the other grows, as in mtmd)
])
def test_gemma4v_sizes_follow_calc_size_preserved_ratio(size, want):
    """Worked by hand from mtmd's img_tool::calc_size_preserved_ratio with align 12 (patch 4,
    window 3) and 70..1120 tokens of 144 pixels; libmtmd's own sizes are checked through the
    embeddings' token counts in tests/test_vision_gemma4.py."""
    from elelem.vision.preprocess import size_preserving_ratio
    assert size_preserving_ratio(*size, 12, 70 * 144, 1120 * 144) == want
