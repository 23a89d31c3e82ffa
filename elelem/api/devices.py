"""Devices beyond the local CPU: ggml RPC servers, and the split of a model's
layers over them.

``LLM(rpc_servers=["host:port", ...])`` connects to each server (after a
handshake of our own, so that a bad address is a clear error before ggml's
client, which aborts the process on one, ever sees it), then gives each of
the servers' devices a contiguous range of layers; the local CPU keeps the
first layers, the embeddings and the output head.  The split is even by
default: an RPC server here is a CPU, whose "free memory" is its host's RAM
and says nothing about how fast it runs a layer, and a layer costs the same
compute wherever it runs.  ``tensor_split`` weighs the devices otherwise, and
``n_gpu_layers`` says how many layers leave the CPU (llama.cpp's names, so
that a local GPU can take the same place in the list later).
"""
from __future__ import annotations

import logging
import socket
import struct
from dataclasses import dataclass
from typing import Optional, Sequence

from .._core import DEFAULT_RPC_TIMEOUT, rpc_connect, rpc_connected_endpoints
from ..errors import CapacityError, InvalidArgumentError, RPCError
from ..gguf.reader import GGML_TYPES

log = logging.getLogger("elelem")

# ggml-rpc's wire format (third_party/ggml/include/ggml-rpc.h, src/ggml-rpc/ggml-rpc.cpp):
# a request is | command (1 byte) | size (u64) | payload |, a reply | size (u64) | payload |.
RPC_CMD_HELLO = 14
RPC_PROTO_MAJOR = 7
RPC_CONN_CAPS_SIZE = 24
HELLO_REPLY_SIZE = 4 + RPC_CONN_CAPS_SIZE   # major, minor, patch, padding, caps
HANDSHAKE_TIMEOUT = 10.0


