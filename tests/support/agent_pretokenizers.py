"""The pre-tokenizers of the agent-model families, against llama.cpp live: vocabularies and texts.

Standard library only, like pretokenizer_corpus.py (whose corpus, probe vocabulary
and GGUF writing this reuses): tests/support/fixtures/make_agent_pretokenizer_fixtures.py
imports it under the llama.cpp reference python, tests/test_tokenizer_agent_families.py
under elelem's.

``tokenizer.ggml.pre`` of each family, as llama.cpp's converter writes it: the
tokenizer hash table of conversion/base.py (get_vocab_base_pre) names its
reference model for each value, and llama-vocab.cpp maps the value to a type:

==========================  ===============  =======================================
reference model             pre              llama.cpp type
==========================  ===============  =======================================
GLM-4.5-Air, GLM-4.7-Flash  glm4             CHATGLM4 (Llama 3's regex, no BOS)
DeepSeek-V3                 deepseek-v3      DEEPSEEK3_LLM (three std::regex passes)
Kimi-K2-Base                kimi-k2          KIMI_K2 (a splitter of its own)
LFM2.5-350M, LFM2.5-8B-A1B  lfm2             LLAMA3
granite-docling-258M        granite-docling  GRANITE_DOCLING (GPT-2's regex)
Seed-Coder-8B-Base          seed-coder       SEED_CODER (std::regex)
SmolLM-135M                 smollm           SMOLLM (StarCoder's regexes)
MiniMax-M2                  minimax-m2       MINIMAX_M2 (GPT-4o's regex)
Laguna-XS.2                 laguna           LAGUNA (newline runs, then Qwen2's)
==========================  ===============  =======================================

The other models of these families get whichever value their tokenizer's hash
has in that table.  Their GGUFs, as llama.cpp prints their metadata in bug
reports, carry: Nemotron-3-Nano ``pixtral`` (LLAMA3), SmolLM3 ``smaug-bpe``
(Llama 3's regex), Granite 4.0 ``dbrx`` (Llama 3's regex), Granite 3
``refact`` (StarCoder's), DeepSeek-V2-Lite ``deepseek-llm``.  Moonlight's
converter (deepseek2's set_vocab) writes ``kimi-k2`` or refuses the tokenizer.
Seed-OSS shares Seed-Coder's 155,136-token vocabulary (``seed-coder``, not
seen in a GGUF here).  ALREADY_SUPPORTED compares the values that map to types
elelem had before.

The other byte-level pre-tokenizers of llama.cpp's table (Ling's, Arcee's, Tiny
Aya's, MiniCPM5's, ...) are compared on the probe vocabulary too.

No vocabulary of these families is in the sdist, so an sdist vocabulary
(``models/ggml-vocab-<base>.gguf``) is given each ``pre`` (CONFIGS), and so is
the probe vocabulary (pretokenizer_corpus.probe_vocab's construction over
CORPUS), whose ids show every split.  CORPUS is pretokenizer_corpus.CORPUS plus
texts for what these regexes add: Han next to kana and Hangul, the CJK
extensions and compatibility ideographs Kimi-K2 counts as Han, symbols (\\p{S})
against punctuation, an ASCII mark before ASCII and non-ASCII letters, marks in
words, whitespace before newlines (Laguna splits there first), code.
"""
from __future__ import annotations

import hashlib
import json
import random

import pretokenizer_corpus as base_corpus

#: The new pre-tokenizers: (base vocabulary, tokenizer.ggml.pre); base "probe" is probe_vocab().
CONFIGS = [
    ("deepseek-llm", "deepseek-v3"), ("qwen2", "deepseek-v3"), ("probe", "deepseek-v3"),
    ("qwen2", "kimi-k2"), ("probe", "kimi-k2"),
    ("qwen2", "seed-coder"), ("llama-bpe", "seed-coder"), ("probe", "seed-coder"),
    ("qwen2", "laguna"), ("probe", "laguna"),
    # the other std::regex and digit-group pre-tokenizers of llama.cpp
    *[("probe", pre) for pre in ("bailingmoe", "ufakzeka", "minicpm5", "jais-2", "exaone-moe", "spark2_5", "youtu",
                                 "tiny_aya", "afmoe", "granite-embed-multi-97m", "bloom", "viking", "chameleon",
                                 "superbpe")],
]
#: Family names llama.cpp maps to a type elelem already had, on the probe vocabulary: ids equal.
ALREADY_SUPPORTED = ["glm4", "deepseek-llm", "lfm2", "granite-docling", "smollm", "minimax-m2", "dbrx", "refact",
                     "llama-bpe", "smaug-bpe", "tekken", "pixtral", "gpt-2"]
