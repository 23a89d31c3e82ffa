"""The benchmarks' real-sized synthetic files (benchmarks/families.py) are written by
the family writers with ``stream=True`` (tests/support/synthetic_stream.py): their
matrices made and quantized a block of rows at a time as they are written.  Such a
file must be laid out as the tests' whole-in-memory one of the same config (the
same keys, tensors, shapes, types and offsets: llama.cpp's converter's layout),
each matrix the one its generator makes whole, and it must run."""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.gguf.reader import read_gguf
import synthetic_mamba2
import synthetic_mla
import synthetic_stream
from synthetic import quantize
from synthetic_mamba2 import Mamba2Config, write_mamba2_model
from synthetic_mla import MLAConfig, write_mla_model

CONFIGS = {
    "mla": (MLAConfig(n_layer=3, wtype="q8_0", embd_type="q8_0", seed=5), write_mla_model),
    "mamba2": (Mamba2Config(arch="nemotron_h_moe", pattern="MEM*EM", wtype="q8_0", embd_type="q8_0", n_embd=64,
                            n_ff_exp=64, n_ff_shexp=64, seed=6), write_mamba2_model),
}
make_weights = {"mla": synthetic_mla.make_weights, "mamba2": synthetic_mamba2.make_weights}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_streamed_file_is_laid_out_as_the_whole_one_and_runs(tmp_path, monkeypatch, family):
    cfg, write = CONFIGS[family]
    # Blocks of a few rows, so that every matrix is made and quantized in several pieces.
    monkeypatch.setattr(synthetic_stream, "CHUNK_VALUES", 3 * 64)
    whole, streamed = tmp_path / "whole.gguf", tmp_path / "streamed.gguf"
    stored = write(whole, cfg)
    assert write(streamed, cfg, stream=True) == {}
    a, b = read_gguf(whole), read_gguf(streamed)
    assert a.file_size == b.file_size
    assert {k: np.asarray(v).tolist() for k, v in a.metadata.items()} == \
           {k: np.asarray(v).tolist() for k, v in b.metadata.items()}
    assert [(t.name, t.shape, t.type_name, t.offset) for t in a.tensors.values()] == \
           [(t.name, t.shape, t.type_name, t.offset) for t in b.tensors.values()]
    assert any(stored.types[name] == "q8_0" and len(t.shape) == 3 for name, t in b.tensors.items())   # experts
    # The experts, made and quantized in blocks of 3 rows, are those made and quantized whole.
    name = next(n for n, t in b.tensors.items() if n.endswith("ffn_up_exps.weight"))
    t = b.tensors[name]
    at = b.data_offset + t.offset
    got = np.frombuffer(streamed.read_bytes()[at:at + t.nbytes], dtype=np.uint8)
    monkeypatch.setattr(synthetic_stream, "CHUNK_VALUES", 1 << 30)
    random = make_weights[family](cfg, stream=True)[name]
    (values,) = random.row_blocks()
    np.testing.assert_array_equal(got, quantize(values, "q8_0").reshape(-1))
    with elelem.LLM(str(streamed), n_ctx=64, n_threads=1) as llm:
        logits = llm.eval([1, 2, 3, 4, 5])
    assert logits.shape == (cfg.n_vocab,) and np.isfinite(logits).all()
