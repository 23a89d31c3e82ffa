"""elelem's tokenizer on llama.cpp's own vocabulary test files, and on the pre-tokenizers of
gpt-oss, GLM-4.5, Mistral, Qwen3.5 and Gemma 4's tokenizer against llama.cpp live.

* llama.cpp checks its tokenizers with ``models/ggml-vocab-<name>.gguf`` plus
  ``.inp`` / ``.out`` (tests/test-tokenizer-0.cpp: tokenize(text, add_special=false,
  parse_special=false) must give the ids of .out; llama-cpp-python 0.3.36 gives
  exactly those).  Every such file of the pinned sdist runs here
  (tests/support/llamacpp_sdist.py fetches it with pip once, hence ``real_model``).
* No such file exists for ``gpt-4o`` (gpt-oss), ``glm4`` (GLM-4.5) or
  ``tekken`` (Mistral 3, Devstral): real vocabularies of the sdist, and a probe
  vocabulary whose ids show every split, are given those pre-tokenizers
  (tests/support/pretokenizer_corpus.py; also ``qwen35``, whose test file has few
  combining marks) and compared with llama.cpp's ids on a corpus that tells
  the regexes apart (and Gemma 4's own vocabulary on it too): live when this machine has the llama.cpp
  reference (tests/support/fixtures/make_pretokenizer_fixtures.py, cached), else the
  stored tests/support/fixtures/tokenize_pre_variants.json (made by that script; it must
  match the corpus and the sdist's vocabularies, or the test skips, and fails
  under CI=true).
* The tests without ``real_model`` pin down the table of pre-tokenizers and a
  few of llama.cpp's splits without any file.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from elelem.text.tokenizer import Tokenizer
from elelem.text.tokenizer.pretokenize import pretokenizer_for

import llamacpp_sdist as sdist
import pretokenizer_corpus as corpus
from llamacpp_reference import Reference, file_sha256, run_script, skip_or_fail
from tokenizer_meta import read_metadata

HERE = Path(__file__).resolve().parent
STORED = HERE / "support" / "fixtures" / "tokenize_pre_variants.json"
needs_sdist = pytest.mark.real_model  # the sdist is fetched with pip on first use

#: Every ggml-vocab-*.gguf with .inp / .out in the sdist that elelem must tokenize as llama.cpp does.
REQUIRED = ("bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
            "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder")
#: The others, with why elelem does not pass them yet (strict xfail: a fix makes them fail
#: until they move to REQUIRED).
NOT_SUPPORTED = {
}


# ------------------------------------------------------------------ llama.cpp's vocab test files


def check_vocab_file(name: str) -> None:
    cases = sdist.vocab_cases(name)
    assert len(cases) >= 40
    tok = Tokenizer.from_metadata(read_metadata(str(sdist.vocab_path(name))))
    mismatches = [(text[:50], got, ids) for text, ids in cases
                  if (got := tok.encode(text, add_bos=False, add_eos=False)) != ids]
    assert not mismatches, f"{name}: {len(mismatches)}/{len(cases)} differ from .out, first: {mismatches[:3]}"


@needs_sdist
def test_every_vocab_test_file_is_checked():
    """A new ggml-vocab-*.inp in a newer sdist must be added to REQUIRED or NOT_SUPPORTED."""
    assert set(sdist.vocab_test_names()) == set(REQUIRED) | set(NOT_SUPPORTED)


@needs_sdist
@pytest.mark.parametrize("name", REQUIRED)
def test_vocab_test_file_gives_llama_cpp_ids(name):
    check_vocab_file(name)


# Every vocab test file of the sdist is in REQUIRED now.  A file that is added to
# NOT_SUPPORTED again is collected here as a strict xfail (an empty parameter set
# would be a skip, which CI=true refuses).
if NOT_SUPPORTED:
    @needs_sdist
    @pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=r, strict=True))
                                      for n, r in NOT_SUPPORTED.items()])
    def test_vocab_test_file_not_supported_yet(name):
        check_vocab_file(name)


# ------------------------------------------------------------------ pre-tokenizers against llama.cpp live

_memo: dict = {}


def pre_reference() -> dict:
    """make_pretokenizer_fixtures.py's output: live (cached) or the stored fixture, if it still holds."""
    if "pre" not in _memo:
        try:
            _memo["pre"] = _make_pre_reference()
        except RuntimeError as e:  # a failed reference run fails every test that needs it, without rerunning
            _memo["pre"] = e
    if isinstance(_memo["pre"], RuntimeError):
        raise _memo["pre"]
    return _memo["pre"]


