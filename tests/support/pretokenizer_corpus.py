"""Texts and vocabularies for comparing elelem's BPE pre-tokenizers with llama.cpp live.

Standard library only: tests/support/fixtures/make_pretokenizer_fixtures.py imports it
under the llama.cpp reference python, tests/test_tokenizer_vocab_files.py under
elelem's.  No llama.cpp vocabulary test file exists for the pre-tokenizers of
gpt-oss (``gpt-4o``), GLM-4.5 (``glm4``) or Mistral (``tekken``), so a real
vocabulary of the sdist (``models/ggml-vocab-<base>.gguf``) is rewritten with
``tokenizer.ggml.pre`` set to each of them (CONFIGS), and both tokenizers split
CORPUS: texts that tell the regexes apart (contractions in upper case, runs of
1-5 digits, CJK and full-width text, case changes inside words, punctuation
runs, whitespace runs with newlines and non-ASCII spaces, emoji, accents and
combining marks, scripts without case, code, chat markup).
"""
from __future__ import annotations

import hashlib
import json
import random

#: (base vocabulary, tokenizer.ggml.pre): ggml-vocab-<base>.gguf with that pre-tokenizer, or for
#: base "probe" the vocabulary of probe_vocab().
CONFIGS = [
    *[("qwen2", pre) for pre in ("qwen2", "gpt-4o", "tekken", "glm4")],
    *[("llama-bpe", pre) for pre in ("gpt-4o", "tekken", "glm4", "chatglm-bpe")],
    ("qwen35", "qwen35"),
    *[("probe", pre) for pre in ("gpt-4o", "tekken", "glm4", "qwen2", "llama-bpe", "deepseek-llm",
                                 "deepseek-coder", "falcon", "default", "gpt-2", "starcoder", "qwen35")],
    # Gemma 4's own tokenizer (tokenizer.ggml.model "gemma4": llama.cpp sets pre "gemma4" itself).
    ("gemma-4", "gemma4"),
]
#: Other names llama.cpp maps to the same pre-tokenizer: compared on the probe vocabulary,
#: by a digest of all their ids.
ALIASES = {"llama4": "gpt-4o", "minimax-m2": "gpt-4o", "kanana2": "gpt-4o", "talkie": "gpt-4o", "glm5": "glm4",
           "deepseek-r1-qwen": "qwen2", "falcon3": "llama-bpe"}
#: Metadata keys left out of the "bare" variant, to see the pre-tokenizer's own BOS defaults.
BARE_DROPPED_KEYS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")
#: Bases with no "bare" variant: Gemma 4 has no default BOS id but always adds BOS, and
#: llama.cpp aborts tokenizing with add_special then.
NO_BARE = ("gemma-4",)
#: The probe vocabulary has every substring of the corpus up to this many characters as a token.
PROBE_MAX_CHARS = 10

