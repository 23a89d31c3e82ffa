"""Running the app under uvicorn: announce the URL when ready, and stop gracefully.

On SIGTERM (or Ctrl-C) uvicorn stops accepting connections and waits for the
running requests.  After ``grace`` seconds the server cancels the ones still
running: each stream then ends properly, with an error event and no
``[DONE]``, its generation stopped within one engine step and its session
closed.  uvicorn's own deadline, a little later, is only a backstop.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING, Optional

import uvicorn

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .app import ServerState

log = logging.getLogger("elelem.server")

#: After the grace period, how long cancelled requests get to end before uvicorn cancels their tasks.
_BACKSTOP_SECONDS = 5.0


class ElelemServer(uvicorn.Server):
    """uvicorn's server, which prints its URL once it accepts connections and
    cancels the generations still running ``grace`` seconds into a shutdown."""

    def __init__(self, app: Starlette, *, host: str, port: int, grace: float):
        # The app's ServerState, kept as itself: uvicorn's config.app is typed as any kind of ASGI app.
        self.app_state: ServerState = app.state.server
        config = self.app_state.config
        # Requests past config.max_requests get OpenAI's 503 from the app (limits.py); connections
        # past twice that get uvicorn's plain one, so idle clients cannot pile up without bound.
        assert config.max_requests is not None  # ServerConfig.__post_init__ sets it when it is not given
        connections = 2 * config.max_requests
        # uvicorn annotates timeout_graceful_shutdown as an int, but only hands it to asyncio's
        # timeout, which takes any number of seconds: the float stays as the grace period makes it.
        super().__init__(uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                                        lifespan="on",
                                        timeout_graceful_shutdown=grace + _BACKSTOP_SECONDS,  # type: ignore[arg-type]
                                        limit_concurrency=connections))
        self.grace = grace
        self.url: Optional[str] = None

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            names = ", ".join(m.id for m in self.app_state.registry.models)
            print(f"elelem: serving {names} at {self.url}/v1", file=sys.stderr, flush=True)

    async def shutdown(self, sockets=None):
        state = self.app_state
        timer = asyncio.get_running_loop().call_later(self.grace, self._cancel_running, state)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    @staticmethod
    def _cancel_running(state) -> None:
        count = state.cancel_all()
        if count:
            log.warning("shutting down: cancelled %d running request(s) after the grace period", count)


def serve(app, *, host: str, port: int, grace: float) -> int:
    """Serve until SIGTERM or Ctrl-C; 0 after a clean stop, 1 if the server never started."""
    server = ElelemServer(app, host=host, port=port, grace=grace)
    # uvicorn re-raises the signal it caught once it has shut down; with handlers of our
    # own in place, that ends here instead of killing the process, so the exit status is 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: None)
    server.run()
    return 0 if server.started else 1
