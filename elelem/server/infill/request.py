"""The body of ``POST /infill``, checked as llama-server checks it, into the library's keyword options.

The infill fields are llama.cpp's: ``input_prefix`` and ``input_suffix``
(required: a string, or a list of strings and token ids), ``input_extra``
(a list of ``{"filename", "text"}`` files) and ``prompt`` (a string).  The
generation fields are ``/completion``'s, as far as elelem's sampling has
them: ``n_predict`` (or ``max_tokens``; -1: no limit), ``temperature``,
``top_k``, ``top_p``, ``min_p``, ``typical_p``, ``repeat_penalty``,
``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``, ``seed``
(-1: random), ``logit_bias`` (llama.cpp's ``[[token, bias]]`` pairs or
``{token: bias}`` object, a token as an id or a text, ``false`` to ban it),
``ignore_eos``, ``stop``, ``grammar``, ``stream``, and the editor plugins'
``n_indent`` and ``t_max_predict_ms`` (:class:`.wire.LineLimits`).  Samplers elelem lacks
(mirostat, DRY, XTC, dynamic temperature, top-n-sigma) are refused unless
off; what changes nothing here is accepted and left unread (``cache_prompt``:
prefixes are always reused; ``id_slot``, ``samplers``, ``n_keep``,
``t_max_prompt_ms``, ...).  As in
llama-server, other unknown fields are ignored: editor plugins send many.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from ...api.assets import ModelAssets
from ...api.infill import extra_files
from ...errors import InvalidArgumentError
from ..config import ServerConfig
from ..errors import bad_request
from ..fields import BOOLEAN, LIST, STRING, Field, Kind, Spec
from ..lora import LORA_LIST

_PIECE = Kind("a string or a list of strings and token ids", lambda value: isinstance(value, str) or (
    isinstance(value, list) and all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))
                                    for v in value)))
_INTEGER = Kind("an integer", lambda value: isinstance(value, int) and not isinstance(value, bool))
_NUMBER = Kind("a number", lambda value: isinstance(value, (int, float)) and not isinstance(value, bool))

# Handed to the library as they are; it checks their ranges.
_SAMPLING = {"temperature": _NUMBER, "top_k": _INTEGER, "top_p": _NUMBER, "min_p": _NUMBER, "typical_p": _NUMBER,
             "repeat_penalty": _NUMBER, "repeat_last_n": _INTEGER, "presence_penalty": _NUMBER,
             "frequency_penalty": _NUMBER}
#: llama.cpp's samplers elelem does not have, and the value that turns each off.
_ABSENT_SAMPLERS = {"mirostat": 0, "dry_multiplier": 0, "xtc_probability": 0, "dynatemp_range": 0}

SPEC = Spec({
    # llama.cpp's own words for the required fields.
    "input_prefix": Field(_PIECE, required=True, message='"input_prefix" is required, as {path} must be a string '
                                                         'or a list of strings and token ids'),
    "input_suffix": Field(_PIECE, required=True, message='"input_suffix" is required, as {path} must be a string '
                                                         'or a list of strings and token ids'),
    "input_extra": Field(LIST, message='"input_extra" must be an array of {{"filename": string, "text": string}}'),
    "prompt": Field(STRING, message='"prompt" must be a string'),
    "model": Field(STRING),
    "stream": Field(BOOLEAN),
    "n_predict": Field(_INTEGER), "max_tokens": Field(_INTEGER), "max_completion_tokens": Field(_INTEGER),
    "seed": Field(_INTEGER),
    "ignore_eos": Field(BOOLEAN),
    "grammar": Field(STRING),
    "lora": Field(LORA_LIST),
    "n_probs": Field(_INTEGER),
    "n_indent": Field(_INTEGER), "t_max_predict_ms": Field(_INTEGER),
    "response_fields": Field(Kind("a list of strings", lambda value: isinstance(value, list) and all(
        isinstance(v, str) for v in value))),
    **{name: Field(kind) for name, kind in _SAMPLING.items()},
    **{name: Field(_NUMBER) for name in (*_ABSENT_SAMPLERS, "top_n_sigma")},
    "n_cmpl": Field(_INTEGER), "n": Field(_INTEGER),
}, open=True)


def infill_body(body: Any, config: ServerConfig) -> dict:
    """The body checked: the spec, then the values (a 400 in llama.cpp's words for the first problem)."""
    body = SPEC.check(body)
    try:
        extra_files(body.get("input_extra"))
    except InvalidArgumentError as error:
        raise bad_request(str(error), "input_extra") from None
    for name, off in _ABSENT_SAMPLERS.items():
        if body.get(name) not in (None, off):
            raise bad_request(f"{name} is not supported by this server (its sampler is not implemented); "
                              f"leave it at {off}", name)
    if body.get("top_n_sigma") is not None and body["top_n_sigma"] >= 0:
        raise bad_request("top_n_sigma is not supported by this server; leave it negative (off)", "top_n_sigma")
    if body.get("n_probs"):
        raise bad_request("n_probs is not supported on /infill by this server", "n_probs")
    if body.get("n_cmpl", body.get("n", 1)) != 1:
        raise bad_request("one completion per request: n_cmpl must be 1", "n_cmpl")
    if (body.get("n_indent") or 0) < 0:
        raise bad_request(f"n_indent must be 0 or more, got {body['n_indent']}", "n_indent")
    max_tokens_limit(body, config)
    return body


def max_tokens_limit(body: dict, config: ServerConfig) -> Optional[int]:
    """``n_predict`` (or its aliases, as llama.cpp reads them): None for -1, no limit but the context."""
    value = next((body[name] for name in ("n_predict", "max_completion_tokens", "max_tokens")
                  if body.get(name) is not None), -1)
    if value < -1:
        raise bad_request(f"n_predict must be -1 (no limit) or more, got {value}", "n_predict")
    limit = config.max_tokens_limit
    if limit is not None and value > limit:
        raise bad_request(f"n_predict is {value}; this server allows at most {limit}", "n_predict")
    return limit if value == -1 else value


def generation_options(body: dict, assets: ModelAssets, config: ServerConfig) -> dict:
    """The library's keyword options (max_tokens, stop, grammar, sampling) for a checked body."""
    options: dict = {name: body[name] for name in _SAMPLING if body.get(name) is not None}
    if options.get("temperature", 0) < 0:  # llama.cpp samples greedily at a temperature at or below 0
        options["temperature"] = 0
    options["max_tokens"] = max_tokens_limit(body, config)
    if body.get("seed") is not None and body["seed"] != -1:
        options["seed"] = body["seed"] & 0xFFFFFFFF  # llama.cpp's seed is a uint32
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else [s for s in stop if isinstance(s, str)] if isinstance(
        stop, list) else []
    if [s for s in stops if s]:
        options["stop"] = [s for s in stops if s]
    if body.get("grammar"):
        options["grammar"] = body["grammar"]
    if body.get("lora"):   # an empty list: the server's scales, as llama-server
        options["lora"] = body["lora"]
    bias = logit_bias(body.get("logit_bias"), assets)
    if body.get("ignore_eos"):
        bias.update({token: -math.inf for token in assets.tokenizer.eog_ids})
    if bias:
        options["logit_bias"] = bias
    return options


def logit_bias(value: Any, assets: ModelAssets) -> dict[int, float]:
    """llama.cpp's ``logit_bias``: ``[[token, bias], ...]`` or ``{token: bias}``, a token an id or a text
    (each of its tokens biased), ``false`` banning it; entries of another shape are skipped, as there."""
    pairs: list = []
    if isinstance(value, list):
        pairs = [tuple(item) for item in value if isinstance(item, list) and len(item) == 2]
    elif isinstance(value, dict):
        pairs = [(int(key) if key.lstrip("-").isdigit() else key, bias) for key, bias in value.items()]
    out: dict[int, float] = {}
    for token, bias in pairs:
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)):
            continue
        if isinstance(token, int) and not isinstance(token, bool):
            if 0 <= token < assets.n_vocab:
                out[token] = float(bias)
        elif isinstance(token, str):
            for t in assets.tokenize(token, add_bos=False):
                out[t] = float(bias)
    return out