def _make_pre_reference() -> dict:
    models = sdist.models_dir()
    bases = sorted({base for base, _ in corpus.CONFIGS} - {"probe"})
    files = [sdist.vocab_path(base) for base in bases]
    name = STORED.name
    live = run_script("make_pretokenizer_fixtures.py", ["--out", "{out}/" + name, "--vocab-dir", str(models)],
                      [], [*files, HERE / "support" / "pretokenizer_corpus.py"], [name])
    if live is not None:
        return live[name]
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    header = stored["header"]
    diffs = [] if header.get("corpus_digest") == corpus.digest() else ["tests/support/pretokenizer_corpus.py changed"]
    diffs += [f"ggml-vocab-{base}.gguf differs" for base, path in zip(bases, files)
              if header.get("vocabularies", {}).get(base, {}).get("sha256") != file_sha256(path)]
    if diffs:
        skip_or_fail(f"{Reference.not_built()}, and {name} was made from other inputs: " + "; ".join(diffs))
    return stored


@functools.cache
def base_metadata(base: str) -> dict:
    return dict(read_metadata(str(sdist.vocab_path(base))))


def metadata(base: str, pre: str) -> dict:
    if base == "probe":
        return corpus.probe_metadata(pre)
    return dict(base_metadata(base), **{"tokenizer.ggml.pre": pre})


CONFIG_IDS = [f"{base}/{pre}" for base, pre in corpus.CONFIGS]


@needs_sdist
@pytest.mark.parametrize("config", CONFIG_IDS)
def test_pretokenizer_ids_match_llama_cpp(config):
    ref = pre_reference()
    texts, expected = ref["texts"], ref["configs"][config]
    tok = Tokenizer.from_metadata(metadata(*config.split("/")))
    assert len(texts) == len(expected["ids"]) >= 400
    mismatches = [(text[:40], got, ids) for text, ids in zip(texts, expected["ids"])
                  if (got := tok.encode(text, add_bos=False, add_eos=False)) != ids]
    assert not mismatches, f"{config}: {len(mismatches)}/{len(texts)} differ, first: {mismatches[:3]}"
    special = [(texts[int(i)][:40], ids) for i, ids in expected["ids_special"].items()
               if tok.encode(texts[int(i)], add_bos=False, add_eos=False, special=True) != ids]
    assert not special, f"{config}, special=True: {len(special)} differ, first: {special[:3]}"


@needs_sdist
@pytest.mark.parametrize("config", CONFIG_IDS)
def test_pretokenizer_bos_defaults_match_llama_cpp(config):
    """BOS / EOS and add_bos as llama.cpp derives them, with the GGUF's keys and without
    (GLM-4.5 has no default BOS; Tekken and Llama 3 add BOS unless told not to)."""
    expected = pre_reference()["configs"][config]
    meta = metadata(*config.split("/"))
    bare = {key: value for key, value in meta.items() if key not in corpus.BARE_DROPPED_KEYS}
    for name, m in (("vocab", meta), ("bare", bare)):
        if name not in expected:  # no bare variant (pretokenizer_corpus.NO_BARE)
            continue
        tok = Tokenizer.from_metadata(m)
        facts = {"bos": tok.bos_id, "eos": tok.eos_id, "add_bos": tok.add_bos, "add_eos": tok.add_eos,
                 "hello_add_special": tok.encode("Hello")}
        assert facts == expected[name], name


@needs_sdist
@pytest.mark.parametrize("alias", corpus.ALIASES)
def test_pretokenizer_aliases_match_llama_cpp(alias):
    expected = pre_reference()["aliases"][alias]
    tok = Tokenizer.from_metadata(metadata(expected["base"], alias))
    ids = [tok.encode(text, add_bos=False, add_eos=False) for text in pre_reference()["texts"]]
    assert corpus.ids_digest(ids) == expected["ids_digest"]
    assert pretokenizer_for(alias).name == pretokenizer_for(expected["same_as"]).name


@needs_sdist
def test_probe_vocabulary_tells_the_pre_tokenizers_apart():
    """The probe's ids differ between any two pre-tokenizers on many texts, so its
    comparison above checks the splits themselves, which real vocabularies hide."""
    configs = pre_reference()["configs"]
    probes = {c: configs[c]["ids"] for c in CONFIG_IDS if c.startswith("probe/")}
    same_regex = {frozenset({"probe/glm4", "probe/llama-bpe"})}  # ChatGLM4's regex is Llama 3's
    for a in probes:
        for b in probes:
            if a < b and frozenset({a, b}) not in same_regex:
                differ = sum(x != y for x, y in zip(probes[a], probes[b]))
                assert differ >= 10, (a, b, differ)


# ------------------------------------------------------------------ without files


