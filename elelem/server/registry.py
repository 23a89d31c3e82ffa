"""The names the routes use for the served models: :class:`ServedModel`, one model
(:mod:`.served`), and ``ModelRegistry``, the pool of them (:mod:`.pool`)."""
from __future__ import annotations

from .pool import ModelPool
from .served import ServedModel

ModelRegistry = ModelPool

__all__ = ["ModelRegistry", "ModelPool", "ServedModel"]