#: Other names of the new types, on the probe vocabulary: ids equal to the named one's.
ALIASES = {"hunyuan-dense": "deepseek-v3", "joyai-llm": "deepseek-v3", "hy_v4": "deepseek-v3", "grok-2": "qwen2",
           "bailingmoe2": "bailingmoe", "llada-moe": "bailingmoe", "cohere2moe": "tiny_aya",
           "poro-chat": "bloom", "gpt3-finnish": "bloom"}
#: Kimi-K2's GGUFs may lack merges (llama.cpp then skips them): the probe vocabulary without them.
NO_MERGES = ("probe", "kimi-k2")
BARE_DROPPED_KEYS = base_corpus.BARE_DROPPED_KEYS

_EXTRA = [
    # Han, kana, Hangul, full-width and CJK punctuation side by side
    "漢字ひらがなカタカナ한글", "中文テスト中文", "日本語「引用」です。", "ｶﾀｶﾅ半角", "龥龦鿿", "\u9fa6\u9fff\u3400\u4dbf",
    "\U00020000\U0002a6df\U0002a700\U0002b81f\U0002ebef", "\uf900\ufa6e\ufaff\U0002f800\U0002fa1f", "〇一二三", "々〆ヶ",
    "ゝゞヽヾ", "中a文B字c", "中1文22字333", "ﾟ゛゜", "テスト'S", "中'文", "我's",
    # ASCII punctuation and symbols before letters
    "\"quoted\" 'single' `tick`", "#include", "@decorator", "$var", "~home", "^caret", "|pipe|", "<tag>", "a+b=c",
    "'éclair", "\"Émile\"", "_private", "__dunder__", "-flag", "--long-flag", "./run.sh", "\\escape", "[link](url)",
    "{key}", "(paren)", "1+1=2", "x<=y>=z", "#Ωmega", "@Ñandú",
    # symbols (\p{S}) and punctuation
    "©2026 ®™", "5€ £3 ¥", "±×÷", "→←↑↓", "∑∫√∞", "°C", "©\n", "™\r\n\r\n", "♥♦♣♠", "⌘⌥⇧", "¬¦", "¨´¸",
    "˂˃˄˅", "⁄", "%‰", "&§", "¶†", "a©b", " ©", "  ©©  ", "!©!", "«»", "‹›", "。、", "!!\n\n", "?? \n",
    # marks inside and at the start of words
    "e\u0301te\u0301", "\u0301abc", "a\u0301\u0302\u0303", "ma\u0308dchen", "क़िताब", "नमस्ते", "ภาษา\u0e31", "\u20dd",
    "x\u0327", "Ç\u0327",
    # whitespace before newlines, newline runs, carriage returns
    "a  \nb", "a \n\n b", "x\t\n\ty", "  \n\n  ", "a\r\nb", "a \r\n b", "a\n \nb", "\n a", "a \n", "end \n\n",
    " \u3000\n", "a\u00a0\nb", "a\n\n\n b\n\n", "line1\nline2\n\nline4", "\r\r\n\n", "x \r",
    # contractions in every case, after CJK and digits
    "I'LL", "we'RE", "they'Ve", "SHE'd", "it'S", "don'T", "I'M", "'LL", "ab'c", "a'sb", "Ω's", "ÉCOLE'LL",
    # numbers
    "1234567", "12 345 678", "٣٤٥٦", "١٢٣٤٥٦٧", "１２３４", "³⁴", "⅓⅔", "3.14e10", "0b1010_1010",
    # code
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    "async fn run() -> Result<(), E> {\n\tlet x = vec![1, 2];\n}\n",
    "const π = 3.14159; // 圆周率\nlet s = `${a}+${b}`;",
    "SELECT name, COUNT(*) FROM users GROUP BY 1 HAVING COUNT(*) > 10;",
    "if (a && b || !c) { x |= 0xFF; }",
    "<div class=\"a\">中文</div>\n",
    "    \n        \n",
    "emoji 🤖🧠 in code: print('🚀')",
    # Chameleon's sentinel and image tokens, BLOOM's excluded marks
    "<sentinel:0><sentinel:123>", "IMGIMGABZ IMGIMGIIIIZ IMGIMGJZ", "a (b|c) d", "x.y,z!w?v…u。t，s、r।q۔p،o",
]

