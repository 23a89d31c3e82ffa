"""``LLM``'s options, in six groups: each option is a field of one frozen
dataclass, documented and checked there.

    >>> LLM("smollm2-135m", context=ContextOptions(n_ctx=8192, kv_type="q8_0"))

is ``LLM("smollm2-135m", n_ctx=8192, kv_type="q8_0")``: ``LLM`` takes every
field as a keyword of its own too, and builds the groups from them.  A group
and a keyword of one of its fields (with a value other than the default) in
the same call raise ``TypeError``: one of the two would be ignored.

The command line, the server and ``elelem.compat.Llama`` build these same
objects (:func:`build_options`, :func:`override_options`).

Nothing here loads the native core, so the server and the command line can
build and check options before a model opens.
"""
from __future__ import annotations

import operator
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from ..engine.state_cache import DEFAULT_STATE_CACHE_MB
from ..errors import InvalidArgumentError
from .lora import normalize_adapters

DEFAULT_N_CTX = 4096
DEFAULT_N_SEQ_MAX = 16
MAX_N_CTX = 2**31 - 1  # positions are int32 in ggml
#: elelem._core.DEFAULT_RPC_TIMEOUT, kept here so that options build without the
#: native core (tests/test_api_options.py checks that the two agree).
DEFAULT_RPC_TIMEOUT = 120.0

#: llama.cpp rounds its context up to a multiple of this many cells (llama_context:
#: GGML_PAD(n_ctx, 256)), and attends over the cells in use rounded the same way.
KV_CELL_PAD = 256