def parse_endpoints(value) -> list[str]:
    """``["host:port", ...]`` or ``"host:port,host:port"`` -> a checked list."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []  # llama-cpp-python's "no servers"
    items = value.split(",") if isinstance(value, str) else list(value)
    endpoints = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgumentError(f"rpc_servers: each server is a 'host:port' string, got {item!r}")
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host:
            raise InvalidArgumentError(f"rpc_servers: {item!r} is not 'host:port'")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InvalidArgumentError(f"rpc_servers: {item!r}: the port must be a number in 1..65535")
        endpoint = f"{host}:{int(port)}"
        if endpoint in endpoints:
            raise InvalidArgumentError(f"rpc_servers: {endpoint} is given twice")
        endpoints.append(endpoint)
    if isinstance(value, str) and not endpoints:
        raise InvalidArgumentError(f"rpc_servers: no 'host:port' in {value!r}")
    return endpoints


def check_server(endpoint: str, timeout: float = HANDSHAKE_TIMEOUT, handshake: bool = True):
    """Connect to ``endpoint`` and do ggml-rpc's HELLO; returns the server's
    protocol version (None without ``handshake``), or raises RPCError saying what is wrong."""
    host, _, port = endpoint.rpartition(":")
    try:
        addresses = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise RPCError(f"RPC server {endpoint}: cannot resolve host {host!r} ({error.strerror})",
                       endpoints=[endpoint]) from None
    try:
        address = addresses[0][4]  # AF_INET: (host, port)
        sock = socket.create_connection((str(address[0]), int(address[1])), timeout=timeout)
    except ConnectionRefusedError:
        raise RPCError(f"RPC server {endpoint}: connection refused (nothing listens there; "
                       "start one with 'elelem rpc-server')", endpoints=[endpoint]) from None
    except (socket.timeout, TimeoutError):
        raise RPCError(f"RPC server {endpoint}: no connection within {timeout:g} s", endpoints=[endpoint]) from None
    except OSError as error:
        raise RPCError(f"RPC server {endpoint}: cannot connect ({error.strerror or error})",
                       endpoints=[endpoint]) from None
    with sock:
        if not handshake:
            return None
        try:
            sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            reply = _recv_exactly(sock, 8 + HELLO_REPLY_SIZE)
        except (socket.timeout, TimeoutError):
            raise RPCError(f"RPC server {endpoint}: no answer to the handshake within {timeout:g} s (a ggml RPC "
                           "server serves one client at a time: is another one connected?)",
                           endpoints=[endpoint]) from None
        except OSError as error:
            raise RPCError(f"RPC server {endpoint}: the handshake failed ({error.strerror or error}); is it a "
                           "ggml RPC server?", endpoints=[endpoint]) from None
    size, major, minor, patch = struct.unpack_from("<QBBB", reply)
    if size != HELLO_REPLY_SIZE:
        raise RPCError(f"{endpoint} did not answer like a ggml RPC server", endpoints=[endpoint])
    if major != RPC_PROTO_MAJOR:
        raise RPCError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; this elelem needs "
                       f"{RPC_PROTO_MAJOR}.x (use the same elelem or llama.cpp version on both sides)",
                       endpoints=[endpoint])
    return major, minor, patch


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


def connect_servers(endpoints: Sequence[str], timeout: float = DEFAULT_RPC_TIMEOUT) -> list:
    """The devices of every server, in the order given (each checked first)."""
    devices = []
    connected = rpc_connected_endpoints()
    for endpoint in endpoints:
        # A server already connected in this process is busy with that one
        # connection (ggml-rpc shares it between models): it would not answer
        # a handshake on another, so only check that it still listens.
        check_server(endpoint, min(timeout, HANDSHAKE_TIMEOUT), handshake=endpoint not in connected)
        devices.extend(rpc_connect(endpoint, timeout))
    return devices


@dataclass
class Placement:
    """Which device runs each layer: ``layer_device[il]`` indexes ``devices``, -1 is the local CPU."""
    devices: list
    layer_device: list[int]

    def layers_of(self, index: int) -> list[int]:
        return [il for il, d in enumerate(self.layer_device) if d == index]

    def describe(self) -> str:
        parts = []
        cpu_layers = self.layers_of(-1)
        if cpu_layers:
            parts.append(f"CPU: layers {cpu_layers[0]}-{cpu_layers[-1]}")
        for i, dev in enumerate(self.devices):
            layers = self.layers_of(i)
            where = f"{dev.name} ({dev.description})"
            parts.append(f"{where}: layers {layers[0]}-{layers[-1]}" if layers else f"{where}: none")
        return "; ".join(parts)


def plan_layers(n_layer: int, devices: list, n_gpu_layers: Optional[int] = None,
                tensor_split: Optional[Sequence[float]] = None) -> Placement:
    """Split ``n_layer`` layers: the first ones stay on the CPU, the last
    ``n_gpu_layers`` go to ``devices``, in contiguous ranges in their order,
    sized by ``tensor_split`` (default: equal).  ``n_gpu_layers`` None is an
    equal share for every device and the CPU; -1 (or more than n_layer) is
    every layer off the CPU."""
    if not devices:
        return Placement([], [-1] * n_layer)
    n_dev = len(devices)
    if n_gpu_layers is None:
        n_off = round(n_layer * n_dev / (n_dev + 1))
    else:
        if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int):
            raise InvalidArgumentError(f"n_gpu_layers must be an integer, got {n_gpu_layers!r}")
        n_off = n_layer if n_gpu_layers < 0 else min(n_gpu_layers, n_layer)
    weights = [1.0] * n_dev if tensor_split is None else [float(w) for w in tensor_split]
    if len(weights) != n_dev or any(not w >= 0 for w in weights) or sum(weights) <= 0:
        raise InvalidArgumentError(f"tensor_split needs {n_dev} non-negative weights (one per device: "
                                   f"{', '.join(d.name for d in devices)}), not all 0; got {tensor_split!r}")
    # Cumulative shares rounded to layer boundaries: contiguous ranges that add up to n_off.
    total = sum(weights)
    bounds = [round(n_off * sum(weights[:i + 1]) / total) for i in range(n_dev)]
    layer_device = [-1] * n_layer
    start = n_layer - n_off
    previous = 0
    for index, bound in enumerate(bounds):
        for il in range(start + previous, start + bound):
            layer_device[il] = index
        previous = bound
    return Placement(list(devices), layer_device)


def kv_layer_bytes(cells: int, n_head_kv: int, head_dim_k: int, head_dim_v: int, type_k: str, type_v: str) -> int:
    """What one layer's K and V take in a cache of ``cells`` cells, in the
    given types (``"f16"``, ``"q8_0"``, ...; a name ggml lacks counts as f16,
    and opening the context then says what is wrong with it)."""
    return cells * n_head_kv * (_row_bytes(type_k, head_dim_k) + _row_bytes(type_v, head_dim_v))


def _row_bytes(type_name: str, n: int) -> int:
    name = type_name.upper() if isinstance(type_name, str) else None
    block, size = next(((b, s) for t, b, s in GGML_TYPES.values() if t == name), (1, 2))
    return -(-n // block) * size


def check_memory(placement: Placement, layer_bytes: list[int], kv_bytes_per_layer: int) -> None:
    """Each device must have room for its layers' weights and K/V (as it reports its free memory)."""
    for index, dev in enumerate(placement.devices):
        layers = placement.layers_of(index)
        need = sum(layer_bytes[il] for il in layers) + kv_bytes_per_layer * len(layers)
        free, _total = dev.memory()
        if layers and need > free:
            raise CapacityError(f"{dev.name} ({dev.description}) has {free / 2**20:.0f} MiB free; its "
                                f"{len(layers)} layers need {need / 2**20:.0f} MiB (give it fewer with "
                                "tensor_split or n_gpu_layers)")
