"""logprobs: the model's log-probabilities of the tokens
it generated, in llama-cpp-python's completion shape and OpenAI's chat shape.

For the same greedy tokens the values must be llama.cpp's within 1e-3: the
real models run against llama-cpp-python's ``create_completion(...,
logprobs=5)`` on this machine (tests/support/fixtures/make_logprobs_fixtures.py).
"""
from __future__ import annotations

import numpy as np
import pytest

import elelem
from elelem.engine.step_costs import StepCosts
from elelem.errors import InvalidArgumentError
from elelem.sampling.logprobs import log_softmax, token_logprob
from llamacpp_reference import THREADS, elelem_kernel_options
from fixtures.make_logprobs_fixtures import MAX_TOKENS, PROMPTS, TOP

TOLERANCE = 1e-3


def test_log_softmax_and_the_likeliest_tokens():
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(5000) * 4).astype(np.float32)
    exact = logits.astype(np.float64) - np.log(np.sum(np.exp(logits.astype(np.float64))))
    np.testing.assert_allclose(log_softmax(logits), exact, atol=1e-5)
    entry = token_logprob(logits, 7, 4)
    assert entry.token == 7 and entry.logprob == pytest.approx(exact[7], abs=1e-5)
    assert [i for i, _ in entry.top] == list(np.argsort(-exact)[:4])
    assert token_logprob(logits, 7, 0).top == ()
    with_inf = logits.copy()
    with_inf[3] = -np.inf                         # a banned token: probability 0, not NaN
    assert token_logprob(with_inf, 3, 1).logprob == -np.inf


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_completion_logprobs_match_llamacpp(llamacpp, name):
    from conftest import packaged_model
    path = packaged_model(name)
    reference = llamacpp.logprobs(name, path)
    with elelem.LLM(path, n_ctx=512, n_threads=THREADS, **elelem_kernel_options()) as llm:
        for run in reference["runs"]:
            # Each prompt evaluated afresh, as the reference does (it resets): the BOS
            # kept from the previous prompt was computed in a batch of another size,
            # and ggml picks kernels by batch size (K-quant weights that are not
            # repacked take a tiled kernel from 8 rows): its K and V differ in the last
            # bits (Gemma-3-270M, AMD EPYC with AVX-512: logprobs off by up to 0.13).
            llm.reset()
            ours = llm.create_completion(run["prompt"], max_tokens=MAX_TOKENS, temperature=0.0, logprobs=TOP)
            mine, theirs = ours["choices"][0]["logprobs"], run["logprobs"]
            # Compare up to the first token that differs (a near-tie may flip between builds).
            n = next((i for i, (a, b) in enumerate(zip(mine["tokens"], theirs["tokens"])) if a != b),
                     min(len(mine["tokens"]), len(theirs["tokens"])))
            assert n >= 3, (run["prompt"], mine["tokens"], theirs["tokens"])
            assert mine["text_offset"][:n] == theirs["text_offset"][:n]
            np.testing.assert_allclose(mine["token_logprobs"][:n], theirs["token_logprobs"][:n], atol=TOLERANCE)
            for a, b in zip(mine["top_logprobs"][:n], theirs["top_logprobs"][:n]):
                shared = a.keys() & b.keys()
                assert len(shared) >= TOP - 1            # a tie at the edge of the top 5 may differ
                for key in shared:
                    assert a[key] == pytest.approx(b[key], abs=TOLERANCE)


@pytest.fixture(scope="module")
def smollm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=2) as llm:
        yield llm


@pytest.mark.real_model
def test_streamed_logprobs_are_the_whole_answers_split_by_chunk(smollm):
    whole = smollm.create_completion(PROMPTS[0], max_tokens=8, temperature=0.0, logprobs=2)
    chunks = list(smollm.create_completion(PROMPTS[0], max_tokens=8, temperature=0.0, logprobs=2, stream=True))
    joined = {k: [v for c in chunks for v in c["choices"][0]["logprobs"][k]] for k in whole["choices"][0]["logprobs"]}
    assert joined == whole["choices"][0]["logprobs"]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == whole["choices"][0]["text"]
    logprobs = whole["choices"][0]["logprobs"]
    assert "".join(logprobs["tokens"]) == text     # every token, in order, and its text offset
    base = len(PROMPTS[0])
    assert logprobs["text_offset"] == [base + len("".join(logprobs["tokens"][:i])) for i in range(len(text and
                                                                                                        logprobs["tokens"]))]


@pytest.mark.real_model
def test_chat_logprobs_have_openais_shape_and_the_completions_values(smollm):
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = smollm.create_chat_completion(messages, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=3)
    content = reply["choices"][0]["logprobs"]["content"]
    assert "".join(item["token"] for item in content) == reply["choices"][0]["message"]["content"]
    for item in content:
        assert bytes(item["bytes"]).decode("utf-8", "ignore") == item["token"]
        assert len(item["top_logprobs"]) == 3
        values = [alt["logprob"] for alt in item["top_logprobs"]]
        assert values == sorted(values, reverse=True) and item["logprob"] <= values[0] + 1e-6
    chunks = list(smollm.create_chat_completion(messages, max_tokens=6, temperature=0.0, logprobs=True,
                                                top_logprobs=3, stream=True))
    streamed = [item for c in chunks if c["choices"][0]["logprobs"] for item in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    plain = smollm.create_chat_completion(messages, max_tokens=6, temperature=0.0)
    assert plain["choices"][0]["logprobs"] is None
    only_chosen = smollm.create_chat_completion(messages, max_tokens=2, temperature=0.0, logprobs=True)
    assert all(item["top_logprobs"] == [] for item in only_chosen["choices"][0]["logprobs"]["content"])


@pytest.mark.real_model
def test_logprobs_turn_speculation_off_unless_asked_for(smollm_path):
    """Verified drafts come from batched steps, which round differently: a call
    with logprobs decodes token by token, so its values are llama.cpp's."""
    prompt = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return"
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=2, speculative=False) as plain, \
            elelem.LLM(smollm_path, n_ctx=512, n_threads=2) as default:
        default.engine.step_costs = StepCosts.flat()  # drafts verified whatever steps cost here
        expected = plain.create_completion(prompt, max_tokens=12, temperature=0.0, logprobs=1)["choices"][0]
        drafted_before = default.engine.drafted_tokens
        got = default.create_completion(prompt, max_tokens=12, temperature=0.0, logprobs=1)["choices"][0]
        assert default.engine.drafted_tokens == drafted_before
        assert got == expected
        default.create_completion(prompt, max_tokens=12, temperature=0.0, logprobs=1, speculative=True)
        assert default.engine.drafted_tokens > drafted_before


@pytest.mark.real_model
@pytest.mark.parametrize("kwargs", [{"logprobs": 21}, {"logprobs": -1}, {"logprobs": True}, {"logprobs": 2.5}])
def test_bad_completion_logprobs_are_refused(smollm, kwargs):
    with pytest.raises(InvalidArgumentError, match="logprobs"):
        smollm.create_completion("Hi", max_tokens=2, **kwargs)


@pytest.mark.real_model
@pytest.mark.parametrize("kwargs", [{"logprobs": 3}, {"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}])
def test_bad_chat_logprobs_are_refused(smollm, kwargs):
    with pytest.raises(InvalidArgumentError, match="logprobs"):
        smollm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=2, **kwargs)
