"""Images through the server: the real ``openai`` and ``anthropic`` clients,
the Responses API's ``input_image``, ``/v1/models``' input modalities, the
limits on sources, and a model opened without a projector.

The model is a synthetic gemma3 with SmolLM2's vocabulary and a synthetic
gemma3 projector (tests/support/synthetic_mmproj.py); the numbers themselves
are checked against libmtmd in tests/test_vision_llamacpp.py.
"""
from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
httpx = pytest.importorskip("httpx")
PIL = pytest.importorskip("PIL.Image")

from elelem.server import ServerConfig  # noqa: E402
from synthetic import TinyConfig, write_model  # noqa: E402
from synthetic_mmproj import TinyProjector, write_projector  # noqa: E402
from test_server import InProcessServer  # noqa: E402
from vocab_metadata import vocab_writer  # noqa: E402

KEY = "test-key-images"
TEXT = TinyConfig(arch="gemma3", n_vocab=49152, n_embd=64, head_dim=32, n_layer=2, n_swa=8, tied=True)


def _png(seed: int, size=(40, 30)) -> bytes:
    px = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PIL.fromarray(px).save(buf, "PNG")
    return buf.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def files(smollm_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server_images")
    write_model(tmp / "text.gguf", TEXT, extra_metadata=vocab_writer(smollm_path))
    write_projector(tmp / "mmproj.gguf", TinyProjector(n_embd_out=64))
    return tmp / "text.gguf", tmp / "mmproj.gguf"


@pytest.fixture(scope="module")
def server(files):
    text, mmproj = files
    running = InProcessServer(ServerConfig(models=[str(text)], api_key=KEY, parallel=2, n_ctx=512, keep_alive=None,
                                           n_threads=2, llm_options={"mmproj": str(mmproj)}))
    yield running
    running.stop()


def _user(parts):
    return [{"role": "user", "content": parts}]


def _image_counts(server) -> tuple[int, int]:
    """(images encoded, images evaluated) of the served model, as /metrics shows them."""
    text = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    return tuple(int(re.search(rf'^{name}{{model="text"}} (\d+)$', text, re.M).group(1))
                 for name in ("elelem_images_encoded_total", "elelem_images_evaluated_total"))


@pytest.mark.real_model
def test_chat_completions_take_image_url_parts_and_the_same_image_is_encoded_once(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    parts = [{"type": "image_url", "image_url": {"url": _url(_png(1))}}, {"type": "text", "text": "What is this?"}]
    first = client.chat.completions.create(model="text", messages=_user(parts), max_tokens=3, temperature=0)
    assert first.choices[0].message.content is not None
    images = server.model.llm.images
    encoded, evaluated = images.projector.n_encoded, server.model.llm.engine.media.images_evaluated
    # An agent's next turn sends the same screenshot again, with the reply and a new question.
    messages = _user(parts) + [{"role": "assistant", "content": first.choices[0].message.content},
                               {"role": "user", "content": "And now?"}]
    client.chat.completions.create(model="text", messages=messages, max_tokens=3, temperature=0)
    assert images.projector.n_encoded == encoded                        # found by its pixels' hash
    assert server.model.llm.engine.media.images_evaluated == evaluated  # and in the KV cache
    assert _image_counts(server) == (encoded, evaluated)
    models = client.models.list().data
    assert models[0].model_extra["input_modalities"] == ["text", "image"]


@pytest.mark.real_model
def test_anthropic_image_blocks(server):
    client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)
    reply = client.messages.create(model="text", max_tokens=3, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(_png(2)).decode()}},
        {"type": "text", "text": "Describe it."}]}])
    assert reply.content and reply.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.real_model
