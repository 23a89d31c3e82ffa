"""``elelem.compat.Llama``: llama-cpp-python 0.3's ``Llama``, over :class:`elelem.LLM`.

Code written for llama-cpp-python runs on it with one import changed::

    from elelem.compat import Llama          # was: from llama_cpp import Llama

    llm = Llama(model_path="model.gguf", n_ctx=2048, n_gpu_layers=-1)
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"], echo=True)

The shim adapts llama-cpp-python's arguments to elelem's; elelem's own API
stays as strict as it is.  What it adapts:

* constructor keywords (:mod:`.llama_options`): ``n_ctx`` (default 512, 0 =
  the model's trained context), ``n_batch`` (at most ``n_ctx``),
  ``n_threads``, ``use_mmap``, ``flash_attn``, ``type_k``/``type_v`` (ggml
  type ids or names), ``seed``, ``last_n_tokens_size`` (the penalties'
  window), ``logits_all`` (``eval`` keeps every row in ``scores``),
  ``spm_infill``, ``embedding``/``pooling_type``, ``n_gpu_layers`` (default
  0), ``main_gpu``, ``tensor_split`` and ``rpc_servers``; GPU layers asked
  for on a machine without a GPU run on the CPU, as in llama-cpp-python, with a
  warning that says why (``elelem.LLM`` raises ``DeviceError`` instead); the rest are accepted and,
  where they would change something in llama.cpp, logged once;
  ``elelem_options`` passes more keywords to ``elelem.LLM``;
* ``max_tokens``: None or <= 0 means up to the end of the context, and a
  ``max_tokens`` that does not fit after the prompt is cut to what does, as
  llama-cpp-python does (elelem itself raises ``ContextLimitError``);
* ``temperature < 0`` (``temp`` in ``generate``): a plain draw from the
  softmax, as llama.cpp's chain is then just ``dist``;
* ``seed``: without a per-call seed, every ``create_*`` call samples with the
  Llama's seed, so, as in llama-cpp-python, the same call gives the same
  text; ``generate`` draws a fresh seed while the Llama's is
  ``LLAMA_DEFAULT_SEED``;
* ``grammar``: a ``LlamaGrammar`` (its GBNF text) or the text itself;
* ``tokenize(bytes, add_bos=True)``: ``add_bos`` True adds BOS where the model
  does, as llama.cpp's ``add_special``.

Not supported, refused with :class:`~elelem.errors.InvalidArgumentError`:
mirostat, and ``logits_processor``/``stopping_criteria`` in the ``create_*``
calls (``generate`` takes both).
"""
from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from ..api.llm import LLM
from ..api.offload import explicit_request, gpu_devices
from ..api.options import ContextOptions, PlacementOptions, VisionOptions, WeightOptions, override_options
from ..api.states import LLMState
from ..api.structured import output_constraint, output_grammar
from ..errors import ContextLimitError, ElelemError, InvalidArgumentError
from ..gguf.reader import read_gguf
from ..model.architectures import model_spec
from ..model.hub import resolve_model
from ..sampling.sampler import Sampler, SamplingParams
from . import llama_options as options
from .llama_options import LLAMA_DEFAULT_SEED

log = logging.getLogger("elelem")


@dataclass(frozen=True)
class LlamaState:
    """What :meth:`Llama.save_state` returns: elelem's state of the cache, and the seed."""

    state: LLMState
    seed: int

    @property
    def n_tokens(self) -> int:
        return self.state.n_tokens

    @property
    def input_ids(self) -> np.ndarray:
        return np.array(self.state.tokens, dtype=np.intc)

    @property
    def llama_state_size(self) -> int:
        return self.state.nbytes


