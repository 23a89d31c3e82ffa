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

import inspect
import logging
import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Concatenate, Iterable, Optional, ParamSpec, Sequence, TypeVar, Union

from .._core import (flash_attn_supported, new_context, open_adapter, open_model,  # names, not the package
                     place_layers, unsupported_weights)
from ..cpu import amx_types, widen_after, widen_q5_0
from ..engine.engine import Engine
from ..engine.assistant import AssistantHead
from ..engine.mtp import MTPHead
from ..errors import ClosedError, ContextLimitError, UnsupportedArchitectureError
from ..gguf.reader import GGUFFile, read_gguf
from ..model.adapters import AdapterInfo, read_adapter
from ..model.architectures import ModelSpec, model_spec
from ..model.hub import ProgressFn, resolve_model
from .assets import ModelAssets
from .devices import check_memory, connect_servers, kv_layer_bytes, parse_endpoints, plan_layers
from .offload import Offload, keep_supported, plan_offload
from .companions import with_companions
from .draft import open_draft, open_mtp
from .embeddings import embed, embedding_response, model_pooling
from .rerank import rerank
from .images import ImageInput
from .infill import DEFAULT_N_BATCH, Piece, infill_ids
from .lora import ScalesSpec, describe, resolve_scales
from .options import (DEFAULT_N_CTX, DEFAULT_N_SEQ_MAX, DEFAULT_RPC_TIMEOUT, FIELD_GROUP, GROUPS,  # noqa: F401
                      KV_CELL_PAD, MAX_N_CTX, CacheOptions, ContextOptions, PlacementOptions, SpeculativeOptions,
                      VisionOptions, WeightOptions, build_options, padded_cells)
from .session import Session
from .states import open_prompt_cache
from .tools.parsers import format_named

log = logging.getLogger("elelem")

P = ParamSpec("P")
R = TypeVar("R")


