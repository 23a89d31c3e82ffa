"""Fill-in-the-middle with repository context: the prompt llama.cpp's server builds for ``/infill``.

The ids elelem builds (elelem.api.infill) must be llama.cpp's for the same
request on Qwen2.5-Coder: llama.cpp's tokenizer and the FIM token ids it reads
from the GGUF, live under the reference build when this machine has one
(tests/support/fixtures/make_infill_fixtures.py, which transcribes
format_prompt_infill, cached), else the stored
tests/support/fixtures/infill_qwen2.5-coder-0.5b.json when it was made from
the same model file and cases.  Qwen3-Coder has the same FIM, repository and
file-separator tokens (<|fim_prefix|>, <|repo_name|>, <|file_sep|>, ...) at
the same ids, so its prompts follow the same path.

The layout without FIM_REP and FIM_SEP (the snippet separator) and with a
BOS is checked against llama.cpp the same way, on Qwen's vocabulary with
those tokens renamed and add_bos set (tests/support/infill_variants.py),
and on a stub tokenizer.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

import elelem
from elelem.api.infill import extra_files, infill_ids
from elelem.errors import InvalidArgumentError

from elelem.gguf.reader import read_gguf
from elelem.text.tokenizer import Tokenizer

import infill_cases
import infill_variants
from infill_reference import llamacpp_infill

@pytest.fixture(scope="module")
def llamacpp_ids(qwen_path) -> dict:
    """llama.cpp's prompt ids for each case of infill_cases.py, by name."""
    return llamacpp_infill(qwen_path)["cases"]


@pytest.fixture(scope="module")
def llamacpp_variant_ids(qwen_path) -> dict:
    """The same for the vocabulary variants of infill_variants.py, by variant and case."""
    return llamacpp_infill(qwen_path)["variants"]


@pytest.fixture(scope="module")
def qwen(qwen_path):
    with elelem.LLM(qwen_path, n_ctx=2560, n_threads=2) as llm:
        yield llm


def _ids(assets, body: dict, overrides: dict) -> list[int]:
    s = infill_cases.settings(overrides)
    return infill_ids(assets, body["input_prefix"], body["input_suffix"], extra=body.get("input_extra"),
                      prompt=body.get("prompt", ""), n_ctx=s["n_ctx"], n_batch=s["n_batch"],
                      n_predict=s["n_predict"], suffix_first=s["spm_infill"])


@pytest.mark.real_model
@pytest.mark.parametrize("name, body, overrides", infill_cases.CASES, ids=[c[0] for c in infill_cases.CASES])
def test_the_prompt_ids_are_llamacpps_on_qwen_coder(qwen, llamacpp_ids, name, body, overrides):
    assert _ids(qwen.assets, body, overrides) == llamacpp_ids[name]


@pytest.mark.real_model
@pytest.mark.parametrize("variant", sorted(infill_variants.VARIANTS))
def test_without_repo_and_file_tokens_and_with_a_bos_the_ids_are_llamacpps(qwen_path, llamacpp_variant_ids,
                                                                            tmp_path, variant):
    path = infill_variants.write_variant(Path(qwen_path), tmp_path / f"{variant}.gguf", variant)
    tokenizer = Tokenizer.from_metadata(read_gguf(path).metadata)
    assert tokenizer.special_id("fim_rep") is None and tokenizer.special_id("fim_sep") is None
    assets = _StubAssets(tokenizer, n_vocab=len(read_gguf(path).metadata["tokenizer.ggml.tokens"]))
    for name, body, overrides in infill_cases.CASES:
        assert _ids(assets, body, overrides) == llamacpp_variant_ids[variant][name], name


@pytest.mark.real_model
def test_the_repository_layout_on_qwen_coder(qwen):
    body = {"input_prefix": "x = ", "input_suffix": "\n", "input_extra": [infill_cases.UTILS], "prompt": "1 +"}
    text = qwen.detokenize(_ids(qwen.assets, body, {}), special=True).decode()
    assert text == ("<|repo_name|>myproject\n<|file_sep|>geometry/utils.py\n" + infill_cases.UTILS["text"]
                    + "<|file_sep|>filename\n<|fim_prefix|>x = 1 +<|fim_suffix|>\n<|fim_middle|>")


