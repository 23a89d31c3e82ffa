"""The model endpoints: ``GET /v1/models`` (and one model), and the pool's
``POST /models/load`` and ``/models/unload``, as llama.cpp's router has them.

A server of one model lists it as OpenAI's API does; a pool adds each
model's ``status`` (``loaded``, ``loading``, ``unloaded``, ``failed`` with
its error), as llama.cpp's router lists them.
"""
from __future__ import annotations

from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .body import read_json
from .errors import APIError, bad_request
from .registry import ServedModel


def _model_object(state: Any, model: ServedModel) -> dict:
    entry: dict[str, Any] = {"id": model.id, "object": "model", "created": state.started, "owned_by": "elelem"}
    llm = model.llm
    if llm is not None:   # what a loaded model reads: images too when it has a projector (api/images.py)
        entry["input_modalities"] = ["text", "image"] if getattr(llm, "images", None) is not None else ["text"]
    if len(state.registry.models) > 1:
        status: dict[str, Any] = {"value": model.state}
        if model.load_error is not None and not model.loaded:
            status["error"] = model.load_error
        entry["status"] = status
    return entry


async def models(state: Any, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_object(state, m) for m in state.registry.models]})


async def model(state: Any, request: Request) -> Response:
    return JSONResponse(_model_object(state, state.registry.get(request.path_params["model"])))


async def load(state: Any, request: Request) -> Response:
    """Load a model now (it waits for room as a request would); 200 once it is loaded."""
    served = await _named(state, request)
    await anyio.to_thread.run_sync(state.registry.load, served, limiter=state.limiter)
    return JSONResponse({"success": True, **_model_object(state, served)})


async def unload(state: Any, request: Request) -> Response:
    """Unload a model now: a 409 while requests hold it (it is never closed under them)."""
    served = await _named(state, request)
    if served.in_flight:
        raise APIError(409, f"the model {served.id!r} is in use by {served.in_flight} requests; retry once "
                            "they end", type="invalid_request_error", code="model_in_use")
    if not await anyio.to_thread.run_sync(state.registry.unload, served, limiter=state.limiter) and served.loaded:
        raise APIError(409, f"the model {served.id!r} is in use; retry once its requests end",
                       type="invalid_request_error", code="model_in_use")
    return JSONResponse({"success": True, **_model_object(state, served)})


async def _named(state: Any, request: Request) -> ServedModel:
    body = await read_json(request, state.config.max_body_bytes)
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str):
        raise bad_request("the body must be {\"model\": NAME}", param="model")
    return state.registry.get(name)
