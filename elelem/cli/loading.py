"""Opening the model a command asked for: pull a known model on first use, with progress."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ..model.hub import DEFAULT_MODEL, KNOWN_MODELS, is_cached, is_hub_reference
from .progress import fetch_with_progress, pull_with_progress


def model_path(name_or_path: str | None) -> str:
    """A local path for ``--model``: known names are pulled (progress on stderr) when not cached;
    Hugging Face references are brought up to date (a bar only if something downloads)."""
    name = DEFAULT_MODEL if name_or_path is None else name_or_path
    if is_hub_reference(name):
        return str(pull_with_progress(name, quiet_if_current=True))
    if name in KNOWN_MODELS and not is_cached(name):
        print(f"elelem: {name} is not in the cache yet; pulling it (once)", file=sys.stderr)
        return str(pull_with_progress(name))
    return name


def gpu_options(args: argparse.Namespace) -> dict:
    """The LLM() keywords of the GPU options (--n-gpu-layers, --main-gpu, --tensor-split), those given only."""
    options = {}
    if getattr(args, "n_gpu_layers", None) is not None:
        options["n_gpu_layers"] = args.n_gpu_layers
    if getattr(args, "main_gpu", 0):
        options["main_gpu"] = args.main_gpu
    if getattr(args, "tensor_split", None) is not None:
        options["tensor_split"] = args.tensor_split
    return options


def flash_attn_option(args: argparse.Namespace):
    """--flash-attn on/off/auto as LLM's flash_attn."""
    return {"on": True, "off": False}.get(getattr(args, "flash_attn", "auto"), "auto")


def llm_options(args: argparse.Namespace, *, n_ctx: int | None = None) -> dict:
    """The option groups of ``LLM`` that the command's flags set (``n_ctx``, if given, over ``--ctx``)."""
    from ..api.options import (CacheOptions, ContextOptions, PlacementOptions, SpeculativeOptions, VisionOptions,
                               WeightOptions)
    return {
        "context": ContextOptions(n_ctx=args.ctx if n_ctx is None else n_ctx, n_threads=args.threads,
                                  flash_attn=flash_attn_option(args)),
        "weights": WeightOptions(use_mmap=args.use_mmap, repack=args.repack, amx=args.amx, lora=args.lora),
        "placement": PlacementOptions(rpc_servers=args.rpc, **gpu_options(args)),
        "speculation": SpeculativeOptions(speculative=args.speculative, draft_model=draft_model(args.draft_model),
                                          mtp=args.mtp),
        "caches": CacheOptions(prompt_cache=args.prompt_cache, prompt_cache_bytes=args.prompt_cache_size,
                               state_cache_mb=args.state_cache_mb),
        "vision": VisionOptions(mmproj=getattr(args, "mmproj", None), image_dir=getattr(args, "image_dir", None),
                                image_urls=bool(getattr(args, "image_urls", False))),
    }


def draft_model(name: str | None) -> str | None:
    """``--draft-model``: a draft model pulled like ``--model``; ``auto`` as it is (:func:`companions`)."""
    from ..model.companions import is_auto
    return name if name is None or is_auto(name) else model_path(name)


def companions(name: str | None, path: str, options: dict) -> dict:
    """``options`` (``llm_options``) with the companions of the model ``name`` (opened from
    ``path``) found: a Hub model's projector (unless --mmproj or --no-mmproj said otherwise)
    and, with ``--draft auto``, its drafter, each pulled with a bar of its own."""
    from ..model.companions import drafter_for, is_auto, projector_for
    name = DEFAULT_MODEL if name is None else name
    vision, speculation = options["vision"], options["speculation"]
    if vision.mmproj is None and is_hub_reference(name):
        mmproj = fetch_with_progress(f"{name} (projector)", lambda progress: projector_for(
            name, Path(path), None, progress=progress), quiet_if_current=True)
        vision = replace(vision, mmproj=False if mmproj is None else str(mmproj))
    if is_auto(speculation.draft_model):
        found = fetch_with_progress(f"{name} (drafter)", lambda progress: drafter_for(
            name, Path(path), progress=progress), quiet_if_current=True) if is_hub_reference(name) \
            else drafter_for(name, Path(path))
        speculation = replace(speculation, draft_model=str(found))
    return {**options, "vision": vision, "speculation": speculation}


def open_llm(args: argparse.Namespace, *, n_ctx: int | None = None):
    from ..api.llm import LLM  # the native core loads here, not at startup
    options = llm_options(args, n_ctx=n_ctx)  # checked (and a draft model pulled) before the model is
    path = model_path(args.model)
    return LLM(path, **companions(args.model, path, options))
