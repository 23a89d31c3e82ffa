"""One module per architecture, found by name.

``elelem/model/archs/<name>.py`` (``-`` in the GGUF name becomes ``_``)
declares ``ARCH``, the architecture's table entry (:class:`Architecture`),
with the reading of its own hyperparameters; and, where it brings tensors
or hyperparameters no other architecture has, ``ROLES`` and ``HPARAMS``.
What several architectures share is in :mod:`elelem.model.archspec`; an
architecture module never imports another.
The graph is built natively by the builder ``ARCH.builder`` names
(``elelem/_native/graph/arch_<builder>.pxi``).

The roles and hyperparameters of every module, in the order
:func:`declaration_modules` gives, are what the native core's
``LayerWeights`` and ``HParams`` structs are generated from at build time
(:mod:`._codegen`, run by ``setup.py``).
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from functools import lru_cache
from types import ModuleType
from typing import Any, Mapping

from ..archspec.spec import Architecture, Experts, HParam, Role

__all__ = ["Architecture", "Experts", "HParam", "Role", "find", "names", "architectures", "declaration_modules",
           "layer_roles", "global_roles", "hparams", "reset"]

# Shared declarations first, in this order (a new shared block's module is added here);
# then each architecture's module by name.
_SHARED = tuple(f"elelem.model.archspec.{m}"
                for m in ("roles", "hparams", "experts", "delta_net", "encoder", "shortconv", "mla", "rank", "mamba2", "nextn",
                          "deepstack"))
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def _module_name(arch_name: str) -> str:
    return arch_name.replace("-", "_").replace(".", "_")


def names() -> list[str]:
    """The module names of the architectures (``gpt_oss`` for ``gpt-oss``), sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _import(module: str) -> ModuleType:
    return importlib.import_module(module if "." in module else f"{__name__}.{module}")


def find(arch_name: str) -> Architecture | None:
    """The architecture a file's ``general.architecture`` names, or None."""
    if not _NAME.fullmatch(arch_name) or _module_name(arch_name) not in names():
        return None
    arch = getattr(_import(_module_name(arch_name)), "ARCH", None)
    return arch if isinstance(arch, Architecture) and arch.name == arch_name else None


def architectures() -> dict[str, Architecture]:
    """Every architecture, by its GGUF name."""
    found = (getattr(_import(m), "ARCH", None) for m in names())
    return {a.name: a for a in found if isinstance(a, Architecture)}


def declaration_modules() -> list[ModuleType]:
    """The modules whose ROLES and HPARAMS make the native structs, in their order there."""
    return [_import(m) for m in _SHARED + tuple(names())]


def _collect(attr: str, kind: type[Role] | type[HParam]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for module in declaration_modules():
        decl: Any
        for decl in getattr(module, attr, ()):
            if not isinstance(decl, kind):
                raise TypeError(f"{module.__name__}.{attr} holds {decl!r}, not a {kind.__name__}")
            if decl.name in out:
                raise TypeError(f"{kind.__name__} {decl.name!r} is declared twice ({module.__name__})")
            out[decl.name] = decl
    return out


@lru_cache(maxsize=None)
def _declared() -> tuple[Mapping[str, Role], Mapping[str, Role], Mapping[str, HParam]]:
    return _collect("ROLES", Role), _collect("GLOBAL_ROLES", Role), _collect("HPARAMS", HParam)


def layer_roles() -> Mapping[str, Role]:
    """Every per-layer tensor role, in LayerWeights' field order."""
    return _declared()[0]


def global_roles() -> Mapping[str, Role]:
    """Every model-wide tensor role."""
    return _declared()[1]


def hparams() -> Mapping[str, HParam]:
    """Every hyperparameter, in HParams' field order (those the struct has)."""
    return _declared()[2]


def reset() -> None:
    """Forget the declarations read so far (after a module was added to ``__path__``: the tests)."""
    _declared.cache_clear()
