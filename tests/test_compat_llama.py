"""elelem.compat.Llama: llama-cpp-python's README examples
and its documented API, run against the shim on SmolLM2 (and Qwen2.5-Coder
for fill-in-the-middle), and compared with llama-cpp-python 0.3.36 itself
(tests/support/fixtures/make_compat_fixtures.py, run live under the reference build).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import elelem
from elelem.api.llm import LLM
from elelem.compat import Llama, LlamaState
from elelem.compat import llama_options
from elelem.engine.engine import REUSE_ALIGNMENT
from elelem.errors import ContextLimitError, ElelemError, InvalidArgumentError
from fixtures import make_compat_fixtures as ref_script
from llamacpp_reference import FIXTURES, THREADS, elelem_kernel_options

pytestmark = pytest.mark.real_model

README_PROMPT = ref_script.README_PROMPT
COMPLETION_KEYS = {"id", "object", "created", "model", "choices", "usage"}
CHOICE_KEYS = {"text", "index", "logprobs", "finish_reason"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens"}


@pytest.fixture(scope="module")
def llm(smollm_path):
    # elelem_kernel_options: the reference's kernels (no AMX) on a CPU with AMX.
    with Llama(model_path=str(smollm_path), n_threads=THREADS, verbose=False,
               elelem_options=elelem_kernel_options()) as llama:
        yield llama


def llamacpp_answers(llamacpp, name: str, path: Path) -> dict:
    """make_compat_fixtures.py's output for one model: live under the reference build, else a stored
    fixture made with this machine's kernels (tests/support/llamacpp_reference.py)."""
    return llamacpp._per_model("make_compat_fixtures.py", "compat", name, path,
                               [FIXTURES / "make_greedy_fixtures.py", FIXTURES / "per_model_fixture.py"])


# -- the README's high-level API ---------------------------------------------------


def test_readme_completion_with_stop_and_echo(llm, smollm_path):
    output = llm(README_PROMPT, max_tokens=32, stop=["Q:", "\n"], echo=True)
    assert set(output) == COMPLETION_KEYS and set(output["choices"][0]) == CHOICE_KEYS
    assert set(output["usage"]) == USAGE_KEYS
    assert output["id"].startswith("cmpl-") and output["object"] == "text_completion"
    assert output["model"] == str(smollm_path)
    text = output["choices"][0]["text"]
    assert text.startswith(README_PROMPT) and len(text) > len(README_PROMPT)
    answer = text[len(README_PROMPT):]
    assert "\n" not in answer and "Q:" not in answer
    usage = output["usage"]
    assert usage["prompt_tokens"] == len(llm.tokenize(README_PROMPT.encode()))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] <= llm.n_ctx()
    assert output["choices"][0]["finish_reason"] in ("stop", "length")


def test_readme_examples_give_llamacpp_python_s_greedy_answers(llm, smollm_path, llamacpp):
    reference = llamacpp_answers(llamacpp, "smollm2-135m", smollm_path)
    for (prompt, options), theirs in zip(ref_script.COMPLETIONS, reference["completions"]):
        mine = llm(prompt, temperature=0.0, **options)["choices"][0]
        assert (mine["text"], mine["finish_reason"]) == (theirs["text"], theirs["finish_reason"]), prompt
    for messages, theirs in zip(ref_script.CHATS, reference["chats"]):
        mine = llm.create_chat_completion(messages, temperature=0.0, max_tokens=24)["choices"][0]
        assert mine["message"] == theirs["message"] and mine["finish_reason"] == theirs["finish_reason"]
    generator = llm.generate(llm.tokenize(ref_script.GENERATE_PROMPT.encode()), temp=0.0)
    assert [next(generator) for _ in range(ref_script.GENERATE_TOKENS)] == reference["generated"]
    generator.close()
    for (text, add_bos, special), theirs in zip(ref_script.TOKENIZE, reference["tokenized"]):
        assert llm.tokenize(text.encode(), add_bos=add_bos, special=special) == theirs, text


def test_fill_in_the_middle_matches_llamacpp_on_qwen_coder(qwen_path, llamacpp):
    reference = llamacpp_answers(llamacpp, "qwen2.5-coder-0.5b", qwen_path)["fim"]
    with Llama(model_path=str(qwen_path), n_threads=THREADS, verbose=False,
               elelem_options=elelem_kernel_options()) as qwen:
        out = qwen(ref_script.FIM_PREFIX, suffix=ref_script.FIM_SUFFIX, max_tokens=ref_script.FIM_MAX_TOKENS,
                   temperature=0.0)
        assert out["usage"]["prompt_tokens"] == len(reference["prompt_ids"])
        assert out["choices"][0]["text"] == reference["text"]
        assert out["choices"][0]["text"].startswith("a + b")


