"""Qwen3-VL projector files (also Qwen3.5's and 3.6's vision half): the reader's
checks, damaged files, and the text models' pairing with a projector.  The
embeddings are compared with libmtmd's, bit for bit, in tests/test_vision_qwen3vl.py."""
from __future__ import annotations

import numpy as np
import pytest

from elelem import errors
from elelem.model.projector import read_projector
from synthetic_mmproj import TinyProjector, write_projector

QWEN3 = TinyProjector(projector_type="qwen3vl_merger", n_embd=32, n_head=4, n_ff=48, n_layer=4, patch_size=8,
                      image_size=64, n_embd_out=64, deepstack=(0, 2))


def test_the_reader_reads_the_converters_qwen3vl_layout(tmp_path):
    path = tmp_path / "qwen3vl.gguf"
    write_projector(path, QWEN3)
    spec = read_projector(path)
    h = spec.hparams
    assert (h["n_ff"], h["n_merge"], h["norm"], h["n_wa_pattern"], h["ffn_op"]) == (48, 2, "layer", 0, "gelu")
    assert spec.kind.image_begin == "<|vision_start|>" and spec.kind.mrope and spec.kind.dynamic_size
    assert (spec.n_deepstack, spec.row_width) == (2, 3 * 64)
    g = spec.global_tensors
    assert (g["patch_bias"], g["pos_embd"]) == ("v.patch_embd.bias", "v.position_embd.weight")
    layers = spec.layer_tensors
    assert layers[1]["qkv_w"] == "v.blk.1.attn_qkv.weight" and layers[1]["q_w"] is None
    assert [bool(layer.get("ds_fc1_w")) for layer in layers] == [True, False, True, False]
    assert layers[2]["ds_fc2_b"] == "v.deepstack.2.fc2.bias"


def test_a_projector_without_deepstack_layers_gives_rows_of_the_text_width(tmp_path):
    """Qwen3.5's vision half: the same type, no deepstack mergers."""
    path = tmp_path / "qwen35.gguf"
    write_projector(path, QWEN3.but(deepstack=()))
    spec = read_projector(path)
    assert (spec.n_deepstack, spec.row_width) == (0, 64)


