"""llama.cpp's ``POST /infill``: code completion with repository context, for editor plugins.

* :mod:`.request` -- the body, checked as llama-server checks it, and
  ``/completion``'s generation options as the library takes them;
* :mod:`.wire` -- llama-server's response, stream and error shapes.

The prompt is built by the library (:func:`elelem.api.infill.infill_ids`,
llama.cpp's ``format_prompt_infill``) on the request's session, once the
model is loaded: with the context one request gets as llama.cpp's slot
context and llama-server's defaults for the rest (``-b 2048``, ``-n -1``, no
``--spm-infill``).  Then it runs as a completion of those ids, batched with
the other endpoints' requests.
"""
from __future__ import annotations

from starlette.requests import Request

from ...api.infill import infill_ids
from ..body import read_json
from ..call import Call
from ..generation import Generation, accept
from .request import generation_options, infill_body
from .wire import LineLimits, LlamaWire, error_response

__all__ = ["infill", "error_response"]


async def infill(state, request: Request) -> Generation:
    """``POST /infill``."""
    body = infill_body(await read_json(request, state.config.max_body_bytes), state.config)
    settings: dict = {}
    built: list = []

    def build_prompt(session, call: Call) -> list[int]:  # in the request's worker thread
        assets = session.assets
        ids = infill_ids(assets, body["input_prefix"], body["input_suffix"], extra=body.get("input_extra"),
                         prompt=body.get("prompt", ""), n_ctx=session.n_ctx)
        call.options.update(generation_options(body, assets, state.config))
        max_tokens = call.options["max_tokens"]
        settings.update({"n_predict": -1 if max_tokens is None else max_tokens, "stream": call.stream,
                         **{k: v for k, v in call.options.items() if k not in ("max_tokens", "logit_bias")}})
        built.append((assets, ids))
        return ids

    def prompt_text() -> str:
        assets, ids = built[0]
        return assets.tokenizer.decode(ids, special=True).decode("utf-8", "replace")

    call = Call(chat=False, model=body.get("model"), stream=body.get("stream") is True, build_prompt=build_prompt)
    limits = LineLimits(body.get("n_indent") or 0, body.get("t_max_predict_ms") or 0)
    return await accept(state, request, call, lambda model_id: LlamaWire(
        model_id, prompt_text, settings, body.get("response_fields"), limits))