def test_an_anthropic_agent_sends_the_same_screenshot_twice_and_it_is_evaluated_once(server):
    """Claude Code's way: each turn resends the whole conversation, the screenshot included.
    The second turn neither encodes it again nor evaluates its embeddings again (counted by
    /metrics); a new screenshot in the third turn is encoded and evaluated once."""
    client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)
    shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": base64.b64encode(_png(6, (48, 36))).decode()}}
    messages = [{"role": "user", "content": [shot, {"type": "text", "text": "Why does this page fail?"}]}]
    before = _image_counts(server)
    client.messages.create(model="text", max_tokens=3, messages=messages)
    first = _image_counts(server)
    assert first == (before[0] + 1, before[1] + 1)
    messages += [{"role": "assistant", "content": "The button is hidden."},
                 {"role": "user", "content": [{"type": "text", "text": "How do I fix it?"}]}]
    client.messages.create(model="text", max_tokens=3, messages=messages)
    assert _image_counts(server) == first
    other = {"type": "image", "source": {**shot["source"], "data": base64.b64encode(_png(7)).decode()}}
    messages += [{"role": "assistant", "content": "Show it to me."},
                 {"role": "user", "content": [other, {"type": "text", "text": "Here."}]}]
    client.messages.create(model="text", max_tokens=3, messages=messages)
    assert _image_counts(server) == (first[0] + 1, first[1] + 1)


@pytest.mark.real_model
def test_responses_input_image(server):
    response = httpx.post(server.url + "/v1/responses", headers={"authorization": f"Bearer {KEY}"}, timeout=120,
                          json={"model": "text", "max_output_tokens": 3, "input": [{"role": "user", "content": [
                              {"type": "input_text", "text": "What is here?"},
                              {"type": "input_image", "image_url": _url(_png(3))}]}]})
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("completed", "incomplete")


@pytest.mark.real_model
@pytest.mark.parametrize("url, message", [
    ("https://example.com/shot.png", "http(s) image URLs are not allowed"),
    ("/etc/passwd", "local image paths are not allowed"),
    ("data:image/png;base64,not-base64!", "base64"),
    (_url(b"\x89PNG\r\n\x1a\n broken"), "could not be decoded"),
])
def test_bad_images_are_400s_and_nothing_is_fetched(server, url, message):
    response = httpx.post(server.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                          timeout=120, json={"model": "text", "max_tokens": 2, "messages": _user(
                              [{"type": "image_url", "image_url": {"url": url}}])})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


@pytest.mark.real_model
def test_a_model_without_a_projector_says_so(files):
    text, _ = files
    running = InProcessServer(ServerConfig(models=[str(text)], api_key=KEY, parallel=1, n_ctx=256, keep_alive=None,
                                           n_threads=2))
    try:
        response = httpx.post(running.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                              timeout=120, json={"model": "text", "max_tokens": 2, "messages": _user(
                                  [{"type": "image_url", "image_url": {"url": _url(_png(4))}}])})
        assert response.status_code == 400
        assert "without a projector" in response.json()["error"]["message"]
        models = httpx.get(running.url + "/v1/models", headers={"authorization": f"Bearer {KEY}"}).json()
        assert models["data"][0]["input_modalities"] == ["text"]
    finally:
        running.stop()


@pytest.mark.real_model
def test_compat_llama_takes_a_multimodal_chat_handler(files):
    """llama-cpp-python's usage, unchanged: Llama(..., chat_handler=Gemma3ChatHandler(clip_model_path=...))
    (any handler with a clip_model_path, as its Llava15ChatHandler family has), then image_url parts."""
    from elelem.compat import Llama

    class Gemma3ChatHandler:   # the attribute llama-cpp-python's handlers keep the projector path in
        def __init__(self, clip_model_path):
            self.clip_model_path = clip_model_path

    text, mmproj = files
    llm = Llama(str(text), n_ctx=256, n_threads=2, chat_handler=Gemma3ChatHandler(clip_model_path=str(mmproj)),
                verbose=False)
    try:
        out = llm.create_chat_completion(messages=_user([
            {"type": "image_url", "image_url": {"url": _url(_png(5))}}, {"type": "text", "text": "What is it?"}]),
            max_tokens=2, temperature=0)
        assert out["choices"][0]["message"]["role"] == "assistant"
        assert llm._llm.images.projector.n_encoded == 1
    finally:
        llm.close()
