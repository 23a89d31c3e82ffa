"""``response_format`` and ``grammar`` through ``elelem serve``, driven by the ``openai`` client."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from elelem.server import ServerConfig  # noqa: E402
from test_server import InProcessServer, post  # noqa: E402

pytestmark = pytest.mark.real_model

KEY = "test-key-structured"
ASK = [{"role": "user", "content": "Give me a contact for Ada Lovelace, 36, as JSON."}]


class Contact(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=18, le=99)


@pytest.fixture(scope="module")
def server(smollm_path):
    running = InProcessServer(ServerConfig(models=[str(smollm_path)], api_key=KEY, parallel=2, n_ctx=512,
                                           keep_alive=None, n_threads=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_openai_parse_with_a_pydantic_model(client, server):
    # The client sends {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}} and parses
    # the reply into the model (it raises if the content does not validate, or if max_tokens cut it).
    completion = client.chat.completions.parse(model=server.model.id, messages=ASK, response_format=Contact,
                                               max_tokens=120, temperature=0)
    contact = completion.choices[0].message.parsed
    assert isinstance(contact, Contact) and 18 <= contact.age <= 99
    assert completion.choices[0].finish_reason == "stop"


def test_json_object_streamed(client, server):
    # The system message keeps SmolLM2 to the object asked for (16 tokens): without it,
    # greedy decoding on some CPUs writes an endless description of itself, inside JSON.
    ask = [{"role": "system", "content": "You reply with JSON only."},
           {"role": "user", "content": 'Return {"colors": ["red", "green", "blue"]} as JSON.'}]
    chunks = list(client.chat.completions.create(model=server.model.id, messages=ask, max_tokens=120,
                                                 temperature=0, stream=True,
                                                 response_format={"type": "json_object"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


def test_grammar_extension_on_completions(client, server):
    reply = client.completions.create(model=server.model.id, prompt="The capital of France is", max_tokens=12,
                                      temperature=0, extra_body={"grammar": 'root ::= " " [A-Z][a-z]+ "."'})
    assert reply.choices[0].text == " Paris."


@pytest.mark.parametrize("response_format, keyword", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}, "uniqueItems"),
    ({"type": "json_object", "schema": {"type": "string", "format": "ipv5"}}, "format"),
    ({"type": "xml"}, None),
    ("json_object", None),
])
def test_bad_response_formats_are_400s_in_openais_shape(client, server, response_format, keyword):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=server.model.id, messages=ASK, max_tokens=8,
                                       response_format=response_format)
    error = raised.value.response.json()["error"]
    assert raised.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == "response_format"
    if keyword is not None:
        assert repr(keyword) in error["message"]


def test_bad_grammar_is_a_400(server):
    response = post(server, "/v1/completions", {"model": server.model.id, "prompt": "x", "grammar": "root ::= ("},
                    authorization=f"Bearer {KEY}")
    assert response.status_code == 400 and response.json()["error"]["param"] == "grammar"