def padded_cells(n_ctx: int) -> int:
    """The cells of a cache for ``n_ctx`` positions, as llama.cpp sizes it.  Not
    memory for its own sake: attention sums over min(cells, used rounded up to
    256), so a cache of 223 cells sums over 223 where llama.cpp's sums over 256,
    and at a near-tie the tokens differ (measured: a 160-token greedy answer
    ending after 111 tokens instead of llama.cpp's 153).  Sequences stay
    limited to ``n_ctx`` positions."""
    return -(-n_ctx // KV_CELL_PAD) * KV_CELL_PAD


def _is_integer(value: Any) -> bool:
    return not isinstance(value, bool) and hasattr(type(value), "__index__")


@dataclass(frozen=True)
class ContextOptions:
    """The context: how many positions, sequences and cells, and how they are computed.

    :param n_ctx: the most positions one sequence may hold (default: the
        smaller of the model's trained context and 4096).
    :param n_batch: the most tokens one step evaluates (512).
    :param n_threads: the CPU threads of a step (default: the CPUs this
        process may run on).
    :param kv_size: the cells of the KV cache that all sequences share
        (default: ``n_ctx`` rounded up to a multiple of 256, as llama.cpp
        sizes it).
    :param n_seq_max: how many sequences -- sessions, and calls running at
        once -- the cache holds (default 16, at most 64).
    :param kv_type: the type of the cached keys and values: ``"f16"`` (as
        llama.cpp; ``"f32"`` for an encoder, whose K and V llama.cpp never
        rounds since it keeps no cache for them), ``"f32"``, or the quantized
        ``"q8_0"`` (half of f16's memory) and ``"q4_0"`` (under a third).
    :param type_k: the type of the cached keys, apart from the values (llama.cpp's
        option of that name; default ``kv_type``).
    :param type_v: the type of the cached values (default ``kv_type``).  A
        quantized V needs flash attention, which is then turned on.
    :param flash_attn: ggml's fused attention kernel: ``"auto"`` (default, as
        llama.cpp's default) turns it on where every device that holds a
        layer's K/V runs it (the CPU always does), True asks for it, False
        keeps the mul_mat + softmax path (llama-cpp-python's default, and so
        its exact tokens).
    """

    n_ctx: Optional[int] = None
    n_batch: int = 512
    n_threads: Optional[int] = None
    kv_size: Optional[int] = None
    n_seq_max: int = DEFAULT_N_SEQ_MAX
    kv_type: Optional[str] = None
    type_k: Optional[str] = None
    type_v: Optional[str] = None
    flash_attn: Union[bool, str] = "auto"

    def __post_init__(self) -> None:
        if self.n_ctx is not None:
            if not _is_integer(self.n_ctx):
                raise InvalidArgumentError(f"n_ctx must be an integer, got {self.n_ctx!r}")
            n = operator.index(self.n_ctx)
            if not 1 <= n <= MAX_N_CTX:
                raise InvalidArgumentError(f"n_ctx must be between 1 and {MAX_N_CTX:,}, got {n:,}")
            object.__setattr__(self, "n_ctx", n)
        if self.flash_attn not in (True, False, "auto"):
            raise InvalidArgumentError(f"flash_attn must be True, False or 'auto', got {self.flash_attn!r}")


@dataclass(frozen=True)
class WeightOptions:
    """How the weights are held in memory.

    :param use_mmap: True (default) maps the weights from the file; False reads
        them into memory instead (slower to open, but the model no longer
        depends on the file staying unchanged on disk: a mapped file that is
        truncated under it ends the process with SIGBUS, as in llama.cpp).
    :param repack: True (default) lets the CPU backend copy the matmul weights
        it has faster kernels for into its own layouts when the model opens,
        as llama.cpp does: its AVX2/AVX-512 repacked GEMMs (Q4_0, IQ4_NL, ...)
        and, on CPUs with AMX, its AMX tiles.  It costs the memory of the
        repacked copies; False uses every weight in place from the file.
    :param amx: AMX per weight type: None (default) follows
        ``elelem.cpu.AMX_SLOWER_TYPES``, False never uses AMX, True uses it
        for every type it takes, and a set of ggml type names (``{"q4_1"}``)
        uses it for those types only (an unknown name is a ``ValueError``).
    :param widen: gives Q5_0 weights (most of a Q4_K_M file whose rows are not
        a multiple of 256, as Qwen2.5-0.5B's) a Q8_0 copy holding the same
        values, for the steps of two or more tokens -- prompts, speculative
        verification, batched streams -- where ggml's tinyBLAS then skips
        unpacking 5-bit values: about 1.1-1.4x faster such steps, with
        llama.cpp's arithmetic bit for bit.  One-token steps keep the smaller
        Q5_0 weight, so the copies cost their own memory (34/22 of the Q5_0
        weights: 268 MB for Qwen2.5-0.5B's 173 MB), made when they pay rather
        than at load.  None (default) widens on AVX2 CPU modules when
        ``repack`` is on and the copies take at most
        ``elelem.cpu.WIDEN_AUTO_LIMIT``, once prompts have evaluated
        ``elelem.cpu.WIDEN_AFTER_PROMPT_TOKENS`` tokens; True lifts that limit
        and makes them at the first prompt; False never widens.
        ``elelem info --system`` shows what this CPU has.
    :param lora: LoRA adapters (GGUF files as llama.cpp's
        ``convert_lora_to_gguf.py`` writes them) to load with the model: each a
        path (at scale 1) or ``(path, scale)``, as llama.cpp's ``--lora`` and
        ``--lora-scaled``; at most 8.  Their scales change at run time
        (:mod:`elelem.api.lora`).  An adapter for another model raises
        :class:`~elelem.errors.AdapterError`.
    """

    use_mmap: bool = True
    repack: bool = True
    amx: Union[bool, Iterable[str], None] = None
    widen: Optional[bool] = None
    lora: Any = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora", normalize_adapters(self.lora))


@dataclass(frozen=True)
class PlacementOptions:
    """Where the layers run: the CPU, local GPUs, or ggml RPC servers.

    :param n_gpu_layers: how many layers leave the CPU (default: every layer
        and the output head; -1 says the same).  They go to the best local
        GPU -- a CUDA or Metal device before a Vulkan one, the same card
        counted once -- last-first, as in llama.cpp, each with its K/V; the token
        embeddings stay on the CPU, and the output head goes to the GPU when
        every layer does.  Layers that do not fit the free memory (after the
        K/V, the output and the compute buffers; ``ELELEM_GPU_MEMORY_LIMIT``
        caps what counts as free) stay on the CPU, with a warning that says
        how many.  With no GPU the model runs on the CPU and the log says
        why; but an explicit ``n_gpu_layers`` (other than 0), ``main_gpu`` or
        ``tensor_split`` with no GPU to be had raises ``DeviceError``.
        ``LLM.offload`` says what was done (:mod:`elelem.api.offload`).
    :param main_gpu: the GPU number (``elelem info --devices``) that takes the
        layers (default 0, the best one).
    :param tensor_split: one weight per GPU: the layers are split over every
        GPU in those proportions (``[3, 1]``).  With ``rpc_servers``, one
        weight per server device.
    :param rpc_servers: ``["host:port", ...]`` or ``"host:port,host:port"``:
        places layers on ggml RPC servers (``elelem rpc-server``): each
        server's devices get a contiguous range of layers, with those layers'
        weights and K/V, and the local CPU keeps the first layers, the
        embeddings and the output (:mod:`elelem.api.devices`); local GPUs are
        then not used.  The split is even unless ``tensor_split`` or
        ``n_gpu_layers`` (-1: all) say otherwise.  A server that cannot be
        reached raises ``RPCError`` when the model opens.
    :param rpc_timeout: seconds (default 120) after which a server that died or
        stopped answering during a call makes that call raise ``RPCError``;
        the LLM is unusable after it.
    """

    n_gpu_layers: Optional[int] = None
    main_gpu: int = 0
    tensor_split: Optional[Sequence[float]] = None
    rpc_servers: Union[str, Sequence[str], None] = None
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT

    def __post_init__(self) -> None:
        if _names_servers(self.rpc_servers) and not (
                isinstance(self.rpc_timeout, (int, float)) and self.rpc_timeout > 0):
            raise InvalidArgumentError(f"rpc_timeout must be a positive number of seconds, got {self.rpc_timeout!r}")


def _names_servers(value: Any) -> bool:
    """Whether ``rpc_servers`` names a server (its form is checked where it is parsed)."""
    if value is None:
        return False
    try:
        items = value.split(",") if isinstance(value, str) else list(value)
    except TypeError:
        return False
    return any(not isinstance(item, str) or item.strip() for item in items)


@dataclass(frozen=True)
class SpeculativeOptions:
    """Speculative decoding: tokens guessed ahead and verified in the step of the next one.

    :param speculative: True (default) verifies tokens guessed from the prompt
        and the text so far (prompt lookup) in the same step as the next one:
        several tokens per step where the answer copies its context (code
        being rewritten), and the same text (see
        :mod:`elelem.engine.speculative`); the text calls take
        ``speculative=`` too, for one call.
    :param draft_model: a path, a packaged name or an open ``LLM``: a smaller
        model with the same vocabulary (else ``VocabularyMismatchError``)
        that guesses the tokens instead of prompt lookup
        (:mod:`elelem.engine.draft_model`); or a drafter file: an MTP head
        alone (``mtp-*.gguf``), an EAGLE-3 head, a DFlash drafter
        (:mod:`elelem.engine.dflash`) or a Gemma 4 drafter
        (``gemma4-assistant``, :mod:`elelem.engine.assistant`), drafting as
        an MTP head does.  ``"auto"``: the model's own companion drafter --
        for a model from the Hugging Face Hub, the ``mtp-*.gguf`` its
        repository ships, else its ``dflash-*.gguf``, else its
        ``eagle3-*.gguf`` (pulled beside it, as llama.cpp's ``-hf`` picks
        them); for a local file, one in its folder -- and
        ``ModelNotFoundError`` where there is none
        (:mod:`elelem.api.companions`).
    :param mtp: True (default) also drafts with the multi-token-prediction
        head the model's file carries (Qwen3.5/3.6 ``nextn`` layers), per
        request where the draft planner measures that it pays better than
        prompt lookup (:mod:`elelem.engine.mtp`); the text stays the
        model's own.  Not with a ``draft_model``.
    """

    speculative: bool = True
    draft_model: Any = None
    mtp: bool = True


@dataclass(frozen=True)
class CacheOptions:
    """What is kept so that a later prompt evaluates only its new tokens.

    :param prompt_cache: a folder that keeps the KV state of finished
        sequences on disk: a prompt that shares a long prefix with one stored
        -- in this process or in a later one -- loads that prefix instead of
        evaluating it (:mod:`elelem.engine.prompt_cache`).
    :param prompt_cache_bytes: the most that folder holds (default 2 GiB),
        least recently used evicted first.
    :param state_cache_mb: the MiB (None: 2048) a hybrid model (Gated
        DeltaNet, Mamba: a recurrent state that cannot be cut back) keeps in
        memory so that a conversation's next turn evaluates only its new
        tokens: the recurrent state where each prompt ended, and the whole
        state of a conversation whose sequence another one took, least
        recently used evicted first (:mod:`elelem.engine.state_cache`); 0
        keeps none.
    """

    prompt_cache: Union[str, os.PathLike, None] = None
    prompt_cache_bytes: Optional[int] = None
    state_cache_mb: Optional[int] = None

    def __post_init__(self) -> None:
        value = self.state_cache_mb
        if value is not None and (not _is_integer(value) or operator.index(value) < 0):
            raise InvalidArgumentError(f"state_cache_mb must be a non-negative integer (MiB), got {value!r}")

    @property
    def state_cache_bytes(self) -> int:
        mb = DEFAULT_STATE_CACHE_MB if self.state_cache_mb is None else operator.index(self.state_cache_mb)
        return mb << 20


@dataclass(frozen=True)
class VisionOptions:
    """Images in: a projector file and where images may come from.

    :param mmproj: the model's projector file (an ``mmproj-*.gguf``, a
        ``clip`` GGUF), which encodes images into embeddings the text model
        reads as tokens (:mod:`elelem.vision`).  None (default): a model from
        the Hugging Face Hub comes with its repository's projector, as with
        llama.cpp's ``-hf`` (:mod:`elelem.api.companions`), and a local file
        reads text only; False: text only, no projector fetched.
    :param image_dir: local image paths (and ``file://`` URLs) are read only
        under this directory; None allows none.
    :param image_urls: fetch ``http(s)`` image URLs (default False: images
        come as ``data:`` URLs, or as paths under ``image_dir``).
    :param image_max_bytes: the largest encoded image taken (default 20 MiB).
    :param image_max_pixels: the most pixels a decoded image may have
        (default 50 million).
    """

    mmproj: Union[str, os.PathLike, None, bool] = None
    image_dir: Union[str, os.PathLike, None] = None
    image_urls: bool = False
    image_max_bytes: Optional[int] = None
    image_max_pixels: Optional[int] = None

    def __post_init__(self) -> None:
        if self.mmproj is True or not isinstance(self.mmproj, (str, os.PathLike, type(None), bool)):
            raise InvalidArgumentError(f"mmproj must be a path, None (a Hub model's own projector) or False "
                                       f"(none), got {self.mmproj!r}")
        for name in ("image_max_bytes", "image_max_pixels"):
            value = getattr(self, name)
            if value is not None and (not _is_integer(value) or operator.index(value) <= 0):
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")


#: LLM's keyword for each group.
GROUPS: dict[str, type] = {"context": ContextOptions, "weights": WeightOptions, "placement": PlacementOptions,
                           "speculation": SpeculativeOptions, "caches": CacheOptions, "vision": VisionOptions}
#: Each option's group, by the option's name.
FIELD_GROUP: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in fields(cls)}


