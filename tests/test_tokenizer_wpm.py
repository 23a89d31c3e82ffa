"""The WordPiece tokenizer (``tokenizer.ggml.model = "bert"``): hand-checked cases, and llama.cpp's ids and text
on the synthetic vocabularies of tests/support/wpm_vocabs.py (llama-cpp-python 0.3.36, tests/support/fixtures/make_wpm_fixtures.py)."""
from __future__ import annotations

import pytest

import wpm_vocabs
from elelem.errors import GGUFError, GGUFMetadataError
from elelem.gguf.reader import read_gguf, validate_tokenizer_metadata
from elelem.text.tokenizer import Tokenizer
from elelem.text.tokenizer.wpm import split_words

NORMAL, CONTROL, USER_DEFINED, BYTE = wpm_vocabs.NORMAL, wpm_vocabs.CONTROL, wpm_vocabs.USER_DEFINED, wpm_vocabs.BYTE

# ------------------------------------------------------------------ a vocabulary small enough to read

TINY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",           # 0-4, control
        "▁hello", "▁world", "▁,", "▁!", "▁un", "aff", "able",      # 5-11
        "▁play", "▁p", "ing", "▁caf", "e", "é", "▁中", "▁文", "<x>"]  # 12-20; <x> user-defined
TINY_TYPES = [CONTROL] * 5 + [NORMAL] * 15 + [USER_DEFINED]


def tiny(**keys) -> Tokenizer:
    meta = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": TINY, "tokenizer.ggml.token_type": TINY_TYPES,
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.seperator_token_id": 3,
            "tokenizer.ggml.unknown_token_id": 1, "tokenizer.ggml.padding_token_id": 0,
            "tokenizer.ggml.mask_token_id": 4}
    meta.update({"tokenizer.ggml." + k: v for k, v in keys.items()})
    return Tokenizer.from_metadata(meta)


def test_hello_world_by_hand():
    tok = tiny()
    # lowercased; "," and "!" are words of their own; [CLS] ... [SEP] by default
    assert tok.encode("Hello, world!") == [2, 5, 7, 6, 8, 3]
    assert tok.encode("Hello, world!", add_bos=False) == [5, 7, 6, 8]
    assert tok.encode("Hello, world!", add_bos=True, add_eos=False) == [2, 5, 7, 6, 8]
    assert tok.decode([2, 5, 7, 6, 8, 3]) == b"hello , world !"
    assert tok.decode([5, 7, 6, 8]) == b" hello , world !"  # without [CLS] the space stays, as in llama-cpp-python
    assert tok.decode([2, 5, 7, 6, 8, 3], special=True) == b"[CLS] hello , world ![SEP]"


def test_greedy_longest_match_and_unknown_words():
    tok = tiny()
    assert tok.encode("unaffable", add_bos=False) == [9, 10, 11]
    assert tok.encode("playing", add_bos=False) == [12, 14]      # "▁play" before "▁p"
    assert tok.encode("pl", add_bos=False) == [1]                 # "▁p" then no "l": the whole word is [UNK]
    assert tok.encode("hello xyz world", add_bos=False) == [5, 1, 6]
    assert tok.encode("中文", add_bos=False) == [18, 19]          # each ideograph is a word
    assert tok.encode("", add_bos=False) == [] and tok.encode("") == [2, 3]
    assert tok.encode(" \t\n ", add_bos=False) == []


