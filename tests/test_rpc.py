"""Layers on ggml RPC servers: `elelem rpc-server` processes on
loopback, started here, and LLM(rpc_servers=...) splitting a model over them.

The failure tests (a server killed or frozen mid-generation) run their client
in a child process: ggml-rpc keeps one connection per server for the whole
process, and once one is lost, no model in that process may use RPC again.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import elelem
from elelem import LLM
from elelem.api.devices import check_memory, check_server, kv_layer_bytes, parse_endpoints, plan_layers
from elelem.errors import CapacityError, InvalidArgumentError, RPCError
from synthetic import TinyConfig

HERE = Path(__file__).parent
PACKAGE_ROOT = Path(elelem.__file__).resolve().parent.parent  # the elelem under test, for the children
CHILD_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_ROOT), str(HERE),
                                                                     os.environ.get("PYTHONPATH")])))
SIX_LAYERS = TinyConfig(n_layer=6, n_ctx_train=512)
TIMEOUT = 30.0  # rpc_timeout of the clients here: a stuck server fails the test instead of hanging it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `elelem rpc-server` child process on a free loopback port."""

    def __init__(self, *extra: str):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "elelem", "rpc-server", "--port", str(self.port), "--threads", "1", *extra],
            cwd=HERE, env=CHILD_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout: float = 30.0) -> "Server":
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"rpc-server exited with {self.proc.returncode}: {self.proc.communicate()}")
            try:
                check_server(self.endpoint, timeout=2.0)
                return self
            except RPCError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@pytest.fixture
def start_server():
    """A factory of started servers, every one killed when the test ends."""
    started = []

    def start(*extra: str) -> Server:
        server = Server(*extra)
        started.append(server)
        return server.wait_ready()

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def two_servers():
    servers = [Server(), Server()]
    try:
        yield [s.wait_ready() for s in servers]
    finally:
        for server in servers:
            server.stop()


def greedy(llm, prompt, n=16) -> list[int]:
    tokens = list(prompt)
    out = []
    for _ in range(n):
        logits = llm.eval(tokens if not out else tokens[-1:])
        tokens.append(int(np.argmax(logits)))
        out.append(tokens[-1])
    return out


# -- the split ---------------------------------------------------------------

class FakeDevice:
    def __init__(self, name):
        self.name = self.description = name


def test_plan_layers_even_split_keeps_the_first_layers_on_the_cpu():
    p = plan_layers(30, [FakeDevice("a"), FakeDevice("b")])
    assert p.layer_device == [-1] * 10 + [0] * 10 + [1] * 10
    p = plan_layers(7, [FakeDevice("a"), FakeDevice("b")])
    assert p.layer_device.count(-1) + p.layer_device.count(0) + p.layer_device.count(1) == 7
    assert p.layer_device == sorted(p.layer_device)  # contiguous ranges, in the devices' order


def test_plan_layers_n_gpu_layers_and_tensor_split():
    a, b = FakeDevice("a"), FakeDevice("b")
    assert plan_layers(8, [a, b], n_gpu_layers=-1).layer_device == [0] * 4 + [1] * 4
    assert plan_layers(8, [a, b], n_gpu_layers=2).layer_device == [-1] * 6 + [0, 1]
    assert plan_layers(8, [a, b], n_gpu_layers=-1, tensor_split=[3, 1]).layer_device == [0] * 6 + [1] * 2
    assert plan_layers(8, [a, b], n_gpu_layers=0).layer_device == [-1] * 8
    with pytest.raises(InvalidArgumentError, match="tensor_split"):
        plan_layers(8, [a, b], tensor_split=[1])
    with pytest.raises(InvalidArgumentError, match="tensor_split"):
        plan_layers(8, [a, b], tensor_split=[0, 0])


