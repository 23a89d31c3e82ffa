"""echo and suffix in create_completion.

``echo=True`` returns the prompt's text before the answer, in the library and
the server alike (one implementation, elelem.api.completions).  ``suffix``
asks a model with fill-in-the-middle tokens for the text between the prompt
and the suffix; the prompt is llama.cpp's ``FIM_PRE prefix FIM_SUF suffix
FIM_MID``.
"""
from __future__ import annotations

import pytest

import elelem
from elelem.api.prompts import infill_prompt_ids
from elelem.errors import InvalidArgumentError
from elelem.server.config import ServerConfig
from elelem.server.chat.request import completion_call

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def qwen(qwen_path):
    with elelem.LLM(qwen_path, n_ctx=256, n_threads=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def smollm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=256, n_threads=2) as llm:
        yield llm


@pytest.mark.real_model
def test_the_fim_prompt_is_prefix_suffix_middle_as_llamacpp_builds_it(qwen):
    vocab = {qwen.tokenizer.token_text(i): i for i in (151659, 151660, 151661)}
    assert vocab == {"<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661}
    plain = {"add_bos": False, "special": False}
    ids = infill_prompt_ids(qwen.assets, PREFIX, SUFFIX, qwen._default()._check_ids)
    assert ids == [151659, *qwen.tokenize(PREFIX, **plain), 151661, *qwen.tokenize(SUFFIX, **plain), 151660]
    spm = infill_prompt_ids(qwen.assets, PREFIX, SUFFIX, qwen._default()._check_ids, suffix_first=True)
    assert spm == [151661, *qwen.tokenize(SUFFIX, **plain), 151659, *qwen.tokenize(PREFIX, **plain), 151660]
    # Plain text: control-token text in the code is not parsed into the control token.
    assert 151643 not in infill_prompt_ids(qwen.assets, "x = '<|endoftext|>'", "", qwen._default()._check_ids)


@pytest.mark.real_model
def test_suffix_fills_the_middle_on_qwen_coder(qwen):
    out = qwen.create_completion(PREFIX, suffix=SUFFIX, max_tokens=4, temperature=0, stop=["\n"])
    assert out["choices"][0]["text"] == "a + b"
    ids = infill_prompt_ids(qwen.assets, PREFIX, SUFFIX, qwen._default()._check_ids)
    assert out["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.real_model
def test_suffix_on_a_model_without_fim_tokens_is_refused(smollm):
    with pytest.raises(InvalidArgumentError, match="no FIM tokens"):
        smollm.create_completion("def add(a, b):", suffix="\n")
    with pytest.raises(InvalidArgumentError, match="suffix must be a string"):
        smollm.create_completion("def add(a, b):", suffix=3)


@pytest.mark.real_model
def test_echo_puts_the_prompt_before_the_answer(smollm):
    prompt = "The capital of France is"
    plain = smollm.create_completion(prompt, max_tokens=4, temperature=0)
    echoed = smollm.create_completion(prompt, max_tokens=4, temperature=0, echo=True)
    assert plain["choices"][0]["text"] and echoed["choices"][0]["text"] == prompt + plain["choices"][0]["text"]
    assert echoed["usage"] == plain["usage"]
    ids = smollm.tokenize(prompt)
    by_ids = smollm.create_completion(ids, max_tokens=4, temperature=0, echo=True)
    assert by_ids["choices"][0]["text"] == smollm.detokenize(ids).decode() + plain["choices"][0]["text"]
    chunks = list(smollm.create_completion(prompt, max_tokens=4, temperature=0, echo=True, stream=True))
    assert chunks[0]["choices"][0]["text"].startswith(prompt + plain["choices"][0]["text"][:1])
    assert "".join(c["choices"][0]["text"] for c in chunks) == echoed["choices"][0]["text"]
    # Nothing generated: the prompt still comes back, in the last (only) chunk.
    end_at_once = {min(smollm.eos_ids): 100.0}
    empty = list(smollm.create_completion(prompt, max_tokens=4, temperature=0, echo=True, stream=True,
                                          logit_bias=end_at_once))
    assert [c["choices"][0]["text"] for c in empty] == [prompt] and empty[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.real_model
def test_echo_is_a_boolean_and_not_with_logprobs(smollm):
    with pytest.raises(InvalidArgumentError, match="logprobs together with echo"):
        smollm.create_completion("Hi", echo=True, logprobs=2)
    with pytest.raises(InvalidArgumentError, match="echo must be a boolean"):
        smollm.create_completion("Hi", echo="yes")


def test_the_server_passes_suffix_on_to_the_library():
    call = completion_call({"prompt": PREFIX, "suffix": SUFFIX, "echo": True}, ServerConfig(models=["smollm2-135m"]))
    assert call.options["suffix"] == SUFFIX and call.echo
    assert "suffix" not in completion_call({"prompt": "x", "suffix": ""}, ServerConfig(models=["smollm2-135m"])).options
