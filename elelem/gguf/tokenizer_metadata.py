"""The checks of the ``tokenizer.ggml.*`` keys that the tokenizer then trusts blindly."""
from __future__ import annotations

import re
from typing import NoReturn

import numpy as np

from .file import GGUFFile
from .format import GGUFValueType

_SPECIAL_TOKEN_KEY = re.compile(r"tokenizer\.ggml\.\w+_token_id")
# The tokenizer's flags; llama.cpp refuses a file where one is not a BOOL.
_TOKENIZER_FLAGS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                    "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix",
                    "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
TOKEN_TYPE_BYTE = 6  # llama_token_type LLAMA_TOKEN_TYPE_BYTE


def validate_tokenizer_metadata(gguf: GGUFFile) -> None:
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
    """
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
    vocab = set(tokens)
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
