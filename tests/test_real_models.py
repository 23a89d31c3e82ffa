"""Real packaged models against llama.cpp's tokens and a NumPy reference.

Fixtures in tests/fixtures/reference/ come from llama-cpp-python 0.3.36 (see
the "made_by" and "greedy_call" fields in each file).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import elelem

pytestmark = pytest.mark.real_model
FIXTURES = Path(__file__).parent / "fixtures" / "reference"
N_COMPARED = 16  # the first tokens must agree; later ones may drift with summation order


def _greedy_cases(fixture):
    data = json.loads((FIXTURES / fixture).read_text())
    return [pytest.param(case, id=case["prompt"][:30]) for case in data["greedy"]]


SHARED = {  # fixture file, path fixture
    "qwen2": ("qwen2.5-coder-0.5b-instruct-q4_k_m.json", "qwen_path"),
    "llama": ("smollm2-135m-instruct-q4_1.json", "smollm_path"),
    "gemma3": ("gemma-3-270m-q4_k_m.json", "gemma_path"),
}
# The shared fixtures were made on a machine with AVX2 and no AVX-512.  ggml's
# kernels differ by CPU, and greedy decoding flips at near-ties, so a token may
# differ where llama.cpp's own top two logits are this close on another CPU.
NEAR_TIE = 0.5
VALUE_TOLERANCE = {"qwen2": 0.05, "llama": 0.05, "gemma3": 0.08}


def _cases(model):
    data = json.loads((FIXTURES / SHARED[model][0]).read_text())
    return [pytest.param(model, case, id=f"{model}-{case['prompt'][:24]}") for case in data["greedy"]]


@pytest.mark.parametrize("model,case", [c for m in SHARED for c in _cases(m)])
def test_first_16_greedy_tokens_follow_llama_cpp(request, model, case):
    """Teacher-forced over llama.cpp's tokens: at each of the first 16 steps
    elelem's greedy choice is llama.cpp's, or a near-tie with it."""
    path = request.getfixturevalue(SHARED[model][1])
    want = case["greedy_ids"][:N_COMPARED]
    with elelem.LLM(path, n_ctx=512) as llm:
        assert llm.spec.arch.name == model
        logits = llm.eval(case["prompt_ids"])
        flips = []
        for i, token in enumerate(want):
            top = int(np.argmax(logits))
            if top != token:
                gap = float(logits[top] - logits[token])
                assert gap < NEAR_TIE, f"step {i}: elelem picks {top}, llama.cpp {token}, gap {gap:.3f}"
                flips.append(i)
            logits = llm.eval([token])
    assert len(flips) <= 1


@pytest.mark.slow
@pytest.mark.parametrize("model", SHARED)
def test_logits_agree_with_numpy_reference(request, model):
    from real_reference import config_of, dequantized_weights
    from synthetic import reference_logits
    path = request.getfixturevalue(SHARED[model][1])
    case = json.loads((FIXTURES / SHARED[model][0]).read_text())["greedy"][0]
    ids = case["prompt_ids"] + case["greedy_ids"][:4]
    want = reference_logits(dequantized_weights(path), config_of(path), ids, dtype=np.float32)
    with elelem.LLM(path, n_ctx=64) as llm:
        got = llm.eval(ids, all_logits=True)
    # Same top-1 at every position.  Values: ggml quantizes activations to
    # 8 bits (Q8_0 / Q8_K) for quantized matmuls, which moves logits by up to
    # ~2.5% of their range on Qwen2.5 and SmolLM2, and ~5.2% on Gemma 3, whose
    # post-attention and post-FFN norms rescale that noise (measured; a wrong
    # graph, say a missing bias or a wrong RoPE base, is off by far more).
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() <= VALUE_TOLERANCE[model] * np.abs(want).max()
    assert min(np.corrcoef(g, w)[0, 1] for g, w in zip(got, want)) > 0.995


# Greedy fixtures made with llama.cpp on this project's CI machine, with the
# CPU features ggml saw (see each file's header).  Where this CPU has the same
# features, elelem runs the same kernels in the same order, and its greedy
# tokens must equal llama.cpp's exactly.  On other CPUs, a token may differ
# only where llama.cpp's own top two were within NEAR_TIE.
GREEDY = Path(__file__).parent / "fixtures" / "greedy"
LOCAL = {"qwen2": ("qwen2.5-coder-0.5b.json", "qwen_path"), "llama": ("smollm2-135m.json", "smollm_path"),
         "gemma3": ("gemma3-270m.json", "gemma_path")}
CPU_FLAGS = ("SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
             "AVX512_BF16")


def _this_cpu() -> dict:
    from elelem import _core
    compiled = {name for name, value in _core.cpu_backend_info()["features"] if value == "1"}
    return {flag: int(flag in compiled) for flag in CPU_FLAGS}


def _local_cases():
    for model, (name, _) in LOCAL.items():
        data = json.loads((GREEDY / name).read_text())
        for case in data["greedy"]:
            yield pytest.param(model, data["header"], case, id=f"{model}-{case['prompt'][:24]}")


@pytest.mark.parametrize("model,header,case", list(_local_cases()))
def test_greedy_tokens_equal_llama_cpp_on_the_same_cpu(request, model, header, case):
    path = request.getfixturevalue(LOCAL[model][1])
    with elelem.LLM(path, n_ctx=2048) as llm:
        got = llm.generate_tokens(case["prompt_ids"], len(case["greedy_ids"]),
                                  stop_ids=[header["eos_id"]])
    want = case["greedy_ids"]
    same_cpu = all(header["cpu_features"].get(f, 0) == v for f, v in _this_cpu().items())
    if same_cpu:
        assert got == want
    else:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert first is None or case["gaps"][first] < NEAR_TIE


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_opening_maps_the_weights_without_reading_them(qwen_path):
    """The 491 MB file is mapped, not read: resident memory grows by the
    repacked copies (28 MB on this model) and the tables, not by the file."""
    before = _rss_mb()
    with elelem.LLM(qwen_path, n_ctx=512) as llm:
        opened = _rss_mb()
        assert llm.gguf.file_size > 400 * 2**20
        assert opened - before < 120, f"RSS grew by {opened - before:.0f} MB on open"
        llm.eval([1, 2, 3])  # now the pages are touched, and RSS may grow
