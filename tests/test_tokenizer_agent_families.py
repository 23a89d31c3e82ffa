"""The pre-tokenizers of the agent-model families (GLM-4.x, DeepSeek-V3, Kimi-K2, LFM2,
Granite, Seed, SmolLM, MiniMax-M2, Laguna, Nemotron), and the rest of llama.cpp's
byte-level ones (Ling, Arcee, Tiny Aya, MiniCPM5, ...), against llama.cpp.

* No vocabulary test file of the sdist has these pre-tokenizers, so sdist
  vocabularies and a probe vocabulary whose ids show every split are given each
  family's ``tokenizer.ggml.pre`` (tests/support/agent_pretokenizers.py, which
  also says which value each family's GGUFs carry) and tokenized by elelem and
  by llama.cpp, live when this machine has the llama.cpp reference
  (tests/support/fixtures/make_agent_pretokenizer_fixtures.py, cached), else from
  the stored tests/support/fixtures/tokenize_pre_agent_families.json (made by that
  script; it must match the corpus and the sdist's vocabularies, or the test
  skips, and fails under CI=true).
* The tests without ``real_model`` pin down the table (every value llama.cpp
  knows is either reproduced or refused) and a few of llama.cpp's splits.
"""
from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from elelem.errors import GGUFError
from elelem.text.tokenizer import Tokenizer
from elelem.text.tokenizer.pretokenize import pretokenizer_for

import agent_pretokenizers as corpus
import llamacpp_sdist as sdist
from llamacpp_reference import Reference, file_sha256, run_script, skip_or_fail
from tokenizer_meta import read_metadata

HERE = Path(__file__).resolve().parent
SUPPORT = HERE / "support"
STORED = SUPPORT / "fixtures" / "tokenize_pre_agent_families.json"
needs_sdist = pytest.mark.real_model  # the sdist is fetched with pip on first use

# ------------------------------------------------------------------ against llama.cpp live

_memo: dict = {}


def reference() -> dict:
    """make_agent_pretokenizer_fixtures.py's output: live (cached) or the stored fixture, if it still holds."""
    if "ref" not in _memo:
        try:
            _memo["ref"] = _make_reference()
        except RuntimeError as e:  # a failed reference run fails every test that needs it, without rerunning
            _memo["ref"] = e
    if isinstance(_memo["ref"], RuntimeError):
        raise _memo["ref"]
    return _memo["ref"]


def _make_reference() -> dict:
    bases = sorted({base for base, _ in corpus.CONFIGS} - {"probe"})
    files = [sdist.vocab_path(base) for base in bases]
    name = STORED.name
    inputs = [*files, SUPPORT / "agent_pretokenizers.py", SUPPORT / "pretokenizer_corpus.py",
              SUPPORT / "fixtures" / "make_pretokenizer_fixtures.py"]
    live = run_script("make_agent_pretokenizer_fixtures.py",
                      ["--out", "{out}/" + name, "--vocab-dir", str(sdist.models_dir())], [], inputs, [name])
    if live is not None:
        return live[name]
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    header = stored["header"]
    diffs = [] if header.get("corpus_digest") == corpus.digest() else ["tests/support/agent_pretokenizers.py changed"]
    diffs += [f"ggml-vocab-{base}.gguf differs" for base, path in zip(bases, files)
              if header.get("vocabularies", {}).get(base, {}).get("sha256") != file_sha256(path)]
    if diffs:
        skip_or_fail(f"{Reference.not_built()}, and {name} was made from other inputs: " + "; ".join(diffs))
    return stored


@functools.cache
def _probe() -> tuple[list[str], list[str]]:
    return corpus.probe_vocab()


def metadata(base: str, pre: str) -> dict:
    if base in ("probe", "probe-no-merges"):
        tokens, merges = _probe()
        meta = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                "tokenizer.ggml.tokens": tokens}
        return meta if base == "probe-no-merges" else dict(meta, **{"tokenizer.ggml.merges": merges})
    return dict(read_metadata(str(sdist.vocab_path(base))), **{"tokenizer.ggml.pre": pre})


