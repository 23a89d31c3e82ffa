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

Every single-pass pattern has only single-level quantifiers and ends with ``|.``,
so a match always advances and the split is linear in the length of the text.

The other pre-tokenizers (DeepSeek, Falcon, GPT-4o / o200k, Mistral's Tekken,
Seed-Coder, ...) have no hand-written splitter in llama.cpp: it runs their
regexes in ``std::regex``, pass after pass, on a stand-in text (see "Regexes
llama.cpp runs in std::regex" below), and so do these, with Python's ``re``,
whose backtracking and leftmost-first alternation are ECMAScript's.  A pass list
may also hold a hand-written splitter: a pattern that runs on the real text
(``_Custom``: Laguna's newline split before Qwen2's) or the digit grouping of
Arcee and Tiny Aya (``_DigitGroups``).

The pre-tokenizers of llama.cpp that are not byte-level BPE (``whitespace``,
``gemma4`` under ``tokenizer.ggml.model = "gpt2"``, ...) are refused
(``GGUFError`` naming the value) rather than replaced by another one.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable, Union

from ...errors import GGUFError
from ._unicode_classes import LETTER as _L, MARK as _M, NUMBER as _N, PUNCTUATION as _P
from ._unicode_symbols import SYMBOL as _SYM

log = logging.getLogger("elelem")

# White_Space code points, as llama.cpp's unicode tables list them (a class body).
WHITESPACE = r"\t\n\x0b\x0c\r\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_W = WHITESPACE

_CONTRACTIONS_ANY_CASE = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
_CONTRACTIONS_LOWER = r"'s|'t|'re|'ve|'m|'ll|'d"


def _qwen2_like(digits: str, letters: str = _L) -> str:
    return (
        f"{_CONTRACTIONS_ANY_CASE}"
        f"|[^\\r\\n{_L}{_N}]?[{letters}]+"
        f"|{digits}"
        f"| ?[^{_W}{letters}{_N}]+[\\r\\n]*"
        f"|[{_W}]*[\\r\\n]+"
        f"|[{_W}]+(?![^{_W}])"
        f"|[{_W}]+"
        f"|."
    )


#: Qwen2: digits one at a time.
QWEN2_PATTERN = _qwen2_like(f"[{_N}]")
#: Qwen3.5 / Qwen3-Next: Qwen2's, with combining marks (\p{M}) in letter runs and out of
#: punctuation runs (unicode_regex_split_custom_qwen35); a mark may still be a run's prefix.
QWEN35_PATTERN = _qwen2_like(f"[{_N}]", _L + _M)
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


def _ranges(body: str) -> list[tuple[int, int]]:
    """The code point ranges of a class body of 8-digit escapes (``_unicode_classes``)."""
    return [(int(lo, 16), int(hi or lo, 16))
            for lo, hi in re.findall(r"\\U([0-9a-f]{8})(?:-\\U([0-9a-f]{8}))?", body)]


def _body(ranges: list[tuple[int, int]]) -> str:
    return "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges)


def _minus(body: str, cut: list[tuple[int, int]]) -> str:
    """A class body without the code points of ``cut`` (``re`` has no class subtraction)."""
    out = []
    for lo, hi in _ranges(body):
        pieces = [(lo, hi)]
        for c_lo, c_hi in cut:
            pieces = [p for a, b in pieces
                      for p in ((a, min(b, c_lo - 1)), (max(a, c_hi + 1), b)) if p[0] <= p[1]]
        out.extend(pieces)
    return _body(out)


# Kimi-K2: llama.cpp's hand-written splitter (unicode_regex_split_custom_kimi_k2) for
# tokenization_kimi.py's regex.  Han is unicode_cpt_is_han's ranges (whatever
# their category); a letter run holds no Han and ignores case (the tokenizer.json
# regex's \p{Lu}... / \p{Ll}... split is not in the splitter), marks are not
# letters, and a contraction ends a letter run whatever its case.
_HAN = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]
KIMI_K2_PATTERN = (
    f"[{_body(sorted(_HAN))}]+"
    f"|[^\\r\\n{_L}{_N}]?[{_minus(_L, _HAN)}]+(?:{_CONTRACTIONS_ANY_CASE})?"
    f"|[{_N}]{{1,3}}"
    f"| ?[^{_W}{_L}{_N}]+[\\r\\n]*"
    f"|[{_W}]*[\\r\\n]+"
    f"|[{_W}]+(?![^{_W}])"
    f"|[{_W}]+"
    f"|."
)