# Blocks to draw code points from: ASCII, Latin, marks, Greek to Armenian, Hebrew and Arabic,
# Devanagari, Thai and Lao, Myanmar, Hangul Jamo, Khmer, punctuation and symbols, CJK radicals,
# CJK punctuation and kana, Bopomofo, CJK and its extensions (and the unassigned ends of
# their ranges), Hangul, private use, compatibility ideographs, variation selectors, half- and
# full-width forms, emoji, mathematical letters, Linear B, tags.
_BLOCKS = [(0x20, 0x7E)] * 6 + [
    (0x80, 0x2FF), (0x300, 0x36F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xEFF), (0x1000, 0x109F),
    (0x1100, 0x11FF), (0x1780, 0x17FF), (0x2000, 0x206F), (0x2070, 0x2BFF), (0x2E80, 0x2FDF), (0x3000, 0x30FF),
    (0x3100, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA960, 0xA9FF), (0xAA60, 0xAA7F), (0xAC00, 0xD7FF),
    (0xE000, 0xE0FF), (0xF900, 0xFAFF), (0xFE00, 0xFE6F), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x20000, 0x20100),
    (0x2A6D0, 0x2A710), (0x2B730, 0x2B830), (0x2CE90, 0x2CEC0), (0x2EBD0, 0x2EBF5), (0x2F800, 0x2FA30),
    (0x1D400, 0x1D7FF), (0x10000, 0x1007F), (0xE0000, 0xE007F),
]
_SPACES = [" ", "  ", "\n", "\r\n", "\t", "\u3000", "\u00a0", "\u2028", "\x0b", "\x85"]


def _random_code_points(n: int, seed: int) -> list[str]:
    """Short texts of code points from _BLOCKS, whitespace and numbers: where categories meet."""
    rng = random.Random(seed)
    texts: list[str] = []
    while len(texts) < n:
        parts = []
        for _ in range(rng.randint(1, 9)):
            r = rng.random()
            if r < 0.2:
                parts.append(rng.choice(_SPACES))
            elif r < 0.3:
                parts.append(str(rng.randint(0, 99999)))
            else:
                cp = rng.randint(*rng.choice(_BLOCKS))
                if not 0xD800 <= cp <= 0xDFFF:
                    parts.append(chr(cp) * rng.choice([1, 1, 1, 2, 3]))
        text = "".join(parts)[:12]
        if text and text not in texts:
            texts.append(text)
    return texts


CORPUS: list[str] = [*base_corpus.CORPUS, *_EXTRA, *_random_code_points(250, 20261207)]


def probe_vocab() -> tuple[list[str], list[str]]:
    """pretokenizer_corpus.probe_vocab's construction over this CORPUS: (tokens, merges)."""
    saved = base_corpus.CORPUS
    base_corpus.CORPUS = CORPUS
    try:
        return base_corpus.probe_vocab()
    finally:
        base_corpus.CORPUS = saved


def probe_metadata(pre: str, merges: bool = True) -> dict:
    """The probe vocabulary as GGUF metadata, with ``tokenizer.ggml.pre = pre`` (and without merges if asked)."""
    tokens, merge_list = probe_vocab()
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens}
    if merges:
        meta["tokenizer.ggml.merges"] = merge_list
    return meta


def digest() -> str:
    """What a stored fixture must have been made from."""
    data = json.dumps({"corpus": CORPUS, "configs": CONFIGS, "already": ALREADY_SUPPORTED, "aliases": ALIASES,
                       "no_merges": NO_MERGES, "bare": BARE_DROPPED_KEYS,
                       "probe_max_chars": base_corpus.PROBE_MAX_CHARS}, ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()