CONFIG_IDS = [f"{base}/{pre}" for base, pre in corpus.CONFIGS]
ALL_IDS = [*CONFIG_IDS, *[f"probe/{pre}" for pre in [*corpus.ALREADY_SUPPORTED, *corpus.ALIASES]],
           "/".join(("probe-no-merges", corpus.NO_MERGES[1]))]


@needs_sdist
@pytest.mark.parametrize("config", ALL_IDS)
def test_ids_match_llama_cpp(config):
    ref = reference()
    texts, expected = ref["texts"], ref["configs"][config]
    tok = Tokenizer.from_metadata(metadata(*config.split("/")))
    assert len(texts) == len(expected["ids"]) >= 600
    mismatches = [(text[:40], got, ids) for text, ids in zip(texts, expected["ids"])
                  if (got := tok.encode(text, add_bos=False, add_eos=False)) != ids]
    assert not mismatches, f"{config}: {len(mismatches)}/{len(texts)} differ, first: {mismatches[:3]}"
    special = [(texts[int(i)][:40], ids) for i, ids in expected["ids_special"].items()
               if tok.encode(texts[int(i)], add_bos=False, add_eos=False, special=True) != ids]
    assert not special, f"{config}, special=True: {len(special)} differ, first: {special[:3]}"


@needs_sdist
@pytest.mark.parametrize("config", CONFIG_IDS)
def test_bos_defaults_match_llama_cpp(config):
    """BOS / EOS and add_bos as llama.cpp derives them, with the GGUF's keys and without."""
    expected = reference()["configs"][config]
    meta = metadata(*config.split("/"))
    bare = {key: value for key, value in meta.items() if key not in corpus.BARE_DROPPED_KEYS}
    for name, m in (("vocab", meta), ("bare", bare)):
        tok = Tokenizer.from_metadata(m)
        facts = {"bos": tok.bos_id, "eos": tok.eos_id, "add_bos": tok.add_bos, "add_eos": tok.add_eos,
                 "hello_add_special": tok.encode("Hello")}
        assert facts == expected[name], name


@needs_sdist
def test_probe_tells_each_new_pre_tokenizer_from_its_nearest():
    """On the probe vocabulary llama.cpp's ids differ between each new pre-tokenizer and the
    one it is closest to, so the comparison above checks the new splits themselves.  (Ling's
    regex splits as Qwen2's does: its "\\s*[\\r\\n]" ends where Qwen2's "\\s*[\\r\\n]+" does.)"""
    configs = reference()["configs"]
    for new, near in (("deepseek-v3", "deepseek-llm"), ("kimi-k2", "minimax-m2"), ("kimi-k2", "llama-bpe"),
                      ("seed-coder", "grok-2"), ("laguna", "grok-2"), ("laguna", "seed-coder"),
                      ("ufakzeka", "grok-2"), ("minicpm5", "grok-2"), ("jais-2", "llama-bpe"),
                      ("exaone-moe", "grok-2"), ("spark2_5", "deepseek-v3"), ("youtu", "kimi-k2"),
                      ("tiny_aya", "minimax-m2"), ("afmoe", "deepseek-v3"), ("granite-embed-multi-97m", "minimax-m2"),
                      ("viking", "bloom"), ("chameleon", "gpt-2"), ("superbpe", "gpt-2")):
        a, b = configs[f"probe/{new}"]["ids"], configs[f"probe/{near}"]["ids"]
        assert sum(x != y for x, y in zip(a, b)) >= 5, (new, near)


@needs_sdist
@pytest.mark.parametrize("alias", corpus.ALIASES)
def test_aliases_give_the_same_ids(alias):
    configs = reference()["configs"]
    same_as = corpus.ALIASES[alias]
    if f"probe/{same_as}" in configs:
        assert configs[f"probe/{alias}"]["ids"] == configs[f"probe/{same_as}"]["ids"]
    assert pretokenizer_for(alias).name == pretokenizer_for(same_as).name


