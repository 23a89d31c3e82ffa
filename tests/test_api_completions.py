"""create_completion / create_chat_completion return llama-cpp-python's dict shapes.

The expected keys are those of llama_cpp/llama_types.py (0.3.x):
CreateCompletionResponse, CreateChatCompletionResponse and the stream chunks.
"""
from __future__ import annotations

import pytest

import elelem

pytestmark = pytest.mark.real_model

COMPLETION_KEYS = {"id", "object", "created", "model", "choices", "usage"}
CHUNK_KEYS = {"id", "object", "created", "model", "choices"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens"}
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def llm(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=1) as llm:
        yield llm


def check_usage(usage, prompt_tokens, completion_tokens):
    assert set(usage) == USAGE_KEYS
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == prompt_tokens + completion_tokens


def test_completion(llm):
    out = llm.create_completion("Once upon a time", max_tokens=4, temperature=0)
    assert set(out) == COMPLETION_KEYS
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    assert isinstance(out["created"], int) and out["model"] == str(llm.path)
    (choice,) = out["choices"]
    assert choice == {"text": choice["text"], "index": 0, "logprobs": None, "finish_reason": "length"}
    assert choice["text"] == llm.generate("Once upon a time", max_tokens=4, temperature=0)
    check_usage(out["usage"], len(llm.tokenize("Once upon a time", special=True)), 4)
    assert llm("Once upon a time", max_tokens=4, temperature=0)["choices"][0]["text"] == choice["text"]
    assert llm.create_completion("x", max_tokens=2, model="my-model")["model"] == "my-model"


def test_completion_stream(llm):
    chunks = list(llm.create_completion("Once upon a time", max_tokens=4, temperature=0, stream=True))
    assert all(set(c) == CHUNK_KEYS and c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    *deltas, last = chunks
    assert all(c["choices"][0]["finish_reason"] is None for c in deltas)
    assert last["choices"] == [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}]
    text = "".join(c["choices"][0]["text"] for c in deltas)
    assert text == llm.generate("Once upon a time", max_tokens=4, temperature=0)


def test_chat_completion(llm):
    out = llm.create_chat_completion(MESSAGES, max_tokens=32, temperature=0)
    assert set(out) == COMPLETION_KEYS
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    (choice,) = out["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant" and set(choice["message"]) == {"role", "content"}
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == llm.chat(MESSAGES, max_tokens=32, temperature=0)
    assert out["usage"]["completion_tokens"] > 0


def test_chat_completion_stream(llm):
    chunks = list(llm.create_chat_completion(MESSAGES, max_tokens=3, temperature=0, stream=True))
    assert all(set(c) == CHUNK_KEYS and c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["id"].startswith("chatcmpl-")
    first, *middle, last = chunks
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in middle)
    assert last["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]
    text = "".join(c["choices"][0]["delta"]["content"] for c in middle)
    assert text == llm.chat(MESSAGES, max_tokens=3, temperature=0)


def test_chat_defaults_to_llama_cpp_python_temperature(llm):
    from elelem.api.text_api import CHAT_DEFAULTS
    assert CHAT_DEFAULTS == {"temperature": 0.2}
    # a seed makes even the sampled default reproducible
    a = llm.create_chat_completion(MESSAGES, max_tokens=8, seed=3)["choices"][0]["message"]["content"]
    assert a == llm.chat(MESSAGES, max_tokens=8, seed=3)


def test_stop_strings_in_completions(llm):
    full = llm.generate("1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert " 7," in full  # the model counts on
    out = llm.create_completion("1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 7,"])
    assert out["choices"][0]["text"] == full[:full.index(" 7,")]
    assert out["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(c["choices"][0]["text"] for c in
                       llm.create_completion("1, 2, 3, 4,", max_tokens=12, temperature=0, stop=" 7,", stream=True))
    assert streamed == out["choices"][0]["text"]