def _vision_of(chat_handler: Any) -> VisionOptions:
    """llama-cpp-python's multimodal chat handlers (Llava15ChatHandler and its subclasses:
    Gemma3ChatHandler, MTMDChatHandler, ...) carry the projector file as ``clip_model_path``:
    the model is opened with it, and chats take images as those handlers take them (data:
    and http(s) URLs, which they fetch).  The handler's own prompt format is not used: chats
    are rendered with the model's chat template, as llama.cpp's server renders them."""
    clip = getattr(chat_handler, "clip_model_path", None)
    if isinstance(clip, (str, os.PathLike)):
        return VisionOptions(mmproj=clip, image_urls=True)
    if chat_handler is not None:
        options.note_no_effect("chat_handler", chat_handler, "chats are rendered with the model's own chat "
                                                             "template (ChatML when it has none)")
    return VisionOptions()


class Llama:
    """llama-cpp-python's ``Llama``: see the module docstring for what differs."""

    def __init__(self, model_path: Union[str, os.PathLike], *, n_ctx: int = 512, n_batch: int = 512,
                 n_threads: Optional[int] = None, n_threads_batch: Optional[int] = None,
                 seed: int = LLAMA_DEFAULT_SEED, use_mmap: bool = True, flash_attn: bool = False,
                 type_k: Any = None, type_v: Any = None, logits_all: bool = False, embedding: bool = False,
                 pooling_type: int = -1, last_n_tokens_size: int = 64, spm_infill: bool = False,
                 chat_format: Optional[str] = None, verbose: bool = True,
                 lora_path: Optional[str] = None, lora_scale: float = 1.0,
                 elelem_options: Optional[dict] = None, tool_call_format: Optional[str] = None, **kwargs: Any):
        """``elelem_options`` (not a llama-cpp-python keyword) are more keywords for
        :class:`elelem.LLM`: ``{"prompt_cache": DIR}``, ``{"repack": False}``, ...
        ``tool_call_format`` (not one either) names the format the model writes tool calls in
        (``"hermes"``, ``"qwen3_coder"``, ``"harmony"``, ``"mistral"``, ``"llama3"``, ``"glm"``);
        by default it is read from the chat template, as llama.cpp does.  ``lora_path`` is a
        LoRA adapter (GGUF) applied at ``lora_scale``, as llama-cpp-python's; more adapters,
        and scales changed later, through ``elelem_options={"lora": [...]}`` and
        ``self._llm.set_lora`` (:mod:`elelem.api.lora`)."""
        # Layers on GPUs or RPC servers: llama-cpp-python's names and meanings, its
        # default n_gpu_layers=0 included (every layer stays on the CPU).
        devices = {k: kwargs.pop(k) for k in ("rpc_servers", "n_gpu_layers", "main_gpu", "tensor_split")
                   if k in kwargs}
        devices.setdefault("n_gpu_layers", 0)
        _cpu_when_no_gpu(devices)
        vision = _vision_of(kwargs.pop("chat_handler", None))
        options.check_ignored({"chat_format": chat_format, **kwargs})
        self.model_path = str(model_path)
        self.verbose = verbose      # elelem never prints: it logs to logging.getLogger("elelem")
        self.chat_format = chat_format
        self.lora_path = lora_path
        self.lora_scale = lora_scale
        self.lora_base = kwargs.get("lora_base")
        self.last_n_tokens_size = last_n_tokens_size
        self.spm_infill = bool(spm_infill)
        self._logits_all = bool(logits_all)
        self._seed = seed
        path = resolve_model(model_path)
        spec = model_spec(read_gguf(path))
        n_ctx_train = spec.hparams["n_ctx_train"]
        if n_ctx == 0:  # llama-cpp-python: the model's trained context
            n_ctx = n_ctx_train
        elif spec.global_tensors.get("pos_embd") and isinstance(n_ctx, int) and n_ctx > n_ctx_train:
            # llama.cpp runs past a learned position table (BERT) until a text reaches
            # its end; elelem refuses such an n_ctx, so the shim clamps it.
            log.info("n_ctx=%d clamped to this model's %d learned positions", n_ctx, n_ctx_train)
            n_ctx = n_ctx_train
        self.n_batch = min(n_ctx, n_batch) if isinstance(n_ctx, int) and isinstance(n_batch, int) else n_batch
        derived = {
            "context": ContextOptions(n_ctx=n_ctx, n_batch=self.n_batch, n_threads=n_threads,
                                      flash_attn=bool(flash_attn), type_k=options.kv_type_name("type_k", type_k),
                                      type_v=options.kv_type_name("type_v", type_v)),
            "weights": WeightOptions(use_mmap=use_mmap, lora=((lora_path, lora_scale),) if lora_path else ()),
            "placement": PlacementOptions(**devices),
            "vision": vision,
            **options.embedding_options(LLM, embedding, pooling_type),
            **({"tool_call_format": tool_call_format} if tool_call_format is not None else {}),
        }
        # elelem_options come last: they may override what the shim derives (flash_attn, ...).
        self._llm = LLM(path, **override_options(derived, elelem_options or {}))
        self.n_threads = self._llm.n_threads
        self.n_threads_batch = self.n_threads
        if n_threads_batch is not None and n_threads_batch != self.n_threads:
            options.note_no_effect("n_threads_batch", n_threads_batch,
                                   f"elelem uses n_threads ({self.n_threads}) for prompts too")
        self._last_logits: Optional[np.ndarray] = None
        self._scores: Optional[np.ndarray] = None
        self.cache = None

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: Optional[str] = None, additional_files: Optional[list] = None,
                        local_dir: Union[str, os.PathLike, None] = None, local_dir_use_symlinks: Any = "auto",
                        cache_dir: Union[str, os.PathLike, None] = None, **kwargs: Any) -> "Llama":
        """llama-cpp-python's: the GGUF ``filename`` (a path in the repository, or a glob such as
        ``"*Q4_K_M.gguf"``) of the Hugging Face repository ``repo_id``, downloaded into the
        Hugging Face cache (``cache_dir``, else ``HF_HUB_CACHE``) and checked against its sha256.
        A split model comes whole whichever of its files the glob names; ``filename=None``
        chooses as ``hf://repo_id`` does (Q4_K_M, then Q8_0, then the first).  ``additional_files``
        are globs of more files to fetch; ``local_dir`` gets copies of the files (symbolic links
        to the cache with ``local_dir_use_symlinks=True``).  Other keywords are :class:`Llama`'s.
        Needs ``pip install 'elelem[hub]'``."""
        from ..model import hf
        ref = hf.parse_reference(f"hf://{repo_id}")
        if ref.quant or ref.revision:
            raise InvalidArgumentError(f"repo_id {repo_id!r}: give ORG/REPO only")
        ref = hf.HubRef(ref.repo_id, filename=filename)
        files = hf.pull_files(ref, cache_dir=cache_dir, extra_files=tuple(additional_files or ()))
        if local_dir is not None:
            files = hf.copy_to(files, local_dir, symlinks=local_dir_use_symlinks is True)
        return cls(model_path=str(files[0]), **kwargs)

    # -- the elelem model underneath ---------------------------------------------

    @property
    def llm(self) -> LLM:
        """The :class:`elelem.LLM` this wraps, for elelem's own API."""
        return self._llm

    def close(self) -> None:
        self._llm.close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- facts -----------------------------------------------------------------

    def n_ctx(self) -> int:
        return self._llm.n_ctx

    def n_vocab(self) -> int:
        return self._llm.n_vocab

    def n_embd(self) -> int:
        return self._llm.hparams["n_embd"]

    def token_bos(self) -> int:
        bos = self._llm.tokenizer.bos_id
        return -1 if bos is None else bos

    def token_eos(self) -> int:
        eos = self._llm.tokenizer.eos_id
        return -1 if eos is None else eos

    def token_nl(self) -> int:
        ids = self._llm.tokenize(b"\n", add_bos=False)
        return ids[0] if len(ids) == 1 else -1

    @property
    def metadata(self) -> dict[str, str]:
        """The GGUF metadata's scalar values as strings, as llama.cpp lists them (arrays left out)."""
        out = {}
        for key, value in self._llm.gguf.metadata.items():
            if isinstance(value, (bool, np.bool_)):
                out[key] = "true" if value else "false"
            elif isinstance(value, (int, np.integer, str)):
                out[key] = str(value)
            elif isinstance(value, (float, np.floating)):
                out[key] = f"{float(value):f}"
        return out

    # -- tokens ----------------------------------------------------------------

    def tokenize(self, text: Union[bytes, str], add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_bos`` adds BOS where the model does (llama.cpp's ``add_special``)."""
        return self._llm.tokenize(text, add_bos=None if add_bos else False, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        """The bytes of ``tokens``; after ``prev_tokens`` when given (a leading space then stays)."""
        if not prev_tokens:
            return self._llm.detokenize(list(tokens), special=special)
        before = self._llm.detokenize(list(prev_tokens), special=special)
        return self._llm.detokenize([*prev_tokens, *tokens], special=special)[len(before):]

    # -- the cache ---------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens in the cache; setting it forgets those after (llama-cpp-python's rewind)."""
        return self._llm.n_past

    @n_tokens.setter
    def n_tokens(self, value: int) -> None:
        self._llm.rewind(value)
        self._last_logits = None

    @property
    def input_ids(self) -> np.ndarray:
        """A copy of llama-cpp-python's ``(n_ctx,)`` token array: the cached tokens, then zeros."""
        ids = np.zeros(self.n_ctx(), dtype=np.intc)
        cached = self._llm.cached_tokens
        ids[:len(cached)] = cached
        return ids

    @property
    def _input_ids(self) -> np.ndarray:
        return np.array(self._llm.cached_tokens, dtype=np.intc)

    @property
    def eval_tokens(self) -> deque:
        return deque(self._llm.cached_tokens, maxlen=self.n_ctx())

    @property
    def scores(self) -> np.ndarray:
        """With ``logits_all=True``: ``(n_ctx, n_vocab)`` logits, a row per token ``eval`` evaluated."""
        if not self._logits_all:
            raise InvalidArgumentError("scores are kept only by a Llama made with logits_all=True")
        if self._scores is None:  # np.zeros maps its pages lazily: rows cost memory once written
            self._scores = np.zeros((self.n_ctx(), self.n_vocab()), dtype=np.float32)
        return self._scores

    def reset(self) -> None:
        self._llm.reset()
        self._last_logits = None

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after the cached ones."""
        tokens = list(tokens)
        if not tokens:
            return  # as llama-cpp-python: nothing to do
        start = self._llm.n_past
        logits = self._llm.eval(tokens, all_logits=self._logits_all)
        if self._logits_all:
            rows = logits.reshape(len(tokens), -1)
            self.scores[start:start + len(tokens)] = rows
            logits = rows[-1]
        self._last_logits = logits

    def save_state(self) -> LlamaState:
        return LlamaState(self._llm.save_state(), self._seed)

    def load_state(self, state: Union[LlamaState, LLMState]) -> None:
        """Load what :meth:`save_state` saved (an elelem ``LLMState`` works too)."""
        if isinstance(state, LlamaState):
            self._seed = state.seed
            state = state.state
        self._llm.load_state(state)
        self._last_logits = None  # elelem's states hold no logits: the next call evaluates a token

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def set_cache(self, cache) -> None:
        """Accepted; elelem reuses cached prefixes by itself (and ``LLM(prompt_cache=DIR)`` keeps them on disk)."""
        if cache is not None:
            options.note_no_effect("set_cache", type(cache).__name__,
                                   "elelem reuses the longest cached prefix of every prompt by itself")
        self.cache = cache

    # -- token by token ------------------------------------------------------------

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
               mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor=None, grammar=None, idx: Optional[int] = None) -> int:
        """A token drawn from the logits of the last ``eval`` (row ``idx`` with ``logits_all``)."""
        _no_mirostat(mirostat_mode)
        logits = self.scores[idx] if idx is not None and self._logits_all else self._logits_to_sample()
        sampler = Sampler(self._sampling_params(temp, top_k, top_p, min_p, typical_p, repeat_penalty,
                                                frequency_penalty, presence_penalty, self._generate_seed()),
                          n_vocab=self.n_vocab())
        row = _processed(logits, logits_processor, lambda: self._input_ids)
        constraint = self._constraint(grammar)
        return sampler.sample(row) if constraint is None else constraint.sample(sampler, row, [])

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor=None, stopping_criteria=None,
                 grammar=None) -> Iterator[int]:
        """Token ids continuing ``tokens``, one per ``next()``, for as long as the caller asks.

        As llama-cpp-python's: it never stops by itself (an end-of-generation
        token is yielded like any other), ``send(ids)`` evaluates more tokens
        after the one just yielded, the penalties look at the tokens this call
        generated (its last ``last_n_tokens_size``), and ``reset=True`` keeps
        the longest cached prefix of ``tokens``.  Running past ``n_ctx``
        raises :class:`~elelem.errors.ContextLimitError`.
        """
        _no_mirostat(mirostat_mode)
        params = self._sampling_params(temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty,
                                       presence_penalty, self._generate_seed())
        return self._generate(list(tokens), Sampler(params, n_vocab=self.n_vocab()), reset,
                              logits_processor, stopping_criteria, self._constraint(grammar))

    def _generate(self, tokens, sampler, reset, logits_processor, stopping_criteria, constraint):
        if reset:
            self._last_logits = self._llm.prefill(tokens)
        elif tokens:
            self.eval(tokens)
        elif self._last_logits is None:
            raise InvalidArgumentError("generate(reset=False) with no tokens needs logits: eval() tokens first")
        generated: list[int] = []
        eog = sorted(self._llm.tokenizer.eog_ids)
        while True:
            row = _processed(self._logits_to_sample(), logits_processor, lambda: self._input_ids)
            if constraint is not None and constraint.complete:  # the grammar is done: only an end may follow
                row = np.where(np.isin(np.arange(row.size), eog), row, -np.inf).astype(row.dtype)
                token = sampler.sample(row, generated)
            elif constraint is not None:
                token = constraint.sample(sampler, row, generated)
            else:
                token = sampler.sample(row, generated)
            if stopping_criteria is not None and stopping_criteria(self._input_ids, row):
                return
            generated.append(token)
            more = yield token
            self.eval([token, *(more or [])])

    def _logits_to_sample(self) -> np.ndarray:
        """The logits of the last ``eval`` (or prefill), which the next token is drawn from."""
        if self._last_logits is None:
            raise InvalidArgumentError("nothing to sample from: eval() tokens first")
        return self._last_logits

    # -- llama-cpp-python's dicts ---------------------------------------------------

    def create_completion(self, prompt: Union[str, list[int]], suffix: Optional[str] = None,
                          max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: Optional[int] = None,
                          echo: bool = False, stop: Optional[Union[str, list[str]]] = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: Optional[int] = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                          stopping_criteria=None, logits_processor=None, grammar=None,
                          logit_bias: Optional[dict] = None) -> Union[dict, Iterator[dict]]:
        """A ``text_completion`` dict, or an iterator of its chunks (``stream=True``).

        ``suffix`` fills in the middle (models with FIM tokens); ``echo``
        puts the prompt in front of the answer (streamed too, in the first chunk).
        """
        _no_mirostat(mirostat_mode)
        _no_hooks(logits_processor, stopping_criteria)
        sampling = self._call_sampling(temperature, top_k, top_p, min_p, typical_p, repeat_penalty,
                                       frequency_penalty, presence_penalty, seed, logit_bias)
        if suffix is not None and self.spm_infill:
            sampling["suffix_first"] = True
        return self._clamped(self._llm.create_completion, prompt, max_tokens, suffix=suffix, logprobs=logprobs,
                             echo=echo, stop=stop, stream=stream, model=model, grammar=_grammar_text(grammar),
                             **sampling)

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict], functions: Optional[list] = None,
                               function_call: Any = None, tools: Optional[list] = None, tool_choice: Any = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: Optional[Union[str, list[str]]] = None, seed: Optional[int] = None,
                               response_format: Optional[dict] = None, max_tokens: Optional[int] = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                               logits_processor=None, grammar=None, logit_bias: Optional[dict] = None,
                               logprobs: Optional[bool] = None,
                               top_logprobs: Optional[int] = None, *, reasoning_format: Optional[str] = None,
                               chat_template_kwargs: Optional[dict] = None,
                               tool_call_format: Optional[str] = None,
                               parallel_tool_calls: Optional[bool] = None) -> Union[dict, Iterator[dict]]:
        """A ``chat.completion`` dict, or its chunks; the model's own chat template renders ``messages``.

        OpenAI's older ``functions``/``function_call`` become ``tools``/``tool_choice``
        (the calls then come back as ``message.tool_calls``, ``finish_reason``
        ``"tool_calls"``), read in the format the chat template shows (Hermes,
        Qwen3-Coder XML, gpt-oss harmony, Mistral, Llama 3, GLM) or in
        ``tool_call_format`` (this call's, else the constructor's).  A required
        or named ``tool_choice`` holds the call to its tools' schemas from the
        format's marker on (:mod:`elelem.api.tools`).  ``parallel_tool_calls=True``
        lets more calls follow the first (as llama.cpp's server, the default is one).

        Beyond llama-cpp-python, as llama.cpp's server takes them: a reasoning
        model's thinking comes back as ``message.reasoning_content``
        (``delta.reasoning_content`` streamed) unless ``reasoning_format`` is
        ``"none"``; ``chat_template_kwargs`` are variables for the chat template
        (``{"enable_thinking": False}``, ``{"reasoning_effort": "low"}``).
        """
        _no_mirostat(mirostat_mode)
        _no_hooks(logits_processor, None)
        if functions is not None:
            if tools is not None:
                raise InvalidArgumentError("give tools or functions, not both")
            tools = [{"type": "function", "function": f} for f in functions]
        if function_call is not None:
            if tool_choice is not None:
                raise InvalidArgumentError("give tool_choice or function_call, not both")
            tool_choice = function_call if isinstance(function_call, str) else \
                {"type": "function", "function": {"name": dict(function_call).get("name")}}
        sampling = self._call_sampling(temperature, top_k, top_p, min_p, typical_p, repeat_penalty,
                                       frequency_penalty, presence_penalty, seed, logit_bias)
        return self._clamped(self._llm.create_chat_completion, messages, max_tokens, tools=tools,
                             tool_choice=tool_choice, stream=stream, stop=stop, response_format=response_format,
                             grammar=_grammar_text(grammar), model=model, logprobs=logprobs,
                             top_logprobs=top_logprobs, reasoning_format=reasoning_format,
                             chat_template_kwargs=chat_template_kwargs, tool_call_format=tool_call_format,
                             parallel_tool_calls=parallel_tool_calls, **sampling)

    def _clamped(self, call, prompt, max_tokens, **kwargs):
        # llama-cpp-python cuts a max_tokens that does not fit after the prompt down to what
        # does; elelem refuses it (before any compute), and None asks for exactly that room.
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens <= 0:
            max_tokens = None
        try:
            return call(prompt, max_tokens=max_tokens, **kwargs)
        except ContextLimitError:
            if max_tokens is None:
                raise  # the prompt alone fills the context: llama-cpp-python raises too
            return call(prompt, max_tokens=None, **kwargs)

    # -- embeddings --------------------------------------------------------------

    def create_embedding(self, input: Union[str, list[str]], model: Optional[str] = None) -> dict:
        return self._embedding_call("create_embedding")(input, model=model)

    def embed(self, input: Union[str, list[str]], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        return self._embedding_call("embed")(input, normalize=normalize, truncate=truncate,
                                             return_count=return_count)

    def _embedding_call(self, name: str):
        if not hasattr(LLM, "embed"):
            raise ElelemError(f"{name}: this version of elelem has no embeddings yet")
        return getattr(self._llm, name)

    # -- helpers -----------------------------------------------------------------

    def _generate_seed(self) -> Optional[int]:
        return None if self._seed in (LLAMA_DEFAULT_SEED, -1) else self._seed

    def _sampling_params(self, temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty,
                         presence_penalty, seed) -> SamplingParams:
        return SamplingParams(**_chain(temp, top_k, top_p, min_p, typical_p), repeat_penalty=repeat_penalty,
                              frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                              repeat_last_n=self.last_n_tokens_size, seed=seed)

    def _call_sampling(self, temperature, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty,
                       presence_penalty, seed, logit_bias) -> dict:
        # Without a seed of its own a call samples with the Llama's, so the same call gives
        # the same text, as in llama-cpp-python (which derives the call's seed from it).
        seed = seed if seed is not None else self._seed % 2**32 if self._seed >= 0 else None
        return {**_chain(temperature, top_k, top_p, min_p, typical_p), "repeat_penalty": repeat_penalty,
                "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
                "repeat_last_n": self.last_n_tokens_size, "seed": seed, "logit_bias": logit_bias or {}}

    def _constraint(self, grammar):
        text = _grammar_text(grammar)
        return None if text is None else output_constraint(self._llm.assets, output_grammar(grammar=text))


def _chain(temperature, top_k, top_p, min_p, typical_p) -> dict:
    """The sampling chain's settings; a negative temperature is llama.cpp's bare ``dist``."""
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature < 0:
        return {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0}
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "typical_p": typical_p}


def _grammar_text(grammar) -> Optional[str]:
    """GBNF text from a ``LlamaGrammar`` (its ``_grammar``), an object with a ``grammar`` string, or text."""
    if grammar is None or isinstance(grammar, str):
        return grammar
    for attribute in ("_grammar", "grammar"):
        text = getattr(grammar, attribute, None)
        if isinstance(text, str):
            return text
    raise InvalidArgumentError(f"grammar must be GBNF text or a LlamaGrammar, got {type(grammar).__name__}")


def _processed(logits: np.ndarray, logits_processor, input_ids) -> np.ndarray:
    """``logits`` through llama-cpp-python's logits processors, called as ``processor(input_ids(), row)``."""
    if logits_processor is None:
        return logits
    row = np.array(logits, dtype=np.float32)
    ids = input_ids()
    for processor in logits_processor:
        row = np.asarray(processor(ids, row), dtype=np.float32)
    return row


def _no_mirostat(mode) -> None:
    if mode:
        raise InvalidArgumentError(f"mirostat_mode={mode!r}: mirostat sampling is not supported by elelem")


def _no_hooks(logits_processor, stopping_criteria) -> None:
    for name, value in (("logits_processor", logits_processor), ("stopping_criteria", stopping_criteria)):
        if value is not None:
            raise InvalidArgumentError(f"{name} is not supported in the create_* calls; "
                                       f"generate() takes it, token by token")


def _cpu_when_no_gpu(devices: dict) -> None:
    """llama-cpp-python scripts pass n_gpu_layers=-1 whether or not there is a GPU, and
    llama.cpp then runs on the CPU; LLM would raise DeviceError.  The shim keeps
    llama-cpp-python's behaviour, but says so in a warning with the reason."""
    if devices.get("rpc_servers") or not explicit_request(devices.get("n_gpu_layers"), devices.get("main_gpu", 0),
                                                          devices.get("tensor_split")):
        return
    gpus, modules = gpu_devices()
    if not gpus:
        why = "; ".join(m.reason for m in modules if m.reason) or "no GPU backend module"
        log.warning("n_gpu_layers=%s: no GPU (%s), so every layer runs on the CPU", devices.get("n_gpu_layers"), why)
        devices.update(n_gpu_layers=0, main_gpu=0, tensor_split=None)