# --- Regexes llama.cpp runs in std::regex -------------------------------------------
#
# llama.cpp has hand-written splitters only for a few regexes (GPT-2, Llama 3,
# Qwen2, ...: the patterns above).  Every other regex runs in std::regex
# (ECMAScript), one pass after the other, each pass splitting every piece of the
# pass before into its matches *and the runs of text between them*
# (unicode_regex_split_stl).  std::regex knows no Unicode, so llama.cpp gives it
# a stand-in text of one character per code point:
#
# * a regex with \p{L}, \p{N}, \p{P} sees every non-ASCII code point as one byte
#   for its category and \p{L} as [<letter byte>A-Za-z]: the same matches as
#   elelem's class of that category on the real text;
# * a regex without \p{..} (std::wregex) sees the code points, so its ranges,
#   such as DeepSeek's [一-龥ࠀ-一가-퟿], compare code points;
# * either way every non-ASCII whitespace code point is first replaced by \v,
#   as std::regex's \s is only the C locale's [\t\n\v\f\r ]: a range that spans
#   U+3000 does not match U+3000, while \s does.
#
# The splitters below do the same on a copy of the text with that replacement
# (_stl_text), and write \s as _S.
_S = r"\t\n\x0b\x0c\r "
_NON_ASCII_SPACE = re.compile("[\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


def _stl_text(text: str) -> str:
    """``text`` as std::regex sees it: non-ASCII whitespace replaced by \\v (same length)."""
    return text if text.isascii() else _NON_ASCII_SPACE.sub("\x0b", text)


_ASCII_LETTERS = r"\U00000041-\U0000005a\U00000061-\U0000007a"
assert _L.startswith(_ASCII_LETTERS)
#: \p{L} without A-Za-z: in the stand-in text all of these are the one letter byte.
_L_NON_ASCII = _L[len(_ASCII_LETTERS):]

# GPT-4o (o200k) and Tekken split words at case changes.  Their tokenizer.json
# regexes use \p{Lu}, \p{Ll}, ...; llama.cpp rewrites them with the categories
# it has: an "upper" letter is a letter that is not a-z, a "lower" letter one
# that is not A-Z, so a non-ASCII letter is both, and marks (\p{M}) are not
# letters at all.
_UPPERISH = "A-Z" + _L_NON_ASCII
_LOWERISH = "a-z" + _L_NON_ASCII

#: gpt-oss, Llama 4, MiniMax-M2: o200k's regex as llama.cpp adapts it.
GPT4O_PATTERN = (
    f"[^\\r\\n{_L}{_N}]?[{_UPPERISH}]*[{_LOWERISH}]+(?:{_CONTRACTIONS_ANY_CASE})?"
    f"|[^\\r\\n{_L}{_N}]?[{_UPPERISH}]+[{_LOWERISH}]*(?:{_CONTRACTIONS_ANY_CASE})?"
    f"|[{_N}]{{1,3}}"
    f"| ?[^{_S}{_L}{_N}]+[\\r\\n/]*"
    f"|[{_S}]*[\\r\\n]+"
    f"|[{_S}]+(?![^{_S}])"
    f"|[{_S}]+"
)
#: Mistral's Tekken: the same without contractions, digits one at a time.
TEKKEN_PATTERN = (
    f"[^\\r\\n{_L}{_N}]?[{_UPPERISH}]*[{_LOWERISH}]+"
    f"|[^\\r\\n{_L}{_N}]?[{_UPPERISH}]+[{_LOWERISH}]*"
    f"|[{_N}]"
    f"| ?[^{_S}{_L}{_N}]+[\\r\\n/]*"
    f"|[{_S}]*[\\r\\n]+"
    f"|[{_S}]+(?![^{_S}])"
    f"|[{_S}]+"
)

# DeepSeek LLM's letters: a literal list of ranges (Latin, Greek, Cyrillic,
# Armenian, Georgian, Cherokee, ...), not \p{L}.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    "\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    "\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
# CJK ideographs, U+0800..U+4E00 and Hangul: in the stand-in text U+3000 and the
# other whitespace in that span are \v, outside the class.
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

#: llama.cpp's passes per pre-tokenizer (llm_tokenizer_bpe), as patterns on the stand-in text.
DEEPSEEK_LLM_PASSES = (
    "[\\r\\n]",
    f"[{_S}]?[{_DEEPSEEK_LETTERS}]+",
    f"[{_S}]?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",  # :-~ holds A-Z, a-z too
    f"[{_S}]+\\Z",  # \s+$: $ is the end of each piece
    _DEEPSEEK_CJK,
    f"[{_N}]+",
)
DEEPSEEK_CODER_PASSES = (
    "[\\r\\n]",
    f"[{_S}]?[{_L}]+",
    f"[{_S}]?[{_P}]+",
    _DEEPSEEK_CJK,
    f"[{_N}]",
)
# The second pass is GPT-2's regex, which llama.cpp runs with its GPT-2 splitter
# (GPT2_PATTERN, which leaves no text between its matches).
FALCON_PASSES = (
    f"[{_P}$+<=>^~|`]+",
    GPT2_PATTERN,
    "[0-9][0-9][0-9]",
)
# DeepSeek-V3 (also Hunyuan dense, Hy4, JoyAI): digits in threes, then runs of CJK
# ideographs and kana (a std::wregex: code point ranges), then the words.  An
# ASCII punctuation mark takes the ASCII letters after it ("[A-Za-z]" is
# ASCII in the stand-in text too), and letter runs hold marks (\p{M}).
_ASCII_PUNCT_AND_SYMBOLS = "!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~"
DEEPSEEK3_PASSES = (
    f"[{_N}]{{1,3}}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    (f"[{_ASCII_PUNCT_AND_SYMBOLS}][A-Za-z]+"
     f"|[^\\r\\n{_L}{_P}{_SYM}]?[{_L}{_M}]+"
     f"| ?[{_P}{_SYM}]+[\\r\\n]*"
     f"|[{_S}]*[\\r\\n]+"
     f"|[{_S}]+(?![^{_S}])"
     f"|[{_S}]+"),
)
# Seed-Coder (Seed-OSS): Qwen2's words, but a punctuation run takes no newlines.
# Its regex is not one llama.cpp has a splitter for, so it runs in std::regex.
SEED_CODER_PASSES = (
    (f"{_CONTRACTIONS_ANY_CASE}"
     f"|[^\\r\\n{_L}{_N}]?[{_L}]+"
     f"|[{_N}]"
     f"| ?[^{_S}{_L}{_N}\\r\\n]+"
     f"|[{_S}]*[\\r\\n]+"
     f"|[{_S}]+(?![^{_S}])"
     f"|[{_S}]+"),
)


