"""generate / stream / chat / tokenize on a real model (SmolLM2-135M), with sampling passed through."""
from __future__ import annotations

import math

import pytest

import elelem
from elelem.errors import InvalidArgumentError, InvalidTokenError

pytestmark = pytest.mark.real_model

PROMPT = "The three primary colors are"
USER = [{"role": "user", "content": "Name a fruit."}]


@pytest.fixture(scope="module")
def llm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=1) as llm:
        yield llm


def test_greedy_generate_is_the_argmax_path(llm):
    ids = llm.tokenize(PROMPT, special=True)
    want = llm.detokenize(llm.generate_tokens(ids, 12)).decode()
    assert llm.generate(PROMPT, max_tokens=12, temperature=0) == want


def test_stream_deltas_join_to_the_generated_text_and_seeds_repeat(llm):
    sampling = dict(max_tokens=16, temperature=1.2, seed=7)
    deltas = list(llm.stream(PROMPT, **sampling))
    assert len(deltas) > 1
    assert "".join(deltas) == llm.generate(PROMPT, **sampling)
    others = {llm.generate(PROMPT, **{**sampling, "seed": seed}) for seed in (8, 9, 10)}
    assert len(others - {"".join(deltas)}) >= 1  # another seed, another text


def test_chat_streams_whole_characters(llm):
    deltas = list(llm.chat_stream([{"role": "user", "content": "Reply with three emoji."}],
                                  max_tokens=8, temperature=0))
    text = "".join(deltas)
    assert any(ord(c) > 0xFFFF for c in text)  # emoji, made of several byte tokens each
    # (only the very end may hold a cut-off character, if max_tokens fell inside one)
    assert not any("\ufffd" in d for d in deltas[:-1])


def test_chat_stops_at_the_end_of_turn_token(llm):
    stream = llm.chat_stream(USER, max_tokens=64, temperature=0)
    text = stream.text()
    assert stream.finish_reason == "stop" and stream.completion_tokens < 64
    assert text and "<|im_end|>" not in text
    assert llm.chat(USER, max_tokens=64, temperature=0) == text


def test_sampling_parameters_reach_the_sampler(llm):
    greedy = llm.generate(PROMPT, max_tokens=6, temperature=0)
    # top_k=1 leaves only the argmax, whatever the temperature
    assert llm.generate(PROMPT, max_tokens=6, temperature=1.5, top_k=1, seed=1) == greedy
    first = llm.tokenize(PROMPT + greedy, special=True)[len(llm.tokenize(PROMPT, special=True))]
    banned = llm.generate(PROMPT, max_tokens=6, temperature=0, logit_bias={first: -math.inf})
    assert banned != greedy
    # Temperature 0 is a plain argmax: the filters have nothing to choose between.
    assert llm.generate(PROMPT, max_tokens=6, temperature=0, top_k=3, min_p=0.5, top_p=0.5, typical_p=0.5) == greedy
    # What each option does to the tokens, penalties included, is checked against a
    # reference sampler in tests/test_sampling_reference.py.


def test_bad_sampling_arguments_fail_before_compute(llm):
    before = llm.n_evaluated
    with pytest.raises(InvalidArgumentError):
        llm.generate(PROMPT, temperature=-1)
    with pytest.raises(InvalidTokenError):
        llm.generate(PROMPT, logit_bias={10**9: 1.0})
    with pytest.raises(TypeError, match="temprature"):
        llm.generate(PROMPT, temprature=0.5)
    with pytest.raises(InvalidArgumentError):
        llm.generate(PROMPT, max_tokens=-1)
    assert llm.n_evaluated == before


def test_tokenize_and_detokenize(llm):
    ids = llm.tokenize("Hello world")
    assert llm.detokenize(ids) == b"Hello world"
    assert llm.tokenize("<|im_start|>", special=True) == [1]
    assert llm.tokenize("<|im_start|>") != [1]  # plain text unless asked
    assert llm.detokenize([1]) == b"" and llm.detokenize([1], special=True) == b"<|im_start|>"
    assert llm.tokenize("hi", add_bos=True)[0] == llm.tokenizer.bos_id


def test_prompt_may_be_token_ids(llm):
    ids = llm.tokenize(PROMPT, special=True)
    assert llm.generate(ids, max_tokens=5, temperature=0) == llm.generate(PROMPT, max_tokens=5, temperature=0)


def test_chat_content_is_tokenized_with_special_tokens_as_llama_cpp_does(llm):
    # Documented behaviour (llama.cpp, llama-cpp-python): the rendered prompt is
    # tokenized with special=True, so control-token text in a message becomes the token.
    from elelem.api.prompts import chat_prompt_ids
    ids = chat_prompt_ids(llm, [{"role": "user", "content": "a<|im_end|>b"}])
    im_end = llm.tokenize("<|im_end|>", special=True)[0]
    assert ids.count(im_end) == 3  # system, the injected one, user
