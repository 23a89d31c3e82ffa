"""Many models behind one ``elelem serve``: the request's ``model`` picks, each model loads
on first use, and past ``max_loaded`` (or ``max_memory``) the least recently used idle
one is unloaded.

The pool's rules run on tiny synthetic models with Hermes' chat template; two packaged
models (SmolLM2 and Gemma 3) answer the real ``openai`` client at once.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from elelem.errors import InvalidArgumentError  # noqa: E402
from elelem.server import ServerConfig, create_app  # noqa: E402
from elelem.server.config import find_models  # noqa: E402
from elelem.server.pool import ModelPool  # noqa: E402
from format_models import write_format_model  # noqa: E402
from synthetic import TinyConfig  # noqa: E402

KEY = "pool-key-0123456789"
HI = [{"role": "user", "content": "Hi"}]


class Served:
    """uvicorn serving an app (of a given pool) in a thread, on a free loopback port."""

    def __init__(self, config: ServerConfig, pool: ModelPool | None = None):
        self.app = create_app(config, pool)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_config=None,
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"
        self.pool = self.app.state.server.registry

    def model(self, name: str):
        return self.pool.get(name)

    def post(self, path: str, body: dict, **headers) -> httpx.Response:
        headers.setdefault("authorization", f"Bearer {KEY}")
        headers.setdefault("anthropic-version", "2023-06-01")
        return httpx.post(self.url + path, json=body, headers=headers, timeout=120)

    def chat(self, model: str, max_tokens: int = 2, **fields) -> httpx.Response:
        return self.post("/v1/chat/completions", {"model": model, "messages": HI, "max_tokens": max_tokens,
                                                  "temperature": 0, **fields})

    def listed(self) -> dict:
        answer = httpx.get(self.url + "/v1/models", headers={"authorization": f"Bearer {KEY}"})
        return {m["id"]: m.get("status", {}).get("value") for m in answer.json()["data"]}

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def wait_until(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """Three tiny models (a, b, c) in a folder, c in a subfolder."""
    root = tmp_path_factory.mktemp("models")
    (root / "more").mkdir()
    for i, path in enumerate([root / "a.gguf", root / "b.gguf", root / "more" / "c.gguf"]):
        write_format_model(path, "hermes", seed=20 + i)
    return root


def config(models_dir, **options) -> ServerConfig:
    options = {"keep_alive": None, "n_ctx": 256, **options}
    return ServerConfig(models_dir=str(models_dir), api_key=KEY, parallel=2, n_threads=1, **options)


class CountingOpen:
    """``LLM``, counting the loads of each model, and slowed for those named in ``slow``."""

    def __init__(self, slow: dict | None = None):
        from elelem.api.llm import LLM
        self._llm = LLM
        self.slow = slow or {}
        self.opened: list[str] = []
        self.started = threading.Event()

    def __call__(self, source, **options):
        name = Path(source).stem
        self.opened.append(name)
        self.started.set()
        time.sleep(self.slow.get(name, 0.0))
        return self._llm(source, **options)


# -- naming and choosing --------------------------------------------------------

def test_models_dir_names_models_by_file_and_skips_parts_projectors_and_drafters(tmp_path):
    for name in ("x.gguf", "sub/y.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf",
                 "mmproj-x.gguf", "mtp-x.gguf", "sub/eagle3-y.gguf", "DFlash-x.gguf", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    found = find_models(str(tmp_path))
    assert [Path(p).name for p in found] == ["big-00001-of-00002.gguf", "y.gguf", "x.gguf"]
    pool = ModelPool(ServerConfig(models_dir=str(tmp_path)), open_llm=lambda *a, **k: None)
    assert [m.id for m in pool.models] == ["big", "y", "x"]
    config = pool.config
    assert config.preload is False  # a folder alone loads nothing before the first request
    with pytest.raises(InvalidArgumentError, match="is not a folder"):
        ServerConfig(models_dir=str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="holds no .gguf"):
        ServerConfig(models_dir=str(tmp_path / "empty"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.gguf").write_bytes(b"")
    pool = ModelPool(ServerConfig(models_dir=str(tmp_path)), open_llm=lambda *a, **k: None)
    assert [m.id for m in pool.models].count("x") == 1  # the second x is named by its path
    assert str(tmp_path / "x.gguf") in [m.id for m in pool.models]


def test_the_request_picks_the_model_and_an_unknown_one_is_404_in_each_protocol(models_dir):
    served = Served(config(models_dir))
    try:
        assert served.listed() == {"a": "unloaded", "b": "unloaded", "c": "unloaded"}
        answers = {name: served.chat(name) for name in ("a", "c")}
        assert {n: a.json()["model"] for n, a in answers.items()} == {"a": "a", "c": "c"}
        assert served.listed() == {"a": "loaded", "b": "unloaded", "c": "loaded"}

        chat = served.chat("nope")
        assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"
        assert "a, b, c" in chat.json()["error"]["message"]
        responses = served.post("/v1/responses", {"model": "nope", "input": "Hi"})
        assert responses.status_code == 404 and responses.json()["error"]["code"] == "model_not_found"
        messages = served.post("/v1/messages", {"model": "nope", "max_tokens": 4, "messages": HI})
        assert messages.status_code == 404
        assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "not_found_error"
        embeddings = served.post("/v1/embeddings", {"model": "nope", "input": "Hi"})
        assert embeddings.status_code == 404
        # A pool has no default: a request without a model names the ones there are.
        assert served.post("/v1/chat/completions", {"messages": HI, "max_tokens": 2}).status_code in (400, 404)
    finally:
        served.stop()


# -- least recently used ----------------------------------------------------------

def test_max_loaded_1_unloads_the_model_used_before(models_dir):
    opener = CountingOpen()
    served = Served(config(models_dir, max_loaded=1), ModelPool(config(models_dir, max_loaded=1), opener))
    try:
        for name in ("a", "b", "a", "a", "c"):
            assert served.chat(name).status_code == 200
            assert [n for n, s in served.listed().items() if s == "loaded"] == [name]
        assert opener.opened == ["a", "b", "a", "c"]  # a second request to a loaded model loads nothing
    finally:
        served.stop()


def test_the_least_recently_used_idle_model_gives_way(models_dir):
    served = Served(config(models_dir, max_loaded=2))
    try:
        for name in ("a", "b", "a", "c"):  # b is the least recently used when c comes
            assert served.chat(name).status_code == 200
        assert served.listed() == {"a": "loaded", "b": "unloaded", "c": "loaded"}
    finally:
        served.stop()


@contextmanager
def holding(served: Served, model: str):
    """A streamed request to ``model`` that holds its slot until the block ends: a client
    that stops reading stops the generation once the sockets' buffers are full (a
    few hundred KiB of events), long before its thousands of tokens."""
    with httpx.Client(timeout=120) as client, client.stream(
            "POST", served.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
            json={"model": model, "messages": HI, "max_tokens": 4000, "temperature": 0, "stream": True,
                  "logit_bias": {str(t): -100 for t in served.model(model).load().tokenizer.eog_ids}}) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        yield  # then the client leaves, which cancels the generation and frees the slot


def test_a_model_in_use_is_not_unloaded_the_next_waits_for_it(models_dir):
    served = Served(config(models_dir, max_loaded=1, load_timeout=60.0, n_ctx=4096))
    try:
        assert served.chat("a").status_code == 200
        with ThreadPoolExecutor(1) as workers:
            with holding(served, "a"):
                other = workers.submit(served.chat, "b")
                time.sleep(0.5)
                assert served.model("a").loaded and not served.model("b").loaded  # b waits for a's request
            assert other.result().status_code == 200  # then a gives way
        assert served.listed() == {"a": "unloaded", "b": "loaded", "c": "unloaded"}
    finally:
        served.stop()
    short = Served(config(models_dir, max_loaded=1, load_timeout=0.5, n_ctx=4096))
    try:
        assert short.chat("a").status_code == 200
        with holding(short, "a"):
            refused = short.chat("b")  # every loaded model in use past the load timeout: a 503
            assert refused.status_code == 503 and refused.headers["retry-after"]
        assert short.chat("b").status_code == 200
    finally:
        short.stop()


def test_a_memory_budget_unloads_as_max_loaded_does(models_dir):
    probe = ModelPool(config(models_dir), open_llm=lambda *a, **k: None)
    each = probe.get("a").footprint()
    assert each > Path(models_dir / "a.gguf").stat().st_size  # the weights and a KV cache
    served = Served(config(models_dir, max_memory=int(2.5 * each)))
    try:
        for name in ("a", "b", "c"):
            assert served.chat(name).status_code == 200
        assert served.listed() == {"a": "unloaded", "b": "loaded", "c": "loaded"}
    finally:
        served.stop()


# -- loading --------------------------------------------------------------------

def test_a_model_asked_for_at_once_loads_once_and_others_answer_meanwhile(models_dir):
    opener = CountingOpen(slow={"c": 2.0})
    served = Served(config(models_dir), ModelPool(config(models_dir), opener))
    try:
        assert served.chat("a").status_code == 200
        with ThreadPoolExecutor(4) as workers:
            loads = [workers.submit(served.chat, "c") for _ in range(3)]
            wait_until(lambda: served.model("c").loading)
            t0 = time.perf_counter()
            assert served.chat("a").status_code == 200  # a answers while c loads
            assert time.perf_counter() - t0 < 1.5 and served.model("c").loading
            assert served.listed()["c"] == "loading"
            assert [f.result().status_code for f in loads] == [200, 200, 200]
        assert opener.opened.count("c") == 1
    finally:
        served.stop()


def _priority() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_load_runs_in_a_thread_of_its_own_at_the_lowest_priority_beside_loaded_models(models_dir):
    import gc
    seen = {}
    opener = CountingOpen()

    def open_llm(source, **options):
        seen[Path(source).stem] = (threading.current_thread().name, _priority() if linux else None,
                                   sys.getswitchinterval(), gc.isenabled())
        return opener(source, **options)
    linux = sys.platform.startswith("linux")
    pool = ModelPool(config(models_dir, max_loaded=2), open_llm)
    interval, mine = sys.getswitchinterval(), _priority() if linux else None
    try:
        pool.load(pool.get("a"))  # nothing else loaded: nothing to keep out of the way of
        pool.load(pool.get("b"))
        assert seen["a"] == ("elelem-load-a", mine, pytest.approx(0.0002), False)
        assert seen["b"] == ("elelem-load-b", 19 if linux else None, pytest.approx(0.0002), False)
        # The caller's thread keeps its priority; the process's settings are back.
        assert (_priority() if linux else None) == mine and sys.getswitchinterval() == interval
        assert gc.isenabled()
    finally:
        pool.close()


def _nice_values() -> dict:
    """Each thread of this process: its nice value (/proc's stat, the 19th field)."""
    values = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            values[int(task.name)] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, IndexError):
            pass  # a thread that ended meanwhile
    return values


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_a_model_loaded_at_the_lowest_priority_steps_at_the_usual_one(models_dir):
    """ggml's worker threads, started while the model loads, would keep the load's priority
    for good; the pool starts them again from the request's thread."""
    cfg = ServerConfig(models_dir=str(models_dir), api_key=KEY, parallel=1, n_threads=2, keep_alive=None,
                       n_ctx=256, max_loaded=2)
    pool = ModelPool(cfg)
    mine = _priority()
    try:
        before = set(_nice_values())
        pool.load(pool.get("a"))
        pool.load(pool.get("b"))  # at the lowest priority, a being loaded
        def started() -> dict:
            return {tid: nice for tid, nice in _nice_values().items() if tid not in before}
        assert len(started()) >= 2  # a's and b's ggml workers (2 threads: one each beside the caller)
        # The load's own thread may take a moment to leave the thread list after it ended.
        wait_until(lambda: set(started().values()) == {mine}, 10)
        with pool.get("b").session() as session:
            session.generate("Hi", max_tokens=2)  # b steps on its restarted workers
    finally:
        pool.close()