class _Custom(str):
    """A pass that is one of llama.cpp's hand-written splitters: it runs on the real text."""


# Laguna: runs of newlines and runs of other text (unicode_regex_split_custom_newlines),
# then Qwen2's splitter inside each, so no word spans a newline boundary.
LAGUNA_PASSES = (_Custom("[^\n]+|\n+"), _Custom(QWEN2_PATTERN))


class _DigitGroups:
    """llama.cpp's unicode_regex_split_custom_afmoe: each run of \\p{N} in groups of three
    from the right.  The text before a run is not a piece of its own: it goes with the
    run's first group (later passes split it off)."""

    _number = re.compile(f"[{_N}]+")

    def split(self, text: str, start: int, end: int) -> list[tuple[int, int]]:
        out, prev = [], start
        for m in self._number.finditer(text, start, end):
            first = m.start() + len(m.group()) % 3
            cuts = ([first] if first != m.start() else []) + list(range(first + 3, m.end() + 1, 3))
            for cut in cuts:
                out.append((prev, cut))
                prev = cut
        if prev < end:
            out.append((prev, end))
        return out


def _wide_cased() -> str:
    """The letter words of o200k-style regexes where llama.cpp's collapsed \\p{Lu}, \\p{Ll}, ...
    are all \\p{L}: case plays no part (Tiny Aya, Youtu)."""
    word = f"[{_L}{_M}]"
    return (f"[^\\r\\n{_L}{_N}]?{word}*{word}+(?:{_CONTRACTIONS_ANY_CASE})?"
            f"|[^\\r\\n{_L}{_N}]?{word}+{word}*(?:{_CONTRACTIONS_ANY_CASE})?")