# ------------------------------------------------------------------ without files

#: Every tokenizer.ggml.pre value llama-cpp-python 0.3.36's llama_vocab::impl::load accepts
#: (src/llama-vocab.cpp), besides "default".
LLAMA_CPP_PRE_VALUES = (
    "a.x-4.0", "afmoe", "bailingmoe", "bailingmoe2", "bloom", "chameleon", "chatglm-bpe", "codeshell", "cohere2moe",
    "command-r", "dbrx", "deepseek-coder", "deepseek-llm", "deepseek-r1-qwen", "deepseek-v3", "exaone", "exaone-moe",
    "exaone4", "f2llmv2", "falcon", "falcon-h1", "falcon3", "gemma4", "gigachat", "glm4", "glm5", "gpt-2", "gpt-4o",
    "gpt3-finnish", "granite-docling", "granite-embed-multi-311m", "granite-embed-multi-97m", "grok-2", "hunyuan",
    "hunyuan-dense", "hy_v4", "jais", "jais-2", "jina-de", "jina-es", "jina-v1-en", "jina-v2-code", "jina-v2-de",
    "jina-v2-es", "jina-v5-nano", "joyai-llm", "kanana2", "kimi-k2", "kormo", "laguna", "lfm2", "llada-moe",
    "llama-bpe", "llama-v3", "llama3", "llama4", "megrez", "mellum", "mellum2", "midm-2.0", "minerva-7b",
    "minicpm5", "minimax-m2", "modern-bert", "mpt", "olmo", "phi-2", "pixtral", "poro-chat", "qwen2", "qwen35",
    "refact", "roberta-bpe", "sarvam-moe", "seed-coder", "smaug-bpe", "smollm", "solar-open", "spark2_5",
    "stablelm2", "starcoder", "superbpe", "talkie", "tekken", "tiny_aya", "trillion", "ufakzeka", "viking",
    "whitespace", "youtu",
)
#: The ones elelem refuses (GGUFError): BPE without GPT-2's byte encoding, which elelem reads
#: only as tokenizer.ggml.model "gemma4".
REFUSED = ("gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace")


@pytest.mark.parametrize("pre", LLAMA_CPP_PRE_VALUES)
def test_every_llama_cpp_value_is_reproduced_or_refused(pre):
    if pre in REFUSED:
        with pytest.raises(GGUFError, match=f"tokenizer.ggml.pre '{pre}' is not supported"):
            pretokenizer_for(pre)
    else:
        assert pretokenizer_for(pre).name != "default"


def test_refused_value_fails_when_the_tokenizer_is_built():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "whitespace", "tokenizer.ggml.tokens": ["a", "b"],
            "tokenizer.ggml.merges": []}
    with pytest.raises(GGUFError, match="'whitespace'"):
        Tokenizer.from_metadata(meta)


