"""The checks of the ``tokenizer.ggml.*`` keys that the tokenizer then trusts blindly."""
from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import NoReturn

import numpy as np

from .file import GGUFFile, LazyStrings
from .format import GGUFValueType
from .short_holds import set_in_slices

_TOKENIZER_PREFIX = "tokenizer.ggml."
_SPECIAL_TOKEN_KEY = re.compile(r"tokenizer\.ggml\.\w+_token_id")
# The tokenizer's flags; llama.cpp refuses a file where one is not a BOOL.
_TOKENIZER_FLAGS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                    "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix",
                    "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
TOKEN_TYPE_BYTE = 6  # llama_token_type LLAMA_TOKEN_TYPE_BYTE


def validate_tokenizer_metadata(gguf: GGUFFile) -> bytes:
    """Check the ``tokenizer.ggml.*`` keys that the tokenizer trusts blindly.

    Raises GGUFMetadataError naming the key, the offset of its value and,
    for array entries, the index.  Checks: tokens are STRING, scores FLOAT32,
    token_type INT32 and merges STRING arrays; scores and token_type have one
    entry per token; every ``tokenizer.ggml.*_token_id`` is a UINT32 (as
    llama.cpp requires) in ``[0, n_vocab)``; ``tokenizer.ggml.pre`` is a
    STRING and the ``add_bos_token``/``add_eos_token``/``add_sep_token``/``add_space_prefix``
    flags and the WordPiece ``normalizer.lowercase``/``normalizer.strip_accents``
    options are BOOLs, as llama.cpp requires; every BYTE-type token reads
    ``<0xNN>`` with two hex digits; and for a ``gpt2`` (byte-level BPE)
    vocabulary every merge is ``"A B"`` with A, B and AB in the vocabulary.
    A file without ``tokenizer.ggml.tokens`` passes only if its tokenizer
    model is absent or ``"none"``.

    Tokenizer metadata that passed once in this process passes again without
    the checks (:func:`tokenizer_digest`): a server that unloads a model and loads
    it again spends no Python on them, beside the models it is running.
    Returns that digest.
    """
    digest = tokenizer_digest(gguf)
    with _passed_lock:
        if digest in _passed:
            _passed.move_to_end(digest)
            return digest
    _validate(gguf)
    with _passed_lock:
        _passed[digest] = None
        while len(_passed) > _PASSED_KEPT:
            _passed.popitem(last=False)
    return digest


#: digests of the tokenizer metadata that passed, most recent last
_passed: OrderedDict[bytes, None] = OrderedDict()
_passed_lock = threading.Lock()
_PASSED_KEPT = 64


def tokenizer_digest(gguf: GGUFFile) -> bytes:
    """A digest of every ``tokenizer.ggml.*`` key of ``gguf``: its name, its GGUF types and its
    value (a string array as the file's bytes, while they have not been decoded).  It covers
    all that :func:`validate_tokenizer_metadata` reads, so equal digests pass or fail alike,
    whatever file or path they came from.  hashlib lets go of the GIL over the big arrays."""
    digest = hashlib.blake2b(digest_size=32)
    for key in sorted(k for k in gguf.metadata if k.startswith(_TOKENIZER_PREFIX)):
        value = gguf.metadata[key]
        digest.update(f"{key}\0{gguf._value_types[key]}\0{type(value).__name__}\0".encode())
        if isinstance(value, LazyStrings):
            value.update_digest(digest)
        elif isinstance(value, np.ndarray):
            digest.update(f"{value.dtype.str}{value.shape}\0".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        else:
            digest.update(repr(value).encode("utf-8", "surrogatepass"))
        digest.update(b"\0\0")
    return digest.digest()


def _validate(gguf: GGUFFile) -> None:
    model = gguf.expect_scalar("tokenizer.ggml.model", GGUFValueType.STRING, required=False)
    tokens = gguf.expect_array(
        "tokenizer.ggml.tokens", GGUFValueType.STRING, required=model not in (None, "none")
    )
    if tokens is None:
        return
    n_vocab = len(tokens)
    if n_vocab == 0:
        gguf._fail("tokenizer.ggml.tokens", "vocabulary is empty")
    gguf.expect_scalar("tokenizer.ggml.pre", GGUFValueType.STRING, required=False)
    for key in _TOKENIZER_FLAGS:
        gguf.expect_scalar(key, GGUFValueType.BOOL, required=False)

    scores = gguf.expect_array("tokenizer.ggml.scores", GGUFValueType.FLOAT32, required=False)
    if scores is not None and len(scores) != n_vocab:
        gguf._fail("tokenizer.ggml.scores", f"has {len(scores)} entries for {n_vocab} tokens")

    token_types = gguf.expect_array("tokenizer.ggml.token_type", GGUFValueType.INT32, required=False)
    if token_types is not None:
        if len(token_types) != n_vocab:
            gguf._fail("tokenizer.ggml.token_type", f"has {len(token_types)} entries for {n_vocab} tokens")
        for index in np.flatnonzero(token_types == TOKEN_TYPE_BYTE).tolist():
            if not _BYTE_TOKEN.fullmatch(tokens[index]):
                gguf._fail("tokenizer.ggml.tokens",
                           f"byte token {tokens[index]!r} is not of the form <0xNN>", index=index)

    for key in gguf.metadata:
        if _SPECIAL_TOKEN_KEY.fullmatch(key):
            token_id = gguf.expect_scalar(key, GGUFValueType.UINT32)
            if token_id >= n_vocab:
                gguf._fail(key, f"token id {token_id} is outside the vocabulary [0, {n_vocab})")

    merges = gguf.expect_array("tokenizer.ggml.merges", GGUFValueType.STRING, required=False)
    if merges is not None and model == "gpt2":
        _check_merges(gguf, tokens, merges)


def _check_merges(gguf: GGUFFile, tokens: list[str], merges: list[str]) -> None:
    # llama.cpp splits a merge at its first space after the first character,
    # so a merge may start with a literal space; partition() is the fast path
    # (about 0.1 s for Qwen2's 151k merges would otherwise become 0.15 s).
    vocab = set_in_slices(tokens)
    for index, merge in enumerate(merges):
        left, space, right = merge.partition(" ")
        if not left and space:
            split = merge.find(" ", 1)
            left, space, right = (merge[:split], " ", merge[split + 1:]) if split > 0 else ("", "", "")
        if not space or left not in vocab or right not in vocab or left + right not in vocab:
            _fail_merge(gguf, vocab, index, left, space, right)


def _fail_merge(gguf: GGUFFile, vocab: set[str], index: int, left: str, space: str, right: str) -> NoReturn:
    merge = gguf.metadata["tokenizer.ggml.merges"][index]
    if not space:
        gguf._fail("tokenizer.ggml.merges", f"merge {merge!r} is not of the form 'A B'", index=index)
    missing = next(t for t in (left, right, left + right) if t not in vocab)
    gguf._fail("tokenizer.ggml.merges",
               f"merge {merge!r} uses {missing!r}, which is not in the vocabulary", index=index)
