"""``elelem serve``: an OpenAI-compatible HTTP server over the engine.

Needs the ``elelem[server]`` extra (starlette, uvicorn); the library itself
never imports this package.  Each request runs on a session of its own, in a
worker thread, so concurrent requests are batched by the engine step by step.

* :mod:`.config` -- the settings (``ServerConfig``) and their limits;
* :mod:`.registry` -- the models: loaded on first use, unloaded when idle;
* :mod:`.schema` -- request bodies checked and turned into library calls;
* :mod:`.generation` -- running one call in a thread, as JSON or SSE;
* :mod:`.errors` -- every failure as OpenAI's error JSON, with its status;
* :mod:`.metrics` -- the Prometheus text of ``/metrics``;
* :mod:`.app` -- the routes, the API key and the body limit.
"""
from __future__ import annotations

from .app import create_app
from .config import ServerConfig

__all__ = ["create_app", "ServerConfig"]
