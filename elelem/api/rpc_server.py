"""``elelem rpc-server``'s library side: serve this machine's devices to
``LLM(rpc_servers=...)`` clients with ggml's own RPC server (one client at a
time, as ggml-rpc does).

The protocol has no authentication and no encryption: whoever reaches the
port can run graphs and read and write the server's memory buffers.  So the
server binds to loopback unless told otherwise, and binding anywhere else is
logged as a warning; reach a remote server through an ssh tunnel instead
(README, "Layers on other machines").
"""
from __future__ import annotations

import ipaddress
import logging
import threading
from typing import Callable, Optional, Sequence

from .._core import cpu_device, local_devices, rpc_serve
from ..errors import InvalidArgumentError

log = logging.getLogger("elelem")

EXPOSED_WARNING = ("the RPC server listens on {host}, not on loopback: ggml's RPC protocol has no "
                   "authentication or encryption, so anyone who can reach port {port} can run code on its "
                   "buffers and read them. Prefer --host 127.0.0.1 and an ssh tunnel (ssh -L).")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_devices(names: Optional[Sequence[str]]) -> list:
    """The devices to serve: by ggml name ("CPU", ...), default the CPU."""
    if not names:
        return [cpu_device()]
    known = {dev.name: dev for dev in local_devices()}
    devices = []
    for name in names:
        if name not in known:
            raise InvalidArgumentError(f"no device named {name!r} here; there are: {', '.join(sorted(known))}")
        devices.append(known[name])
    return devices


def check_bind_address(host: str, port: int, allow_remote: bool) -> None:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise InvalidArgumentError(f"--host must be an IPv4 address (ggml's RPC server binds IPv4), "
                                   f"got {host!r}") from None
    if not 1 <= port <= 65535:
        raise InvalidArgumentError(f"the port must be in 1..65535, got {port}")
    if not is_loopback(host):
        if not allow_remote:
            raise InvalidArgumentError(f"{host} is not a loopback address: the RPC protocol has no "
                                       "authentication; pass allow_remote (--allow-remote) to bind it anyway")
        log.warning(EXPOSED_WARNING.format(host=host, port=port))


def start_rpc_server(host: str, port: int, n_threads: int, device_names: Optional[Sequence[str]] = None,
                     allow_remote: bool = False, cache_dir: Optional[str] = None,
                     on_exit: Optional[Callable[[BaseException], None]] = None) -> threading.Thread:
    """Serve in a daemon thread (ggml's server loop runs with the GIL
    released and never returns); ``on_exit(error)`` is called if it stops,
    which happens only when it cannot listen."""
    check_bind_address(host, port, allow_remote)
    devices = resolve_devices(device_names)
    endpoint = f"{host}:{port}"

    def serve():
        try:
            rpc_serve(endpoint, devices, n_threads, cache_dir)
        except BaseException as error:  # it returned: it could not listen
            if on_exit is not None:
                on_exit(error)

    thread = threading.Thread(target=serve, name=f"elelem-rpc-server-{port}", daemon=True)
    thread.start()
    log.info("RPC server on %s serving %s with %d threads", endpoint,
             ", ".join(f"{d.name} ({d.description})" for d in devices), n_threads)
    return thread