_CONTRACTIONS = [
    "DON'T", "I'M", "YOU'RE", "WE'VE", "SHE'LL", "HE'D", "IT'S", "it's", "It'S", "don't", "Don'T", "you're",
    "they've", "we'll", "I'd", "'s", "'S", "'t", "'ll", "'LL", "'Re", "o'clock", "rock'n'roll", "l'été",
    "DON\u2019T", "Tom's BIKE'S", "'ſ", "X'D", "5's", "éé's", "ÉCOLE'S",
]
_NUMBERS = [
    "1", "12", "123", "1234", "12345", "123456", "1234567890", "3.14159", "1,000,000", "v1.2.3", "0x1F",
    "2026-12-01", "-42", "+7", "1e-10", "٣٤٥", "１２３", "½", "4 ½ months", "x²", "Ⅻ", "①②", "a1b22c333d4444e55555",
    "room 101, floor 7", "$19.99", "100%", "9am-5pm", "ID:00042",
]
_CJK = [
    "日本語のテキスト", "中文分词测试", "我爱中文。", "한국어 텍스트", "「こんにちは」", "全角\u3000スペース", "中a文b",
    "中\u3000文", "，。！？", "（全角）", "ｈｅｌｌｏ　ｗｏｒｌｄ", "カタカナー", "漢字かな交じり文", "𠀀𠀁", "中1文22",
]
_CASE = [
    "HelloWorld", "helloWORLD", "HTTPServer", "iPhone", "XMLHttpRequest", "camelCaseWord", "PascalCase",
    "snake_case_word", "SCREAMING_SNAKE", "ÉCOLE", "École", "éCOLE", "ÀÉÎÕÜ", "àéîõü", "ǅungla", "ǄUNGLA",
    "ΣΊΣΥΦΟΣ", "Σίσυφος", "ПРИВЕТмир", "приветМИР", "McDonald", "MacBookPro", "aBcDeF", "ABCdef", "abcDEF",
    "A", "a", "I", "OK", "Ok", "oK", "ĲssEL", "ﬁne ﬂow", "Straße", "STRASSE", "İstanbul", "ıi",
]
_PUNCT = [
    "!!!", "?!?!", "...", "\u2026", "---", "***", "((()))", "a/b/c", "path/to/file.py", "</div>\n", "[INST]",
    "#!/usr/bin/env", "=>", "->", "::", "$$$", "`code`", "~~~", "|||", "^_^", "@user", "#tag", "&amp;", "<<>>",
    "«guillemets»", "\u201cdouble\u201d", "\u2018single\u2019", "¿Qué?", "¡Hola!", "a--b", "a//b", "/\n", "!\n\n",
    "x = [1, 2, 3];", "{'a': 1}", "\"quoted\"", "'quoted'", "— dash – en", "§ ¶ † ‡", "©®™", "€£¥₹",
]
_SPACE = [
    "\n", "\n\n", "\r\n", "\r\n\r\n", "a\n\nb", "  \n  ", "\t\t", "a  b", "a   \n", "   ", " ", "  leading",
    "trailing  ", "a \u3000 b", "\u00a0", "a\u00a0b", "a\u2009b", "\u3000\u3000x", "x\u3000", "\n\u3000\n",
    "a\x0bb", "a\x0cb", "a\x1cb\x1dc", "a\u2028b", "a\u0085b", "a\u1680b", "a\u202fb", " \n \n ", "\t\n\t",
    "hello   ", "hello \n", "end\u3000", "x\n   \ny", "  \u3000  ", "a\r\rb", "\n\n\n\n\n",
]
_EMOJI = [
    "🚀", "😀😃", "👨\u200d👩\u200d👧", "🇫🇷", "✅ done", "❤️", "🫨", "hello 😀 world", "👍🏽", "🦙.cpp",
    "😶\u200d🌫️", "(🎉)", "🚀🚀🚀",
]
_ACCENTS = [
    "café", "cafe\u0301", "naïve", "Ångström", "résumé", "ñandú", "Zalgo z\u0351\u036b\u0343",
    "अनुच्छेद", "ภาษาไทย", "مرحبا بالعالم", "עברית", "Ελληνικά", "Հայերեն", "ქართული", "ᏣᎳᎩ", "Привет, мир",
    "\u0301", "e\u0301\u0301", "ǅ", "ℕ ℤ ℚ", "Ωmega \u2126hm \u212aelvin", "ｱｲｳ",
]
_CODE = [
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) {\n\tx[i] = i*2;\n}",
    "if x == 10 and y != 20:\n    pass",
    "print(f\"{name!r:>10}\")",
    "SELECT * FROM t WHERE id=42;",
    "const f = (x) => x ** 2;",
    "<html><body>Hi</body></html>",
    "// comment\n/* block */",
    "    indented\n        more\n",
    "x=1\ny=22\nz=333\n",
    "__init__(self)", "0.5e-10", "#include <stdio.h>", "a_b_c", "std::vector<int>", "$HOME/bin:$PATH",
    "fn main() -> Result<(), Box<dyn Error>> {}", "λx.x", "i+=1;j-=2", "arr[-1]",
]
_MARKUP = [
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|start|>assistant<|channel|>final<|message|>4.<|end|>",
    "[INST]What is 2 + 2?[/INST]4.</s>",
    "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>\n",
    "<think>\nLet me think.\n</think>\n\nAnswer.",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
]
_ODD = [
    "", "\u0378", "a\u0378b", "\ue000", "a\U0010fffdb", "a\x01b", "\x7f", "a\u200bb", "\ufeffbom", "\ufffd",
    "a" * 50, "A" * 50, "Aa" * 30, "aA" * 30, "1" * 41, " " * 40, "\n" * 20, "É" * 30, "中" * 40, "!" * 33,
    "\u3000" * 10, "'" * 9, "ab'" * 10,
]
#: Pieces for the seeded random strings: where two pieces meet, the regexes disagree.
_PIECES = [
    "Hello", "WORLD", "hello", "DON'T", "'s", "'S", "'re", "I'M", "ÉCOLE", "école", "É", "é", "ǅ", "Σ", "σ", "ß",
    "中", "文", "日本", "。", "，", "한", "국어", "😀", "🚀", "\u200d", "\u00a0", "\u3000", " ", "  ", "\n", "\n\n",
    "\r\n", "\t", "\x0b", ",", ".", "!", "?", "'", "\"", "$", "_", "-", "/", "\\", "#", "`", "~", "^", "|", "<", ">",
    "(", ")", "[", "]", "{", "}", "0", "7", "42", "123", "4567", "½", "²", "٣", "１", "\u0301", "ก", "ा", "α",
    "Ω", "Я", "я", "ﬁ", "Ａ", "ａ", "<|im_start|>", "[INST]", "\ue000", "\u0378", "x", "Y", "z", "Ab", "aB",
]