def build_options(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """``LLM``'s keywords with every option in its group: each group as given, or
    built from its fields among ``keywords``; keywords of no group pass as they
    are.  A group given with one of its fields set otherwise than by default
    raises ``TypeError``."""
    out = {name: value for name, value in keywords.items() if name not in GROUPS and name not in FIELD_GROUP}
    for group, cls in GROUPS.items():
        defaults = {f.name: f.default for f in fields(cls)}
        given = {name: keywords[name] for name in defaults if name in keywords}
        value = keywords.get(group)
        if value is None:
            out[group] = cls(**given)
            continue
        if not isinstance(value, cls):
            raise TypeError(f"{group} must be a {cls.__name__}, got {type(value).__name__}")
        clashing = [name for name in given if not _is_default(given[name], defaults[name])]
        if clashing:
            raise TypeError(f"{', '.join(clashing)} given both as a keyword and in {group}={cls.__name__}(...): "
                            f"give each option once")
        out[group] = value
    return out


def override_options(options: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (as :func:`build_options` returns them) with ``changes`` applied:
    a group replaces that group, an option replaces that field of its group,
    and any other keyword is set as it is."""
    out = dict(options)
    for name, value in changes.items():
        if name in FIELD_GROUP:
            group = FIELD_GROUP[name]
            out[group] = replace(out.get(group) or GROUPS[group](), **{name: value})
        else:
            out[name] = value
    return out


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if default is None or isinstance(default, bool) or type(value) is not type(default):
        return False
    try:
        return bool(value == default)
    except Exception:  # a value whose == gives no truth value is not the default
        return False
