"""The Starlette app: routes, the API key, the body limit, and the lifespan of the models."""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from typing import Awaitable, Callable, Optional, Union

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from . import admin, anthropic, chat, lora, responses
from .auth import check_key
from .body import read_json
from .chat_page import chat_page
from .config import ServerConfig
from .embeddings import embedding_call, run_embedding
from .errors import APIError, from_exception
from .generation import Generation
from .infill import error_response as llama_error_response, infill
from .limits import RequestLimit
from .metrics import Metrics
from .registry import ModelRegistry
from .rerank import rerank_endpoint

log = logging.getLogger("elelem.server")


class ServerState:
    """What the routes share: the settings, the models, the counts."""

    def __init__(self, config: ServerConfig, registry: ModelRegistry):
        self.config = config
        self.registry = registry
        self.metrics = Metrics()
        self.ready = False
        self.started = int(time.time())
        # One worker thread per running request, plus a few for loading and cleanup.
        most = max([config.parallel, *(preset.get("parallel", 0) for preset in config.presets.values())])
        self.limiter = anyio.CapacityLimiter(most * len(config.models) + 4)
        self.generations: set[Generation] = set()

    def cancel_all(self) -> int:
        """Stop every running generation (used at shutdown, after the grace period)."""
        for generation in list(self.generations):
            generation.cancel()
        return len(self.generations)


def create_app(config: ServerConfig, registry: Optional[ModelRegistry] = None) -> Starlette:
    """The ASGI app of ``elelem serve``; ``app.state.server`` is its :class:`ServerState`."""
    state = ServerState(config, registry if registry is not None else ModelRegistry(config))

    @asynccontextmanager
    async def lifespan(app):
        # The default model loads before the server accepts requests, so /health means ready.
        await anyio.to_thread.run_sync(state.registry.load_at_startup)
        state.registry.start_reaper()
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            state.cancel_all()
            await anyio.to_thread.run_sync(state.registry.close)

    routes = [
        Route("/", _endpoint(state, _page, auth=False), methods=["GET"]),
        Route("/health", _endpoint(state, _health, auth=False), methods=["GET"]),
        Route("/metrics", _endpoint(state, _metrics, auth=False), methods=["GET"]),
        Route("/v1/models", _endpoint(state, admin.models), methods=["GET"]),
        Route("/v1/models/{model:path}", _endpoint(state, admin.model), methods=["GET"]),
        Route("/models/load", _endpoint(state, admin.load), methods=["POST"]),
        Route("/models/unload", _endpoint(state, admin.unload), methods=["POST"]),
        Route("/v1/chat/completions", _endpoint(state, chat.chat_completions), methods=["POST"]),
        Route("/v1/completions", _endpoint(state, chat.completions), methods=["POST"]),
        Route("/v1/embeddings", _endpoint(state, _embeddings), methods=["POST"]),
        # Anthropic's clients send the key as x-api-key, and read errors in Anthropic's shape.
        Route("/v1/messages", _endpoint(state, anthropic.messages, x_api_key=True,
                                        error_response=anthropic.error_response), methods=["POST"]),
        Route("/v1/responses", _endpoint(state, responses.handler()), methods=["POST"]),
        Route("/infill", _endpoint(state, infill, error_response=llama_error_response), methods=["POST"]),
        # llama-server's rerank routes, with its error shape
        *(Route(path, _endpoint(state, rerank_endpoint, error_response=llama_error_response), methods=["POST"])
          for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")),
        Route("/lora-adapters", _endpoint(state, lora.list_adapters), methods=["GET"]),
        Route("/lora-adapters", _endpoint(state, lora.set_adapters), methods=["POST"]),
    ]
    # ServerConfig.__post_init__ sets max_requests when it is not given.
    assert config.max_requests is not None
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
                    middleware=[Middleware(RequestLimit, limit=config.max_requests,
                                           retry_after=config.retry_after_seconds)])
    app.state.server = state
    return app


def _endpoint(state: ServerState, handler: Callable[[ServerState, Request], Awaitable[Union[Response, Generation]]],
              *, auth: bool = True, x_api_key: bool = False,
              error_response: Callable[[APIError], Response] = APIError.response
              ) -> Callable[[Request], Awaitable[Union[Response, Generation]]]:
    """A route: checks the key, runs ``handler(state, request)``, logs, and answers every error before
    a generation with ``error_response`` (OpenAI's JSON unless the protocol has its own)."""
    # A generation is an ASGI app of its own, answered like a response (Starlette awaits either).
    async def endpoint(request: Request) -> Union[Response, Generation]:
        t0 = time.perf_counter()
        try:
            if auth:
                check_key(state.config.api_key, request, x_api_key=x_api_key)
            response = await handler(state, request)
        except Exception as error:  # noqa: B902 -- never a bare 500 page
            response = error_response(from_exception(error, state.config.retry_after_seconds))
        if isinstance(response, Generation):
            return response  # it counts and logs itself once it has answered
        state.metrics.request_done(request.url.path, response.status_code)
        log.info("%s %s -> %d (%.0f ms)", request.method, request.url.path, response.status_code,
                 (time.perf_counter() - t0) * 1000)
        return response
    return endpoint


async def _page(state: ServerState, request: Request) -> Response:
    return chat_page()  # it asks for the key itself, if the server has one


async def _health(state: ServerState, request: Request) -> Response:
    if not state.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    # Where each loaded model runs: a GPU run that fell back to the CPU shows here, not only in the log.
    offload = {m.id: o["summary"] for m in state.registry.models if (o := m.offload) is not None}
    return JSONResponse({"status": "ok", "offload": offload})


async def _metrics(state: ServerState, request: Request) -> Response:
    return PlainTextResponse(state.metrics.render(state.registry.models),
                             media_type="text/plain; version=0.0.4")


async def _embeddings(state: ServerState, request: Request) -> Response:
    call = embedding_call(await read_json(request, state.config.max_body_bytes))
    model = state.registry.get(call.model)
    await model.reserve()   # embeddings take a slot like any request

    def work() -> dict:
        with model.session() as session:
            return run_embedding(session, model.load(), call, model.id)
    try:
        return JSONResponse(await anyio.to_thread.run_sync(work, limiter=state.limiter))
    finally:
        model.release()


async def _http_exception(request: Request, error: Exception) -> Response:
    # Starlette's own 404 (no such route) and 405 (wrong method), in OpenAI's shape.  Registered for
    # HTTPException, so Starlette passes only those, though its handler type takes any exception.
    assert isinstance(error, HTTPException)
    return APIError(error.status_code, f"{request.method} {request.url.path}: {error.detail}",
                    type="invalid_request_error").response()


async def _unexpected(request: Request, error: Exception) -> Response:
    return from_exception(error).response()
