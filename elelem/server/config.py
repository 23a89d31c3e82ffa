"""The server's settings, with the bounds that keep one client from exhausting it."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ..api.options import FIELD_GROUP, build_options, override_options, padded_cells
from ..errors import InvalidArgumentError
from ..model.hf_reference import DRAFTERS, PROJECTOR

_SPLIT = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")
_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


#: What a model's preset may set, for that model only (``ServerConfig.presets``).
PRESET_FIELDS = ("n_ctx", "parallel", "n_threads", "n_gpu_layers", "main_gpu", "tensor_split", "flash_attn",
                 "speculative", "draft_model", "llm_options")


@dataclass
class ServerConfig:
    """What ``elelem serve`` was asked for.

    ``models`` are names or paths as given to ``LLM`` (the first is the
    default, loaded at startup unless ``preload`` is false); ``models_dir``
    adds every GGUF file below that folder (:func:`find_models`), after them.
    ``max_loaded`` models, and ``max_memory`` bytes of them (the files'
    weights and their KV caches), are loaded at most (None: no bound): past
    either, the least recently used idle model is unloaded for the next;
    ``load_timeout`` bounds how long a request waits for its model to load
    or for room to load it.  ``presets`` give a model (by id or by source)
    settings of its own, of :data:`PRESET_FIELDS`.  ``parallel`` is how many requests run at once
    per model (each on a session of its own); ``keep_alive`` is how long a
    model stays loaded without requests (None: forever); ``n_ctx`` is the
    context of each request (None: the model's, at most 4096).

    ``n_threads``, ``speculative``, ``draft_model``, ``flash_attn``,
    ``n_gpu_layers``, ``main_gpu``, ``tensor_split``, ``prompt_cache``,
    ``prompt_cache_bytes`` and ``state_cache_mb`` are the models' ``LLM``
    options of those names (:mod:`elelem.api.options`), and ``llm_options``
    more of them, as keywords; :meth:`model_options` builds the option
    groups every served model opens with.  Their defaults are ``LLM``'s but
    for ``flash_attn``, on (llama.cpp's server turns it on too): the requests
    share one KV cache, and without ggml's fused kernel every token attends
    over every request's cells, masked; the fused kernel skips them.  With 8
    requests of 100 cells each, a step of their 8 tokens took 76 ms without
    it and 45 with it (Qwen2.5-Coder-0.5B, 2 threads).  The text is then
    llama.cpp's with flash attention.  The offload shows in the log,
    ``/health`` and ``/metrics``.
    """

    models: list[str] = field(default_factory=list)
    models_dir: Optional[str] = None
    max_loaded: Optional[int] = None
    max_memory: Optional[int] = None    # bytes
    load_timeout: float = 120.0
    preload: Optional[bool] = None      # None: when models were given (not only a models_dir)
    api_key: Optional[str] = None
    parallel: int = 8
    n_ctx: Optional[int] = None         # per request; None: the model's, at most 4096
    n_threads: Optional[int] = None
    keep_alive: Optional[float] = 300.0
    speculative: bool = True
    flash_attn: bool = True
    n_gpu_layers: Optional[int] = None
    main_gpu: int = 0
    tensor_split: Optional[list] = None
    draft_model: Optional[str] = None   # a path or known name, for every model served
    prompt_cache: Optional[str] = None  # a folder, shared by every model served
    prompt_cache_bytes: Optional[int] = None
    state_cache_mb: Optional[int] = None
    max_body_bytes: int = 4 * 2**20
    max_messages: int = 512
    max_tokens_limit: Optional[int] = None   # None: n_ctx bounds it
    max_queue: Optional[int] = None     # requests that may wait for a slot; None: 4 x parallel
    queue_timeout: float = 30.0         # how long one may wait
    retry_after_seconds: int = 1
    max_requests: Optional[int] = None  # HTTP requests held at once (more get a 503); None: from the above
    llm_options: dict = field(default_factory=dict)  # more LLM() keywords (rpc_servers, tool_call_format, ...)
    presets: dict = field(default_factory=dict)  # model id or source -> {PRESET_FIELDS name: value}

    def __post_init__(self) -> None:
        if self.preload is None:
            self.preload = bool(self.models)
        if self.models_dir is not None:
            self.models = [*self.models, *(m for m in find_models(self.models_dir) if m not in self.models)]
        if not self.models:
            raise InvalidArgumentError("the server needs at least one model" + (
                f": {self.models_dir} holds no .gguf file" if self.models_dir is not None else ""))
        for name, preset in self.presets.items():
            unknown = sorted(set(preset) - set(PRESET_FIELDS))
            if unknown:
                raise InvalidArgumentError(f"the preset of {name!r} sets {', '.join(unknown)}; a preset sets "
                                           f"{', '.join(PRESET_FIELDS)}")
        if self.max_loaded is not None and self.max_loaded < 1:
            raise InvalidArgumentError(f"max_loaded must be at least 1, got {self.max_loaded}")
        if not 1 <= self.parallel <= 63:  # one sequence more is the LLM's default session
            raise InvalidArgumentError(f"parallel must be between 1 and 63, got {self.parallel}")
        if self.max_queue is None:
            self.max_queue = 4 * self.parallel
        if self.max_requests is None:
            # Running and queued generations, and room for cheap requests (/health, /v1/models).
            self.max_requests = max(64, 4 * self.parallel * len(self.models) + self.max_queue * len(self.models))

    def for_model(self, *names: str) -> "ServerConfig":
        """The settings of the model of these names (its id, its source): these,
        with its presets' fields over them (the preset of an earlier name over a
        later one's); a preset's ``llm_options`` join the server's."""
        found = [self.presets[n] for n in reversed(names) if self.presets.get(n)]
        if not found:
            return self
        preset: dict[str, Any] = {}
        llm_options = dict(self.llm_options)
        for each in found:
            preset.update(each)
            llm_options.update(each.get("llm_options") or {})
        preset["llm_options"] = llm_options
        # A preset of its own parallel gets the queue that goes with it (4 x parallel), as a server would.
        queue = {"max_queue": None} if "parallel" in preset else {}
        return replace(self, models=list(self.models), models_dir=None, presets={}, **{**queue, **preset})

    def model_options(self, n_ctx: int) -> dict[str, Any]:
        """The ``LLM`` keywords a served model opens with: its option groups, and
        ``llm_options``' keywords of no group.  The cache holds ``parallel``
        contexts of ``n_ctx`` positions, rounded up as llama.cpp rounds them, and
        a sequence more than ``parallel`` for the LLM's own default session."""
        given = {name: getattr(self, name) for name in FIELD_GROUP if hasattr(self, name)}
        given.update(n_ctx=n_ctx, n_seq_max=self.parallel + 1, kv_size=padded_cells(n_ctx * self.parallel))
        return override_options(build_options(given), self.llm_options)


def read_presets(path: str) -> dict[str, dict[str, Any]]:
    """``--models-preset``: an INI file of a section per model (its id, or its path), whose
    keys are ``serve``'s options without the dashes: ``ctx``, ``parallel``, ``threads``,
    ``n-gpu-layers``, ``main-gpu``, ``flash-attn`` (on/off), ``speculative`` (true/false),
    ``draft-model``."""
    import configparser
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as file:
            parser.read_file(file)
    except (OSError, configparser.Error) as error:
        raise InvalidArgumentError(f"--models-preset {path}: {error}") from None
    presets = {}
    for section in parser.sections():
        preset: dict[str, Any] = {}
        for key, text in parser.items(section):
            if key not in _PRESET_KEYS:
                raise InvalidArgumentError(f"--models-preset {path}: [{section}] {key}: not a preset key "
                                           f"({', '.join(_PRESET_KEYS)})")
            field_name, parse = _PRESET_KEYS[key]
            try:
                preset[field_name] = parse(text)
            except ValueError:
                raise InvalidArgumentError(f"--models-preset {path}: [{section}] {key} = {text!r} is not a "
                                           f"valid value") from None
        presets[section] = preset
    return presets


def _switch(text: str) -> bool:
    value = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False,
             "0": False}.get(text.strip().lower())
    if value is None:
        raise ValueError(text)
    return value


_PRESET_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {"ctx": ("n_ctx", int), "parallel": ("parallel", int), "threads": ("n_threads", int),
                "n-gpu-layers": ("n_gpu_layers", int), "main-gpu": ("main_gpu", int),
                "flash-attn": ("flash_attn", _switch), "speculative": ("speculative", _switch),
                "draft-model": ("draft_model", str)}


_COMPANIONS = (PROJECTOR, *DRAFTERS)


def find_models(directory: str) -> list[str]:
    """The models below ``directory``: every ``.gguf`` file, in path order, but for the
    later parts of split models (``-00002-of-00003.gguf``: the first part opens them
    all), vision projectors (``mmproj``) and drafters (``mtp-``, ``eagle3-``...), which
    are no models of their own but a model's companions, named as llama.cpp's ``-hf`` finds them."""
    root = Path(directory)
    if not root.is_dir():
        raise InvalidArgumentError(f"models_dir: {directory} is not a folder")
    found = []
    for path in sorted(root.rglob("*.gguf")):
        split = _SPLIT.search(path.name)
        if (split and int(split.group(1)) != 1) or path.name.lower().startswith(_COMPANIONS):
            continue
        found.append(str(path))
    return found


def parse_duration(text: str) -> Optional[float]:
    """Seconds of ``"5m"``, ``"30s"``, ``"1h"``, ``"250ms"`` or a plain number;
    a negative value means forever (None)."""
    match = _DURATION.match(text)
    if match is None:
        raise InvalidArgumentError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h; -1 for forever)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return None if seconds < 0 else seconds