def test_normalizer_options():
    # default: lowercase, and strip accents (first code point of the NFD, marks dropped)
    assert tiny().encode("CAFÉ", add_bos=False) == [15, 16]
    assert tiny().encode("cafe\u0301", add_bos=False) == [15, 16]
    keep = tiny(**{"normalizer.strip_accents": False})
    assert keep.encode("CAFÉ", add_bos=False) == [15, 17]
    cased = tiny(**{"normalizer.lowercase": False})             # strip_accents follows lowercase: off
    assert cased.encode("Hello", add_bos=False) == [1] and cased.encode("café", add_bos=False) == [15, 17]
    assert split_words("ΟΔΟΣ İ", lowercase=True, strip_accents=False) == ["οδοσ", "i"]  # simple mapping
    assert split_words("a\x00b\u200dc\ue000d\ufffde", lowercase=True, strip_accents=True) == ["abcde"]
    assert split_words("a\u00a0b\u3000c", lowercase=True, strip_accents=True) == ["a", "b", "c"]
    assert split_words("x$y+z_w", lowercase=True, strip_accents=True) == ["x", "$", "y", "+", "z", "_", "w"]
    assert split_words("한", lowercase=True, strip_accents=True) == ["\u1112"]  # llama.cpp keeps one jamo


def test_special_tokens():
    tok = tiny()
    assert tok.encode("[MASK] hello", add_bos=False, special=True) == [4, 5]
    assert tok.encode("[MASK]", add_bos=False) == [1, 1, 1]       # plain text: "[", "mask", "]", none in TINY
    assert tok.encode("hello<x>world", add_bos=False) == [5, 20, 6]  # user-defined: always split out
    assert tok.decode([4], special=False) == b"" and tok.decode([4], special=True) == b"[MASK]"
    assert tok.special_id("sep") == 3 and tok.special_id("mask") == 4 and tok.unk_id == 1


def test_stream_decoder_agrees_with_decode():
    tok = tiny()
    for ids in ([2, 5, 7, 6, 8, 3], [5, 6], [2, 3, 5], [2, 2, 5], [2, 0, 6]):
        stream = tok.stream_decoder()
        assert "".join(stream.feed(i) for i in ids) + stream.flush() == tok.decode(ids).decode()


def test_malformed_vocabularies_raise_gguf_error():
    with pytest.raises(GGUFError, match=r"no \[UNK\]"):
        tiny(unknown_token_id=None)                               # and the default 100 is outside
    with pytest.raises(GGUFError, match=r"no \[SEP\]"):
        tiny(seperator_token_id=None)
    with pytest.raises(GGUFError, match=r"no \[CLS\]"):
        tiny(bos_token_id=None)
    with pytest.raises(GGUFError, match="byte tokens"):
        Tokenizer.from_metadata({**wpm_vocabs.metadata("uncased"),
                                 "tokenizer.ggml.token_type": [BYTE] + wpm_vocabs.VOCABS["uncased"]["token_type"][1:]})
    with pytest.raises(GGUFError, match="must be a bool"):
        tiny(**{"normalizer.lowercase": 1})
    with pytest.raises(GGUFError, match="token_type has"):
        tiny(token_type=TINY_TYPES[:-1])


def test_gguf_validation_of_bert_vocabularies(tmp_path):
    path = wpm_vocabs.write_gguf(tmp_path / "uncased.gguf", "uncased")
    gguf = read_gguf(path)
    validate_tokenizer_metadata(gguf)                             # what LLM does before building the tokenizer
    from_file, from_dict = Tokenizer.from_metadata(gguf.metadata), Tokenizer.from_metadata(wpm_vocabs.metadata("uncased"))
    for text in ("Hello, world!", "[CLS] Café 中文 [NEW] qqq", "  ", "İ ΟΔΟΣ 한국어"):
        assert from_file.encode(text, special=True) == from_dict.encode(text, special=True)

    for key, bad in (("tokenizer.ggml.unknown_token_id", 10_000), ("tokenizer.ggml.normalizer.lowercase", "yes")):
        wpm_vocabs.write_metadata(tmp_path / "bad.gguf", {**wpm_vocabs.metadata("uncased"), key: bad})
        with pytest.raises(GGUFMetadataError, match=key.replace(".", r"\.")):
            validate_tokenizer_metadata(read_gguf(tmp_path / "bad.gguf"))


