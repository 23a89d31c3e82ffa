"""``elelem rpc-server``: serve this machine's CPU (or other devices) to
``elelem run --rpc HOST:PORT`` / ``LLM(rpc_servers=[...])`` elsewhere."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from ..api.llm import default_n_threads
from ..api.rpc_server import is_loopback, start_rpc_server


def main(args: argparse.Namespace) -> int:
    if not is_loopback(args.host) and args.allow_remote:
        print(f"elelem: WARNING: the RPC server listens on {args.host}:{args.port} with NO authentication "
              "and NO encryption: anyone who can reach that port can use and read its memory. "
              "Prefer --host 127.0.0.1 and 'ssh -L' from the client.", file=sys.stderr)
    stop = threading.Event()
    failure: list[BaseException] = []

    def on_exit(error: BaseException) -> None:
        failure.append(error)
        stop.set()

    def on_signal(signum, _frame) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    threads = args.threads or default_n_threads()
    start_rpc_server(args.host, args.port, threads, args.device, args.allow_remote, args.cache, on_exit)
    print(f"elelem: RPC server on {args.host}:{args.port}, {threads} threads; Ctrl-C stops it", file=sys.stderr)
    while not stop.wait(0.5):  # a timed wait, so the signal handlers run
        pass
    if failure:
        print(f"elelem: error: {failure[0]}", file=sys.stderr)
        return 1
    print("elelem: RPC server stopped", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # ggml's server loop never returns and may be mid-graph for a client:
    # leave without unwinding the interpreter under it.
    os._exit(0)
