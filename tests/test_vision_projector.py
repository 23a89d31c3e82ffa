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


def test_damaged_projector_files_raise_elelem_errors_only(projector_file, tmp_path):
    """Bytes of the header, keys and tensor table overwritten (seeded): reading
    raises an ElelemError or succeeds, and a file that reads opens and encodes
    without a crash."""
    core = pytest.importorskip("elelem._core")
    from elelem.gguf import read_gguf
    path, _ = projector_file
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
                                        spec.layer_tensors)
        except errors.ElelemError:
            continue
        opened += 1
        vm.encode(np.zeros((3, spec.image_size, spec.image_size), np.float32))
        vm.close()
    assert opened < 150
