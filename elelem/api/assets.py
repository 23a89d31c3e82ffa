"""What every session of one model shares besides the engine: the file's
metadata, its tokenizer and its chat template, built on first use.

Kept apart from :class:`~elelem.api.llm.LLM` so that sessions refer to these
and to the engine, never to the LLM: nothing refers back, so closing (or
dropping) an LLM frees it at once, without waiting for the garbage collector.

Models whose ``tokenizer.ggml.*`` keys are the same (one file opened twice,
the sizes of one family: Qwen2.5-Coder 0.5B and 7B) share one tokenizer
while any of them holds it: built once, its tables (45 MB of Python objects
for Qwen2's 151,936 tokens) in memory once.  A server that unloads a model
and loads it again, and keeps the tokenizer meanwhile (server/served.py),
builds none: that is 0.1 s of Python, holding the GIL in slices beside the
models answering.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Optional

from ..gguf.reader import GGUFFile, validate_tokenizer_metadata
from ..model.architectures import ModelSpec
from ..sampling.grammar import GrammarTokenizer
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer

log = logging.getLogger("elelem")

#: the tokenizers some open model holds, by the digest of their tokenizer metadata
_tokenizers: "weakref.WeakValueDictionary[bytes, Tokenizer]" = weakref.WeakValueDictionary()
_tokenizers_lock = threading.Lock()


class ModelAssets:
    """The metadata, tokenizer and chat template of one open model file."""

    def __init__(self, path: Path, gguf: GGUFFile, spec: ModelSpec):
        self.path = path
        self.gguf = gguf
        self.spec = spec
        self.n_vocab: int = spec.hparams["n_vocab"]
        self._build_lock = threading.Lock()
        self._tokenizer: Optional[Tokenizer] = None
        self._chat_template: Optional[ChatTemplate] = None
        self._grammar_tokenizer: Optional[GrammarTokenizer] = None
        #: The LLM's tool_call_format (a format's name); None: read from the chat template.
        self.tool_call_format: Optional[str] = None
        #: Images in (an api.images.ImageInput): set when the model is opened with a projector.
        self.images: Any = None
        self.eos_ids = self._metadata_eos_ids()

    @property
    def model_name(self) -> str:
        """The ``model`` field of the completion dicts: the file path, as llama-cpp-python."""
        return str(self.path)

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            with self._build_lock:
                if self._tokenizer is None:
                    self._tokenizer = self._shared_tokenizer()
        return self._tokenizer

    @property
    def tokenizer_lock(self) -> threading.Lock:
        """Held around the tokenizer's encode by threads that share it (its word cache is not thread-safe)."""
        return self.tokenizer.lock

    def _shared_tokenizer(self) -> Tokenizer:
        t0 = time.perf_counter()
        digest = validate_tokenizer_metadata(self.gguf)  # ids in range, types, merges vs vocabulary
        with _tokenizers_lock:
            tokenizer = _tokenizers.get(digest)
        if tokenizer is not None:
            log.debug("the tokenizer is one an open model has: shared")
            return tokenizer
        built = Tokenizer.from_metadata(self.gguf.metadata)
        with _tokenizers_lock:   # another model may have built the same meanwhile: one of them is kept
            tokenizer = _tokenizers.setdefault(digest, built)
        log.debug("built the tokenizer in %.3f s", time.perf_counter() - t0)
        return tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            tokenizer = self.tokenizer
            with self._build_lock:
                if self._chat_template is None:
                    self._chat_template = ChatTemplate.from_metadata(self.gguf.metadata,
                                                                     token_text=tokenizer.token_text)
        return self._chat_template

    @property
    def grammar_tokenizer(self) -> GrammarTokenizer:
        """The vocabulary as the constraint engine reads it, built on the first constrained request."""
        if self._grammar_tokenizer is None:
            tokenizer = self.tokenizer
            lock = self.tokenizer_lock

            def encode(text: str) -> list[int]:  # not a method: the cache must not refer back to self
                with lock:
                    return tokenizer.encode(text, add_bos=False, add_eos=False)

            with self._build_lock:
                if self._grammar_tokenizer is None:
                    t0 = time.perf_counter()
                    self._grammar_tokenizer = GrammarTokenizer.of(tokenizer, self.n_vocab, encode)
                    log.debug("built the grammar tokenizer in %.3f s", time.perf_counter() - t0)
        return self._grammar_tokenizer

    def tokenize(self, text, add_bos: Optional[bool] = None, special: bool = False,
                 add_eos: Optional[bool] = None) -> list[int]:
        tokenizer = self.tokenizer
        with self.tokenizer_lock:
            return tokenizer.encode(text, add_bos=add_bos, add_eos=add_eos, special=special)

    def _metadata_eos_ids(self) -> frozenset[int]:
        ids = set()
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            value = self.gguf.get(key)
            if isinstance(value, int) and 0 <= value < self.n_vocab:
                ids.add(value)
        return frozenset(ids)
