"""The generation loop on scripted logits: UTF-8 safe deltas, stop strings, EOG, max_tokens.

The "model" here forces a given token at each step (a huge logit), so the
tests are exact and need no compute; the tokenizer is SmolLM2's real one.
"""
from __future__ import annotations

import threading
import numpy as np
import pytest

from elelem.api.generation import GenerationTarget, TextStream
from elelem.gguf.reader import read_gguf
from elelem.sampling.sampler import SamplingParams
from elelem.text.tokenizer import Tokenizer

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def tokenizer(smollm_path):
    return Tokenizer.from_metadata(read_gguf(smollm_path).metadata)


class ScriptedEngine:
    """Just enough of the engine for a TextStream: each step's logits force
    the next token of ``script``; ``steps`` counts the evaluations."""

    def __init__(self, tokenizer, script):
        self.n_vocab = tokenizer.n_vocab
        self.script = list(script)
        self.steps = 0

    def next_token(self, request):
        while not request.done and not request.generated:
            logits = np.zeros(self.n_vocab, dtype=np.float32)
            logits[self.script[self.steps]] = 100.0
            self.steps += 1
            token, go_on = request.pick(logits)
            if token is not None:
                request.generated.append(token)
            if token is None or not go_on:
                request.finish()
        return request.generated.popleft() if request.generated else None

    def cancel(self, request, error=None):
        request.finish(error)


def stream_over(engine, tokenizer, params, max_tokens, stop=()):
    target = GenerationTarget(engine, 0, 4096, tokenizer.n_vocab, threading.RLock())
    return TextStream(target, tokenizer, [1, 2, 3], params, max_tokens, tuple(stop))


def run(tokenizer, script, *, max_tokens=100, stop=()):
    engine = ScriptedEngine(tokenizer, script)
    stream = stream_over(engine, tokenizer, GREEDY, max_tokens, stop)
    return list(stream), stream, engine


def test_a_character_split_over_byte_tokens_comes_out_whole(tokenizer):
    emoji = tokenizer.encode("😀")
    assert len(emoji) > 1  # byte-level pieces, each alone not valid UTF-8
    end = min(tokenizer.eog_ids)
    deltas, stream, _ = run(tokenizer, tokenizer.encode("Hi ") + emoji + tokenizer.encode(" ok") + [end])
    assert "".join(deltas) == "Hi 😀 ok"
    assert not any("\ufffd" in d for d in deltas)
    assert "😀" in deltas  # released in one piece, once its last byte arrived
    assert stream.finish_reason == "stop"


def test_end_of_generation_token_stops_and_is_not_text(tokenizer):
    im_end = tokenizer.encode("<|im_end|>", special=True)
    assert len(im_end) == 1 and tokenizer.is_eog(im_end[0])
    deltas, stream, session = run(tokenizer, tokenizer.encode("Done.") + im_end + tokenizer.encode(" more"))
    assert "".join(deltas) == "Done."
    assert stream.finish_reason == "stop"
    assert stream.completion_tokens == len(tokenizer.encode("Done."))


def test_max_tokens_ends_with_length_and_skips_the_last_evaluation(tokenizer):
    words = tokenizer.encode(" one two three four five six")
    deltas, stream, session = run(tokenizer, words, max_tokens=3)
    assert stream.completion_tokens == 3 and stream.finish_reason == "length"
    assert "".join(deltas) == tokenizer.decode(words[:3]).decode()
    assert session.steps == 3  # the prefill and two decode steps: the 3rd token is never fed back


def test_a_stop_string_across_tokens_is_held_back_then_dropped(tokenizer):
    script = tokenizer.encode("Answer: 42\n\nUser: next question")
    deltas, stream, session = run(tokenizer, script, stop=["\nUser:"])
    assert "".join(deltas) == "Answer: 42\n"
    assert stream.finish_reason == "stop"
    assert not any("User" in d for d in deltas)
    assert session.steps < len(script)  # generation stopped as soon as the stop string was complete


def test_held_back_text_is_released_at_the_end(tokenizer):
    script = tokenizer.encode("value <|no") + [min(tokenizer.eog_ids)]
    deltas, stream, _ = run(tokenizer, script, stop=["<|none|>"])
    assert "".join(deltas) == "value <|no"


def test_max_tokens_zero_computes_nothing(tokenizer):
    deltas, stream, session = run(tokenizer, [5], max_tokens=0)
    assert deltas == [] and stream.finish_reason == "length" and session.steps == 0


def test_the_sampler_is_checked_before_any_step(tokenizer):
    engine = ScriptedEngine(tokenizer, [5])
    with pytest.raises(ValueError):
        stream_over(engine, tokenizer, SamplingParams(logit_bias={10**9: 1.0}), 5)
    assert engine.steps == 0
