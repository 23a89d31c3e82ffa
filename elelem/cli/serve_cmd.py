"""``elelem serve``: the OpenAI-compatible server of :mod:`elelem.server`.

SIGTERM or Ctrl-C: running requests get ``--grace`` seconds to finish, the
rest are cancelled, the models are closed, and the exit status is 0.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import sys

from ..model.hub import is_hub_reference
from .loading import companions, draft_model, model_path

log = logging.getLogger("elelem.server")


def main(args: argparse.Namespace) -> int:
    try:
        from ..server import ServerConfig, create_app
        from ..server.config import parse_duration, read_presets
        from ..server.serving import serve
    except ImportError as error:
        print(f"elelem: error: the server needs its extra ({error.name} is missing): "
              "pip install 'elelem[server]'", file=sys.stderr)
        return 1
    # Known names are pulled first; with --models-dir alone, the folder's models are all there is.
    load_timeout = parse_duration(args.load_timeout)
    presets = read_presets(args.models_preset) if args.models_preset else {}
    models = [_pull(name, args, presets) for name in (args.model or ([] if args.models_dir else [None]))]
    config = ServerConfig(models=models, models_dir=args.models_dir, max_loaded=args.max_loaded,
                          max_memory=args.max_memory,
                          load_timeout=float("inf") if load_timeout is None else load_timeout,
                          api_key=args.api_key, parallel=args.parallel, n_ctx=args.ctx,
                          n_threads=args.threads, keep_alive=parse_duration(args.keep_alive),
                          speculative=args.speculative, flash_attn=args.flash_attn,
                          n_gpu_layers=args.n_gpu_layers, main_gpu=args.main_gpu, tensor_split=args.tensor_split,
                          prompt_cache=args.prompt_cache, prompt_cache_bytes=args.prompt_cache_size,
                          state_cache_mb=args.state_cache_mb,
                          draft_model=draft_model(args.draft_model),
                          llm_options=_llm_options(args), presets=presets)
    if not _is_loopback(args.host) and args.api_key is None:
        log.warning("binding %s without --api-key: anyone who can reach this port can use the models",
                    args.host)
    status = serve(create_app(config), host=args.host, port=args.port, grace=args.grace)
    if status == 0:
        print("elelem: server stopped", file=sys.stderr)
    return status


def _pull(name, args, presets: dict) -> str:
    """The local path of the model ``name``; for one from Hugging Face, its companions (the
    repository's projector unless --mmproj or --no-mmproj; its drafter with --draft auto)
    pulled too and set in its preset, under that path."""
    from ..api.options import SpeculativeOptions, VisionOptions
    path = model_path(name)
    if not is_hub_reference(name):
        return path
    asked_draft = draft_model(args.draft_model)
    found = companions(name, path, {"vision": VisionOptions(mmproj=args.mmproj),
                                    "speculation": SpeculativeOptions(draft_model=asked_draft)})
    vision: VisionOptions = found["vision"]
    speculation: SpeculativeOptions = found["speculation"]
    preset = presets.setdefault(path, {})
    if args.mmproj is None and vision.mmproj:
        preset["llm_options"] = {**preset.get("llm_options", {}), "mmproj": vision.mmproj}
    if speculation.draft_model != asked_draft:
        preset["draft_model"] = speculation.draft_model
    return path


def _llm_options(args) -> dict:
    """LLM() options every served model gets from the command line."""
    options = {}
    if args.rpc:
        options["rpc_servers"] = args.rpc
    if args.tool_call_format:
        options["tool_call_format"] = args.tool_call_format
    if args.lora:
        options["lora"] = [(path, 0.0 if args.lora_init_without_apply else scale) for path, scale in args.lora]
    if not args.mtp:
        options["mtp"] = False
    if args.mmproj is False:
        options["mmproj"] = False
    elif args.mmproj:
        if args.model and len(args.model) > 1 or args.models_dir:
            raise SystemExit("elelem serve: --mmproj is one model's projector; serve that model alone (one --model)")
        options["mmproj"] = args.mmproj
    if args.image_urls:
        options["image_urls"] = True
    return options


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