def default_n_threads() -> int:
    """The CPUs this process may run on (ggml's matmuls want one thread per core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _as_session(like: Callable[Concatenate[Any, P], R]
                ) -> Callable[[Callable[..., Any]], Callable[Concatenate[Any, P], R]]:
    """An ``LLM`` method that forwards to ``like``, a ``Session`` method: it takes
    that method's signature (for ``help()``, IDEs and type checkers) and adds
    its docstring after its own, so the parameters are documented once."""
    def decorate(method: Callable[..., Any]) -> Callable[Concatenate[Any, P], R]:
        method.__signature__ = inspect.signature(like)  # type: ignore[attr-defined]
        method.__doc__ = "\n\n".join(inspect.cleandoc(doc) for doc in (method.__doc__, like.__doc__) if doc)
        return method
    return decorate


class LLM:
    """A GGUF model, opened for generation.

    ``model_path`` is a path to a ``.gguf`` file or a packaged model name
    (see ``elelem models``; None is the default model), pulled on first use
    (``progress`` is then called as ``progress(stage, done, total)``).

    The options come in six groups (:mod:`elelem.api.options`), where each
    is documented: ``context`` (:class:`~elelem.api.options.ContextOptions`:
    ``n_ctx``, ``n_batch``, ``n_threads``, ``kv_size``, ``n_seq_max``,
    ``kv_type``, ``type_k``, ``type_v``, ``flash_attn``), ``weights``
    (:class:`~elelem.api.options.WeightOptions`: ``use_mmap``, ``repack``,
    ``amx``, ``widen``, ``lora``), ``placement``
    (:class:`~elelem.api.options.PlacementOptions`: ``n_gpu_layers``,
    ``main_gpu``, ``tensor_split``, ``rpc_servers``, ``rpc_timeout``),
    ``speculation`` (:class:`~elelem.api.options.SpeculativeOptions`:
    ``speculative``, ``draft_model``), ``caches``
    (:class:`~elelem.api.options.CacheOptions`: ``prompt_cache``,
    ``prompt_cache_bytes``, ``state_cache_mb``) and ``vision``
    (:class:`~elelem.api.options.VisionOptions`: ``mmproj``, the projector
    file that lets ``chat`` take images -- a Hub model's repository's by
    default, :mod:`elelem.api.companions` -- ``image_dir``, ``image_urls``,
    ``image_max_bytes``, ``image_max_pixels``).  Each option is a keyword
    of its own too: ``LLM(path, n_ctx=8192)`` is
    ``LLM(path, context=ContextOptions(n_ctx=8192))``.  A group and one of
    its options given another value than its default in the same call raise
    ``TypeError``.

    ``embedding=True`` is llama-cpp-python's switch (embeddings always work
    here); ``pooling`` overrides the model's pooling for them
    (:mod:`elelem.api.embeddings`).  ``tool_call_format`` names the format
    the model writes tool calls in (``"hermes"``, ``"qwen3_coder"``,
    ``"harmony"``, ``"mistral"``, ``"llama3"``, ``"glm"``; see
    :mod:`elelem.api.tools.parsers`) for a chat template that does not show
    it; by default it is read from the template.

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
                 progress: Optional[ProgressFn] = None, speculative: bool = True, draft_model=None, mtp: bool = True,
                 prompt_cache: str | os.PathLike | None = None, prompt_cache_bytes: Optional[int] = None,
                 embedding: bool = False, pooling: Optional[str] = None, rpc_servers=None,
                 n_gpu_layers: Optional[int] = None, main_gpu: int = 0, tensor_split=None,
                 rpc_timeout: float = DEFAULT_RPC_TIMEOUT, widen: Optional[bool] = None, lora: Any = (),
                 tool_call_format: Optional[str] = None, state_cache_mb: Optional[int] = None,
                 context: Optional[ContextOptions] = None, weights: Optional[WeightOptions] = None,
                 placement: Optional[PlacementOptions] = None, speculation: Optional[SpeculativeOptions] = None,
                 caches: Optional[CacheOptions] = None, mmproj: str | os.PathLike | None | bool = None,
                 image_dir: str | os.PathLike | None = None, image_urls: bool = False,
                 image_max_bytes: Optional[int] = None, image_max_pixels: Optional[int] = None,
                 vision: Optional[VisionOptions] = None):
        # The keywords above are the groups' fields (tests/test_api_options.py checks that
        # they agree, defaults included); every option is read from its group below.
        options = build_options({name: value for name, value in locals().items()
                                 if name in FIELD_GROUP or name in GROUPS})
        t0 = time.perf_counter()
        context, weights, placement, speculation, caches, vision = (options[group] for group in GROUPS)
        if tool_call_format is not None:
            format_named(tool_call_format)  # an unknown name fails before the model loads
        self._engine: Optional[Engine] = None
        self._model: Any = None  # the native Model (no stub: the core is compiled)
        self._session: Optional[Session] = None
        self._lora: list[AdapterInfo] = []
        self.images: Optional[ImageInput] = None
        self.path = resolve_model(model_path, progress=progress)
        self.gguf: GGUFFile = read_gguf(self.path)
        self.spec: ModelSpec = model_spec(self.gguf)
        # an EAGLE-3 head or a DFlash drafter: it drafts for a target, from that target's states
        if self.spec.hparams.get("mtp_head") or self.spec.arch.name == "dflash":
            raise UnsupportedArchitectureError(f"{self.path} is a {self.spec.arch.name} drafter head: give it as "
                                               "the draft_model of the target it drafts for")
        vision, speculation = with_companions(model_path, self.path, vision, speculation, arch=self.spec.arch.name,
                                              progress=progress)
        n_ctx_train = self.spec.hparams["n_ctx_train"]
        n_ctx = min(n_ctx_train, DEFAULT_N_CTX) if context.n_ctx is None else context.n_ctx
        if self.spec.global_tensors.get("pos_embd") and n_ctx > n_ctx_train:
            raise ContextLimitError(f"n_ctx {n_ctx} is past this model's {n_ctx_train} learned positions")
        n_batch, kv_type = context.n_batch, context.kv_type
        if self.spec.arch.encoder:
            # An encoder evaluates each text in one step (its tokens see each other), and
            # llama.cpp keeps its K and V in float32.
            n_batch = max(n_batch, n_ctx) if isinstance(n_batch, int) else n_batch
            kv_type = kv_type or "f32"
        type_k, type_v = context.type_k or kv_type or "f16", context.type_v or kv_type or "f16"
        cells = padded_cells(n_ctx) if context.kv_size is None else context.kv_size
        self.offload: Offload = self._plan_placement(placement, cells, type_k, type_v, n_batch,
                                                     context.flash_attn is True)
        self.placement = self.offload.placement
        placed = {name for il in range(len(self.spec.layer_tensors)) if self.placement.layer_device[il] >= 0
                  for name in self.spec.layer_tensors[il].values() if name}
        if self.offload.output_device >= 0:
            placed |= set(self._output_tensors()) - {self.spec.global_tensors["tok_embd"]}
        flash = self._resolve_flash_attn(context.flash_attn, type_k, type_v)
        widened = widen_q5_0(weights.widen, weights.repack, self.spec.widened_bytes(self.gguf.tensors, placed))
        self._model = open_model(
            path=self.path, builder=self.spec.arch.builder, hparams=self.spec.hparams,
            global_tensors=self.spec.global_tensors, layer_tensors=self.spec.layer_tensors,
            description=self.spec.description,
            matmul_weights=[n for n in self.spec.matmul_weights() if n not in placed], repack=weights.repack,
            use_mmap=weights.use_mmap, amx_types=amx_types(weights.amx), widen_q5_0=widened,
            shards=self.gguf.shard_paths)
        self._model.widen_after = widen_after(weights.widen)
        try:
            if self.placement.devices and not self.placement.devices[0].endpoint:
                keep_supported(self.offload, lambda dev, layers, out: unsupported_weights(
                    m=self._model, dev=dev, layers=layers, with_output=out))
                self.placement = self.offload.placement
            if self.placement.devices:
                place_layers(m=self._model, devices=self.placement.devices, layer_device=self.placement.layer_device,
                             rpc_timeout=float(placement.rpc_timeout), output_device=self.offload.output_device)
                log.info("layers: %s%s", self.placement.describe(), "; output head on " + self.placement.devices[
                    self.offload.output_device].name if self.offload.output_device >= 0 else "")
            self._lora = [read_adapter(path, self.gguf, self.spec) for path, _ in weights.lora]
            adapters = [open_adapter(model=self._model, path=info.path, alpha=info.alpha) for info in self._lora]
            native = new_context(
                model=self._model, kv_size=cells, n_batch=n_batch,
                n_threads=default_n_threads() if context.n_threads is None else context.n_threads,
                kv_type=type_k, type_v=type_v, flash_attn=flash, n_seq_max=context.n_seq_max,
                devices=self.placement.devices, layer_device=self.placement.layer_device, adapters=adapters)
            draft = None if speculation.draft_model is None else open_draft(
                speculation.draft_model, target_gguf=self.gguf, target_n_vocab=self.spec.hparams["n_vocab"],
                context=native, repack=weights.repack, use_mmap=weights.use_mmap, amx=weights.amx,
                target_spec=self.spec)
            head = None
            if isinstance(draft, (MTPHead, AssistantHead)):   # a companion mtp-*.gguf or a drafter file
                head, draft = draft, None
            elif draft is None and speculation.speculative and speculation.mtp:
                head = open_mtp(self.path, self.gguf, self.spec, context=native, repack=weights.repack,
                                use_mmap=weights.use_mmap, amx=weights.amx)
            disk_cache = None if caches.prompt_cache is None else open_prompt_cache(
                caches.prompt_cache, self.path, native, caches.prompt_cache_bytes)
            self._log_compute_buffers(native)
            self._engine = Engine(native, n_ctx=n_ctx if context.kv_size is None else min(n_ctx, native.kv_size),
                                  speculative=bool(speculation.speculative), draft=draft, mtp=head, prompt_cache=disk_cache,
                                  state_cache_bytes=caches.state_cache_bytes)
            self._engine.lora_scales = tuple(scale for _, scale in weights.lora)
            self.assets = ModelAssets(self.path, self.gguf, self.spec)
            self.assets.tool_call_format = tool_call_format  # None: read from the chat template
            self.images = ImageInput.open(vision, arch=self.spec.arch.name, n_embd=self.spec.hparams["n_embd"],
                                          media=self._engine.media, n_threads=native.n_threads,
                                          n_deepstack=int(self.spec.hparams.get("n_deepstack", 0)))
            self.assets.images = self.images
            # embedding=True is llama-cpp-python's switch; here embeddings always work.
            self.embedding = bool(embedding)
            self.pooling = model_pooling(self.gguf, self.spec.arch.name, pooling,
                                         has_head=self._model.rank_outputs > 0)
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
                 self.path, self.spec.description, self.load_time, n_ctx, native.n_threads,
                 native.n_seq_max, native.kv_size)

    def _plan_placement(self, options: PlacementOptions, kv_cells, type_k: str, type_v: str, n_batch,
                        flash_attn: bool) -> Offload:
        n_layer = self.spec.hparams["n_layer"]
        h = self.spec.hparams
        n_head_kv, head_dim_k, head_dim_v, v_stored = self.spec.kv_heads()
        kv_bytes = kv_layer_bytes(kv_cells, n_head_kv, head_dim_k, head_dim_v if v_stored else 0, type_k, type_v)
        layer_bytes = [sum(self.gguf.tensors[n].nbytes for n in table.values() if n)
                       for table in self.spec.layer_tensors]
        endpoints = parse_endpoints(options.rpc_servers)
        if not endpoints:
            return plan_offload(n_layer, layer_bytes, sum(self.gguf.tensors[n].nbytes for n in self._output_tensors()),
                                kv_bytes, h, n_batch if isinstance(n_batch, int) else 512, kv_cells, flash_attn,
                                options.n_gpu_layers, options.main_gpu, options.tensor_split,
                                output_head=not self.spec.arch.encoder)
        placement = plan_layers(n_layer, connect_servers(endpoints, float(options.rpc_timeout)),
                                options.n_gpu_layers, options.tensor_split)
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
        n_head_kv, head_dim_k, head_dim_v, v_stored = self.spec.kv_heads()
        heads = [int(max(v) if isinstance(v, (list, tuple)) else v) for v in (h["n_head"], n_head_kv)]
        lacking = [d.name for d in devices
                   if not flash_attn_supported(dev=d, head_dim_k=head_dim_k, head_dim_v=head_dim_v,
                                               n_head=heads[0], n_head_kv=heads[1], type_k=type_k,
                                               type_v=type_v if v_stored else type_k)]
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
    def lora_adapters(self) -> list[dict]:
        """The LoRA adapters loaded (``lora=``), each with its id, path, name
        and the scale calls run at unless they say otherwise
        (:mod:`elelem.api.lora`)."""
        return describe(self._lora, self._engine_or_raise().lora_scales)

    def set_lora(self, scales: ScalesSpec) -> None:
        """Set the LoRA adapters' scales for the calls that start from now
        on: a scale for each adapter, ``{id: scale}`` or llama-server's
        ``[{"id": .., "scale": ..}]`` (adapters not named: 0).  0 leaves an
        adapter out."""
        engine = self._engine_or_raise()
        engine.lora_scales = resolve_scales(scales, len(engine.lora_scales), engine.lora_scales)

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

    # -- the default session -------------------------------------------------
    # The low-level calls act on the default session; the text calls run on it when it
    # is free, and on a session of their own when another thread holds it.

    @property
    def n_past(self) -> int:
        """Positions the cache holds for the default session."""
        return self._default().n_past

    @property
    def n_evaluated(self) -> int:
        """Tokens evaluated by the default session since the model opened."""
        return self._default().n_evaluated

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the tokens whose keys and values are in the default session's cache."""
        return self._default().cached_tokens

    @property
    def eos_ids(self) -> frozenset[int]:
        """The tokens that end a generation."""
        return self._default().eos_ids

    @_as_session(Session.eval)
    def eval(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.eval`."""
        return self._default().eval(*args, **kwargs)

    @_as_session(Session.prefill)
    def prefill(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.prefill`."""
        return self._default().prefill(*args, **kwargs)

    @_as_session(Session.rewind)
    def rewind(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.rewind`."""
        return self._default().rewind(*args, **kwargs)

    @_as_session(Session.reset)
    def reset(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.reset`."""
        return self._default().reset(*args, **kwargs)

    @_as_session(Session.generate_tokens)
    def generate_tokens(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.generate_tokens`."""
        return self._default().generate_tokens(*args, **kwargs)

    @_as_session(Session.tokenize)
    def tokenize(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.tokenize`."""
        return self._default().tokenize(*args, **kwargs)

    @_as_session(Session.detokenize)
    def detokenize(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.detokenize`."""
        return self._default().detokenize(*args, **kwargs)

    @_as_session(Session.cancel)
    def cancel(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.cancel`."""
        return self._default().cancel(*args, **kwargs)

    @_as_session(Session.save_state)
    def save_state(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.save_state`."""
        return self._default().save_state(*args, **kwargs)

    @_as_session(Session.load_state)
    def load_state(self, *args, **kwargs):
        """The default session's :meth:`~elelem.api.session.Session.load_state`."""
        return self._default().load_state(*args, **kwargs)

    @_as_session(Session.generate)
    def generate(self, *args, **kwargs):
        """:meth:`~elelem.api.session.Session.generate` on a free session."""
        return self._text_call("generate", args, kwargs)

    @_as_session(Session.stream)
    def stream(self, *args, **kwargs):
        """:meth:`~elelem.api.session.Session.stream` on a free session, held until the stream ends."""
        return self._text_call("stream", args, kwargs)

    @_as_session(Session.chat)
    def chat(self, *args, **kwargs):
        """:meth:`~elelem.api.session.Session.chat` on a free session."""
        return self._text_call("chat", args, kwargs)

    @_as_session(Session.chat_stream)
    def chat_stream(self, *args, **kwargs):
        """:meth:`~elelem.api.session.Session.chat_stream` on a free session, held until the stream ends."""
        return self._text_call("chat_stream", args, kwargs)

    @_as_session(Session.create_completion)
    def create_completion(self, *args, **kwargs):
        """:meth:`~elelem.api.session.Session.create_completion` on a free session."""
        return self._text_call("create_completion", args, kwargs)

    __call__ = create_completion

    @_as_session(Session.create_chat_completion)
    def create_chat_completion(self, *args, **kwargs):
        """:meth:`~elelem.api.session.Session.create_chat_completion` on a free session."""
        return self._text_call("create_chat_completion", args, kwargs)

    def infill(self, prefix: Piece, suffix: Piece, *, extra: Any = None, prompt: str = "",
               n_batch: int = DEFAULT_N_BATCH, suffix_first: bool = False, stream: bool = False, **options: Any):
        """The code between ``prefix`` and ``suffix``, with ``extra`` files of the repository as context
        (a mapping of file names to texts, or llama.cpp's ``[{"filename", "text"}]``), on a free session.

        The prompt is the one llama.cpp's server builds for ``/infill``
        (:mod:`elelem.api.infill`), ``max_tokens`` standing for its ``-n``.
        ``options`` are :meth:`generate`'s (``max_tokens``, ``stop``,
        ``grammar``, sampling); ``stream=True`` gives :meth:`stream`'s
        iterator of text deltas instead of the text.
        """
        max_tokens = options.get("max_tokens")
        ids = infill_ids(self.assets, prefix, suffix, n_ctx=self.n_ctx, extra=extra, prompt=prompt, n_batch=n_batch,
                         n_predict=-1 if max_tokens is None else max_tokens, suffix_first=suffix_first)
        return self.stream(ids, **options) if stream else self.generate(ids, **options)

    def _text_call(self, name: str, args: tuple, kwargs: dict):
        with self._leased() as (session, release):
            result = getattr(session, name)(*args, **kwargs)
        if name in ("stream", "chat_stream") or kwargs.get("stream"):
            # Streams hold the session until they end; one that was never read frees it when dropped.
            return _attach_release(result, release)
        release()
        return result

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

    def rerank(self, query: str, documents: Sequence[str], top_n: Optional[int] = None) -> list[dict]:
        """How relevant each of ``documents`` is to ``query``, best first:
        ``{"index", "relevance_score"}`` per document, at most ``top_n`` of
        them, scored and ordered as llama.cpp's ``/v1/rerank`` does
        (:mod:`elelem.api.rerank`).  The model must be a reranker: one with a
        classification head (bge-reranker, Qwen3-Reranker)."""
        engine = self._engine_or_raise()
        results, _ = rerank(engine, self.assets, query, documents, top_n=top_n, n_ctx=engine.n_ctx)
        return results

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
        engine = self._engine_or_raise()
        with self._lease_lock:
            if not self._default_in_use:
                self._default_in_use = True
                return default, self._release_default
            if self._idle:
                session = self._idle.pop()
            elif engine.n_seq_max - len(self._children) - 1 > 0:
                session = Session(engine, self.assets, n_ctx=engine.n_ctx)
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
        if self.images is not None:
            self.images.close()
            self.images = None
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
