"""Small synthetic WordPiece (``tokenizer.ggml.model = "bert"``) vocabularies, written as vocab-only GGUFs.

Shared by tests/test_tokenizer_wpm.py and its DEV-ONLY llama.cpp side,
tests/fixtures/make_wpm_fixtures.py (run under the reference python), so it
needs only ``gguf`` and the standard library.  Pieces are written as GGUF BERT
vocabularies write them: a word start with a leading "▁" (U+2581), a
continuation ("##ing" in vocab.txt) bare, special tokens as they are.
"""
from __future__ import annotations

import hashlib
import json
import string
from pathlib import Path
from typing import Any

import gguf

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE_MARK = "\u2581"
KEY = "tokenizer.ggml."

_SPECIALS = [("[PAD]", CONTROL), ("[UNK]", CONTROL), ("[CLS]", CONTROL), ("[SEP]", CONTROL), ("[MASK]", CONTROL)]
_ALPHABET = string.ascii_lowercase + string.digits
_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "un", "play",
          "caf", "na", "token", "i", "don", "it", "is", "a", "an", "of", "to", "in", "em", "bed", "price",
          "straße", "日", "本", "語", "中", "文", "。", "，", "「", "」", "…", "€", "°", "½", "²", "ß", "ı", "σ",
          "ς", "ω", "οδοσ", "οδος", "ᄒ", "ᄀ", "ᄋ", "한", "국", "어", "i\u0307", "k", "\u2581", "fi", "\ufb01",
          "😀"]
# "ᄀ", "ᄋ": what is left of 국 and 어 once llama.cpp's strip_accents keeps the first code point of their NFD.
_PIECES = ["ing", "ed", "aff", "able", "iz", "ation", "er", "s", "ly", "ve", "ï", "lo", "ld", "ding", "ce",
           "ᄀ", "ᄋ", "국", "어"]
_CASED = ["Hello", "World", "The", "Caf", "Na", "É", "Ü", "Ñ", "İ", "Σ", "Ω", "K"]
_CASED_PIECES = ["é", "ü", "ñ", "ï", "É", "ο", "Σ", "ς"]


def _pieces(words: list[str], continuations: list[str]) -> list[str]:
    out = [SPACE_MARK + c for c in _ALPHABET + string.punctuation]
    out += [SPACE_MARK + w for w in words]
    out += list(_ALPHABET) + continuations
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def _spec(tokens: list[tuple[str, int]], **keys: Any) -> dict:
    return {"tokens": [t for t, _ in tokens], "token_type": [k for _, k in tokens], "keys": keys}


def _uncased() -> dict:
    """bert-base-uncased style, ids as today's converter writes them (bos = [CLS], eos = [SEP])."""
    tokens = _SPECIALS + [("[NEW]", USER_DEFINED), ("[unused0]", UNUSED)]
    tokens += [(p, NORMAL) for p in _pieces(_WORDS, _PIECES)]
    return _spec(tokens, bos_token_id=2, eos_token_id=3, unknown_token_id=1, seperator_token_id=3,
                 padding_token_id=0, mask_token_id=4, cls_token_id=2, add_bos_token=True, add_eos_token=True)


def _cased(lowercase: bool, strip_accents: bool | None) -> dict:
    tokens = _SPECIALS + [(p, NORMAL) for p in _pieces(_WORDS + _CASED, _PIECES + _CASED_PIECES
                                                        + list(string.ascii_uppercase))]
    keys: dict[str, Any] = {"bos_token_id": 2, "unknown_token_id": 1, "seperator_token_id": 3,
                            "padding_token_id": 0, "mask_token_id": 4, "normalizer.lowercase": lowercase}
    if strip_accents is not None:
        keys["normalizer.strip_accents"] = strip_accents
    return _spec(tokens, **keys)


def _defaults() -> dict:
    """No special-token ids at all: llama.cpp's defaults (bos 101, unk 100, sep 102, pad 0, mask 103)
    apply.  cls_token_id, which llama.cpp does not read, and add_bos/add_eos = false, which its
    WordPiece tokenize ignores, are there to show it."""
    tokens = [("[PAD]", CONTROL)] + [(f"[unused{i}]", NORMAL) for i in range(99)]
    tokens += [("[UNK]", CONTROL), ("[CLS]", CONTROL), ("[SEP]", CONTROL), ("[MASK]", CONTROL)]
    tokens += [(p, NORMAL) for p in _pieces(_WORDS, _PIECES)]
    return _spec(tokens, cls_token_id=5, add_bos_token=False, add_eos_token=False)


VOCABS: dict[str, dict] = {
    "uncased": _uncased(),
    "cased": _cased(lowercase=False, strip_accents=None),
    "cased_strip_accents": _cased(lowercase=False, strip_accents=True),
    "lowercase_keep_accents": _cased(lowercase=True, strip_accents=False),
    "defaults": _defaults(),
}


def digest(name: str) -> str:
    """What a stored fixture records of the vocabulary it was made on."""
    return hashlib.sha256(json.dumps(VOCABS[name], sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def metadata(name: str) -> dict[str, Any]:
    """The vocabulary as the ``key -> value`` dict ``Tokenizer.from_metadata`` reads."""
    spec = VOCABS[name]
    meta = {KEY + "model": "bert", KEY + "pre": "default", KEY + "tokens": list(spec["tokens"]),
            KEY + "token_type": list(spec["token_type"])}
    meta.update({KEY + k: v for k, v in spec["keys"].items()})
    return meta


def write_gguf(path: Path, name: str) -> Path:
    """A tensor-less GGUF holding the vocabulary (llama.cpp loads it with vocab_only)."""
    return write_metadata(path, metadata(name))


def write_metadata(path: Path, meta: dict[str, Any]) -> Path:
    """A tensor-less GGUF of ``meta``: bools, ints as UINT32, strings, the token list, INT32 arrays."""
    writer = gguf.GGUFWriter(str(path), "bert")
    for key, value in meta.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif key == KEY + "tokens":
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