def test_parse_endpoints():
    assert parse_endpoints("127.0.0.1:1, localhost:02") == ["127.0.0.1:1", "localhost:2"]
    assert parse_endpoints(["h:5"]) == ["h:5"]
    assert parse_endpoints("") == parse_endpoints(None) == []
    for bad in ("127.0.0.1:notaport", "127.0.0.1", ":5", "h:0", "h:70000", "h:1,h:1", ","):
        with pytest.raises(InvalidArgumentError):
            parse_endpoints(bad)


# -- two servers on loopback -------------------------------------------------

@pytest.mark.parametrize("wtype", ["f32", "q8_0"])
def test_greedy_tokens_equal_the_local_run(tiny_model, two_servers, wtype):
    path, _ = tiny_model(SIX_LAYERS.but(wtype=wtype))
    prompt = [1, 5, 9, 33, 2, 17, 40]
    with LLM(path, n_ctx=128, n_threads=1) as local:
        expected = greedy(local, prompt)
        local_logits = local.engine.context.decode(prompt, 5, outputs=True)  # a sequence no session uses
    servers = [s.endpoint for s in two_servers]
    with LLM(path, n_ctx=128, n_threads=1, rpc_servers=servers, rpc_timeout=TIMEOUT) as split:
        assert split.placement.layer_device == [-1, -1, 0, 0, 1, 1]
        names = split.engine.context.backend_names
        assert len(names) == 3 and all(s in n for s, n in zip(servers, names)) and names[2] == "CPU"
        assert greedy(split, prompt) == expected
        split_logits = split.engine.context.decode(prompt, 5, outputs=True)
    np.testing.assert_allclose(split_logits, local_logits, rtol=0, atol=1e-4)


def test_the_compat_shim_takes_llama_cpp_pythons_keywords(tiny_model, two_servers):
    """rpc_servers as a comma-separated string, n_gpu_layers=-1 (all off the CPU);
    its default n_gpu_layers=0 keeps every layer local, as in llama.cpp."""
    from elelem.compat import Llama
    path, _ = tiny_model(SIX_LAYERS)
    servers = ",".join(s.endpoint for s in two_servers)
    with Llama(model_path=str(path), n_ctx=128, n_threads=1, rpc_servers=servers, verbose=False) as local:
        assert local.llm.placement.layer_device == [-1] * 6
        expected = greedy(local.llm, [1, 5, 9, 33], 8)
    with Llama(model_path=str(path), n_ctx=128, n_threads=1, rpc_servers=servers, n_gpu_layers=-1,
               tensor_split=[1, 2], verbose=False, elelem_options={"rpc_timeout": TIMEOUT}) as split:
        assert split.llm.placement.layer_device == [0, 0, 1, 1, 1, 1]
        assert greedy(split.llm, [1, 5, 9, 33], 8) == expected


def test_every_layer_remote_and_a_batch_of_sequences(tiny_model, two_servers):
    path, _ = tiny_model(SIX_LAYERS)
    servers = ",".join(s.endpoint for s in two_servers)  # the comma-separated form, as llama-cpp-python's
    with LLM(path, n_ctx=128, n_threads=1) as local:
        expected = local.engine.context.decode([3, 4, 5, 6, 7, 8], [5, 5, 5, 6, 6, 6])
    with LLM(path, n_ctx=128, n_threads=1, rpc_servers=servers, n_gpu_layers=-1, tensor_split=[2, 1],
             rpc_timeout=TIMEOUT) as split:
        assert split.placement.layer_device == [0, 0, 0, 0, 1, 1]
        got = split.engine.context.decode([3, 4, 5, 6, 7, 8], [5, 5, 5, 6, 6, 6])
        generated = split.generate_tokens([3, 4, 5], 8)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    with LLM(path, n_ctx=128, n_threads=1) as local:
        assert local.generate_tokens([3, 4, 5], 8) == generated


def test_a_device_without_room_for_its_layers_is_refused():
    class Small(FakeDevice):
        def memory(self):
            return 3 * 2**20, 8 * 2**20
    placement = plan_layers(4, [Small("rpc")], n_gpu_layers=2)
    check_memory(placement, [2**20] * 4, 2**19)  # 2 layers: 2 MiB of weights + 1 MiB of K/V fit
    with pytest.raises(CapacityError, match="3 MiB free; its 2 layers need 4 MiB"):
        check_memory(placement, [2**20] * 4, 2**20)