_WS_TAIL = f"|[{_S}]*[\\r\\n]+|[{_S}]+(?![^{_S}])|[{_S}]+"
# Ling / Ring (bailingmoe, bailingmoe2, llada-moe): Qwen2's regex spelled otherwise (its
# "\s*[\r\n]" ends where "\s*[\r\n]+" does), run as written since llama.cpp runs it in std::regex.
BAILINGMOE_PASSES = ((f"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n{_L}{_N}]?[{_L}]+|[{_N}]"
                      f"| ?[^{_S}{_L}{_N}]+[\\r\\n]*|[{_S}]*[\\r\\n]|[{_S}]+(?![^{_S}])|[{_S}]+"),)
# ufakzeka: Qwen2's without contractions.
UFAKZEKA_PASSES = (f"[^\\r\\n{_L}{_N}]?[{_L}]+|[{_N}]| ?[^{_S}{_L}{_N}]+[\\r\\n]*{_WS_TAIL}",)
# MiniCPM5: digits in threes, then Qwen2's words with digit runs.
MINICPM5_PASSES = (f"[{_N}]{{1,3}}",
                   f"{_CONTRACTIONS_ANY_CASE}|[^\\r\\n{_L}{_N}]?[{_L}]+|[{_N}]+| ?[^{_S}{_L}{_N}]+[\\r\\n]*{_WS_TAIL}")
# Jais 2: Llama 3's words, whitespace runs cut into powers of two.
JAIS2_PASSES = ((f"{_CONTRACTIONS_ANY_CASE}|[^\\r\\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}| ?[^{_S}{_L}{_N}]+[\\r\\n]*"
                 f"|[{_S}]*[\\r\\n]+"
                 + "".join(f"|[{_S}]{{{n}}}(?![^{_S}])" for n in (512, 256, 128, 64, 32, 16, 8, 4))
                 + f"|[{_S}]{{1,2}}(?![^{_S}])|[{_S}]"),)
# K-EXAONE (exaone-moe): letter runs hold marks and single spaces between letters.
EXAONE_MOE_PASSES = ((f"{_CONTRACTIONS_ANY_CASE}|[^\\r\\n{_L}{_N}]?(?:[{_L}][{_M}]*(?: [{_L}][{_M}]*)*)+|[{_N}]"
                      f"| ?[^{_S}{_L}{_N}]+[\\r\\n/]?|[{_S}]*[\\r\\n]|[{_S}]+(?![^{_S}])|[{_S}]+"),)
