"""Tokenizer throughput on 1 MB of mixed text, elelem vs llama.cpp.

    python benchmarks/tokenizer_speed.py [--mb 1.0] [--models qwen2.5-coder-0.5b,...]

Prints MB/s (of UTF-8 input) per model for a cold tokenizer (empty word
cache) and a warm one (second run), and the time to build the tokenizer from
metadata.  When ``llama_cpp`` (llama-cpp-python) is importable in this
interpreter it also tokenizes the same text with llama.cpp (vocab only) and
checks that the ids are identical.
"""
from __future__ import annotations

import argparse
import pathlib
import random
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from elelem.model.hub import resolve_model  # noqa: E402
from elelem.text.tokenizer import Tokenizer  # noqa: E402
from tests.tokenizer_meta import read_metadata  # noqa: E402

MODELS = ("qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m")

_SYLLABLES = ("ka ri to na mi el an or is ta ve lo qu sh th str pr ex in con de re ab ul "
              "om ix yz gr bl ch ph wh ing ed er est ly tion ment ness").split()
_CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)] + [chr(c) for c in range(0x3041, 0x3097)]
_HANGUL = [chr(c) for c in range(0xAC00, 0xAC00 + 2000)]
_CYRILLIC = [chr(c) for c in range(0x0430, 0x0450)]
_EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇫🇷", "🎉", "❤️", "🚀", "🤷\u200d♀️"]
_ACCENTED = "éèêëàâäôöûüçñßøåæœíóúý"


def _lexicon(rng: random.Random, size: int) -> list[str]:
    words = set()
    while len(words) < size:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.05:
            word = word[: rng.randint(1, len(word))] + rng.choice(_ACCENTED) + word
        words.add(word)
    return sorted(words)


def mixed_text(megabytes: float, seed: int = 0) -> str:
    """Deterministic, varied text: Zipf-distributed prose over a 30k-word lexicon,
    code with random identifiers, numbers, CJK, Hangul, Cyrillic, emoji, whitespace."""
    rng = random.Random(seed)
    lexicon = _lexicon(rng, 30_000)
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]

    def words(n: int) -> list[str]:
        return rng.choices(lexicon, weights, k=n)

    def prose() -> str:
        out = []
        for w in words(rng.randint(8, 30)):
            if rng.random() < 0.08:
                w = w.capitalize()
            if rng.random() < 0.03:
                w += rng.choice(["'s", "'t", "'re", "'ll", "'D"])
            out.append(w)
        return " ".join(out) + rng.choice([". ", "! ", "? ", ", ", ".\n\n"])

    def code() -> str:
        a, b, c = words(3)
        indent = rng.choice(["", "    ", "        ", "\t", "\t\t"])
        return rng.choice([
            f"{indent}def {a}_{b}({c}, n={rng.randint(0, 999)}):\n{indent}    return {c} * n\n",
            f"{indent}for (int {a} = 0; {a} < {rng.randint(1, 10**6)}; ++{a}) {{ {b}[{a}] += {c}; }}\r\n",
            f"SELECT {a}, {b} FROM {c} WHERE id = {rng.randint(0, 10**9)};\n",
            f"{indent}let {a}{b.capitalize()} = await fetch('https://{c}.example.com/{a}?q={rng.randint(0, 99)}');\n",
        ])

    def other() -> str:
        kind = rng.randrange(6)
        if kind == 0:
            return "".join(rng.choices(_CJK, k=rng.randint(5, 40))) + "。\n"
        if kind == 1:
            return " ".join("".join(rng.choices(_HANGUL, k=rng.randint(1, 4))) for _ in range(rng.randint(3, 12))) + ". "
        if kind == 2:
            return " ".join("".join(rng.choices(_CYRILLIC, k=rng.randint(2, 9))) for _ in range(rng.randint(3, 12))) + ", "
        if kind == 3:
            return " ".join(rng.choices(_EMOJI, k=rng.randint(1, 5))) + " "
        if kind == 4:
            return f"{rng.randint(0, 10**rng.randint(1, 18))} {rng.random():.6f} {rng.randint(1900, 2100)}-{rng.randint(1, 12):02d} "
        return rng.choice(["   ", "\n\n\n", "\t\t", "  \n  ", "\r\n"])

    target = int(megabytes * 1_000_000)
    parts, size = [], 0
    while size < target:
        r = rng.random()
        part = prose() if r < 0.6 else code() if r < 0.8 else other()
        parts.append(part)
        size += len(part.encode("utf-8"))
    return "".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0, help="megabytes of text (default 1)")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    text = mixed_text(args.mb)
    data = text.encode("utf-8")
    mb = len(data) / 1e6
    try:
        from llama_cpp import Llama
    except ImportError:
        Llama = None
        print("llama_cpp not importable here: elelem only")
    print(f"text: {mb:.2f} MB, {len(text)} characters")
    for name in args.models.split(","):
        path = resolve_model(name)
        meta = read_metadata(str(path))
        t0 = time.perf_counter()
        tok = Tokenizer.from_metadata(meta)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = tok.encode(text, add_bos=False, add_eos=False)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        tok.encode(text, add_bos=False, add_eos=False)
        warm = time.perf_counter() - t0
        line = (f"{name:20s} elelem: build {build * 1000:6.0f} ms, cold {mb / cold:6.2f} MB/s, "
                f"warm {mb / warm:6.2f} MB/s, {len(ids)} tokens")
        if Llama is not None:
            llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
            t0 = time.perf_counter()
            ref = llm.tokenize(data, add_bos=False, special=False)
            ref_time = time.perf_counter() - t0
            line += f" | llama.cpp {mb / ref_time:6.2f} MB/s, ids {'identical' if ref == ids else 'DIFFER'}"
            del llm
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