@pytest.mark.parametrize("type_k, type_v", [("f16", "f16"), ("f32", "f32"), ("q8_0", "q8_0"), ("q4_0", "f16")])
def test_the_memory_check_sizes_k_and_v_in_the_cache_types(tiny_model, type_k, type_v):
    path, _ = tiny_model(TinyConfig(head_dim=32))  # a quantized cache's blocks are 32 wide
    with LLM(path, n_ctx=64, n_threads=1, type_k=type_k, type_v=type_v) as llm:
        h = llm.spec.hparams
        per_layer = kv_layer_bytes(1, h["n_head_kv"], h["head_dim_k"], h["head_dim_v"], type_k, type_v)
        assert per_layer * h["n_layer"] == llm.engine.context.cache.bytes_per_cell


@pytest.mark.real_model
def test_smollm2_split_over_two_servers_gives_the_local_tokens(smollm_path, two_servers):
    prompt = "The capital of France is"
    # Weights on an RPC server are never repacked, so the local run keeps its
    # weights as stored too: on an AMX CPU it would otherwise run AMX's kernels
    # (SmolLM2's Q4_1), whose sums differ (" 311" against " 321" at token 15).
    with LLM(smollm_path, n_ctx=256, n_threads=1, repack=False) as local:
        expected = local.generate(prompt, max_tokens=16, temperature=0)
    with LLM(smollm_path, n_ctx=256, n_threads=1, rpc_servers=[s.endpoint for s in two_servers],
             rpc_timeout=TIMEOUT, repack=False) as split:
        assert split.generate(prompt, max_tokens=16, temperature=0) == expected