# Spark 2.5: DeepSeek-V3's passes, punctuation runs without newlines, then digits alone.
SPARK2_5_PASSES = (
    f"[{_N}]{{1,3}}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    (f"[{_ASCII_PUNCT_AND_SYMBOLS}][A-Za-z]+|[^\\r\\n{_L}{_P}{_SYM}]?[{_L}{_M}]+| ?[{_P}{_SYM}]+|[\\r\\n]"
     f"|[{_S}]+(?![^{_S}])|[{_S}]+"),
    f"[{_N}]",
)
# Youtu: runs of Hangul, CJK punctuation, Bopomofo, CJK and kana (a std::wregex), then the words.
YOUTU_PASSES = (
    ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c"
     "\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
    f"{_wide_cased()}|[{_N}]| ?[^{_S}{_L}{_N}]+[\\r\\n/]*{_WS_TAIL}",
)
# Tiny Aya, North (cohere2moe): digit groups from the right, then o200k's words.
TINY_AYA_PASSES = (_DigitGroups(), f"{_wide_cased()}|[{_N}]{{1,3}}| ?[^{_S}{_L}{_N}]+[\\r\\n/]*{_WS_TAIL}")
# Arcee (afmoe): digit groups from the right, CJK and Southeast Asian scripts (a std::wregex; its
# first range starts at U+8C48, as llama.cpp writes it), then DeepSeek-V3's words.
AFMOE_PASSES = (
    _DigitGroups(),
    ("[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf"
     "\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af"
     "\u1100-\u11ff]+"),
    (f"[{_ASCII_PUNCT_AND_SYMBOLS}][A-Za-z]+|[^\\r\\n{_L}{_P}{_SYM}]?[{_L}{_M}]+| ?[{_P}{_SYM}]+[\\r\\n]*"
     f"{_WS_TAIL}"),
)
# BLOOM, Poro, GPT-3 Finnish: runs of anything but whitespace and these marks (a std::wregex:
# "(", "|" and ")" are members of the class); Viking also isolates each digit.
BLOOM_PASSES = (f" ?[^({_S}|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",)
VIKING_PASSES = (*BLOOM_PASSES, f"[{_N}]")
# Chameleon: its sentinel and image tokens, tabs, newlines and space pairs, digits, punctuation
# (\\p{P} and ASCII's), then GPT-2's regex (which llama.cpp runs with its GPT-2 splitter).
CHAMELEON_PASSES = (
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\t\n]|    |  )",
    f"[{_N}]",
    f"[{_P}!-/:-@\\[-`{{-~]",
    _Custom(GPT2_PATTERN),
)


class _RightDigitGroups(_DigitGroups):
    """SuperBPE's second pass, (?=(\\d{3})+(?!\\d)) in std::wregex: a match of nothing wherever
    a multiple of three ASCII digits follows up to the next non-digit, so each run of
    ASCII digits is cut into threes from the right (the empty words give no tokens)."""

    _number = re.compile("[0-9]+")

    def split(self, text: str, start: int, end: int) -> list[tuple[int, int]]:
        out, prev = [], start
        for m in self._number.finditer(text, start, end):
            for cut in range(m.start() + len(m.group()) % 3, m.end(), 3):
                if cut > prev:
                    out.append((prev, cut))
                    prev = cut
        if prev < end:
            out.append((prev, end))
        return out


SUPERBPE_PASSES = (f"[{_N}]+", _RightDigitGroups())
# Granite embedding multilingual (97m): o200k's words with marks counted as letters of both cases.
GRANITE_EMB_MULTI_PASSES = ((
    f"[^\\r\\n{_L}{_N}]?[{_UPPERISH}{_M}]*[{_LOWERISH}{_M}]+(?:{_CONTRACTIONS_ANY_CASE})?"
    f"|[^\\r\\n{_L}{_N}]?[{_UPPERISH}{_M}]+[{_LOWERISH}{_M}]*(?:{_CONTRACTIONS_ANY_CASE})?"
    f"|[{_N}]{{1,3}}| ?[^{_S}{_L}{_N}]+[\\r\\n/]*{_WS_TAIL}"),)

