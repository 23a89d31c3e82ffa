"""Small synthetic WordPiece (``tokenizer.ggml.model = "bert"``) vocabularies, written as vocab-only GGUFs.

Shared by tests/test_tokenizer_wpm.py and its DEV-ONLY llama.cpp side,
tests/support/fixtures/make_wpm_fixtures.py (run under the reference python), so it
needs only ``gguf`` and the standard library.  Pieces are written as GGUF BERT
vocabularies write them: a word start with a leading "▁" (U+2581), a
continuation ("##ing" in vocab.txt) bare, special tokens as they are.
"""
from __future__ import annotations

import functools
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


# ------------------------------------------------------------------ probes: one code point at a time

#: normalizer options (lowercase, strip_accents) of the probe vocabularies
# (Lowercasing alone is left out to keep the test short: probe_uncased lowercases too.)
PROBES = {"probe_uncased": (True, True), "probe_cased": (False, False)}
# llama.cpp's CJK ranges end and begin here; a code point on each side of each edge is probed.
_CJK_EDGES = (0x3400, 0x4DBF, 0x4E00, 0x9FFF, 0xF900, 0xFAFF, 0x20000, 0x2A6DF, 0x2A700, 0x2B73F, 0x2B740,
              0x2B81F, 0x2B920, 0x2CEAF, 0x2F800, 0x2FA1F)


@functools.cache
def probe_code_points() -> tuple[int, ...]:
    """Every code point of the BMP but the surrogates, and of the others every 61st, a few
    chosen ones (a mark, a tag, emoji, private use) and the CJK range edges."""
    cps = {cp for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF}
    cps.update(range(0x10000, 0x110000, 61))
    cps.update((0x1D165, 0x1F3FB, 0x1F600, 0xE0001, 0xE0041, 0xF0000, 0x10FFFD))
    cps.update(cp + d for cp in _CJK_EDGES for d in (-1, 0, 1))
    return tuple(sorted(cps))


def probe_text(cp: int) -> str:
    return "a" + chr(cp) + "a"


@functools.cache
def _probe_spec(name: str) -> dict:
    """[UNK], [CLS], [SEP], "▁" and every probed character as a piece of its own."""
    lowercase, strip_accents = PROBES[name]
    tokens = [("[UNK]", CONTROL), ("[CLS]", CONTROL), ("[SEP]", CONTROL), (SPACE_MARK, NORMAL)]
    tokens += [(chr(cp), NORMAL) for cp in probe_code_points() if chr(cp) != SPACE_MARK]
    return _spec(tokens, unknown_token_id=0, bos_token_id=1, seperator_token_id=2,
                 **{"normalizer.lowercase": lowercase, "normalizer.strip_accents": strip_accents})


def probe_summary(tokens: list[str], encode) -> list[list]:
    """What ``encode(probe_text(cp))`` gives for every probed cp, as runs ``[first, last, kind, arg]``
    of consecutive probed code points alike: kind "drop" (the character is removed), "space"
    (it separates words), "alone" (a word of its own) or "join" (part of the word), arg the
    offset from cp of the character it became; anything else is kind "ids" with the token texts."""
    runs: list[list] = []
    for cp in probe_code_points():
        texts = [tokens[i] for i in encode(probe_text(cp))]
        if texts == [SPACE_MARK, "a", "a"]:
            kind, arg = "drop", 0
        elif texts == [SPACE_MARK, "a", SPACE_MARK, "a"]:
            kind, arg = "space", 0
        elif len(texts) == 6 and texts[:3] == [SPACE_MARK, "a", SPACE_MARK] and texts[4:] == [SPACE_MARK, "a"] \
                and len(texts[3]) == 1:
            kind, arg = "alone", ord(texts[3]) - cp
        elif len(texts) == 4 and texts[:2] == [SPACE_MARK, "a"] and texts[3] == "a" and len(texts[2]) == 1:
            kind, arg = "join", ord(texts[2]) - cp
        else:
            kind, arg = "ids", "|".join(texts)
        if runs and runs[-1][2:] == [kind, arg]:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, kind, arg])
    return runs


def _spec_of(name: str) -> dict:
    return _probe_spec(name) if name in PROBES else VOCABS[name]


def digest(name: str) -> str:
    """What a stored fixture records of the vocabulary it was made on."""
    return hashlib.sha256(json.dumps(_spec_of(name), sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def metadata(name: str) -> dict[str, Any]:
    """The vocabulary as the ``key -> value`` dict ``Tokenizer.from_metadata`` reads."""
    spec = _spec_of(name)
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