def test_info_devices_lists_the_servers(two_servers):
    result = subprocess.run([sys.executable, "-m", "elelem", "info", "--devices", "--json",
                             "--rpc", two_servers[0].endpoint], cwd=HERE, env=CHILD_ENV,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = [r for r in json.loads(result.stdout)["devices"] if r["kind"] not in ("gpu", "igpu")]  # a local GPU may show
    assert [r["kind"] for r in rows] == ["cpu", "rpc"]
    assert rows[1]["endpoint"] == two_servers[0].endpoint and rows[1]["free_bytes"] > 0


def test_bench_command_runs_over_the_servers(tiny_model, two_servers):
    path, _ = tiny_model(SIX_LAYERS.but(n_vocab=256))  # the bench prompt draws ids from 100 up
    result = subprocess.run([sys.executable, "-m", "elelem", "bench", "-m", str(path), "-t", "1", "-p", "8",
                             "-g", "4", "--json", "--rpc", ",".join(s.endpoint for s in two_servers)],
                            cwd=HERE, env=CHILD_ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["decode_tok_s"] > 0 and figures["prefill_tok_s"] > 0


# -- bad addresses -----------------------------------------------------------

def test_bad_addresses_raise_at_load(tiny_model):
    path, _ = tiny_model(SIX_LAYERS)
    with pytest.raises(RPCError, match="nohost:1: cannot resolve host 'nohost'"):
        LLM(path, n_ctx=64, rpc_servers=["nohost:1"])
    with pytest.raises(InvalidArgumentError, match="notaport"):
        LLM(path, n_ctx=64, rpc_servers="127.0.0.1:notaport")
    port = free_port()
    with pytest.raises(RPCError, match=f"127.0.0.1:{port}: connection refused") as caught:
        LLM(path, n_ctx=64, rpc_servers=[f"127.0.0.1:{port}"])
    assert caught.value.endpoints == [f"127.0.0.1:{port}"]


def test_a_server_that_is_not_a_ggml_rpc_server(tiny_model):
    path, _ = tiny_model(SIX_LAYERS)
    with socket.socket() as listener:  # accepts, reads, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(RPCError, match="no answer to the handshake"):
            check_server(endpoint, timeout=1.0)
        assert time.monotonic() - t0 < 5


# -- a server lost mid-generation ---------------------------------------------

CLIENT = textwrap.dedent("""
    import json, os, signal, sys, time
    from elelem import LLM
    from elelem.errors import RPCError
    path, servers, victim, how, timeout = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
    llm = LLM(path, n_ctx=128, n_threads=1, rpc_servers=servers, rpc_timeout=timeout)
    first = llm.generate_tokens([1, 2, 3], 4)
    os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        llm.generate_tokens([1, 2, 3, 4, 5], 32)
        outcome = {"raised": None}
    except RPCError as error:
        outcome = {"raised": type(error).__name__, "message": str(error), "endpoints": error.endpoints}
    outcome["seconds"] = time.monotonic() - t0
    try:
        llm.generate_tokens([1], 2)
    except RPCError as error:
        outcome["afterwards"] = str(error)
    llm.close()
    print(json.dumps(outcome))
""")


def run_client(path, servers, victim, how, timeout):
    result = subprocess.run([sys.executable, "-c", CLIENT, str(path), ",".join(s.endpoint for s in servers),
                             str(victim.proc.pid), how, str(timeout)],
                            cwd=HERE, env=CHILD_ENV, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_killed_server_raises_rpc_error_naming_it(tiny_model, start_server):
    path, _ = tiny_model(SIX_LAYERS)
    servers = [start_server(), start_server()]
    outcome = run_client(path, servers, servers[1], "kill", 60)
    assert outcome["raised"] == "RPCError", outcome
    assert servers[1].endpoint in outcome["message"] and "lost the connection" in outcome["message"]
    assert outcome["endpoints"] == [servers[1].endpoint]   # the one that refuses connections now
    assert outcome["seconds"] < 10
    assert "cannot be used any more" in outcome["afterwards"]


def test_a_frozen_server_raises_within_the_timeout(tiny_model, start_server):
    path, _ = tiny_model(SIX_LAYERS)
    servers = [start_server(), start_server()]
    try:
        outcome = run_client(path, servers, servers[0], "stop", 2.0)
    finally:
        servers[0].proc.send_signal(signal.SIGCONT)
    assert outcome["raised"] == "RPCError", outcome
    assert "within 2 s" in outcome["message"] and servers[0].endpoint in outcome["message"]
    assert 1.9 < outcome["seconds"] < 10


# -- the server command ------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_rpc_server_stops_cleanly_on_a_signal(start_server, signum):
    server = start_server()
    server.proc.send_signal(signum)
    _, err = server.proc.communicate(timeout=20)
    assert server.proc.returncode == 0, err
    assert "RPC server stopped" in err


def test_rpc_server_refuses_a_public_address_without_allow_remote():
    result = subprocess.run([sys.executable, "-m", "elelem", "rpc-server", "--host", "0.0.0.0",
                             "--port", str(free_port())], cwd=HERE, env=CHILD_ENV,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "not a loopback address" in result.stderr and "allow_remote" in result.stderr


def test_rpc_server_warns_loudly_with_allow_remote(start_server):
    server = start_server("--host", "0.0.0.0", "--allow-remote")  # reachable on loopback too
    server.proc.send_signal(signal.SIGTERM)
    _, err = server.proc.communicate(timeout=20)
    assert "WARNING" in err and "NO authentication" in err
    assert "no authentication or encryption" in err  # the library's log line too


def test_rpc_server_refuses_an_unknown_device():
    result = subprocess.run([sys.executable, "-m", "elelem", "rpc-server", "--port", str(free_port()),
                             "--device", "NOPE"], cwd=HERE, env=CHILD_ENV, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "no device named 'NOPE'" in result.stderr and "CPU" in result.stderr


def test_rpc_server_on_a_taken_port_fails(start_server):
    server = start_server()
    result = subprocess.run([sys.executable, "-m", "elelem", "rpc-server", "--port", str(server.port)],
                            cwd=HERE, env=CHILD_ENV, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "could not listen" in result.stderr
