"""The :class:`Tokenizer`: GGUF metadata in, llama.cpp-identical ids out."""
from __future__ import annotations

import operator
import threading
from itertools import compress, repeat
from operator import and_
from typing import Any, Iterable, Mapping, Optional, Union

from ...errors import GGUFError, InvalidArgumentError, InvalidTokenError
from .bpe import ByteLevelBPE, SentencePieceStyleBPE
from .pieces import build_pieces
from .pretokenize import pretokenizer_for
from .special import SpecialTokenSplitter
from .spm import SentencePieceBPE
from .stream import StreamDecoder
from .text_input import normalize_input
from .vocab import (ATTR_CONTROL, ATTR_UNKNOWN, ATTR_USER_DEFINED, Vocab, load_vocab, unsupported_model,
                    wordpiece_options)
from .ugm import Unigram
from .wpm import WordPiece, check_wordpiece_vocab

TextInput = Union[str, bytes, bytearray, memoryview]


class Tokenizer:
    """Encode and decode text exactly as llama.cpp does for the same GGUF.

    Build one with :meth:`from_metadata`.  Supports byte-level BPE
    (``tokenizer.ggml.model = "gpt2"``), SentencePiece BPE (``"llama"``),
    WordPiece (``"bert"``), SentencePiece Unigram (``"t5"``) and Gemma 4's
    BPE over ``▁`` pieces (``"gemma4"``).
    """

    def __init__(self, vocab: Vocab,
                 model: Union[ByteLevelBPE, SentencePieceBPE, SentencePieceStyleBPE, WordPiece, Unigram]):
        self._vocab = vocab
        self._model = model
        self._spm = isinstance(model, SentencePieceBPE)
        self._wpm = isinstance(model, WordPiece)
        # Unigram, as SentencePiece BPE, reads invalid UTF-8 byte by byte (Unigram.normalize).
        self._raw_bytes = self._spm or isinstance(model, Unigram)
        attrs = vocab.attrs
        # compress/map: a C loop over the vocabulary, not bytecode per token (see vocab.load_vocab)
        special_mask = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
        special = compress(range(vocab.n_vocab), map(and_, attrs, repeat(special_mask)))
        cached = [(vocab.tokens[i], i) for i in special]
        # User-defined tokens are cut out of the text even with special=False
        # (llama.cpp, after Hugging Face tokenizers); control and unknown ones
        # only when parsing special tokens.
        self._split_plain = SpecialTokenSplitter(
            (t, i) for t, i in cached if not attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN))
        self._split_special = SpecialTokenSplitter(cached)
        self._pieces: Optional[tuple[tuple[bytes, ...], tuple[bytes, ...]]] = None  # built on first decode
        #: Held around encode by callers that share this tokenizer between threads: its word
        #: cache is not thread-safe (several models may share one tokenizer, api/assets.py).
        self.lock = threading.Lock()

        self.n_vocab: int = vocab.n_vocab
        self.bos_id: Optional[int] = vocab.bos_id
        self.eos_id: Optional[int] = vocab.eos_id
        self.eog_ids: frozenset[int] = vocab.eog_ids
        self.add_bos: bool = vocab.add_bos
        self.add_eos: bool = vocab.add_eos
        # What add_eos appends: EOS, or for WordPiece [SEP].
        self._end_id: Optional[int] = vocab.eos_id
        if self._wpm:
            # llama.cpp's WPM tokenize adds [CLS] and [SEP] whenever it adds
            # special tokens at all: the GGUF's add_bos/add_eos flags play no part.
            self.add_bos = self.add_eos = True
            self._end_id = vocab.special_ids["sep"]

    def build_tables(self) -> None:
        """Build now what is otherwise built on first use: the pieces decoding reads and the
        merge ranks encoding does.  A server does this in a model's load, beside the other
        models' requests at low priority with the collector paused, rather than in the
        model's first request."""
        if self._pieces is None:
            self._pieces = build_pieces(self._vocab)
        build = getattr(self._model, "build_tables", None)
        if build is not None:
            build()

    # ------------------------------------------------------------------ build

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """A tokenizer from GGUF metadata: ``key -> value``, arrays as lists or numpy arrays."""
        model_type = meta.get("tokenizer.ggml.model")
        if model_type == "gpt2":
            pre = pretokenizer_for(meta.get("tokenizer.ggml.pre"))
            vocab = load_vocab(meta, pre_add_bos=pre.add_bos, pre_has_bos=pre.has_bos)
            merges = meta.get("tokenizer.ggml.merges")
            if merges is None:
                # llama.cpp loads a Kimi-K2 vocabulary without merges (llama_vocab::impl::load:
                # is_kimi_k2); its words then become single-character and byte tokens.
                if pre.name != "kimi-k2":
                    raise GGUFError("byte-level BPE GGUF has no tokenizer.ggml.merges")
                merges = []
            merges = tuple(merges.tolist() if hasattr(merges, "tolist") else merges)
            return cls(vocab, ByteLevelBPE(vocab.token_to_id, merges, pre))
        if model_type == "llama":
            vocab = load_vocab(meta)
            return cls(vocab, SentencePieceBPE(vocab))
        if model_type == "gemma4":
            vocab = load_vocab(meta)
            merges = meta.get("tokenizer.ggml.merges")
            if merges is None:
                raise GGUFError("a gemma4 tokenizer GGUF has no tokenizer.ggml.merges")
            merges = tuple(merges.tolist() if hasattr(merges, "tolist") else merges)
            return cls(vocab, SentencePieceStyleBPE(vocab.token_to_id, merges))
        if model_type == "t5":
            vocab = load_vocab(meta)
            charsmap = meta.get("tokenizer.ggml.precompiled_charsmap")
            if charsmap is not None and not (hasattr(charsmap, "dtype") and charsmap.dtype.kind in "iu"
                                             and charsmap.dtype.itemsize == 1):
                raise GGUFError("tokenizer.ggml.precompiled_charsmap must be an array of bytes")
            return cls(vocab, Unigram(vocab, None if charsmap is None else charsmap.astype("u1").tobytes()))
        if model_type == "bert":
            vocab = load_vocab(meta)
            unk_id = check_wordpiece_vocab(vocab)
            lowercase, strip_accents = wordpiece_options(meta)
            return cls(vocab, WordPiece(vocab.token_to_id, unk_id, lowercase=lowercase,
                                        strip_accents=strip_accents))
        raise unsupported_model(model_type)

    # ----------------------------------------------------------------- encode

    @property
    def unk_id(self) -> Optional[int]:
        return self._vocab.unk_id

    @property
    def add_space_prefix(self) -> bool:
        return self._vocab.add_space_prefix

    @property
    def special_flags(self) -> tuple[bool, bool, bool]:
        """``(add_bos, add_eos, add_sep)`` as llama.cpp's ``llama_vocab_get_add_*``
        report them: the vocabulary's own, which for WordPiece differ from
        what :meth:`encode` adds (llama.cpp's WordPiece adds [CLS] and [SEP]
        whatever they say)."""
        return self._vocab.add_bos, self._vocab.add_eos, self._vocab.add_sep

    def encode(self, text: TextInput, *, add_bos: Optional[bool] = None,
               add_eos: Optional[bool] = None, special: bool = False) -> list[int]:
        """Token ids of ``text``.

        ``add_bos`` / ``add_eos`` default to the model's own settings.  With
        ``special=True`` the text of control tokens (``<|im_start|>``,
        ``<start_of_turn>``, ...) becomes those tokens; otherwise it is plain text.
        For WordPiece, ``add_bos`` adds [CLS] and ``add_eos`` [SEP]; ``add_eos``
        then defaults to ``add_bos``, as llama.cpp adds both or neither.
        """
        add_bos = self.add_bos if add_bos is None else add_bos
        if add_eos is None:
            add_eos = add_bos if self._wpm else self.add_eos
        bos_id, end_id = self.bos_id, self._end_id
        if add_bos and bos_id is None:
            raise InvalidArgumentError("add_bos=True, but this model has no BOS token")
        if add_eos and end_id is None:
            raise InvalidArgumentError("add_eos=True, but this model has no EOS token")
        raw = normalize_input(text, keep_raw_bytes=self._raw_bytes)

        out: list[int] = [bos_id] if add_bos and bos_id is not None else []
        fragments = (self._split_special if special else self._split_plain).split(raw)
        model = self._model
        if self._spm:
            # llama.cpp puts a space before the first fragment and before every
            # fragment that follows a special token, when add_space_prefix is set.
            prefix = self._vocab.add_space_prefix
            after_special = True
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                    after_special = True
                else:
                    model.encode(" " + fragment if prefix and after_special else fragment, out)
                    after_special = False
        else:
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                else:
                    model.encode(fragment, out)
        if add_eos and end_id is not None:
            out.append(end_id)
        return out

    # ----------------------------------------------------------------- decode

    def token_text(self, token_id: int) -> str:
        """The raw vocabulary piece of ``token_id`` (e.g. ``"Ġhello"``, ``"▁the"``)."""
        return self._vocab.tokens[self._check_id(token_id)]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for inside a text (its leading space
        kept); b"" for a control token."""
        return self._decode_continue([self._check_id(token_id)], False, [2])

    def decode(self, ids: Iterable[int], *, special: bool = False) -> bytes:
        """The bytes ``ids`` stand for: each token's piece, concatenated.

        Control tokens give their text only with ``special=True``.  For a
        vocabulary with ``add_space_prefix``, the space that :meth:`encode` puts
        in front of the text is dropped again (from the first piece after an
        optional leading BOS).  For WordPiece, as llama-cpp-python's
        ``detokenize``: when ``ids`` start with [CLS] (BOS), a space that the
        text then starts with is dropped.  Raises :class:`InvalidTokenError` for an id
        outside ``[0, n_vocab)``.
        """
        return self._decode_continue(ids, special, self._leading_space_state())

    def stream_decoder(self, *, special: bool = False) -> StreamDecoder:
        """A :class:`StreamDecoder` that yields text as ids arrive."""
        return StreamDecoder(self._decode_continue, self._leading_space_state, special=special)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def special_id(self, name: str) -> Optional[int]:
        """The id of the special token llama.cpp calls ``name`` (``"fim_pre"``,
        ``"fim_suf"``, ``"fim_mid"``, ``"eot"``, ``"sep"``, ...), from the GGUF
        metadata or recognized by its text; None when the vocabulary has none."""
        return self._vocab.special_ids.get(name)

    # -------------------------------------------------------------- internals

    def _check_id(self, token_id: int) -> int:
        try:
            index = operator.index(token_id)
        except TypeError:
            raise InvalidTokenError(f"token id must be an integer, not {type(token_id).__name__}") from None
        if not 0 <= index < self.n_vocab:
            raise InvalidTokenError(f"token id {index} is outside [0, {self.n_vocab})")
        return index

    def _leading_space_state(self) -> list[int]:
        # [0]: 0 = nothing decoded yet, 1 = only a BOS so far (WordPiece: the
        # ids began with BOS and no text came yet), 2 = past the start.
        return [0 if self._vocab.add_space_prefix or self._wpm else 2]

    def _decode_continue(self, ids: Iterable[int], special: bool, state: list[int]) -> bytes:
        if self._pieces is None:
            self._pieces = build_pieces(self._vocab)
        table = self._pieces[1] if special else self._pieces[0]
        if not isinstance(ids, list):
            try:
                ids = list(ids)
            except TypeError:
                raise InvalidTokenError(f"token ids must be a sequence of integers, not {type(ids).__name__}") from None
        if not ids:
            return b""
        try:
            in_range = 0 <= min(ids) and max(ids) < self.n_vocab
            pieces = [table[i] for i in ids] if in_range else None
        except TypeError:
            pieces = None
        if pieces is None:  # find the offending id and say which
            for token_id in ids:
                self._check_id(token_id)
            raise InvalidTokenError(f"invalid token ids: {ids!r}")  # pragma: no cover
        if state[0] != 2:
            (self._strip_text_leading_space if self._wpm else self._strip_leading_space)(ids, pieces, state)
        return b"".join(pieces)

    def _strip_leading_space(self, ids: list[int], pieces: list[bytes], state: list[int]) -> None:
        """Drop the space encode() added in front of the text (add_space_prefix vocabularies)."""
        for k, token_id in enumerate(ids):
            if state[0] == 0 and token_id == self.bos_id:
                state[0] = 1
                continue
            state[0] = 2
            if pieces[k].startswith(b" "):
                pieces[k] = pieces[k][1:]
            return

    def _strip_text_leading_space(self, ids: list[int], pieces: list[bytes], state: list[int]) -> None:
        """llama-cpp-python's rule: ids that start with BOS lose the space their text starts with."""
        for k, token_id in enumerate(ids):
            if state[0] == 0:
                if token_id != self.bos_id:
                    state[0] = 2
                    return
                state[0] = 1
            if pieces[k]:  # the first byte of the text
                state[0] = 2
                if pieces[k].startswith(b" "):
                    pieces[k] = pieces[k][1:]
                return