def test_add_eos_appends_sep_without_an_eos_token():
    tok = tiny()
    assert tok.eos_id is None and tok.add_bos and tok.add_eos
    assert tok.encode("hello", add_bos=False, add_eos=True) == [5, 3]


# ------------------------------------------------------------------ llama.cpp's ids and text

MODES = {
    "ids": dict(add_bos=False),
    "ids_add_bos": dict(),                 # llama.cpp's add_special: [CLS] ... [SEP]
    "ids_parse_special": dict(add_bos=False, special=True),
    "ids_add_bos_special": dict(add_bos=True, special=True),
}


@pytest.fixture(scope="module")
def reference(llamacpp):
    return llamacpp.wordpiece()


@pytest.mark.parametrize("name", list(wpm_vocabs.VOCABS))
def test_matches_llama_cpp(reference, name):
    ref = reference["vocabs"][name]
    tok = Tokenizer.from_metadata(wpm_vocabs.metadata(name))
    cases = ref["cases"]
    assert len(cases) >= 120
    for mode, kwargs in MODES.items():
        bad = [(c["text"], tok.encode(c["text"], **kwargs), c[mode]) for c in cases
               if tok.encode(c["text"], **kwargs) != c[mode]]
        assert not bad, f"{mode}: {len(bad)}/{len(cases)} differ, first: {bad[:3]}"
    for key, ids_key, special in (("text_hex", "ids_add_bos", False), ("text_plain_hex", "ids", False),
                                  ("text_special_hex", "ids_add_bos_special", True)):
        bad = [(c["text"], tok.decode(c[ids_key], special=special), bytes.fromhex(c[key])) for c in cases
               if tok.decode(c[ids_key], special=special).hex() != c[key]]
        assert not bad, f"{key}: {len(bad)}/{len(cases)} differ, first: {bad[:3]}"
    for case in ref["bytes_cases"]:
        assert tok.encode(bytes.fromhex(case["bytes_hex"]), add_bos=False) == case["ids"], case["kind"]


@pytest.mark.parametrize("name", list(wpm_vocabs.VOCABS))
def test_special_ids_match_llama_cpp(reference, name):
    facts = reference["vocabs"][name]["vocab"]
    tok = Tokenizer.from_metadata(wpm_vocabs.metadata(name))
    null = lambda i: -1 if i is None else i  # noqa: E731  llama.cpp's LLAMA_TOKEN_NULL
    assert (tok.n_vocab, tok.bos_id, null(tok.eos_id)) == (facts["n_vocab"], facts["bos"], facts["eos"])
    assert [null(tok.special_id(n)) for n in ("sep", "pad", "mask")] == [facts["sep"], facts["pad"], facts["mask"]]
    assert sorted(tok.eog_ids) == facts["eog_ids"]  # [PAD] among them: llama.cpp takes it for Kimi-K2's FIM pad
    # Whatever the GGUF's add_bos/add_eos say (false for "defaults"), llama.cpp's
    # WordPiece tokenize adds [CLS] and [SEP] with add_special; so does encode() by default.
    assert tok.add_bos and tok.add_eos
    assert facts["add_bos"] == (name != "defaults")


@pytest.mark.parametrize("name", list(wpm_vocabs.PROBES))
def test_every_code_point_matches_llama_cpp(reference, name):
    """Each code point of the BMP (and a sample of the others) between two letters: dropped,
    a separator, a word of its own or part of the word, and the character it becomes."""
    meta = wpm_vocabs.metadata(name)
    tok = Tokenizer.from_metadata(meta)
    ours = wpm_vocabs.probe_summary(meta["tokenizer.ggml.tokens"], lambda text: tok.encode(text, add_bos=False))
    theirs = reference["probes"][name]
    assert len(theirs) > 300
    bad = [(a, b) for a, b in zip(ours, theirs) if a != b]
    assert ours == theirs, f"{len(bad)} runs differ, first (elelem, llama.cpp): {bad[:3]}"
