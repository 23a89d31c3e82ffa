"""LoRA adapters over HTTP, as llama-server has them.

``GET /lora-adapters`` lists a model's adapters (loaded with ``--lora`` /
``--lora-scaled``) with the scales requests run at::

    [{"id": 0, "path": "style.gguf", "scale": 1.0, "task_name": "", "prompt_prefix": ""}]

``POST /lora-adapters`` with ``[{"id": 0, "scale": 0.5}]`` sets those scales
for the requests that start afterwards (a hot swap: nothing reloads); an
adapter it does not name is set to 0, as llama-server does.  A request's own
``lora`` field (the same list) sets the scales for it alone (chat/request.py,
infill/request.py), and requests at different scales still share the steps.
With several models, ``?model=NAME`` picks one (default: the only one).
"""
from __future__ import annotations

from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import InvalidArgumentError
from .body import read_json
from .errors import bad_request
from .fields import Kind

#: A request's ``lora`` field: llama-server's list of ``{"id": integer, "scale": number}``.
LORA_LIST = Kind('a list of {"id": integer, "scale": number}', lambda value: isinstance(value, list) and all(
    isinstance(e, dict) and set(e) <= {"id", "scale"} and isinstance(e.get("id"), int)
    and not isinstance(e.get("id"), bool) and isinstance(e.get("scale", 0), (int, float))
    and not isinstance(e.get("scale", 0), bool) for e in value))


async def list_adapters(state: Any, request: Request) -> Response:
    llm = await _llm(state, request)
    return JSONResponse([{"id": a["id"], "path": a["path"], "scale": a["scale"], "task_name": a["task_name"],
                          "prompt_prefix": a["prompt_prefix"]} for a in llm.lora_adapters])


async def set_adapters(state: Any, request: Request) -> Response:
    body = await read_json(request, state.config.max_body_bytes)
    if not LORA_LIST.test(body):
        raise bad_request(f"the body must be {LORA_LIST.name}")
    llm = await _llm(state, request)
    try:
        llm.set_lora(body)
    except InvalidArgumentError as error:
        raise bad_request(str(error)) from None
    return JSONResponse({"success": True})


async def _llm(state: Any, request: Request):
    served = state.registry.get(request.query_params.get("model"))
    return await anyio.to_thread.run_sync(state.registry.load, served, limiter=state.limiter)
