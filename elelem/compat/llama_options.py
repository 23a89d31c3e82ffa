"""llama-cpp-python's ``Llama(...)`` keywords, turned into ``elelem.LLM``'s.

Every keyword of llama-cpp-python 0.3.36's constructor is accepted.  Those
that map are mapped (:func:`llm_options`); one that has no effect here is
logged once per process (logger ``"elelem"``), when it is given a value
other than llama-cpp-python's default, and otherwise ignored: the code that
passes it still runs.  A keyword llama-cpp-python does not know either is
logged the same way (it takes ``**kwargs`` and ignores them too).
"""
from __future__ import annotations

import inspect
import logging
import operator
from typing import Any, Optional

from ..errors import InvalidArgumentError

log = logging.getLogger("elelem")

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "pick a random seed"

#: ggml's type ids (enum ggml_type), as llama-cpp-python's type_k / type_v take them.
GGML_TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 20: "iq4_nl",
                   30: "bf16"}
#: llama.cpp's enum llama_pooling_type; -1 (unspecified) follows the model.
POOLING_NAMES = {-1: None, 0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}

_CPU_ONLY = "elelem splits by layer, each layer's K/V on its device, and lets ggml's scheduler offload ops"
_FROM_GGUF = "elelem reads the model's settings from its GGUF metadata as they are"

#: keyword -> (llama-cpp-python's default, why it changes nothing here).
NO_EFFECT: dict[str, tuple[Any, str]] = {
    "split_mode": (1, _CPU_ONLY),
    "offload_kqv": (True, _CPU_ONLY),
    "op_offload": (None, _CPU_ONLY),
    "numa": (False, "elelem sets no NUMA policy"),
    "vocab_only": (False, "the weights are memory-mapped, so opening the whole model is already cheap"),
    "use_mlock": (False, "the weights are memory-mapped, never locked in RAM"),
    "kv_overrides": (None, _FROM_GGUF),
    "rope_scaling_type": (-1, _FROM_GGUF),
    "rope_freq_base": (0.0, _FROM_GGUF),
    "rope_freq_scale": (0.0, _FROM_GGUF),
    "yarn_ext_factor": (-1.0, _FROM_GGUF),
    "yarn_attn_factor": (1.0, _FROM_GGUF),
    "yarn_beta_fast": (32.0, _FROM_GGUF),
    "yarn_beta_slow": (1.0, _FROM_GGUF),
    "yarn_orig_ctx": (0, _FROM_GGUF),
    "attention_type": (-1, "attention follows the architecture"),
    "swa_full": (None, "the sliding-window layers keep the cache they need"),
    "n_ubatch": (512, "elelem computes n_batch tokens per step"),
    "no_perf": (False, "timings are on each TextStream (prefill_seconds, decode_seconds)"),
    "lora_base": (None, "the adapter applies to the model's own weights (llama-cpp-python 0.3.36 ignores it too)"),
    "chat_format": (None, "chats are rendered with the model's own chat template (ChatML when it has none)"),
    "chat_handler": (None, "chats are rendered with the model's own chat template (ChatML when it has none)"),
    "tokenizer": (None, "elelem tokenizes as llama.cpp does, from the GGUF vocabulary"),
    "draft_model": (None, "elelem verifies prompt-lookup guesses by default (speculative decoding, "
                          "elelem.LLM(speculative=...)); the same greedy text"),
}

_logged: set[str] = set()


def note_no_effect(name: str, value: Any, why: str) -> None:
    """Log, once per process and keyword, that ``name=value`` changes nothing here."""
    if name in _logged:
        return
    _logged.add(name)
    log.warning("Llama(%s=%r): no effect in elelem: %s", name, value, why)


def check_ignored(options: dict[str, Any]) -> None:
    """Log the keywords of ``options`` (the constructor's **kwargs) that are given and change nothing."""
    for name, value in options.items():
        if name in NO_EFFECT:
            default, why = NO_EFFECT[name]
            if not _same(value, default):
                note_no_effect(name, value, why)
        else:
            note_no_effect(name, value, "llama-cpp-python does not know this keyword either")


def _same(value: Any, default: Any) -> bool:
    if default is None or isinstance(default, bool):
        return value is default
    try:
        return bool(value == default)
    except Exception:  # an object whose == does not give a truth value: it is not the default
        return False


def kv_type_name(option: str, value: Any) -> Optional[str]:
    """type_k / type_v as elelem names them: llama-cpp-python passes ggml type ids (``GGML_TYPE_Q8_0`` is 8)."""
    if value is None or isinstance(value, str):
        return value.lower() if isinstance(value, str) else None
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise InvalidArgumentError(f"{option} must be a ggml type id or name, got {value!r}")
    ggml_type = operator.index(value)
    if ggml_type not in GGML_TYPE_NAMES:
        raise InvalidArgumentError(f"{option}={ggml_type} is not a ggml type id elelem knows "
                                   f"({', '.join(f'{k}: {v}' for k, v in GGML_TYPE_NAMES.items())})")
    return GGML_TYPE_NAMES[ggml_type]


def embedding_options(llm_class, embedding: bool, pooling_type: Any) -> dict[str, Any]:
    """The embedding keywords this elelem's LLM takes (embeddings are being added to it)."""
    accepted = inspect.signature(llm_class).parameters
    options: dict[str, Any] = {}
    if "embedding" in accepted:
        options["embedding"] = bool(embedding)
    elif embedding:
        note_no_effect("embedding", embedding, "this elelem has no embeddings yet")
    if pooling_type not in POOLING_NAMES:
        raise InvalidArgumentError(f"pooling_type must be one of {sorted(POOLING_NAMES)} "
                                   f"(llama.cpp's LLAMA_POOLING_TYPE_*), got {pooling_type!r}")
    if POOLING_NAMES[pooling_type] is not None:
        if "pooling" in accepted:
            options["pooling"] = POOLING_NAMES[pooling_type]
        else:
            note_no_effect("pooling_type", pooling_type, "this elelem has no embeddings yet")
    return options
