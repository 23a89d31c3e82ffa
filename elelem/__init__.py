"""elelem: run GGUF language models locally, on a vendored ggml."""
from __future__ import annotations

import logging

from .errors import *  # noqa: F401,F403  (the public exception hierarchy)

__version__ = "0.1.0"

logging.getLogger("elelem").addHandler(logging.NullHandler())


_OPTION_GROUPS = ("ContextOptions", "WeightOptions", "PlacementOptions", "SpeculativeOptions", "CacheOptions",
                  "VisionOptions")


def __getattr__(name: str):
    # The compiled core is imported on first use, so the pure-Python parts
    # (tokenizer, templates, sampling, the GGUF reader) work and test without it.
    if name == "LLM":
        from .api.llm import LLM
        return LLM
    if name == "Session":
        from .api.session import Session
        return Session
    if name in _OPTION_GROUPS:
        from .api import options
        return getattr(options, name)
    if name == "SamplingParams":
        from .sampling.sampler import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'elelem' has no attribute {name!r}")


__all__ = ["LLM", "Session", "SamplingParams", *_OPTION_GROUPS, "__version__"]
