"""OpenAI-style content parts in chat messages: text parts
are the text they hold; an image, without a projector, is refused saying so;
any other part is refused by name."""
from __future__ import annotations

import pytest

import elelem
from elelem.api.prompts import content_text, text_messages
from elelem.errors import InvalidArgumentError


def test_text_parts_join_and_other_parts_are_refused_by_name():
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    assert content_text(parts) == "Hello, world"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]
    assert text_messages(messages) == [messages[0], {"role": "user", "content": "Hello, world"}]
    only_text = messages[:1]
    assert text_messages(only_text) is only_text      # nothing to join: the same list
    with pytest.raises(InvalidArgumentError, match=r"messages\[1\]\.content\[1\] is an image, and this model was "
                                                   r"opened without a projector"):
        text_messages([messages[0], {"role": "user", "content": [parts[0], {"type": "image_url", "image_url": {}}]}])
    with pytest.raises(InvalidArgumentError, match=r"messages\[1\]\.content\[1\] is a 'input_audio' part"):
        text_messages([messages[0], {"role": "user", "content": [parts[0], {"type": "input_audio", "input_audio": {}}]}])
    with pytest.raises(InvalidArgumentError, match="must be a string"):
        content_text([{"type": "text", "text": 3}])
    with pytest.raises(InvalidArgumentError, match="'str' part"):
        content_text(["just a string"])


@pytest.mark.real_model
def test_a_chat_with_content_parts_is_the_chat_with_their_text(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=512, n_threads=2) as llm:
        parts = [{"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "fruit."}]}]
        plain = [{"role": "user", "content": "Name a fruit."}]
        assert llm.chat(parts, max_tokens=8, temperature=0) == llm.chat(plain, max_tokens=8, temperature=0)
        reply = llm.create_chat_completion(parts, max_tokens=4, temperature=0)
        assert reply["choices"][0]["message"]["content"]
        with pytest.raises(InvalidArgumentError, match="input_audio"):
            llm.chat([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], max_tokens=2)
