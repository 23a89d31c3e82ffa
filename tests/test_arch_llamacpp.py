"""elelem's logits against llama.cpp's on tiny synthetic models of each architecture.

llama.cpp's float32 logits come from tests/support/fixtures/make_arch_fixtures.py run
live under this machine's llama.cpp reference (tests/support/llamacpp_reference.py,
built by scripts/reference_llamacpp.py), on the very files elelem reads here:
the weights come from ``TinyConfig.seed``, the vocabulary (which llama.cpp
insists on) from SmolLM2's file, through tests/support/vocab_metadata.py.  The stored
tests/support/fixtures/arch_logits.json is the fallback for a machine without a
reference build, used only if its kernel fingerprint is this machine's.

Tolerance: none.  elelem builds the same ggml graph as llama.cpp on the same
vendored ggml (0.25.3), built with the same options (GGML_LLAMAFILE=ON in
particular: tinyBLAS sums batched matmuls in its own order), so on the same
machine the logits are bit-for-bit llama.cpp's: max |diff| 0.0 for every
config, measured.  (Against llama.cpp on an AVX-512 CPU they differ by up to
5e-5.)  The argmax must agree too; the smallest top-1/top-2 gap is 2.9e-3.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from llamacpp_reference import THREADS, elelem_kernel_options
from synthetic import write_model
from vocab_metadata import vocab_size, vocab_writer

sys.path.insert(0, str(Path(__file__).parent / "support" / "fixtures"))
# importable without llama_cpp
from make_arch_fixtures import CONFIGS, FLASH_ATTN, N_GREEDY, N_PROMPT, token_ids  # noqa: E402

TOKEN_IDS = token_ids()
STORED = Path(__file__).parent / "support" / "fixtures" / "arch_logits.json"


def test_the_stored_fallback_has_every_config():
    """arch_logits.json, used where no reference build is, was made from today's CONFIGS: every one,
    with the same fields (else the fallback is refused on every machine, silently skipping)."""
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    assert stored["header"]["made_by"] == "tests/support/fixtures/make_arch_fixtures.py"
    assert stored["header"]["token_ids"] == TOKEN_IDS
    assert stored["header"]["flash_attn"] == sorted(FLASH_ATTN)
    assert list(stored["configs"]) == list(CONFIGS)
    for name, cfg in CONFIGS.items():
        assert stored["configs"][name]["config"] == json.loads(json.dumps(dataclasses.asdict(cfg))), name


def kernel_options(name: str) -> dict:
    """LLM(...) options for config ``name``: the reference's kernels, and its flash attention setting."""
    return {**elelem_kernel_options(), "flash_attn": name in FLASH_ATTN}


@pytest.fixture(scope="module")
def arch_models(smollm_path, tmp_path_factory) -> Path:
    """The directory with <name>.gguf for every config, written once."""
    assert vocab_size(smollm_path) == 49152
    add_vocab = vocab_writer(smollm_path)
    tmp = tmp_path_factory.mktemp("arch_llamacpp")
    for name, cfg in CONFIGS.items():
        write_model(tmp / f"{name}.gguf", cfg, extra_metadata=add_vocab)
    return tmp


@pytest.fixture(scope="module")
def llamacpp_arch(llamacpp, arch_models, smollm_path) -> dict:
    """name -> llama.cpp's stored record (logits, argmax, top2_gap) for that config."""
    out = llamacpp.arch_logits(arch_models, list(CONFIGS), smollm_path)
    assert out["header"]["token_ids"] == TOKEN_IDS
    return out["configs"]


@pytest.fixture(scope="module")
def elelem_logits(arch_models):
    """name -> elelem's float32 logits (n_tokens, n_vocab) for that config's file."""
    import elelem

    out = {}

    def get(name: str) -> np.ndarray:
        if name not in out:
            with elelem.LLM(arch_models / f"{name}.gguf", kv_type="f16", n_ctx=256, n_threads=THREADS,
                            **kernel_options(name)) as llm:
                assert llm.n_vocab == CONFIGS[name].n_vocab
                out[name] = np.asarray(llm.eval(TOKEN_IDS, all_logits=True), dtype=np.float32)
        return out[name]

    return get


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(CONFIGS))
def test_argmax_matches_llamacpp(elelem_logits, llamacpp_arch, name):
    got = elelem_logits(name)
    assert got.shape == (len(TOKEN_IDS), CONFIGS[name].n_vocab)
    assert min(llamacpp_arch[name]["top2_gap"]) > 2.5e-3  # what makes this meaningful (see above)
    np.testing.assert_array_equal(got.argmax(axis=1), llamacpp_arch[name]["argmax"])


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_llamacpp_exactly(elelem_logits, llamacpp_arch, name):
    want = np.asarray(llamacpp_arch[name]["logits"], dtype=np.float32)   # (n_tokens, 128), exact float32 values
    got = elelem_logits(name)[:, : want.shape[1]]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert diff.max() == 0.0, (
        f"{name}: max |diff| {diff.max():.3g}; per position {[float(f'{d:.3g}') for d in diff.max(axis=1)]}")


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_decoding_follows_llamacpp(arch_models, llamacpp_arch, name):
    """One token a step, as generation runs: teacher-forced along llama.cpp's
    greedy path, each step's argmax is llama.cpp's next token; and elelem's own
    greedy generation takes the same path."""
    import elelem

    path = llamacpp_arch[name]["greedy"]
    assert len(path) == N_GREEDY
    with elelem.LLM(arch_models / f"{name}.gguf", kv_type="f16", n_ctx=256, n_threads=THREADS,
                    speculative=False, **kernel_options(name)) as llm:
        row = llm.eval(TOKEN_IDS[:N_PROMPT])
        for step, token in enumerate(path):
            assert int(np.argmax(row)) == token, f"{name}: step {step}"
            row = llm.eval([token])
        llm.reset()
        assert llm.generate_tokens(TOKEN_IDS[:N_PROMPT], N_GREEDY) == path
