"""An agent's conversation through ``elelem serve`` on a hybrid model: each turn
evaluates only its new messages (plus at most the tile before the last
prompt's end), also when another conversation ran in between and took the
sequence; ``/metrics`` counts prompt tokens received and evaluated.

The model is a tiny random ``qwen35`` (Gated DeltaNet beside attention) with
Qwen3.5's real chat template, through Chat Completions, Anthropic Messages
and the Responses API.  The template opens ``<think>`` at the end of a prompt
and drops the reasoning of earlier turns from history: each new prompt parts
from what the cache holds a few tokens before the last prompt's end.  A
grammar makes the model reason, then answer.
"""
from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from elelem.api.prompts import chat_prompt  # noqa: E402
from elelem.server import ServerConfig  # noqa: E402
from format_models import write_format_model  # noqa: E402
from synthetic import TinyConfig  # noqa: E402
from test_server import InProcessServer  # noqa: E402

KEY = "agent-loop-key-0123456789"
THOUGHT = "root ::= " + json.dumps("Let me look.\n</think>\n\nDone.")
TILE = 64


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=11)
    model = write_format_model(tmp_path_factory.mktemp("qwen35") / "qwen35.gguf", "qwen3_coder", base=base)
    server = InProcessServer(ServerConfig(models=[str(model.path)], api_key=KEY, parallel=1, n_ctx=2048,
                                          keep_alive=None, n_threads=2))
    yield server, model
    server.stop()


def _post(server, path, body):
    answer = httpx.post(server.url + path, json=body, timeout=120,
                        headers={"authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _system(topic: str) -> str:
    return f"You are a coding agent working on {topic}. " + " ".join(f"Rule {i}: keep {topic} tidy." for i in range(25))


def _chat_turn(server, model, system, history, message):
    messages = [{"role": "system", "content": system}, *history, {"role": "user", "content": message}]
    reply = _post(server, "/v1/chat/completions", {"messages": messages, "grammar": THOUGHT, "max_tokens": 40,
                                                   "temperature": 0})["choices"][0]["message"]
    assert reply["reasoning_content"] == "Let me look." and reply["content"] == "Done."
    return messages, messages[1:] + [{"role": "assistant", "content": reply["content"]}]


def _messages_turn(server, model, system, history, message):
    # The Messages API takes no grammar: the random model, steered to write "a"s, reasons
    # to the token limit; the history gives the turn an answer of its own.
    messages = [*history, {"role": "user", "content": message}]
    reply = _post(server, "/v1/messages", {"system": system, "messages": messages, "max_tokens": 8,
                                           "temperature": 0, "logit_bias": {str(model.ids["a"]): 30.0},
                                           "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert [b["type"] for b in reply["content"]] == ["thinking"]
    return [{"role": "system", "content": system}, *messages], messages + [{"role": "assistant", "content": "Done."}]


def _responses_turn(server, model, system, history, message):
    # The Responses API, its history sent whole as input items (store off): the
    # reasoning items of earlier turns go back with them, as agents send them.
    messages = [*history, {"role": "user", "content": message}]
    items = []
    for m in messages:
        if m["role"] == "assistant":
            items.append({"type": "reasoning", "id": "rs", "summary": [],
                          "content": [{"type": "reasoning_text", "text": "aaaa"}]})
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": m["content"], "annotations": []}]})
        else:
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": m["content"]}]})
    reply = _post(server, "/v1/responses", {"instructions": system, "input": items, "max_output_tokens": 8,
                                            "temperature": 0, "logit_bias": {str(model.ids["a"]): 30.0},
                                            "reasoning": {"effort": "low"}, "store": False})
    assert reply["output"][0]["type"] == "reasoning"
    return [{"role": "system", "content": system}, *messages], messages + [{"role": "assistant", "content": "Done."}]


def _prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("turn", [_chat_turn, _messages_turn, _responses_turn],
                         ids=["chat-completions", "messages", "responses"])
def test_each_turn_evaluates_its_new_messages_while_another_conversation_takes_turns(served, turn):
    server, model = served
    llm = server.model.llm
    engine = llm.engine
    conversations = {"a": (_system("the parser"), []), "b": (_system("the scheduler"), [])}
    last_ids = {}
    for i in range(4):
        for name in ("a", "b"):            # turns alternate: each takes the other's sequence
            system, history = conversations[name]
            before = engine.prompt_tokens_evaluated
            rendered, history = turn(server, model, system, history, f"Now step {i} of {name}: fix the tests.")
            conversations[name] = (system, history)
            evaluated = engine.prompt_tokens_evaluated - before
            ids = chat_prompt(llm.assets, rendered)[1]
            if name in last_ids:
                new = len(ids) - _prefix(last_ids[name], ids)
                assert new < len(ids) // 4
                assert 0 < evaluated <= new + 2 * TILE, (name, i, new, evaluated, len(ids))
            last_ids[name] = ids
    assert engine.states.loaded >= 6
    metrics = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    received = _metric(metrics, "elelem_engine_prompt_tokens_total")
    evaluated = _metric(metrics, "elelem_engine_prompt_tokens_evaluated_total")
    assert received == engine.prompt_tokens and evaluated == engine.prompt_tokens_evaluated
    assert 0 < evaluated < received / 2
    assert 0 < _metric(metrics, "elelem_engine_state_cache_bytes") <= engine.states.max_bytes


def _metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])