# llama.cpp's "default" BPE pre-tokenizer.
DEFAULT_PASSES = (
    f"[{_P}$+<=>^~|]+",
    GPT2_PATTERN,
    f"[{_N}]+",
    "[0-9][0-9][0-9]",
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
    #: False where llama.cpp has no default BOS id (ChatGLM4, GLM-4.5): only
    #: tokenizer.ggml.bos_token_id gives one.
    has_bos: bool = True


def _single_pass(pattern: str) -> Callable[[str], list[str]]:
    compiled = re.compile(pattern, re.DOTALL)
    return compiled.findall


def _multi_pass(passes) -> Callable[[str], list[str]]:
    """llama.cpp's std::regex passes: each splits every piece into matches and the text between them."""
    compiled = [p if isinstance(p, _DigitGroups) else (re.compile(p, re.DOTALL), isinstance(p, _Custom))
                for p in passes]

    def split(text: str) -> list[str]:
        stand_in = _stl_text(text)
        spans = [(0, len(text))] if text else []
        for step in compiled:
            if isinstance(step, _DigitGroups):
                spans = [span for start, end in spans for span in step.split(text, start, end)]
                continue
            rx, custom = step
            subject = text if custom else stand_in
            out = []
            for start, end in spans:
                pos = start
                for m in rx.finditer(subject, start, end):
                    m_start, m_end = m.span()
                    if m_start == m_end:
                        continue
                    if m_start > pos:
                        out.append((pos, m_start))
                    out.append((m_start, m_end))
                    pos = m_end
                if pos < end:
                    out.append((pos, end))
            spans = out
        return [text[s:e] for s, e in spans]

    return split


# (family, pattern or passes, ignore_merges, add_bos[, has_bos])
_Passes = Union[str, tuple[Union[str, _DigitGroups], ...]]
_Entry = Union[tuple[str, _Passes, bool, bool], tuple[str, _Passes, bool, bool, bool]]

_QWEN2: _Entry = ("qwen2", QWEN2_PATTERN, False, False)
_QWEN35 = ("qwen35", QWEN35_PATTERN, False, False)
_LLAMA3 = ("llama3", LLAMA3_PATTERN, True, True)
_GPT2 = ("gpt2", GPT2_PATTERN, False, False)
_SMOLLM = ("smollm", SMOLLM_PATTERN, False, False)
_GPT4O = ("gpt4o", (GPT4O_PATTERN,), False, False)

# tokenizer.ggml.pre -> (family, pattern or passes, ignore_merges, add_bos[, has_bos]),
# as llama-vocab.cpp maps them.  A tuple of patterns is a list of std::regex passes.
_BY_PRE: dict[str, _Entry] = {
    **{k: _QWEN2 for k in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez",
                           "stablelm2", "hunyuan", "solar-open")},
    "qwen35": _QWEN35,
    **{k: _LLAMA3 for k in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                            "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    **{k: ("llama3", LLAMA3_PATTERN, False, False) for k in ("dbrx", "smaug-bpe")},
    # ChatGLM4's regex is Llama 3's (llama.cpp runs it with the Llama 3 splitter);
    # these vocabularies have no default BOS token.
    "chatglm-bpe": ("llama3", LLAMA3_PATTERN, False, False, False),
    **{k: ("llama3", LLAMA3_PATTERN, True, False, False) for k in ("glm4", "glm5")},
    **{k: _GPT2 for k in ("gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                          "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert",
                          "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
                          "jina-v1-en", "jina-v2-code", "roberta-bpe")},
    **{k: _SMOLLM for k in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                            "exaone", "minerva-7b", "mellum2")},
    **{k: _GPT4O for k in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")},
    "tekken": ("tekken", (TEKKEN_PATTERN,), True, True),
    "deepseek-llm": ("deepseek-llm", DEEPSEEK_LLM_PASSES, False, False),
    "deepseek-coder": ("deepseek-coder", DEEPSEEK_CODER_PASSES, False, False),
    **{k: ("deepseek-v3", DEEPSEEK3_PASSES, False, False) for k in ("deepseek-v3", "hunyuan-dense",
                                                                    "joyai-llm", "hy_v4")},
    "seed-coder": ("seed-coder", SEED_CODER_PASSES, False, False),
    "laguna": ("laguna", LAGUNA_PASSES, False, False),
    "kimi-k2": ("kimi-k2", KIMI_K2_PATTERN, False, False),
    # Grok 2's regex is Qwen2's, character for character (llama.cpp runs its splitter).
    "grok-2": _QWEN2,
    **{k: ("bailingmoe", BAILINGMOE_PASSES, False, False) for k in ("bailingmoe", "bailingmoe2", "llada-moe")},
    "ufakzeka": ("ufakzeka", UFAKZEKA_PASSES, False, False),
    "minicpm5": ("minicpm5", MINICPM5_PASSES, True, False),
    "jais-2": ("jais-2", JAIS2_PASSES, False, False),
    "exaone-moe": ("exaone-moe", EXAONE_MOE_PASSES, False, False),
    "spark2_5": ("spark2_5", SPARK2_5_PASSES, False, False),
    "youtu": ("youtu", YOUTU_PASSES, True, False),
    **{k: ("tiny_aya", TINY_AYA_PASSES, False, False) for k in ("tiny_aya", "cohere2moe")},
    "afmoe": ("afmoe", AFMOE_PASSES, False, False),
    "granite-embed-multi-97m": ("granite-embed-multi-97m", GRANITE_EMB_MULTI_PASSES, True, False),
    **{k: ("bloom", BLOOM_PASSES, False, False) for k in ("bloom", "poro-chat", "gpt3-finnish")},
    "viking": ("viking", VIKING_PASSES, False, False),
    "chameleon": ("chameleon", CHAMELEON_PASSES, False, True),
    "superbpe": ("superbpe", SUPERBPE_PASSES, False, False),
    "falcon": ("falcon", FALCON_PASSES, False, False),
}


# Values llama.cpp knows (llama_vocab::impl::load) whose splitting elelem does not
# reproduce.  Any other pre-tokenizer would give other ids than the model's own, so
# these are refused rather than replaced.
_NOT_BYTE_LEVEL = ("BPE over raw UTF-8 pieces with spaces escaped (no GPT-2 byte encoding); elelem reads "
                   "that kind as tokenizer.ggml.model \"gemma4\" only")
_REFUSED: dict[str, str] = {
    **{k: _NOT_BYTE_LEVEL for k in ("gemma4", "granite-embed-multi-311m", "sarvam-moe")},
    "whitespace": "words split at whitespace, without GPT-2 byte encoding",
}


def pretokenizer_for(pre: str | None) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value.

    A missing value, ``"default"`` and any value neither elelem nor llama.cpp
    knows use llama.cpp's ``default`` BPE pre-tokenizer (what llama.cpp itself
    uses when the key is missing); an unknown value also logs a warning, since
    the ids will then likely differ from the model's own tokenizer.  A value
    llama.cpp has a pre-tokenizer for that elelem does not reproduce raises
    :class:`~elelem.errors.GGUFError` naming it.
    """
    reason = _REFUSED.get(pre or "")
    if reason is not None:
        raise GGUFError(f"tokenizer.ggml.pre {pre!r} is not supported: llama.cpp's pre-tokenizer for it uses "
                        f"{reason}, which elelem does not reproduce, and another one would give other token ids")
    entry = _BY_PRE.get(pre or "")
    if entry is not None:
        family, pattern, ignore_merges, add_bos, *rest = entry
        split = _multi_pass(pattern) if isinstance(pattern, tuple) else _single_pass(pattern)
        return PreTokenizer(family, split, ignore_merges, add_bos, *rest)
    if pre not in (None, "", "default"):
        log.warning("unknown tokenizer.ggml.pre %r: using the 'default' BPE pre-tokenizer; "
                    "token ids may differ from the model's own tokenizer", pre)
    return PreTokenizer("default", _multi_pass(DEFAULT_PASSES))
