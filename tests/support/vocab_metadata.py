"""Borrow a real model's vocabulary for a synthetic GGUF.

llama.cpp refuses a file without a tokenizer, so the synthetic models that are
compared with llama.cpp (tests/support/fixtures/make_arch_fixtures.py and
tests/test_arch_llamacpp.py) carry SmolLM2's: every ``tokenizer.ggml.*`` key
(model gpt2, pre, tokens, token_type, merges, special ids, flags), copied with
its GGUF type.  The model's ``n_vocab`` must then be ``len(tokens)`` (49152)
so that token_embd/output have the shapes the vocabulary implies.

Imported by the DEV-ONLY generator (run in the llama-cpp-python venv) and by
the test, so it needs only ``gguf`` and the standard library.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

import gguf

PREFIX = "tokenizer.ggml."


@functools.lru_cache(maxsize=2)
def read_vocab_metadata(path: str | os.PathLike) -> tuple[tuple[str, Any, gguf.GGUFValueType, Any], ...]:
    """``(key, value, type, array element type or None)`` for each ``tokenizer.ggml.*`` key, in file order."""
    reader = gguf.GGUFReader(str(path))
    out = []
    for key, field in reader.fields.items():
        if not key.startswith(PREFIX) or not field.types:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        value = field.contents()
        out.append((key, tuple(value) if isinstance(value, list) else value, vtype, sub))
    if not any(k == PREFIX + "tokens" for k, *_ in out):
        raise ValueError(f"{path}: no {PREFIX}tokens")
    return tuple(out)


def vocab_size(path: str | os.PathLike) -> int:
    return len(dict((k, v) for k, v, *_ in read_vocab_metadata(path))[PREFIX + "tokens"])


def vocab_writer(path: str | os.PathLike, extra_tokens: tuple[str, ...] = ()) -> Callable[[gguf.GGUFWriter], None]:
    """A callback for ``synthetic.write_model(..., extra_metadata=...)`` that writes the vocabulary of ``path``,
    with ``extra_tokens`` appended as control tokens (a fine-tune's added special tokens, as
    SmolVLM adds its image markers to SmolLM2's vocabulary); n_vocab grows by their number."""
    items = read_vocab_metadata(path)
    extra_types = {PREFIX + "tokens": tuple(extra_tokens), PREFIX + "token_type": (3,) * len(extra_tokens)}

    def add(writer: gguf.GGUFWriter) -> None:
        for key, value, vtype, sub in items:
            if vtype == gguf.GGUFValueType.ARRAY:
                value = list(value) + list(extra_types.get(key, ()))
            writer.add_key_value(key, value, vtype, sub)

    return add