def test_readme_chat_completion(llm):
    messages = [{"role": "system", "content": "You are an assistant who perfectly describes images."},
                {"role": "user", "content": "Describe this image in detail please."}]
    reply = llm.create_chat_completion(messages=messages, max_tokens=8)
    assert set(reply) == COMPLETION_KEYS and reply["object"] == "chat.completion"
    assert reply["id"].startswith("chatcmpl-")
    choice = reply["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert reply["usage"]["completion_tokens"] <= 8


def test_readme_json_mode_and_json_schema_mode(llm):
    messages = [{"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
                {"role": "user", "content": "Who won the world series in 2020"}]
    schema = {"type": "object", "properties": {"team_name": {"type": "string", "maxLength": 40}},
              "required": ["team_name"]}
    reply = llm.create_chat_completion(messages=messages, response_format={"type": "json_object", "schema": schema},
                                       temperature=0.7, max_tokens=64)
    assert reply["choices"][0]["finish_reason"] == "stop"
    value = json.loads(reply["choices"][0]["message"]["content"])
    assert set(value) == {"team_name"} and isinstance(value["team_name"], str)
    reply = llm.create_chat_completion(messages=messages, response_format={"type": "json_object"},
                                       temperature=0.0, max_tokens=32)
    if reply["choices"][0]["finish_reason"] == "stop":   # a long reply may be cut by max_tokens
        assert isinstance(json.loads(reply["choices"][0]["message"]["content"]), dict)
    assert reply["choices"][0]["message"]["content"].lstrip().startswith("{")


def test_streaming_completion_and_chat(llm):
    whole = llm("The capital of France is", max_tokens=8, temperature=0.0)
    chunks = list(llm("The capital of France is", max_tokens=8, temperature=0.0, stream=True))
    assert all(set(c) == COMPLETION_KEYS - {"usage"} for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    messages = [{"role": "user", "content": "Say hello."}]
    reply = llm.create_chat_completion(messages, max_tokens=8, temperature=0.0)
    parts = list(llm.create_chat_completion(messages, max_tokens=8, temperature=0.0, stream=True))
    assert parts[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert parts[-1]["choices"][0]["delta"] == {} and parts[-1]["choices"][0]["finish_reason"]
    assert "".join(p["choices"][0]["delta"].get("content", "") for p in parts) == \
        reply["choices"][0]["message"]["content"]


def test_grammar_takes_a_llamagrammar_or_its_text(llm):
    class LlamaGrammar:  # llama_cpp.LlamaGrammar keeps its GBNF text in _grammar
        _grammar = 'root ::= "yes" | "no"'
    for grammar in (LlamaGrammar(), LlamaGrammar._grammar):
        out = llm("Is the sky blue? Answer:", grammar=grammar, max_tokens=4, temperature=0.0)
        assert out["choices"][0]["text"] in ("yes", "no")
    with pytest.raises(InvalidArgumentError, match="grammar must be GBNF text"):
        llm("x", grammar=3)


# -- max_tokens, seeds, what is refused ---------------------------------------------


def test_max_tokens_is_clamped_to_the_context_as_llamacpp_python_does(smollm_path):
    with Llama(model_path=str(smollm_path), n_ctx=20, n_threads=THREADS, verbose=False) as small:
        prompt = "Count: one, two, three,"
        n_prompt = len(small.tokenize(prompt.encode()))
        no_end = {t: float("-inf") for t in small.llm.eos_ids}
        for max_tokens in (100, None, -1):
            out = small(prompt, max_tokens=max_tokens, temperature=0.0, logit_bias=no_end)
            assert out["usage"]["completion_tokens"] == 20 - n_prompt, max_tokens
            assert out["choices"][0]["finish_reason"] == "length"
        assert small(prompt, max_tokens=3, temperature=0.0, logit_bias=no_end)["usage"]["completion_tokens"] == 3
        with pytest.raises(ValueError):  # the prompt alone fills the context: llama-cpp-python raises too
            small("word " * 30, max_tokens=4)
        with pytest.raises(ContextLimitError):
            small.llm.create_completion(prompt, max_tokens=100)  # elelem's own API stays strict


def test_a_call_without_a_seed_samples_with_the_llama_s_seed(llm):
    first = llm("Once upon a time", max_tokens=12, temperature=1.0)["choices"][0]["text"]
    again = llm("Once upon a time", max_tokens=12, temperature=1.0)["choices"][0]["text"]
    seeded = llm("Once upon a time", max_tokens=12, temperature=1.0, seed=llm._seed)["choices"][0]["text"]
    assert first == again == seeded
    assert llm("Once upon a time", max_tokens=4, temperature=-1.0)["usage"]["completion_tokens"] >= 1


def test_what_elelem_cannot_do_is_refused_clearly(llm):
    with pytest.raises(InvalidArgumentError, match="mirostat"):
        llm("x", mirostat_mode=2)
    with pytest.raises(InvalidArgumentError, match="generate"):
        llm("x", logits_processor=[lambda ids, scores: scores])
    with pytest.raises(InvalidArgumentError, match="no FIM tokens"):
        llm("def f():", suffix="\n")


# -- the documented lower-level API -------------------------------------------------


def test_tokenize_detokenize_and_the_model_facts(llm):
    text = b"Hello, world! \xc3\xa9t\xc3\xa9"
    ids = llm.tokenize(text)
    assert llm.detokenize(ids) == text
    assert llm.detokenize(ids[2:], prev_tokens=ids[:2]) == llm.detokenize(ids)[len(llm.detokenize(ids[:2])):]
    assert llm.tokenize(b"<|im_start|>", special=True) == [1] and len(llm.tokenize(b"<|im_start|>")) > 1
    meta = llm.llm.gguf
    assert llm.n_ctx() == 512 and llm.n_vocab() == 49152 == len(meta.get("tokenizer.ggml.tokens"))
    assert llm.n_embd() == meta.get("llama.embedding_length") == 576
    assert llm.token_eos() == meta.get("tokenizer.ggml.eos_token_id") == 2
    assert llm.token_bos() == meta.get("tokenizer.ggml.bos_token_id") == 1
    assert llm.detokenize([llm.token_nl()]) == b"\n"
    assert llm.metadata["general.architecture"] == "llama"
    assert llm.metadata["tokenizer.ggml.add_bos_token"] == "false"
    assert "tokenizer.ggml.tokens" not in llm.metadata  # arrays are not listed, as in llama.cpp


def test_generate_yields_the_greedy_ids_and_takes_sent_tokens(llm):
    tokens = llm.tokenize(b"The quick brown fox")
    generator = llm.generate(tokens, top_k=40, top_p=0.95, temp=0, repeat_penalty=1.0)
    ids = [next(generator) for _ in range(8)]
    generator.close()
    assert ids == llm.llm.generate_tokens(tokens, 8)
    # send() evaluates more tokens after the one just yielded (llama-cpp-python's generator protocol).
    generator = llm.generate(tokens, temp=0)
    first = next(generator)
    forced = llm.tokenize(b" jumps over")
    after = generator.send(forced)
    generator.close()
    assert after == llm.llm.generate_tokens([*tokens, first, *forced], 1)[0]
    # A logits processor sees the ids so far and can force a token.
    only_7 = [lambda input_ids, scores: np.where(np.arange(scores.size) == 7, scores, -np.inf)]
    generator = llm.generate(tokens, temp=0.8, logits_processor=only_7)
    assert [next(generator), next(generator)] == [7, 7]
    generator.close()


def test_eval_n_tokens_and_reset(llm):
    llm.reset()
    assert llm.n_tokens == 0
    first, second = llm.tokenize(b"One two three"), llm.tokenize(b" four five")
    llm.eval(first)
    llm.eval(second)
    assert llm.n_tokens == len(first) + len(second)
    assert list(llm.input_ids[:llm.n_tokens]) == first + second and llm.input_ids.shape == (512,)
    token = llm.sample(temp=0)  # from the logits of the last eval
    llm.n_tokens = 2  # rewinding, as llama-cpp-python code does by hand
    assert llm.n_tokens == 2 and llm.llm.cached_tokens == first[:2]
    with pytest.raises(InvalidArgumentError, match="eval"):
        llm.sample(temp=0)  # the logits of the last eval are gone with its tokens
    assert token == llm.llm.generate_tokens(first + second, 1)[0]
    llm.reset()
    assert llm.n_tokens == 0


def test_save_state_and_load_state_round_trip(llm):
    llm.reset()
    tokens = llm.tokenize(b"The weather today is sunny, with a light breeze from the west and")
    llm.eval(tokens)
    state = llm.save_state()
    assert isinstance(state, LlamaState) and state.n_tokens == len(tokens)
    assert list(state.input_ids) == tokens and state.llama_state_size > 0
    expected = llm.llm.generate_tokens(tokens, 4)
    llm.reset()
    llm.load_state(state)
    assert llm.n_tokens == len(tokens)
    before = llm.llm.n_evaluated
    generator = llm.generate(tokens, temp=0)
    assert [next(generator) for _ in range(4)] == expected
    generator.close()
    # the loaded prefix is not evaluated again: its last 2 to 5 tokens (the reuse
    # grid, see the engine), and the 3 picks fed back
    assert llm.llm.n_evaluated - before <= 2 + (REUSE_ALIGNMENT - 1) + 3 < len(tokens)


def test_logits_all_keeps_every_row_of_eval(smollm_path):
    with Llama(model_path=str(smollm_path), n_ctx=64, n_threads=THREADS, logits_all=True, verbose=False) as full:
        tokens = full.tokenize(b"Paris is the capital of")
        full.eval(tokens)
        # flash_attn=False: the shim keeps llama-cpp-python's default, LLM's is "auto" (on, on the CPU).
        with elelem.LLM(smollm_path, n_ctx=64, n_threads=THREADS, flash_attn=False) as plain:
            rows = plain.eval(tokens, all_logits=True)
            greedy = plain.generate_tokens(tokens, 3)
        np.testing.assert_allclose(full.scores[:len(tokens)], rows, atol=1e-4)
        assert full.sample(temp=0) == int(np.argmax(rows[-1]))
        assert full.sample(temp=0, idx=1) == int(np.argmax(rows[1]))
        full.eval([])  # nothing to evaluate: a no-op, as in llama-cpp-python
        assert full.n_tokens == len(tokens)
        generator = full.generate(tokens, temp=0)  # one token per step: one row each
        assert [next(generator) for _ in range(3)] == greedy
        generator.close()
        assert full.scores[len(tokens) + 1].any() and not full.scores[len(tokens) + 2].any()


# -- the constructor ------------------------------------------------------------------


def test_every_keyword_is_accepted_and_those_without_effect_are_logged_once(smollm_path, caplog, monkeypatch):
    monkeypatch.setattr(llama_options, "_logged", set())
    keywords = dict(n_gpu_layers=-1, use_mlock=True, n_ubatch=256, rope_freq_base=0.0, lora_path=None,
                    chat_format="chatml", numa=False, not_a_llama_keyword=1, n_threads_batch=7)
    with caplog.at_level(logging.WARNING, logger="elelem"):
        for _ in range(2):
            with Llama(model_path=str(smollm_path), n_ctx=64, n_threads=1, seed=1337, **keywords) as made:
                assert made.n_ctx() == 64
    logged = [r.getMessage() for r in caplog.records if r.name == "elelem" and "no effect" in r.getMessage()]
    named = sorted(message.split("(")[1].split("=")[0] for message in logged)
    # rope_freq_base=0.0, lora_path=None and numa=False are llama-cpp-python's defaults: nothing to say.
    assert named == ["chat_format", "n_threads_batch", "n_ubatch", "not_a_llama_keyword",
                     "use_mlock"]


def test_the_keywords_that_map(smollm_path):
    with Llama(model_path=str(smollm_path), n_ctx=0, n_batch=4096, n_threads=1, type_k=8, type_v="f16",
               use_mmap=False, verbose=False, elelem_options={"speculative": False}) as made:
        assert not made.llm.engine.speculative
        assert made.n_ctx() == 8192 == made.llm.hparams["n_ctx_train"]   # 0: the trained context
        assert made.n_batch == 4096 and made.n_threads == 1
        cache = made.llm.engine.context.cache
        assert (cache.type_k, cache.type_v) == ("q8_0", "f16")            # GGML_TYPE_Q8_0 is 8
    with pytest.raises(InvalidArgumentError, match="ggml type id"):
        Llama(model_path=str(smollm_path), n_ctx=64, type_k=99)


def test_embeddings_forward_to_elelem_when_it_has_them(llm, monkeypatch):
    if hasattr(LLM, "embed"):
        vector = llm.embed("Hello, world!")
        assert np.asarray(vector).shape[-1] == llm.n_embd()
        response = llm.create_embedding(["Hello", "world"])
        assert response["object"] == "list" and [d["index"] for d in response["data"]] == [0, 1]
    monkeypatch.delattr(LLM, "embed", raising=False)
    with pytest.raises(ElelemError, match="no embeddings"):
        llm.create_embedding("Hello")


# -- tool calls in every format, reasoning, template variables --------------------------------

@pytest.fixture(scope="module")
def family_shim(tmp_path_factory):
    from format_models import family_models
    with family_models(tmp_path_factory, lambda path: Llama(str(path), n_ctx=2048, n_threads=1, verbose=False)) as get:
        yield get


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "harmony", "mistral", "llama3", "glm"])
def test_tool_calls_in_every_format_come_back_in_llamacpp_python_s_shape(family_shim, family):
    from test_tools_formats import BOUNDED, QUESTION, steering, valid_call
    model, shim = family_shim(family)
    response = shim.create_chat_completion(QUESTION, tools=BOUNDED, tool_choice="required", max_tokens=400,
                                           temperature=1.0, seed=0, logit_bias=steering(model, family))
    choice = response["choices"][0]
    assert response["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"] and valid_call(call) in ("get_weather", "get_time")
    # OpenAI's older functions/function_call: the same call, named
    named = shim.create_chat_completion(QUESTION, functions=[t["function"] for t in BOUNDED],
                                        function_call={"name": "get_time"}, max_tokens=400, temperature=1.0, seed=1,
                                        logit_bias=steering(model, family))
    assert valid_call(named["choices"][0]["message"]["tool_calls"][0]) == "get_time"


def test_reasoning_output_and_template_variables(family_shim):
    model, shim = family_shim("harmony")
    token = {t: f"<[{model.ids[t]}]>" for t in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")}
    grammar = (f'start: {token["<|channel|>"]} "analysis" {token["<|message|>"]} "Easy." {token["<|end|>"]} '
               f'{token["<|start|>"]} "assistant" {token["<|channel|>"]} "final" {token["<|message|>"]} "Paris."')
    hi = [{"role": "user", "content": "Capital of France?"}]
    default = shim.create_chat_completion(hi, grammar=grammar, max_tokens=80, temperature=0)
    assert default["choices"][0]["message"] == {"role": "assistant", "content": "Paris.",
                                                "reasoning_content": "Easy."}
    raw = shim.create_chat_completion(hi, grammar=grammar, max_tokens=80, temperature=0, reasoning_format="none")
    # reasoning_format="none": the analysis stays in the content, markup included, as llama.cpp gives it
    assert raw["choices"][0]["message"]["content"] == "<|channel|>analysis<|message|>Easy.<|end|>Paris."
    chunks = list(shim.create_chat_completion(hi, grammar=grammar, max_tokens=80, temperature=0, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Easy."
    assert "".join(d.get("content") or "" for d in deltas) == "Paris."
    # reasoning_effort reaches gpt-oss's template: "Reasoning: low" is 3 byte-level tokens shorter than "medium"
    low = shim.create_chat_completion(hi, grammar=grammar, max_tokens=80, temperature=0,
                                      chat_template_kwargs={"reasoning_effort": "low"})
    assert default["usage"]["prompt_tokens"] - low["usage"]["prompt_tokens"] == 3
    with pytest.raises(InvalidArgumentError, match="reasoning_format"):
        shim.create_chat_completion(hi, reasoning_format="sometimes")


def test_the_tool_call_format_can_be_named(family_shim):
    from test_tools_formats import BOUNDED, QUESTION, steering, valid_call
    model, _ = family_shim("glm")
    with Llama(str(model.path), n_ctx=2048, n_threads=1, verbose=False, tool_call_format="hermes") as shim:
        assert shim.llm.assets.tool_call_format == "hermes"  # GLM's template, Hermes's markup
        response = shim.create_chat_completion(QUESTION, tools=BOUNDED, tool_choice="required", max_tokens=200,
                                               temperature=0, logit_bias=steering(model, "glm"))
        assert valid_call(response["choices"][0]["message"]["tool_calls"][0])
        with pytest.raises(InvalidArgumentError, match="tool_call_format"):
            shim.create_chat_completion(QUESTION, tools=BOUNDED, tool_call_format="nope")
    with pytest.raises(InvalidArgumentError, match="tool_call_format"):
        Llama(str(model.path), tool_call_format="nope", verbose=False)