def _random_strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 14))) for _ in range(n)]


CORPUS: list[str] = [*_CONTRACTIONS, *_NUMBERS, *_CJK, *_CASE, *_PUNCT, *_SPACE, *_EMOJI, *_ACCENTS, *_CODE,
                     *_MARKUP, *_ODD, *_random_strings(220, 20261206)]


def _byte_to_char() -> list[str]:
    """GPT-2's byte-to-character table (elelem.text.tokenizer.bpe.BYTE_TO_CHAR)."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = [], 0
    for b in range(256):
        if b in printable:
            table.append(chr(b))
        else:
            table.append(chr(0x100 + extra))
            extra += 1
    return table


def probe_vocab() -> tuple[list[str], list[str]]:
    """A byte-level BPE vocabulary that shows where a pre-tokenizer splits: (tokens, merges).

    Real vocabularies hide most differences between pre-tokenizers: no token of
    Llama 3's spans "o|W", so "HelloWorld" gives the same ids whether the
    regex splits it or not.  Here every substring of 2..PROBE_MAX_CHARS
    characters of a corpus text is a token, and every split of it into two
    shorter ones a merge, after the merges that assemble each non-ASCII
    character from its bytes.  BPE then turns every pre-tokenizer word of up to
    PROBE_MAX_CHARS characters into one token of its own, and a longer one into
    pieces of its own, so two splits of a text give two different id lists."""
    b2c = _byte_to_char()

    def enc(text: str) -> str:
        return "".join(b2c[b] for b in text.encode("utf-8"))

    tokens = list(b2c)
    seen = set(tokens)
    merges = []
    for ch in sorted({ch for text in CORPUS for ch in text if ord(ch) >= 0x80}):
        symbols = [b2c[b] for b in ch.encode("utf-8")]
        left = symbols[0]
        for right in symbols[1:]:
            if left + right not in seen:
                merges.append(f"{left} {right}")
                tokens.append(left + right)
                seen.add(left + right)
            left += right
    words = {text[i:i + n] for text in CORPUS for n in range(2, PROBE_MAX_CHARS + 1) for i in range(len(text) - n + 1)}
    for word in sorted(words, key=lambda w: (len(w), w)):
        tokens.append(enc(word))
        merges.extend(f"{enc(word[:i])} {enc(word[i:])}" for i in range(1, len(word)))
    return tokens, merges


def probe_metadata(pre: str) -> dict:
    """The probe vocabulary as GGUF metadata (``key -> value``), with ``tokenizer.ggml.pre = pre``."""
    tokens, merges = probe_vocab()
    return {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges}


def digest() -> str:
    """What a stored fixture must have been made from: the corpus and the configurations."""
    data = json.dumps({"corpus": CORPUS, "configs": CONFIGS, "aliases": ALIASES, "bare": BARE_DROPPED_KEYS, "no_bare": NO_BARE,
                       "probe_max_chars": PROBE_MAX_CHARS}, ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def ids_digest(all_ids: list[list[int]]) -> str:
    """A digest of one configuration's ids for the whole corpus (how ALIASES are compared)."""
    return hashlib.sha256(json.dumps(all_ids, separators=(",", ":")).encode()).hexdigest()
