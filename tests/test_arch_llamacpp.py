"""elelem's logits against llama.cpp's on tiny synthetic models of each architecture.

tests/fixtures/arch_logits.json holds llama.cpp's float32 logits (made by
tests/fixtures/make_arch_fixtures.py with llama-cpp-python 0.3.36, which is not
a test dependency) for synthetic models that the test rebuilds byte for byte:
the weights come from ``TinyConfig.seed``, the vocabulary (which llama.cpp
insists on) from SmolLM2's file, through tests/vocab_metadata.py.

Tolerance: none.  elelem builds the same ggml graph as llama.cpp on the same
vendored ggml (0.25.3), built with the same options (GGML_LLAMAFILE=ON in
particular: tinyBLAS sums batched matmuls in its own order), so the logits
are bit-for-bit llama.cpp's: max |diff| 0.0 for every config, measured.  The
argmax must agree too; the smallest stored top-1/top-2 gap is 2.9e-3.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from synthetic import TinyConfig, write_model
from vocab_metadata import vocab_size, vocab_writer

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "arch_logits.json").read_text(encoding="utf-8"))
TOKEN_IDS = FIXTURE["header"]["token_ids"]
CONFIGS = FIXTURE["configs"]


def _config(name: str) -> TinyConfig:
    d = dict(CONFIGS[name]["config"])
    d["extra_keys"] = tuple(tuple(kv) for kv in d["extra_keys"])
    return TinyConfig(**d)


@pytest.fixture(scope="module")
def elelem_logits(smollm_path, tmp_path_factory):
    """name -> elelem's float32 logits (n_tokens, n_vocab) for that config's rebuilt file."""
    import elelem

    assert vocab_size(smollm_path) == 49152
    add_vocab = vocab_writer(smollm_path)
    tmp = tmp_path_factory.mktemp("arch_llamacpp")
    out = {}

    def get(name: str) -> np.ndarray:
        if name not in out:
            cfg = _config(name)
            path = tmp / f"{name}.gguf"
            write_model(path, cfg, extra_metadata=add_vocab)
            with elelem.LLM(path, kv_type="f16", n_ctx=256, n_threads=2) as llm:
                assert llm.n_vocab == cfg.n_vocab
                out[name] = np.asarray(llm.eval(TOKEN_IDS, all_logits=True), dtype=np.float32)
        return out[name]

    return get


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(CONFIGS))
def test_argmax_matches_llamacpp(elelem_logits, name):
    got = elelem_logits(name)
    assert got.shape == (len(TOKEN_IDS), CONFIGS[name]["config"]["n_vocab"])
    assert min(CONFIGS[name]["top2_gap"]) > 2.5e-3  # what makes this meaningful (see above)
    np.testing.assert_array_equal(got.argmax(axis=1), CONFIGS[name]["argmax"])


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_llamacpp_exactly(elelem_logits, name):
    want = np.asarray(CONFIGS[name]["logits"], dtype=np.float32)   # (n_tokens, 128), exact float32 values
    got = elelem_logits(name)[:, : want.shape[1]]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert diff.max() == 0.0, (
        f"{name}: max |diff| {diff.max():.3g}; per position {[float(f'{d:.3g}') for d in diff.max(axis=1)]}")
