"""``elelem serve``: an OpenAI- and Anthropic-compatible HTTP server over the engine.

Needs the ``elelem[server]`` extra (starlette, uvicorn); the library itself
never imports this package.  Each request runs on a session of its own, in a
worker thread, so concurrent requests are batched by the engine step by step.

One package per wire protocol, each with its request parsing (the body
checked and turned into the engine's call) and its wire format out:

* :mod:`.chat` -- Chat Completions and Completions (OpenAI's);
* :mod:`.responses` -- OpenAI's Responses API;
* :mod:`.anthropic` -- Anthropic's Messages API.

And what they share:

* :mod:`.app` -- the routes, the key check and the error shape of each, the lifespan of the models;
* :mod:`.auth` -- the API key; :mod:`.body` -- reading a JSON body within the size limit;
* :mod:`.fields` -- request bodies described as data, refused in each protocol's words;
* :mod:`.tools` -- tools, tool choices and tool calls in chat's shapes;
* :mod:`.call` -- the engine's call, run on a session; :mod:`.generation` -- running it in a
  thread, answered as JSON or SSE; :mod:`.wire` -- the base of each protocol's answer;
* :mod:`.errors` -- every failure as OpenAI's error JSON, with its status;
* :mod:`.config` -- the settings (``ServerConfig``) and their limits;
* :mod:`.pool` -- the models by name, loaded on first use, unloaded when idle or to make room
  (least recently used); :mod:`.served` -- one model's slots and sessions; :mod:`.registry` -- their names;
* :mod:`.admin` -- ``/v1/models`` and the pool's load and unload endpoints;
* :mod:`.metrics` -- the Prometheus text of ``/metrics``.
"""
from __future__ import annotations

from .app import create_app
from .config import ServerConfig

__all__ = ["create_app", "ServerConfig"]