@pytest.mark.parametrize("pre, family, ignore_merges, add_bos, has_bos", [
    ("gpt-4o", "gpt4o", False, False, True),   # gpt-oss
    ("llama4", "gpt4o", False, False, True),
    ("minimax-m2", "gpt4o", False, False, True),
    ("tekken", "tekken", True, True, True),     # Mistral 3, Devstral, Magistral
    ("glm4", "llama3", True, False, False),     # GLM-4.5 / 4.6: ChatGLM4, Llama 3's regex
    ("glm5", "llama3", True, False, False),
    ("chatglm-bpe", "llama3", False, False, False),
    ("qwen2", "qwen2", False, False, True),     # Qwen3, Qwen3-MoE, Qwen3-Coder
    ("qwen35", "qwen35", False, False, True),   # Qwen3.5 / 3.6, Qwen3-Next
    ("deepseek-llm", "deepseek-llm", False, False, True),
    ("deepseek-coder", "deepseek-coder", False, False, True),
    ("falcon", "falcon", False, False, True),
])
def test_pretokenizer_table(pre, family, ignore_merges, add_bos, has_bos):
    """As llama-vocab.cpp's llama_vocab::impl::load maps tokenizer.ggml.pre."""
    p = pretokenizer_for(pre)
    assert (p.name, p.ignore_merges, p.add_bos, p.has_bos) == (family, ignore_merges, add_bos, has_bos)


# llama.cpp's words, read off its ids on the probe vocabulary (tokenize_pre_variants.json).
LLAMA_CPP_SPLITS = {
    "gpt-4o": {"HelloWorld": ["Hello", "World"], "DON'T": ["DON'T"], "ÉCOLE'S": ["É", "COLE'S"],
               "a1b22c333d4444e55555": ["a", "1", "b", "22", "c", "333", "d", "444", "4", "e", "555", "55"],
               "/\n": ["/\n"], "i+=1;j-=2": ["i", "+=", "1", ";j", "-=", "2"]},
    "tekken": {"HelloWorld": ["Hello", "World"], "DON'T": ["DON", "'T"], "ÉCOLE'S": ["É", "COLE", "'S"],
               "/\n": ["/\n"]},
    "glm4": {"HelloWorld": ["HelloWorld"], "DON'T": ["DON", "'T"], "ÉCOLE'S": ["ÉCOLE", "'S"]},
    "deepseek-llm": {"¿Qué?": ["¿", "Qu", "é", "?"], "ﬁne ﬂow": ["ﬁ", "ne", " ﬂ", "ow"],
                     "a1b22c333d4444e55555": ["a", "1", "b", "22", "c", "333", "d", "4444", "e", "55555"],
                     "中a文b": ["中", "a", "文", "b"], "x\n   \ny": ["x", "\n", "   ", "\n", "y"]},
    "deepseek-coder": {"¿Qué?": ["¿", "Qué", "?"], "i+=1;j-=2": ["i", "+=", "1", ";", "j", "-", "=", "2"],
                       "x\n   \ny": ["x", "\n", "   ", "\n", "y"]},
    # Marks (\p{M}) join letter runs and end punctuation runs: Qwen2 gives "cafe", "\u0301".
    "qwen35": {"cafe\u0301": ["cafe\u0301"], "Zalgo z\u0351\u036b\u0343": ["Zalgo", " z\u0351\u036b\u0343"],
               "अनुच्छेद": ["अनुच्छेद"], "\u2764\ufe0f": ["\u2764\ufe0f"],
               "\U0001f636\u200d\U0001f32b\ufe0f": ["\U0001f636\u200d\U0001f32b", "\ufe0f"]},
    "falcon": {"4 ½ months": ["4", " ½", " months"], "x\n   \ny": ["x", "\n   ", "\n", "y"],
               "`code`": ["`", "code", "`"]},
}


@pytest.mark.parametrize("pre", LLAMA_CPP_SPLITS)
def test_llama_cpp_splits(pre):
    split = pretokenizer_for(pre).split
    for text, words in LLAMA_CPP_SPLITS[pre].items():
        assert split(text) == words, text


@settings(max_examples=150, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_std_regex_splits_cover_the_text(text):
    for pre in ("gpt-4o", "tekken", "deepseek-llm", "deepseek-coder", "falcon", "default"):
        words = pretokenizer_for(pre).split(text)
        assert "".join(words) == text and all(words), pre


def test_glm4_has_no_default_bos():
    """llama.cpp: special_bos_id = LLAMA_TOKEN_NULL for ChatGLM4 vocabularies; the GGUF's key still sets one."""
    meta = corpus.probe_metadata("glm4")
    assert Tokenizer.from_metadata(meta).bos_id is None
    assert Tokenizer.from_metadata(dict(meta, **{"tokenizer.ggml.bos_token_id": 5})).bos_id == 5
    assert Tokenizer.from_metadata(corpus.probe_metadata("gpt-4o")).bos_id == 11  # BPE's default