@pytest.mark.real_model
def test_llm_infill_completes_the_middle(qwen):
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    extra = {"utils.py": "def sub(a, b):\n    return a - b\n"}
    assert qwen.infill(prefix, suffix, extra=extra, max_tokens=8, temperature=0, stop=["\n"]) == "a + b"
    streamed = qwen.infill(prefix, suffix, extra=extra, max_tokens=8, temperature=0, stop=["\n"], stream=True)
    assert "".join(streamed) == "a + b"


@pytest.mark.real_model
def test_a_model_without_fim_tokens_is_refused(smollm_path):
    with elelem.LLM(smollm_path, n_ctx=256, n_threads=1) as smollm:
        with pytest.raises(InvalidArgumentError, match="Infill is not supported by this model: prefix token is "
                                                       "missing. suffix token is missing. middle token is missing."):
            smollm.infill("def f():", "\n")


def test_extra_files_take_llamacpps_chunks_or_a_mapping():
    files = extra_files([{"text": "a"}, {"filename": "b.py", "text": "b"}])
    assert [(f.filename, f.text) for f in files] == [("tmp", "a"), ("b.py", "b")]
    assert [(f.filename, f.text) for f in extra_files({"c.py": "c"})] == [("c.py", "c")]
    assert extra_files(None) == []
    for bad, words in [("text", "must be an array"), ([{"filename": "x"}], 'contain a "text" field'),
                       ([{"text": "x", "filename": 3}], '"filename" field must be a string'),
                       ({"a.py": 1}, "map file names to their texts")]:
        with pytest.raises(InvalidArgumentError, match=words):
            extra_files(bad)


# ------------------------------------------------------------------ the layout on a stub tokenizer

class _StubTokenizer:
    """One token per character (its code point + 1000); FIM tokens as given."""

    def __init__(self, special: dict, bos=None):
        self.special, self.bos_id, self.add_bos = special, bos, bos is not None

    def special_id(self, name):
        return self.special.get(name)

    def encode(self, text, *, add_bos=None, add_eos=None, special=False):
        assert add_bos is False and add_eos is False
        return [1000 + ord(c) for c in text]


class _StubAssets:
    """What infill_ids reads of a model's assets."""

    def __init__(self, tokenizer, n_vocab: int = 10 ** 6):
        self.tokenizer, self.tokenizer_lock, self.n_vocab, self.path = tokenizer, threading.Lock(), n_vocab, Path("x")


def _chars(text):
    return [1000 + ord(c) for c in text]


def test_without_repo_and_file_tokens_files_are_separated_by_llamacpps_snippet_line():
    assets = _StubAssets(_StubTokenizer({"fim_pre": 1, "fim_suf": 2, "fim_mid": 3}, bos=9))
    ids = infill_ids(assets, "p", "s", extra=[{"filename": "a.py", "text": "A"}], prompt="q", n_ctx=4096)
    # The extra context comes before the BOS, as llama.cpp inserts it.
    assert ids == [*_chars("\n\n--- snippet ---\n\nA"), 9, 1, *_chars("pq"), 2, *_chars("s"), 3]


def test_budgets_cut_the_prefix_start_the_suffix_end_and_the_extras_start():
    assets = _StubAssets(_StubTokenizer({"fim_pre": 1, "fim_suf": 2, "fim_mid": 3, "fim_rep": 4, "fim_sep": 5}))
    ids = infill_ids(assets, "0123456789", "abcdefghij", extra=[{"text": "XYZ"}], prompt="", n_ctx=24, n_batch=16,
                     n_predict=2)
    # prefix: its last 3 * 16/4 = 12 (all 10); suffix: its first 16/4 - 2 = 2; extra: its last 24 - 16 - 4 = 4.
    # The extra context ends with the current file's line, [FIM_SEP]filename\n: its last 4 tokens are "ame\n".
    assert ids == [*_chars("ame\n"), 1, *_chars("0123456789"), 2, *_chars("ab"), 3]
    with pytest.raises(InvalidArgumentError, match="n_batch must be an integer >= 1"):
        infill_ids(assets, "p", "s", n_ctx=10, n_batch=0)
    with pytest.raises(InvalidArgumentError, match="input_prefix must be a string or a list"):
        infill_ids(assets, 3, "s", n_ctx=10)
