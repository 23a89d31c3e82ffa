"""Drop-in shims for code written against other libraries.

``elelem.compat.Llama`` is llama-cpp-python's ``Llama`` over :class:`elelem.LLM`
(:mod:`.llama`).  Loaded on first use, like ``elelem.LLM``, so importing this
package does not load the native core.
"""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("Llama", "LlamaState"):
        from . import llama
        return getattr(llama, name)
    raise AttributeError(f"module 'elelem.compat' has no attribute {name!r}")


__all__ = ["Llama", "LlamaState"]