def test_unknown_value_still_warns_and_uses_default(caplog):
    with caplog.at_level(logging.WARNING, logger="elelem"):
        assert pretokenizer_for("agent-model-of-2027").name == "default"
    assert any("agent-model-of-2027" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("pre, family, ignore_merges, add_bos, has_bos", [
    ("deepseek-v3", "deepseek-v3", False, False, True),   # DeepSeek-V3 / R1
    ("hunyuan-dense", "deepseek-v3", False, False, True),
    ("joyai-llm", "deepseek-v3", False, False, True),
    ("hy_v4", "deepseek-v3", False, False, True),
    ("kimi-k2", "kimi-k2", False, False, True),           # Kimi-K2 / K2.5
    ("seed-coder", "seed-coder", False, False, True),     # Seed-Coder, Seed-OSS
    ("laguna", "laguna", False, False, True),             # Laguna XS.2
    ("grok-2", "qwen2", False, False, True),
    ("lfm2", "llama3", True, True, True),                 # LFM2 / LFM2.5
    ("granite-docling", "gpt2", False, False, True),
    ("smollm", "smollm", False, False, True),
    ("minimax-m2", "gpt4o", False, False, True),
    ("glm4", "llama3", True, False, False),               # GLM-4.5 / 4.7
    ("bailingmoe2", "bailingmoe", False, False, True),    # Ling / Ring 2.0
    ("minicpm5", "minicpm5", True, False, True),
    ("youtu", "youtu", True, False, True),
    ("cohere2moe", "tiny_aya", False, False, True),
    ("afmoe", "afmoe", False, False, True),
    ("granite-embed-multi-97m", "granite-embed-multi-97m", True, False, True),
    ("poro-chat", "bloom", False, False, True),
    ("chameleon", "chameleon", False, True, True),
])
def test_pretokenizer_table(pre, family, ignore_merges, add_bos, has_bos):
    """As llama-vocab.cpp's llama_vocab::impl::load maps tokenizer.ggml.pre."""
    p = pretokenizer_for(pre)
    assert (p.name, p.ignore_merges, p.add_bos, p.has_bos) == (family, ignore_merges, add_bos, has_bos)


# llama.cpp's words, read off its ids on the probe vocabulary (tokenize_pre_agent_families.json).
LLAMA_CPP_SPLITS = {
    # digits in threes first, then CJK and kana runs, then an ASCII mark takes the ASCII letters after it
    "deepseek-v3": {"DON'T": ["DON", "'T"], "1234567": ["123", "456", "7"], "中a文B字c": ["中", "a", "文", "B", "字", "c"],
                    "漢字ひらがなカタカナ한글": ["漢字ひらがなカタカナ", "한글"], "#include": ["#include"],
                    "\"Émile\"": ["\"", "Émile", "\""], "©2026 ®™": ["©", "202", "6", " ®™"],
                    "e\u0301te\u0301": ["e\u0301te\u0301"]},
    # Han runs apart from other letters, no case split, contractions any case
    "kimi-k2": {"DON'T": ["DON'T"], "HelloWorld": ["HelloWorld"], "中a文B字c": ["中", "a", "文", "B", "字", "c"],
                "漢字ひらがなカタカナ한글": ["漢字", "ひらがなカタカナ한글"], "我's": ["我", "'s"],
                "\uf900\ufa6e\ufaff\U0002f800\U0002fa1f": ["\uf900\ufa6e\ufaff\U0002f800\U0002fa1f"]},
    # a punctuation run takes no newlines
    "seed-coder": {"!\n\n": ["!", "\n\n"], "</div>\n": ["</", "div", ">", "\n"], "1234": ["1", "2", "3", "4"]},
    # newline runs first: the whitespace before a newline stays apart from it
    "laguna": {"a  \nb": ["a", "  ", "\n", "b"], "a \n\n b": ["a", " ", "\n\n", " b"], "!\n\n": ["!", "\n\n"],
               "x\t\n\ty": ["x", "\t", "\n", "\ty"]},
}


@pytest.mark.parametrize("pre", LLAMA_CPP_SPLITS)
def test_llama_cpp_splits(pre):
    split = pretokenizer_for(pre).split
    for text, words in LLAMA_CPP_SPLITS[pre].items():
        assert split(text) == words, text


@settings(max_examples=100, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_new_splits_cover_the_text(text):
    for pre in ("deepseek-v3", "kimi-k2", "seed-coder", "laguna", "bailingmoe", "minicpm5", "jais-2", "exaone-moe",
                "spark2_5", "youtu", "tiny_aya", "afmoe", "granite-embed-multi-97m", "viking", "chameleon", "superbpe"):
        words = pretokenizer_for(pre).split(text)
        assert "".join(words) == text and all(words), pre
