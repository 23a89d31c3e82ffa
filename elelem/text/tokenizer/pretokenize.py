"""Pre-tokenizers for byte-level BPE: split text into the words BPE runs on.

llama.cpp picks a list of regexes by ``tokenizer.ggml.pre`` and, for the common
ones, runs hand-written splitters instead of a regex engine (unicode.cpp).  Those
splitters differ from the tokenizer.json regexes in small ways, and the ids must
match llama.cpp's, so the patterns here are written to reproduce the splitters:

* ``(?i:'s|'t|...)`` becomes ``'[sS]|'[tT]|...``: only ASCII case folds, so
  ``'ſ`` (long s) is not a contraction.
* ``\\p{L}``, ``\\p{N}``, ``\\p{P}`` are the Unicode 15.1 categories llama.cpp's
  tables hold (``_unicode_classes``), not the newer ones of the ``regex`` package.
* ``\\s`` is the White_Space property (llama.cpp's list), so U+001C..U+001F are
  not whitespace although ``str.isspace`` says they are.
* SmolLM's pre-tokenizer first isolates every digit, then runs the GPT-2 regex on
  each piece between digits; one pattern does both here (a digit ends a
  whitespace run the way the end of the text does).

Every pattern has only single-level quantifiers and ends with ``|.``, so a match
always advances and the split is linear in the length of the text.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable

from ._unicode_classes import LETTER as _L, NUMBER as _N, PUNCTUATION as _P

log = logging.getLogger("elelem")

# White_Space code points, as llama.cpp's unicode tables list them (a class body).
WHITESPACE = r"\t\n\x0b\x0c\r\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_W = WHITESPACE

_CONTRACTIONS_ANY_CASE = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
_CONTRACTIONS_LOWER = r"'s|'t|'re|'ve|'m|'ll|'d"


def _qwen2_like(digits: str) -> str:
    return (
        f"{_CONTRACTIONS_ANY_CASE}"
        f"|[^\\r\\n{_L}{_N}]?[{_L}]+"
        f"|{digits}"
        f"| ?[^{_W}{_L}{_N}]+[\\r\\n]*"
        f"|[{_W}]*[\\r\\n]+"
        f"|[{_W}]+(?![^{_W}])"
        f"|[{_W}]+"
        f"|."
    )


#: Qwen2: digits one at a time.
QWEN2_PATTERN = _qwen2_like(f"[{_N}]")
#: Llama 3: digits in groups of up to three, from the left.
LLAMA3_PATTERN = _qwen2_like(f"[{_N}]{{1,3}}")
#: GPT-2.
GPT2_PATTERN = (
    f"{_CONTRACTIONS_LOWER}| ?[{_L}]+| ?[{_N}]+| ?[^{_W}{_L}{_N}]+"
    f"|[{_W}]+(?![^{_W}])|[{_W}]+|."
)
#: StarCoder / SmolLM: every digit alone, GPT-2 rules between digits.
SMOLLM_PATTERN = (
    f"{_CONTRACTIONS_LOWER}| ?[{_L}]+|[{_N}]| ?[^{_W}{_L}{_N}]+"
    f"|[{_W}]+(?![^{_W}{_N}])|[{_W}]+|."
)

# llama.cpp's "default" BPE pre-tokenizer is four passes, each splitting the
# pieces of the one before; a regex pass keeps the text between its matches.
_DEFAULT_PASSES = (
    ("isolate", f"[{_P}$+<=>^~|]+"),
    ("consume", GPT2_PATTERN),
    ("isolate", f"[{_N}]+"),
    ("isolate", "[0-9][0-9][0-9]"),
)


@dataclass(frozen=True)
class PreTokenizer:
    """How one ``tokenizer.ggml.pre`` value splits text, and the flags llama.cpp ties to it."""

    name: str
    split: Callable[[str], list[str]]
    #: llama.cpp's ignore_merges: a word that is itself a token skips BPE.
    ignore_merges: bool = False
    #: add_bos default when the GGUF has no tokenizer.ggml.add_bos_token.
    add_bos: bool = False


def _single_pass(pattern: str) -> Callable[[str], list[str]]:
    compiled = re.compile(pattern, re.DOTALL)
    return compiled.findall


def _multi_pass(passes) -> Callable[[str], list[str]]:
    compiled = [(kind, re.compile(p, re.DOTALL)) for kind, p in passes]

    def split(text: str) -> list[str]:
        spans = [(0, len(text))] if text else []
        for kind, rx in compiled:
            out = []
            for start, end in spans:
                pos = start
                for m in rx.finditer(text, start, end):
                    if kind == "isolate" and m.start() > pos:
                        out.append((pos, m.start()))
                    out.append(m.span())
                    pos = m.end()
                if pos < end:
                    out.append((pos, end))
            spans = out
        return [text[s:e] for s, e in spans]

    return split


_QWEN2 = ("qwen2", QWEN2_PATTERN, False, False)
_LLAMA3 = ("llama3", LLAMA3_PATTERN, True, True)
_GPT2 = ("gpt2", GPT2_PATTERN, False, False)
_SMOLLM = ("smollm", SMOLLM_PATTERN, False, False)

# tokenizer.ggml.pre -> (family, pattern, ignore_merges, add_bos), as llama-vocab.cpp maps them.
_BY_PRE = {
    **{k: _QWEN2 for k in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez",
                           "stablelm2", "hunyuan", "solar-open")},
    **{k: _LLAMA3 for k in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                            "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    **{k: ("llama3", LLAMA3_PATTERN, False, False) for k in ("dbrx", "smaug-bpe", "chatglm-bpe")},
    **{k: ("llama3", LLAMA3_PATTERN, True, False) for k in ("glm4", "glm5")},
    **{k: _GPT2 for k in ("gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                          "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert",
                          "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
                          "jina-v1-en", "jina-v2-code", "roberta-bpe")},
    **{k: _SMOLLM for k in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                            "exaone", "minerva-7b", "mellum2")},
}


def pretokenizer_for(pre: str | None) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value.

    A missing value, ``"default"`` and any value elelem does not know use
    llama.cpp's ``default`` BPE pre-tokenizer (what llama.cpp itself uses when
    the key is missing); an unknown value also logs a warning, since the ids
    will then likely differ from the model's own tokenizer.
    """
    entry = _BY_PRE.get(pre or "")
    if entry is not None:
        family, pattern, ignore_merges, add_bos = entry
        return PreTokenizer(family, _single_pass(pattern), ignore_merges, add_bos)
    if pre not in (None, "", "default"):
        log.warning("unknown tokenizer.ggml.pre %r: using the 'default' BPE pre-tokenizer; "
                    "token ids may differ from the model's own tokenizer", pre)
    return PreTokenizer("default", _multi_pass(_DEFAULT_PASSES))
