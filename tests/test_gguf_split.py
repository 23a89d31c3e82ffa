"""Split GGUF models (``name-00001-of-00003.gguf``, llama.cpp's gguf-split layout): the
reader validates the ``split.*`` keys and reads every file; the model maps each file and
places each tensor in its own file's mapping, so the logits equal the unsplit file's, bit for bit."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from elelem import LLM
from elelem.errors import GGUFMetadataError, GGUFTensorError, ModelNotFoundError
from elelem.gguf.reader import read_gguf, read_gguf_file
from gguf_builders import pack_kv
from gguf_split import split_gguf
from synthetic import TinyConfig, write_model

PROMPT = [1, 5, 9, 2, 33, 7, 60, 4, 11, 3]
# Quantized matmul weights (repacked at load) and an f32 embedding: both kinds of placement.
CONFIG = TinyConfig(wtype="q8_0", seed=3)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    folder = tmp_path_factory.mktemp("split")
    path = folder / "tiny.gguf"
    write_model(path, CONFIG)
    return path


def logits(path, **options):
    with LLM(path, n_ctx=64, n_threads=1, **options) as llm:
        rows = llm.eval(PROMPT, all_logits=True)
        generated = llm.generate_tokens(PROMPT, 4)
    return np.asarray(rows), list(generated)


@pytest.fixture(scope="module")
def reference(whole):
    return logits(whole)


@pytest.mark.parametrize("n_files,empty_first", [(2, False), (3, False), (3, True)])
def test_a_split_model_gives_the_unsplit_logits_bit_for_bit(whole, reference, tmp_path, n_files, empty_first):
    paths = split_gguf(whole, tmp_path, n_files, empty_first=empty_first)
    gguf = read_gguf(paths[0])
    assert gguf.shard_paths == tuple(paths)
    assert {t.shard for t in gguf.tensors.values()} == set(range(1 if empty_first else 0, n_files))
    assert gguf.tensors.keys() == read_gguf(whole).tensors.keys()
    rows, tokens = logits(paths[0])
    assert rows.tobytes() == reference[0].tobytes()
    assert tokens == reference[1]


def test_a_split_model_read_into_memory_gives_the_same_logits(whole, reference, tmp_path):
    paths = split_gguf(whole, tmp_path, 2)
    rows, _ = logits(paths[0], use_mmap=False, repack=False)
    want, _ = logits(whole, use_mmap=False, repack=False)
    assert rows.tobytes() == want.tobytes()


def test_a_model_is_opened_by_its_first_file(whole, tmp_path):
    paths = split_gguf(whole, tmp_path, 3)
    with pytest.raises(GGUFMetadataError, match="file 2 of a model split in 3; open its first file"):
        read_gguf(paths[1])
    assert read_gguf_file(paths[1]).metadata["split.no"] == 1  # one file alone still reads


def test_a_missing_file_is_named(whole, tmp_path):
    paths = split_gguf(whole, tmp_path, 3)
    paths[2].unlink()
    with pytest.raises(ModelNotFoundError, match=r"file 3 of the 3 .* is missing: .*tiny-00003-of-00003\.gguf"):
        read_gguf(paths[0])


def _rewrite_key(path, key, value_type, old, new):
    data = path.read_bytes()
    before, after = pack_kv(key, value_type, old), pack_kv(key, value_type, new)
    assert data.count(before) == 1
    path.write_bytes(data.replace(before, after))


def test_files_out_of_order_are_refused(whole, tmp_path):
    paths = split_gguf(whole, tmp_path, 3)
    _rewrite_key(paths[2], "split.no", 2, 2, 1)
    with pytest.raises(GGUFMetadataError, match="split.no.*is 1, but this is file 3 of 3"):
        read_gguf(paths[0])


def test_a_wrong_tensor_count_is_refused(whole, tmp_path):
    paths = split_gguf(whole, tmp_path, 2)
    n = len(read_gguf(whole).tensors)
    _rewrite_key(paths[0], "split.tensors.count", 5, n, n + 1)
    with pytest.raises(GGUFMetadataError, match=f"says {n + 1} tensors, but the 2 files hold {n}"):
        read_gguf(paths[0])


def test_a_split_count_of_the_wrong_type_is_refused(whole, tmp_path):
    paths = split_gguf(whole, tmp_path, 2)
    before = pack_kv("split.count", 2, 2)
    paths[0].write_bytes(paths[0].read_bytes().replace(before, before[:-6] + struct.pack("<iH", 3, 2)))  # INT16
    with pytest.raises(GGUFMetadataError, match="split.count.*must be a UINT16"):
        read_gguf(paths[0])


def test_a_tensor_in_two_files_is_refused(whole, tmp_path):
    n = len(read_gguf(whole).tensors)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = split_gguf(whole, tmp_path / "a", 2, tensors_per_file=[3, n - 3])
    b = split_gguf(whole, tmp_path / "b", 2, tensors_per_file=[1, n - 1])
    a[1].write_bytes(b[1].read_bytes())  # every tensor but the first: the 2nd and 3rd are in a's first file too
    with pytest.raises(GGUFTensorError, match="duplicate tensor name"):
        read_gguf(a[0])


def test_the_native_loader_checks_the_files_itself(whole, tmp_path):
    """The files may change between the reader's checks and the load: ggml's side checks split.no."""
    from elelem._core import open_model
    from elelem.errors import GGUFError
    from elelem.model.architectures import model_spec
    paths = split_gguf(whole, tmp_path, 3)
    spec = model_spec(read_gguf(paths[0]))
    args = (spec.arch.builder, spec.hparams, spec.global_tensors, spec.layer_tensors)
    with pytest.raises(GGUFError, match="split.no is not 1"):
        open_model(paths[0], *args, shards=[paths[0], paths[2], paths[1]])
    model = open_model(paths[0], *args, shards=paths)
    assert model.n_files == 3
    model.close()
    with pytest.raises(Exception, match="required tensor"):  # one file alone lacks the others' tensors
        open_model(paths[0], *args)
