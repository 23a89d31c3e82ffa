"""Saved KV states: ``LLM.save_state``/``load_state``, and the settings that
key the persistent prompt cache (:mod:`elelem.engine.prompt_cache`).

A state's bytes are the cache's own: they are only valid for the same model
file, the same K/V types and layout, and the same CPU kernels (another
kernel rounds differently, so a prefix computed by it would not continue
exactly as one evaluated here).  :func:`cache_settings` names all of that;
a state made under other settings is refused with
:class:`~elelem.errors.StateError`.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..cpu import cpu_backend_info
from ..engine.prompt_cache import DEFAULT_MAX_BYTES, PromptCache
from ..engine.state_file import VERSION
from ..errors import StateError


@dataclass(frozen=True)
class LLMState:
    """The tokens one sequence holds and their K and V, from
    :meth:`elelem.LLM.save_state`.  Picklable; ``settings`` say what it fits."""

    tokens: tuple[int, ...]
    kv: bytes
    settings: tuple[tuple[str, Any], ...]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return len(self.kv)


def cache_settings(context, model_identity: str) -> dict[str, Any]:
    """What a state's bytes depend on, besides the tokens."""
    cache = context.cache
    backend = cpu_backend_info()
    features = ",".join(name for name, value in backend.get("features", ()) if value == "1")
    return {"format": VERSION, "model": model_identity, "type_k": cache.type_k, "type_v": cache.type_v,
            "v_transposed": bool(cache.v_trans), "bytes_per_cell": cache.bytes_per_cell,
            "recurrent_bytes": cache.state_bytes,   # a hybrid model's recurrent state, after the cells
            "cpu": f"{backend.get('variant')}:{features}"}


def model_file_identity(path: Path) -> str:
    """A cheap identity of a model file for in-memory states: its size and
    modification time (the prompt cache hashes the contents instead)."""
    info = os.stat(path)
    return f"{os.path.basename(path)}:{info.st_size}:{info.st_mtime_ns}"


def make_state(tokens, kv, settings: dict[str, Any]) -> LLMState:
    return LLMState(tuple(int(t) for t in tokens), bytes(memoryview(kv).cast("B")), tuple(sorted(settings.items())))


def check_state(state: LLMState, settings: dict[str, Any]) -> None:
    if not isinstance(state, LLMState):
        raise StateError(f"load_state takes an LLMState from save_state, got {type(state).__name__}")
    theirs = dict(state.settings)
    differ = sorted(k for k in settings.keys() | theirs.keys() if settings.get(k) != theirs.get(k))
    if differ:
        raise StateError("this state was saved under other settings: " + ", ".join(
            f"{k} {theirs.get(k)!r} (here {settings.get(k)!r})" for k in differ))
    size = len(state.tokens) * settings["bytes_per_cell"] + settings["recurrent_bytes"]
    if len(state.kv) != size:
        raise StateError(f"a state of {len(state.tokens)} tokens must hold {size:,} bytes, this one {len(state.kv):,}")


def open_prompt_cache(directory, model_path: Path, context, max_bytes: Optional[int]) -> PromptCache:
    """The prompt cache under ``directory`` for this model and context."""
    folder = Path(directory).expanduser()
    identity = "sha256:" + _model_sha256(folder, Path(model_path))
    return PromptCache(folder, cache_settings(context, identity),
                       max_bytes=DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
                       whole_states=context.cache.hybrid)


def _model_sha256(folder: Path, model_path: Path) -> str:
    """The model file's sha256, remembered in ``folder/models.json`` by path,
    size and modification time (hashing a large model takes seconds)."""
    real = os.path.realpath(model_path)
    info = os.stat(real)
    stamp = [info.st_size, info.st_mtime_ns]
    memo_path = folder / "models.json"
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    known = memo.get(real)
    if isinstance(known, dict) and known.get("stamp") == stamp and isinstance(known.get("sha256"), str):
        return known["sha256"]
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    memo[real] = {"stamp": stamp, "sha256": digest.hexdigest()}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = memo_path.with_name(f".models.json.{os.getpid()}")
    tmp.write_text(json.dumps(memo, indent=1))
    os.replace(tmp, memo_path)          # atomic: a concurrent writer's memo or ours, whole
    return memo[real]["sha256"]