def test_a_request_for_a_loaded_model_is_answered_while_a_real_load_is_under_way(models_dir):
    """c's load (a real one) does not finish until a request for a has been answered: were
    a's request held behind the load (a lock, the event loop, the GIL held for good), this
    would time out instead."""
    answered = threading.Event()
    opener = CountingOpen()

    def open_llm(source, **options):
        llm = opener(source, **options)
        if Path(source).stem == "c":
            llm.tokenizer  # the Python-heavy part done too, in the load's thread
            assert answered.wait(60), "a's request was not answered while c loaded"
        return llm
    served = Served(config(models_dir), ModelPool(config(models_dir), open_llm))
    try:
        assert served.chat("a").status_code == 200
        with ThreadPoolExecutor(1) as worker:
            load = worker.submit(served.chat, "c")
            wait_until(lambda: "c" in opener.opened)
            assert served.chat("a", max_tokens=4).status_code == 200
            assert served.model("c").loading
            answered.set()
            assert load.result().status_code == 200
    finally:
        served.stop()


def test_a_model_that_fails_to_load_fails_its_requests_only(models_dir, tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.gguf").symlink_to(models_dir / f"{name}.gguf")
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    served = Served(config(tmp_path))
    try:
        failed = served.chat("broken")
        assert failed.status_code == 500 and failed.json()["error"]["code"] == "model_load_failed"
        assert "broken" in failed.json()["error"]["message"]
        messages = served.post("/v1/messages", {"model": "broken", "max_tokens": 4, "messages": HI})
        assert messages.status_code == 500 and messages.json()["error"]["type"] == "api_error"
        streamed = served.chat("broken", stream=True)
        assert streamed.status_code == 500  # before the stream starts: a JSON error
        listed = httpx.get(served.url + "/v1/models", headers={"authorization": f"Bearer {KEY}"}).json()
        broken = next(m for m in listed["data"] if m["id"] == "broken")
        assert broken["status"]["value"] == "failed" and broken["status"]["error"]
        assert served.chat("a").status_code == 200 and served.chat("b").status_code == 200
    finally:
        served.stop()


def test_a_model_loaded_again_does_not_check_its_tokenizer_again(models_dir, monkeypatch):
    """The tokenizer checks ran once for a's metadata; unloaded and loaded again, a skips them
    (tokenizer_metadata keeps the digests that passed), so the load's Python work beside the
    running models is less."""
    from elelem.gguf import tokenizer_metadata
    monkeypatch.setattr(tokenizer_metadata, "_passed", type(tokenizer_metadata._passed)())
    checked: list[str] = []
    real = tokenizer_metadata._validate
    monkeypatch.setattr(tokenizer_metadata, "_validate", lambda gguf: (checked.append(gguf.path.stem), real(gguf)))
    served = Served(config(models_dir, max_loaded=1))
    try:
        assert served.chat("a").status_code == 200
        assert checked == ["a"]
        assert served.chat("b").status_code == 200
        after_b = list(checked)  # b's tokenizer is checked unless it is a's, byte for byte
        assert served.chat("a").status_code == 200
        assert not served.model("b").loaded and served.model("a").loaded  # a was unloaded and loaded again
        assert checked == after_b
    finally:
        served.stop()


def test_a_model_loaded_again_builds_no_tokenizer_and_the_pool_keeps_few(models_dir, monkeypatch):
    """An unloaded model keeps its tokenizer, which its next load shares (api/assets.py): the load
    is the weights alone.  Past KEPT_TOKENIZERS unloaded models, the older ones let theirs go."""
    from elelem.server import pool as pool_module
    from elelem.text.tokenizer import Tokenizer
    monkeypatch.setattr(pool_module, "KEPT_TOKENIZERS", 1)
    built: list[int] = []
    real = Tokenizer.from_metadata.__func__
    monkeypatch.setattr(Tokenizer, "from_metadata", classmethod(lambda cls, meta: (built.append(1), real(cls, meta))[1]))
    served = Served(config(models_dir, max_loaded=1))
    try:
        assert served.chat("a").status_code == 200
        first = served.model("a").llm.tokenizer
        assert served.chat("b").status_code == 200 and served.model("a").kept_tokenizer is first
        assert served.chat("a").status_code == 200 and served.model("a").llm.tokenizer is first
        assert len(built) <= 2   # a's, and b's unless it is a's byte for byte (it is: one writer)
        count = len(built)
        assert served.chat("c").status_code == 200   # a unloaded last: b's kept one goes
        assert served.model("a").kept_tokenizer is not None and served.model("b").kept_tokenizer is None
        assert served.chat("a").status_code == 200 and len(built) == count
    finally:
        served.stop()


def test_load_and_unload_endpoints_behind_the_key(models_dir):
    served = Served(config(models_dir))
    try:
        assert served.post("/models/load", {"model": "b"}, authorization="Bearer wrong").status_code == 401
        loaded = served.post("/models/load", {"model": "b"})
        assert loaded.status_code == 200 and loaded.json()["status"]["value"] == "loaded"
        assert served.model("b").loaded
        assert served.post("/models/load", {"model": "zzz"}).status_code == 404
        assert served.post("/models/load", {"name": "b"}).status_code == 400
        unloaded = served.post("/models/unload", {"model": "b"})
        assert unloaded.status_code == 200 and unloaded.json()["status"]["value"] == "unloaded"
        assert not served.model("b").loaded
    finally:
        served.stop()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_unloading_returns_the_memory(tmp_path):
    # Weights read into memory (no mmap), so they count in the resident set while loaded.
    model = write_format_model(tmp_path / "big.gguf", "hermes",
                               base=TinyConfig(n_embd=512, n_ff=2048, n_layer=6, n_head=8, n_head_kv=4, seed=3))
    size = model.path.stat().st_size
    cfg = ServerConfig(models_dir=str(tmp_path), api_key=KEY, parallel=1, n_ctx=256, n_threads=1,
                       keep_alive=None, llm_options={"use_mmap": False})
    served = Served(cfg)
    try:
        for _ in range(2):  # the first round leaves what stays for good (the tokenizer's tables, ...)
            assert served.chat("big").status_code == 200
            assert served.post("/models/unload", {"model": "big"}).status_code == 200
        before = _rss_bytes()
        assert served.chat("big").status_code == 200
        loaded = _rss_bytes()
        assert loaded - before > 0.8 * size
        assert served.post("/models/unload", {"model": "big"}).status_code == 200
        after = _rss_bytes()
        assert loaded - after > 0.8 * size, (before, loaded, after, size)
    finally:
        served.stop()


# -- packaged models, the real client ---------------------------------------------

@pytest.mark.real_model
def test_two_packaged_models_answer_the_openai_client_at_once(smollm_path, gemma_path):
    served = Served(ServerConfig(models=[str(smollm_path), str(gemma_path)], api_key=KEY, parallel=2,
                                 n_ctx=512, n_threads=1, keep_alive=None))
    try:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        ids = [m.id for m in client.models.list().data]
        assert len(ids) == 2

        def ask(model):
            stream = client.chat.completions.create(model=model, messages=[
                {"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0, stream=True)
            return model, "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        with ThreadPoolExecutor(4) as workers:
            answers = list(workers.map(ask, ids * 2))
        assert all(text for _, text in answers)
        assert answers[0] == answers[2] and answers[1] == answers[3]  # greedy: each model as alone
        assert {m.id: m.model_dump().get("status", {}).get("value") for m in client.models.list().data} == \
            {i: "loaded" for i in ids}
        metrics = httpx.get(served.url + "/metrics").text
        assert all(f'elelem_engine_steps_total{{model="{i}"}}' in metrics for i in ids)
    finally:
        served.stop()


def test_serve_takes_the_pool_options(monkeypatch, models_dir):
    import elelem.server.serving
    from elelem.cli import main
    apps = []
    monkeypatch.setattr(elelem.server.serving, "serve", lambda app, **where: apps.append(app) or 0)
    assert main(["serve", "--models-dir", str(models_dir), "--max-loaded", "2", "--max-memory", "1G",
                 "--load-timeout", "30s"]) == 0
    pool = apps[0].state.server.registry
    assert [m.id for m in pool.models] == ["a", "b", "c"]
    assert (pool.config.max_loaded, pool.config.max_memory, pool.config.load_timeout) == (2, 2**30, 30.0)
    assert main(["serve", "--model", str(models_dir / "b.gguf"), "--models-dir", str(models_dir)]) == 0
    pool = apps[1].state.server.registry
    assert [m.id for m in pool.models] == ["b", "a", "c"] and pool.config.preload  # b first, loaded at start


def test_a_preset_gives_a_model_settings_of_its_own(monkeypatch, models_dir, tmp_path):
    import elelem.server.serving
    from elelem.cli import main
    preset = tmp_path / "presets.ini"
    preset.write_text("[a]\nctx = 512\nparallel = 1\n\n[c]\nspeculative = off\n")
    apps = []
    monkeypatch.setattr(elelem.server.serving, "serve", lambda app, **where: apps.append(app) or 0)
    assert main(["serve", "--models-dir", str(models_dir), "--ctx", "256", "--models-preset", str(preset)]) == 0
    pool = apps[0].state.server.registry
    a, b, c = (pool.get(name) for name in "abc")
    assert [(m._config.n_ctx, m._config.parallel, m._config.speculative) for m in (a, b, c)] == [
        (512, 1, True), (256, 8, True), (256, 8, False)]
    assert a._config.max_queue == 4 and b._config.max_queue == 32
    pool.load(a)
    try:
        assert a.llm.n_ctx == 512
    finally:
        pool.close()
    preset.write_text("[a]\nrope = 2\n")
    assert main(["serve", "--models-dir", str(models_dir), "--models-preset", str(preset)]) == 1
    with pytest.raises(InvalidArgumentError, match="sets nope"):
        ServerConfig(models=["a.gguf"], presets={"a": {"nope": 1}})
