"""``elelem serve``, driven by the real ``openai`` client over loopback.

One server runs in-process (uvicorn in a thread) on SmolLM2-135M for the
whole module; the SIGTERM test starts ``python -m elelem serve`` as a
process of its own.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from elelem.engine.step_costs import StepCosts  # noqa: E402
from elelem.server import ServerConfig, create_app  # noqa: E402

pytestmark = pytest.mark.real_model

KEY = "test-key-0123456789"
PARALLEL = 8
N_CTX = 512
MAX_BODY = 64 * 1024
# One compute thread: the HTTP side and the test's clients need CPU too, and ggml's
# spinning threads slow to a crawl when a busy machine takes one of their cores.
THREADS = 1
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
HI = [{"role": "user", "content": "Say hello to Ada in one sentence."}]


class InProcessServer:
    """uvicorn serving the app in a thread, on a free loopback port."""

    def __init__(self, config: ServerConfig):
        self.app = create_app(config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_config=None,
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.state = self.app.state.server

    @property
    def model(self):
        return self.state.registry.default

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def server(smollm_path):
    running = InProcessServer(ServerConfig(models=[str(smollm_path)], api_key=KEY, parallel=PARALLEL, n_ctx=N_CTX,
                                           max_body_bytes=MAX_BODY, max_messages=64, keep_alive=None,
                                           n_threads=THREADS))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model_id(server):
    return server.model.id


def post(server, path, body, **headers):
    headers.setdefault("authorization", f"Bearer {KEY}")
    return httpx.post(server.url + path, content=body if isinstance(body, bytes) else json.dumps(body),
                      headers=headers, timeout=60)


def wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def cells_used(server) -> int:
    return server.model.llm.engine.context.cache.n_used


def no_end(server) -> dict:
    """A logit_bias that bans the end-of-generation tokens: the stream runs to max_tokens."""
    return {str(t): -100 for t in server.model.llm.tokenizer.eog_ids}


def idle(server) -> bool:
    """No request holds a slot, and no cell is held (no session outlives its request)."""
    return server.model.in_flight == 0 and cells_used(server) == 0


# -- endpoints -----------------------------------------------------------------

def test_health_and_models(server, client, model_id):
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok"
    assert health["offload"] == {model_id: "0/30 layers on a GPU (CPU)"}   # no GPU here (lavapipe unnamed)
    assert [m.id for m in client.models.list().data] == [model_id]
    assert client.models.retrieve(model_id).id == model_id


def test_chat_completion(client, model_id):
    reply = client.chat.completions.create(model=model_id, messages=HI, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == model_id
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_chat_matches_the_whole_one_and_ends_with_usage(client, model_id):
    whole = client.chat.completions.create(model=model_id, messages=HI, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model=model_id, messages=HI, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert len({c.id for c in chunks}) == 1


def test_sse_wire_format_ends_with_done(server, model_id):
    response = post(server, "/v1/chat/completions", {"model": model_id, "messages": HI, "max_tokens": 3,
                                                     "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in response.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1])


def test_max_tokens_stop_and_max_completion_tokens(client, model_id):
    three = client.chat.completions.create(model=model_id, messages=HI, max_completion_tokens=3, temperature=0,
                                           logit_bias={}, max_tokens=50)
    assert three.usage.completion_tokens == 3 and three.choices[0].finish_reason == "length"
    text = client.chat.completions.create(model=model_id, messages=HI, max_tokens=16, temperature=0)
    words = text.choices[0].message.content.split()
    assert len(words) >= 3
    stopped = client.chat.completions.create(model=model_id, messages=HI, max_tokens=16, temperature=0,
                                             stop=[" " + words[2]])
    content = stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"
    assert text.choices[0].message.content.startswith(content) and words[2] not in content.split()


def test_seed_repeats_a_sampled_answer(client, model_id):
    def sample(seed):
        return client.chat.completions.create(model=model_id, messages=HI, max_tokens=16, temperature=1.0,
                                              top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5,
                                              seed=seed).choices[0].message.content
    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in (1, 2, 3, 4)}) > 1  # the seed is used, not ignored


def test_logit_bias_forces_a_token(server, client, model_id):
    yes = server.model.llm.tokenize(" yes", add_bos=False)
    assert len(yes) == 1
    reply = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=3, temperature=0,
                                      logit_bias={str(yes[0]): 100})
    assert reply.choices[0].text == " yes" * 3


def test_tool_call_required(client, model_id):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Room for SmolLM2's free text before the forced call (sampling/lazy.py's FREE_TOKENS), and the call.
    reply = client.chat.completions.create(model=model_id, messages=ask, tools=WEATHER, tool_choice="required",
                                           max_tokens=120)
    call = reply.choices[0].message.tool_calls[0]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)


def test_streamed_tool_call_deltas_carry_their_index(client, model_id):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    chunks = list(client.chat.completions.create(
        model=model_id, messages=ask, tools=WEATHER, max_tokens=120, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and all(d.index == 0 for d in deltas)
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    assert "city" in json.loads("".join(d.function.arguments or "" for d in deltas))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_completions_text_ids_echo_and_stream(server, client, model_id):
    prompt = "The capital of France is"
    ids = server.model.llm.tokenize(prompt)
    by_text = client.completions.create(model=model_id, prompt=prompt, max_tokens=5, temperature=0)
    by_ids = client.completions.create(model=model_id, prompt=ids, max_tokens=5, temperature=0)
    assert by_text.object == "text_completion" and by_text.choices[0].text
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_text.usage.prompt_tokens == len(ids)
    echoed = client.completions.create(model=model_id, prompt=prompt, max_tokens=5, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + by_text.choices[0].text
    streamed = list(client.completions.create(model=model_id, prompt=prompt, max_tokens=5, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == by_text.choices[0].text
    assert streamed[-1].usage.completion_tokens == by_text.usage.completion_tokens


def reused_tokens(server) -> int:
    text = httpx.get(server.url + "/metrics").text
    return int(re.search(r"^elelem_prompt_tokens_reused_total (\d+)$", text, re.M).group(1))


def test_a_later_request_reuses_the_prefix_an_earlier_one_left(server, client, model_id):
    before = reused_tokens(server)
    first = client.chat.completions.create(model=model_id, messages=HI, max_tokens=4, temperature=0)
    turn = HI + [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And to Grace?"}]
    client.chat.completions.create(model=model_id, messages=turn, max_tokens=4, temperature=0)
    # The second turn starts with the first one's prompt, which an idle session still holds.
    assert reused_tokens(server) - before >= first.usage.prompt_tokens - 2


def test_metrics_count_requests_and_tokens(server, client, model_id):
    client.completions.create(model=model_id, prompt="Hello", max_tokens=2)
    text = httpx.get(server.url + "/metrics").text
    assert re.search(r'elelem_requests_total\{endpoint="/v1/completions",status="200"\} [1-9]', text)
    assert int(re.search(r"^elelem_completion_tokens_total (\d+)$", text, re.M).group(1)) >= 2
    assert re.search(r'^elelem_engine_steps_total\{model="[^"]+"\} [1-9]', text, re.M)
    steps = int(re.search(r'^elelem_engine_steps_total\{model="[^"]+"\} (\d+)', text, re.M).group(1))
    seconds = float(re.search(r'^elelem_engine_step_seconds_total\{model="[^"]+"\} (\S+)', text, re.M).group(1))
    assert 0 < seconds / steps < 5.0          # a mean step time, in seconds
    for family in ("elelem_queue_depth", "elelem_running_sequences", "elelem_token_interval_seconds_count",
                   "elelem_prompt_tokens_total", "elelem_kv_cells_used", "elelem_model_idle_sessions"):
        assert re.search(rf"^{family}[{{ ]", text, re.M), family


def test_the_chat_page_has_no_external_assets(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert not re.search(r"https?://|//[a-z]", page.text.replace("'self'", ""))  # nothing fetched from elsewhere
    assert "/v1/chat/completions" in page.text and "stream: true" in page.text


# -- errors --------------------------------------------------------------------

def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_malformed_json_and_bad_fields_are_400(server, client, model_id):
    error_of(post(server, "/v1/chat/completions", b"{not json"), 400)
    error_of(post(server, "/v1/chat/completions", b"[1, 2]"), 400)
    error_of(post(server, "/v1/chat/completions", b"[" * 60_000), 400)  # too deep for the parser: not a 500
    error_of(post(server, "/v1/chat/completions", b"\xff\xfe"), 400)
    assert error_of(post(server, "/v1/completions", {"prompt": "x", "max_tokenz": 3}), 400)["param"] == "max_tokenz"
    for bad in ({"messages": []}, {"messages": "hi"}, {"messages": [{"role": "robot", "content": "x"}]},
                {"messages": HI, "max_tokens": -1}, {"messages": HI, "max_tokens": "9"}, {"messages": HI, "n": 2},
                {"messages": HI, "temperature": -1}, {"messages": HI, "top_p": 2},
                {"messages": HI, "presence_penalty": 3}, {"messages": HI, "logit_bias": {"x": 1}},
                {"messages": HI, "logit_bias": {"999999": 1}}, {"messages": HI, "stop": 5},
                {"messages": HI, "stream": "yes"}, {"messages": HI, "stream_options": {"include_usage": True}},
                {"messages": HI, "tools": WEATHER, "tool_choice": {"type": "function",
                                                                  "function": {"name": "nope"}}},
                {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                {"messages": [HI[0]] * 65}, {"messages": HI, "chat_template_kwargs": ["enable_thinking"]},
                {"messages": HI, "chat_template_kwargs": {"messages": []}}):
        error_of(post(server, "/v1/chat/completions", {"model": model_id, **bad}), 400)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=HI, extra_body={"bogus": 1})


def test_chat_template_kwargs_are_passed_to_the_template(client, model_id):
    """llama.cpp's server's chat_template_kwargs ({"enable_thinking": false}, ...) are taken per
    request (SmolLM2's template reads no such variable: the answer is the same)."""
    plain = client.chat.completions.create(model=model_id, messages=HI, max_tokens=4, temperature=0)
    off = client.chat.completions.create(model=model_id, messages=HI, max_tokens=4, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content == plain.choices[0].message.content
    assert off.usage.prompt_tokens == plain.usage.prompt_tokens


def test_a_prompt_past_the_context_is_400(server, model_id):
    error = error_of(post(server, "/v1/completions", {"model": model_id, "prompt": "word " * (N_CTX + 10)}), 400)
    assert error["code"] == "context_length_exceeded"
    error_of(post(server, "/v1/completions", {"model": model_id, "prompt": "hi", "max_tokens": N_CTX}), 400)
    error_of(post(server, "/v1/completions", {"model": model_id, "prompt": [10 ** 7]}), 400)


def test_missing_or_wrong_key_is_401(server, model_id):
    for headers in ({"authorization": ""}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
        assert error_of(post(server, "/v1/chat/completions", {"model": model_id, "messages": HI}, **headers),
                        401)["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert httpx.get(server.url + "/health").status_code == 200  # health needs no key


def test_unknown_model_and_route_are_404(server, client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=HI)
    assert error_of(post(server, "/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404)["code"] == \
        "model_not_found"
    error_of(httpx.get(server.url + "/v1/nothing-here"), 404)


def test_a_body_too_large_is_413(server, model_id):
    big = {"model": model_id, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    error_of(post(server, "/v1/chat/completions", big), 413)

    def chunked():  # no Content-Length: the limit holds while reading
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024
    response = httpx.post(server.url + "/v1/chat/completions", content=chunked(),
                          headers={"authorization": f"Bearer {KEY}"})
    error_of(response, 413)


def test_a_full_queue_is_503_with_retry_after_and_recovers(smollm_path, server):
    small = InProcessServer(ServerConfig(models=[str(smollm_path)], parallel=1, max_queue=1, queue_timeout=1.0,
                                         n_ctx=N_CTX, keep_alive=None, n_threads=THREADS))
    try:
        url = small.url + "/v1/chat/completions"
        ask = {"messages": HI, "max_tokens": 2}
        with httpx.Client(timeout=60) as http:
            body = {"messages": HI, "max_tokens": 300, "stream": True, "logit_bias": no_end(small)}
            with http.stream("POST", url, json=body):  # left unread: it holds the one slot
                wait_until(lambda: small.model.in_flight == 1)
                with ThreadPoolExecutor(1) as pool:
                    waiting = pool.submit(httpx.post, url, json=ask, timeout=60)  # queued, then timed out
                    wait_until(lambda: small.model.queued == 1)
                    full = httpx.post(url, json=ask)  # the queue is full: at once
                    timed_out = waiting.result()
        for response in (full, timed_out):
            assert error_of(response, 503)["type"] == "server_overloaded"
            assert int(response.headers["retry-after"]) >= 1
        assert "had no free slot" in timed_out.json()["error"]["message"]
        wait_until(lambda: idle(small))
        assert httpx.post(url, json=ask).json()["choices"][0]["message"]["content"]  # and it serves again
    finally:
        small.stop()


# -- concurrency -----------------------------------------------------------------

def test_load_from_eight_clients_without_errors_or_leaked_cells(server, model_id):
    steps_before, shared_before = server.model.llm.engine.steps, server.model.llm.engine.shared_steps

    def client_run(index):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        texts = []
        for turn in range(3):
            ask = [{"role": "user", "content": f"Count from {index} to {index + turn + 3}."}]
            if turn % 2:
                chunks = client.chat.completions.create(model=model_id, messages=ask, max_tokens=24, stream=True)
                texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            else:
                texts.append(client.chat.completions.create(model=model_id, messages=ask,
                                                            max_tokens=24).choices[0].message.content)
        return texts

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client_run, range(8)))
    assert all(text for texts in results for text in texts)
    assert server.model.llm.engine.shared_steps > shared_before  # the engine batched the clients together
    assert server.model.llm.engine.steps > steps_before
    wait_until(lambda: server.model.in_flight == 0)
    # Finished requests leave their sessions (and caches) in the idle pool, one per slot at most;
    # closing them frees every cell: no request leaked any.
    assert 1 <= server.model.idle_sessions <= PARALLEL
    server.model.close_idle_sessions()
    assert cells_used(server) == 0


def test_a_client_dropped_mid_stream_frees_its_session(server, model_id):
    before = server.state.metrics.requests[("/v1/chat/completions", 499)]
    server.model.close_idle_sessions()  # so any cell still used after the drop would be the dropped request's
    body = {"model": model_id, "messages": HI, "max_tokens": 400, "stream": True,
            "logit_bias": no_end(server)}  # it would run on for long
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + "/v1/chat/completions", json=body,
                         headers={"authorization": f"Bearer {KEY}"}) as response:
            events = []
            for line in response.iter_lines():
                events += [line] if line.startswith("data: ") else []
                if len(events) == 3:
                    break
            assert cells_used(server) > 0 and server.model.in_flight == 1
    wait_until(lambda: idle(server), seconds=5)
    assert server.model.idle_sessions == 0  # closed, not kept: its cells are freed at once
    assert server.state.metrics.requests[("/v1/chat/completions", 499)] == before + 1


def test_a_client_that_gives_up_on_a_whole_answer_is_cancelled(server, model_id):
    before = server.state.metrics.requests[("/v1/chat/completions", 499)]
    server.model.close_idle_sessions()
    body = {"model": model_id, "messages": HI, "max_tokens": 400, "logit_bias": no_end(server)}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=0.5,
                   headers={"authorization": f"Bearer {KEY}"})
    wait_until(lambda: idle(server), seconds=5)
    assert server.model.idle_sessions == 0
    # 499: the server saw the client leave before the answer was done, and cancelled it.
    assert server.state.metrics.requests[("/v1/chat/completions", 499)] == before + 1


def test_sigterm_during_a_stream_exits_zero(server, smollm_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "elelem", "serve", "--model", str(smollm_path), "--port", "0", "--ctx", "1024",
         "--parallel", "2", "--grace", "3", "--threads", str(THREADS)],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Outside the checkout: `python -m` puts the working directory first on sys.path, and the
        # source tree has no compiled core unless it was built in place.
        cwd=Path(__file__).parent)
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            assert line or process.poll() is None, "the server exited before it was ready"
            match = re.search(r"at (http://\S+)/v1", line)
            url = match.group(1) if match else None
        assert url, "the server never printed its URL"
        assert httpx.get(url + "/health").status_code == 200
        long = {"messages": HI, "max_tokens": 900, "stream": True, "logit_bias": no_end(server)}  # past the grace
        short = {"messages": HI, "max_tokens": 4, "stream": True}  # done well within the grace period
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", url + "/v1/chat/completions", json=long) as cut, \
                    http.stream("POST", url + "/v1/chat/completions", json=short) as finished:
                cut_lines, finished_lines = cut.iter_lines(), finished.iter_lines()
                assert next(line for line in cut_lines if line.startswith("data: "))
                assert next(line for line in finished_lines if '"content"' in line)  # past its prefill
                process.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                assert [line for line in finished_lines if line][-1] == "data: [DONE]"
                rest = [line for line in cut_lines if line]  # cancelled after the grace period
        assert time.monotonic() - t0 < 20
        assert "data: [DONE]" not in rest
        assert "shutting down" in json.loads(rest[-1][6:])["error"]["message"]
        assert process.wait(30) == 0
        assert "server stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_models_load_on_first_use_and_unload_when_idle(smollm_path, tmp_path):
    other = tmp_path / "second-model.gguf"  # the same file under another name: a second model, cheaply
    other.symlink_to(smollm_path)
    served = InProcessServer(ServerConfig(models=[str(smollm_path), str(other)], parallel=2,
                                          keep_alive=2.0, n_threads=THREADS))
    try:
        first, second = served.state.registry.models
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [first.id, second.id]
        assert first.llm is not None and second.llm is None  # only the first is loaded at startup
        assert first.llm.n_ctx == 4096  # no --ctx: the library's default, min(trained context, 4096)
        reply = client.completions.create(model="second-model", prompt=[1, 2, 3], max_tokens=2, temperature=0)
        assert reply.model == second.id and reply.usage.prompt_tokens == 3
        assert second.llm is not None
        wait_until(lambda: first.llm is None and second.llm is None, seconds=15)  # idle past keep-alive
        assert re.search(r'^elelem_model_loaded\{model="[^"]+"\} 0$', httpx.get(served.url + "/metrics").text, re.M)
        again = client.chat.completions.create(model=first.id, messages=HI, max_tokens=2)
        assert again.choices[0].message.content and first.llm is not None  # loaded again on use
    finally:
        served.stop()


@pytest.mark.parametrize("host, warned", [("127.0.0.1", False), ("::1", False), ("localhost", False),
                                          ("0.0.0.0", True), ("192.168.1.20", True)])
def test_binding_beyond_loopback_without_a_key_warns(monkeypatch, caplog, smollm_path, host, warned):
    import elelem.server.serving
    from elelem.cli import main
    served = []
    monkeypatch.setattr(elelem.server.serving, "serve", lambda app, **where: served.append(where) or 0)
    with caplog.at_level("WARNING", logger="elelem.server"):
        assert main(["serve", "--model", str(smollm_path), "--host", host, "--port", "0"]) == 0
    assert served == [{"host": host, "port": 0, "grace": 10.0}]
    assert any("without --api-key" in r.getMessage() for r in caplog.records) == warned
    caplog.clear()
    with caplog.at_level("WARNING", logger="elelem.server"):  # a key silences it
        assert main(["serve", "--model", str(smollm_path), "--host", host, "--api-key", "k"]) == 0
    assert not any("without --api-key" in r.getMessage() for r in caplog.records)


# -- speculative decoding ------------------------------------------------------

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"


def test_usage_reports_the_drafted_tokens(server, client, model_id):
    # Every proposal verified, whatever steps cost here (a wide step of SmolLM2
    # on a small CPU costs nearly its width, and the engine would draft little).
    server.model.load().engine.step_costs = StepCosts.flat()
    reply = client.completions.create(model=model_id, prompt=COUNTING, max_tokens=24, temperature=0)
    details = reply.usage.completion_tokens_details  # OpenAI's Predicted Outputs fields
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    chunks = list(client.completions.create(model=model_id, prompt=COUNTING, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_serve_passes_the_speculation_and_attention_switches_to_the_models(monkeypatch, smollm_path):
    import types

    import elelem.server.serving
    from elelem.cli import main
    from elelem.server.registry import ModelRegistry
    apps = []
    monkeypatch.setattr(elelem.server.serving, "serve", lambda app, **where: apps.append(app) or 0)
    assert main(["serve", "--model", str(smollm_path), "--no-speculative"]) == 0
    assert main(["serve", "--model", str(smollm_path), "--draft-model", str(smollm_path), "--no-flash-attn"]) == 0
    configs = [app.state.server.registry.config for app in apps]
    assert [(c.speculative, c.draft_model, c.flash_attn) for c in configs] == [
        (False, None, True), (True, str(smollm_path), False)]
    opened = []
    fake = types.SimpleNamespace(tokenizer=None, chat_template=None, closed=False)
    for config in configs:
        ModelRegistry(config, open_llm=lambda source, **options: opened.append(options) or fake).default.load()
    assert opened[1]["speculation"].speculative is True and opened[1]["speculation"].draft_model == str(smollm_path)
    # flash attention by default: every request's token skips the other requests' cells
    assert [o["context"].flash_attn for o in opened] == [True, False]


def test_a_restarted_server_loads_the_system_prompt_from_its_prompt_cache(smollm_path, tmp_path):
    system = "You answer briefly. " + " ".join(f"Rule {i}: say what you mean." for i in range(40))
    answers, loaded = [], []
    for question in ("Name a fruit.", "Name a tree."):          # two server processes' lifetimes
        served = InProcessServer(ServerConfig(models=[str(smollm_path)], parallel=1, n_ctx=N_CTX, keep_alive=None,
                                              n_threads=THREADS, prompt_cache=str(tmp_path)))
        try:
            body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                    "max_tokens": 6, "temperature": 0}
            response = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=120)
            assert response.status_code == 200, response.text
            answers.append(response.json()["choices"][0]["message"]["content"])
            loaded.append(served.model.llm.engine.prompt_cache.loaded_tokens)
        finally:
            served.model.llm.close()     # what shutting down does: the cache's write is flushed
            served.stop()
    assert loaded[0] == 0 and loaded[1] > 200
    assert list(tmp_path.rglob("*.kvc"))


def test_logprobs_come_back_in_openais_shapes(client, model_id, server):
    chat = client.chat.completions.create(model=model_id, messages=HI, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert "".join(item.token for item in content) == chat.choices[0].message.content
    assert all(len(item.top_logprobs) == 2 and item.logprob <= 0 for item in content)
    completion = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=4,
                                           temperature=0, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert logprobs.text_offset[0] == len("The capital of France is") and len(logprobs.top_logprobs) == 4
    for body, param in [({"messages": HI, "logprobs": "yes"}, "logprobs"),
                        ({"messages": HI, "top_logprobs": 3}, "top_logprobs"),
                        ({"messages": HI, "logprobs": True, "top_logprobs": 50}, "top_logprobs")]:
        assert error_of(post(server, "/v1/chat/completions", body), 400)["param"] == param
    response = post(server, "/v1/completions", {"prompt": "Hi", "logprobs": 99})
    assert error_of(response, 400)["type"] == "invalid_request_error"


def test_embeddings_endpoint_serves_the_openai_client(client, model_id, server):
    import base64

    import numpy as np
    response = client.embeddings.create(model=model_id, input=["a cat", "a kitten", "import numpy"])
    vectors = np.array([d.embedding for d in response.data])
    assert vectors.shape == (3, 576) and [d.index for d in response.data] == [0, 1, 2]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert response.usage.prompt_tokens > 3
    # the mean-pooled, normalized vectors of the library itself
    mean = np.array(server.model.llm.embed("a cat", return_count=False))
    mean = mean.mean(axis=0) if mean.ndim == 2 else mean
    np.testing.assert_allclose(vectors[0], mean / np.linalg.norm(mean), atol=1e-5)
    raw = post(server, "/v1/embeddings", {"input": "a cat", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, vectors[0], atol=1e-6)
    for body, param in [({"input": []}, "input"), ({"input": "x", "dimensions": 8}, "dimensions"),
                        ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({"inputs": "x"}, "inputs")]:
        assert error_of(post(server, "/v1/embeddings", body), 400)["param"] == param
    assert client.chat.completions.create(model=model_id, messages=HI, max_tokens=2).choices  # still serving


def test_requests_past_the_limit_get_openais_503_json(smollm_path):
    small = InProcessServer(ServerConfig(models=[str(smollm_path)], parallel=1, n_ctx=N_CTX, keep_alive=None,
                                         n_threads=THREADS, max_requests=1))
    try:
        url = small.url + "/v1/chat/completions"
        with httpx.Client(timeout=60) as http:
            body = {"messages": HI, "max_tokens": 300, "stream": True, "logit_bias": no_end(small)}
            with http.stream("POST", url, json=body):      # held open: the one request allowed
                wait_until(lambda: small.model.in_flight == 1)
                over = httpx.get(small.url + "/v1/models")
        error = error_of(over, 503)
        assert error["type"] == "server_overloaded" and int(over.headers["retry-after"]) >= 1
        wait_until(lambda: idle(small))
        assert httpx.get(small.url + "/v1/models").status_code == 200      # and it serves again
    finally:
        small.stop()


def test_a_served_models_cache_is_sized_as_llama_cpp_sizes_it(smollm_path):
    import types

    from elelem.server.registry import ModelRegistry
    opened = []
    fake = types.SimpleNamespace(tokenizer=None, chat_template=None, closed=False)
    config = ServerConfig(models=[str(smollm_path)], parallel=3, n_ctx=300, keep_alive=None)
    ModelRegistry(config, open_llm=lambda source, **options: opened.append(options) or fake).default.load()
    # 3 contexts of 300 positions, rounded up to 256 cells: attention sums over
    # the same span as llama.cpp's (README, "kv_size").
    assert opened[0]["context"].n_ctx == 300 and opened[0]["context"].kv_size == 1024


def test_serve_passes_the_gpu_options_to_the_models(monkeypatch, smollm_path):
    import types

    import elelem.server.serving
    from elelem.api.options import PlacementOptions
    from elelem.cli import main
    from elelem.server.registry import ModelRegistry
    apps = []
    monkeypatch.setattr(elelem.server.serving, "serve", lambda app, **where: apps.append(app) or 0)
    assert main(["serve", "--model", str(smollm_path), "-ngl", "7", "-mg", "1", "-ts", "3,1"]) == 0
    assert main(["serve", "--model", str(smollm_path)]) == 0
    configs = [app.state.server.registry.config for app in apps]
    assert [(c.n_gpu_layers, c.main_gpu, c.tensor_split) for c in configs] == [(7, 1, [3.0, 1.0]), (None, 0, None)]
    opened = []
    fake = types.SimpleNamespace(tokenizer=None, chat_template=None, closed=False)
    for config in configs:
        ModelRegistry(config, open_llm=lambda source, **options: opened.append(options) or fake).default.load()
    placement = opened[0]["placement"]
    assert (placement.n_gpu_layers, placement.main_gpu, placement.tensor_split) == (7, 1, [3.0, 1.0])
    assert opened[1]["placement"] == PlacementOptions()   # LLM's defaults: the best GPU
