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


@pytest.fixture(scope="module")
def qwen(qwen_path):
    with elelem.LLM(qwen_path, n_ctx=512) as llm:
        yield llm


@pytest.mark.parametrize("case", _greedy_cases("qwen2.5-coder-0.5b-instruct-q4_k_m.json"))
def test_qwen2_greedy_tokens_equal_llama_cpp(qwen, case):
    out = qwen.generate_tokens(case["prompt_ids"], N_COMPARED)
    assert out == case["greedy_ids"][:N_COMPARED]


@pytest.mark.slow
def test_qwen2_logits_agree_with_numpy_reference(qwen_path):
    from real_reference import config_of, dequantized_weights
    from synthetic import reference_logits
    ids = [750, 75698, 1445, 1648, 198, 262, 421, 308]  # "def fibonacci(n):\n    if n"
    want = reference_logits(dequantized_weights(qwen_path), config_of(qwen_path), ids, dtype=np.float32)
    with elelem.LLM(qwen_path, n_ctx=64) as llm:
        got = llm.eval(ids, all_logits=True)
    # Same top-1 at every position.  Values: ggml quantizes activations to
    # 8 bits (Q8_0 / Q8_K) for quantized matmuls, which moves logits by up to
    # ~2.5% of their range on this model; 5% leaves room, and a wrong graph
    # (say, a missing bias or a wrong RoPE) is off by far more.
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    assert min(np.corrcoef(g, w)[0, 1] for g, w in zip(got, want)) > 0.995