@pytest.mark.parametrize("cfg, error, message", [
    (QWEN3.but(drop=("v.patch_embd.bias",)), errors.ModelShapeError, "v.patch_embd.bias"),
    (QWEN3.but(drop=("v.position_embd.weight",)), errors.ModelShapeError, "v.position_embd.weight"),
    (QWEN3.but(cut=(("v.position_embd.weight", 0, 60),)), errors.ModelShapeError, "v.position_embd.weight"),
    (QWEN3.but(drop=("v.blk.1.attn_qkv.weight",)), errors.ModelShapeError, "v.blk.1.attn_qkv.weight"),
    (QWEN3.but(cut=(("v.blk.0.attn_qkv.bias", 0, 64),)), errors.ModelShapeError, "v.blk.0.attn_qkv.bias"),
    (QWEN3.but(drop=("v.deepstack.2.fc2.weight",)), errors.ModelShapeError, "v.deepstack.2.fc2.weight"),
    (QWEN3.but(cut=(("v.deepstack.0.norm.weight", 0, 32),)), errors.ModelShapeError, "v.deepstack.0.norm.weight"),
    (QWEN3.but(cut=(("v.deepstack.0.fc2.weight", 0, 48),)), errors.ModelShapeError, "v.deepstack.0.fc2.weight"),
    (QWEN3.but(keys=(("clip.vision.spatial_merge_size", 4),)), errors.GGUFMetadataError, "spatial_merge_size"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_qwen3vl_file_raises_an_error_naming_the_key_or_tensor(tmp_path, cfg, error, message):
    path = tmp_path / "bad.gguf"
    write_projector(path, cfg)
    with pytest.raises(error, match=message):
        read_projector(path)


def test_split_qkv_tensors_in_a_qwen3vl_file_are_refused(tmp_path):
    import gguf

    path = tmp_path / "split.gguf"
    weights = write_projector(path, QWEN3)
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "clip")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        if isinstance(value, list):
            writer.add_array(field.name, value)
        elif isinstance(value, bool):
            writer.add_bool(field.name, value)
        elif isinstance(value, int):
            writer.add_uint32(field.name, value)
        elif isinstance(value, float):
            writer.add_float32(field.name, value)
        else:
            writer.add_string(field.name, value)
    for name, arr in weights.items():
        writer.add_tensor(name, arr)
    writer.add_tensor("v.blk.0.attn_q.weight", np.zeros((32, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(errors.ModelShapeError, match="attn_qkv"):
        read_projector(tmp_path / "bad.gguf")


def test_a_text_model_and_a_projector_must_agree_on_deepstack(tmp_path):
    pytest.importorskip("elelem._core")
    from elelem.vision import Projector
    path = tmp_path / "qwen3vl.gguf"
    write_projector(path, QWEN3)
    with Projector(path, n_threads=2) as projector:
        projector.check_text_model(64, 2)
        with pytest.raises(errors.InvalidArgumentError, match="deepstack"):
            projector.check_text_model(64, 0)
        with pytest.raises(errors.InvalidArgumentError, match="wide"):
            projector.check_text_model(32, 2)


def test_the_encoder_gives_rows_with_their_deepstack_parts(tmp_path):
    """Grids other than the position table's (resized) and equal to it (taken as it is)."""
    pytest.importorskip("elelem._core")
    from elelem.vision import Image, Projector
    path = tmp_path / "qwen3vl.gguf"
    write_projector(path, QWEN3)
    rng = np.random.default_rng(3)
    with Projector(path, n_threads=2) as projector:
        for h, w in ((64, 64), (40, 90), (300, 20)):
            got = projector.encode(Image.from_pixels(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)))
            assert got.embeddings.shape == (got.grid[0] * got.grid[1], 3 * 64)
            assert np.isfinite(got.embeddings).all()
            # the three parts are different projections, not copies
            parts = got.embeddings.reshape(got.n_tokens, 3, 64)
            assert np.abs(parts[:, 0] - parts[:, 1]).max() > 0 and np.abs(parts[:, 1] - parts[:, 2]).max() > 0


def test_damaged_qwen3vl_projector_files_raise_elelem_errors_only(tmp_path):
    """Bytes of the header, keys and tensor table overwritten (seeded): reading
    raises an ElelemError or succeeds, and a file that reads encodes without a crash."""
    pytest.importorskip("elelem._core")
    from elelem.gguf import read_gguf
    from elelem.vision import Image, Projector
    path = tmp_path / "good.gguf"
    write_projector(path, QWEN3)
    good = path.read_bytes()
    header = read_gguf(path).data_offset
    rng = np.random.default_rng(11)
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


@pytest.mark.parametrize("size", [(64, 64), (16 * 8, 16 * 9), (48, 144)], ids=["table-grid", "9x8", "9x3"])
@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_qwen3vl_encoder_matches_the_numpy_reference(tmp_path, size, flash_attn, tolerance=2e-3):
    """Within 2e-3 of the outputs' largest magnitude, deepstack parts included
    (measured: 4.0e-4 to 7.1e-4): what is left is float32 summation, ggml's GELU table and, with flash attention, K and
    V in F16.  The grids: the position table's own (8 x 8 patches, taken as it is),
    and others it is resized to (bilinear, corners aligned).  libmtmd's embeddings
    are matched bit for bit in tests/test_vision_qwen3vl.py."""
    core = pytest.importorskip("elelem._core")
    from elelem.vision.qwen import encoder_inputs
    from synthetic_mmproj import qwen3vl_vit_reference
    path = tmp_path / "qwen3vl.gguf"
    weights = write_projector(path, QWEN3)
    spec = read_projector(path)
    vm = core.open_vision_model(str(path), spec.projector_type, spec.hparams, spec.global_tensors,
                                spec.layer_tensors)
    h, w = size
    pixels = np.random.default_rng(1).uniform(-1, 1, (3, h, w)).astype(np.float32)
    inputs = encoder_inputs(w, h, 8, 0)
    got = vm.encode(pixels, 2, flash_attn, inputs)
    want = qwen3vl_vit_reference(QWEN3, weights, pixels, inputs)
    assert got.shape == want.shape == ((h // 16) * (w // 16), 3 * 64)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= tolerance, err
    vm.close()


@pytest.mark.parametrize("keys, drop_sections, message", [
    ((("{arch}.n_deepstack_layers", 4),), False, "n_deepstack_layers"),   # as many as the layers: past the last
    ((("{arch}.n_deepstack_layers", 1),), True, "rope.dimension_sections"),
], ids=["deepstack-past-the-layers", "no-sections"])
def test_a_bad_qwen3vl_text_model_raises_model_shape_error(tmp_path, keys, drop_sections, message):
    from elelem.gguf.reader import read_gguf
    from elelem.model.architectures import model_spec
    from synthetic import TinyConfig, write_model
    cfg = TinyConfig(arch="qwen3vl", n_vocab=64, n_embd=32, n_head=2, n_head_kv=1, n_layer=4, extra_keys=keys)
    if drop_sections:
        cfg = cfg.but(rope_sections=(0, 0, 0, 0))
    write_model(tmp_path / "bad.gguf", cfg)
    with pytest.raises(errors.ModelShapeError, match=message):
        model_spec(read_gguf(tmp_path / "bad.gguf"))


def test_a_good_qwen3vl_text_model_reads_its_deepstack_and_imrope(tmp_path):
    from elelem.gguf.reader import read_gguf
    from elelem.model.architectures import model_spec
    from synthetic import TinyConfig, write_model
    cfg = TinyConfig(arch="qwen3vlmoe", n_vocab=64, n_embd=32, n_head=2, n_head_kv=1, n_layer=4,
                     extra_keys=(("{arch}.n_deepstack_layers", 3),))
    write_model(tmp_path / "good.gguf", cfg)
    h = model_spec(read_gguf(tmp_path / "good.gguf")).hparams
    assert (h["n_deepstack"], h["rope_type"], list(h["rope_sections"])) == (3, "imrope", [3, 3, 2, 0])
