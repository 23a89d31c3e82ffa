"""The tokenizer target: random bytes and Unicode through encode, decode and streaming.

A case is a small JSON file: which vocabulary, the input (``text``, or
``bytes_b64`` for raw bytes), the flags, and a list of ids for decode.  The
vocabularies are the packaged models that are in the cache (built once per
runner process) and the two tiny synthetic ones of :mod:`fuzzing.seeds`.

Allowed: ``InvalidTokenError`` (an id out of range, a BOS the model lacks) and
``InvalidArgumentError`` (input over the size limit).  Checked besides:

* every id ``encode`` returns is an int in ``[0, n_vocab)``;
* valid UTF-8 comes back byte for byte: ``decode(encode(text))`` with special
  tokens off (SentencePiece turns U+2581 into a space; byte-level BPE only
  when the vocabulary has a token for each of the 256 bytes: SmolLM2's lacks
  21 of them, and llama.cpp, like elelem, drops such bytes);
* the stream decoder, fed one id at a time, gives ``decode(ids)`` as text;
* time is linear: ``encode`` stays under ``0.5 s + 20 us`` per input byte
  (about 20 times the measured cost), so a pattern that backtracks shows up.
"""
from __future__ import annotations

import base64
import json
import random
import time
from pathlib import Path

from .outcomes import INVARIANT, PASS, Outcome, from_exception

TINY_VOCABS = ("tiny-gpt2", "tiny-spm")
SLOW_BASE_S = 0.5
SLOW_PER_BYTE_S = 20e-6

_TOKENIZERS: dict = {}  # vocabulary -> (Tokenizer, tokenizer.ggml.model, round trip holds)


def allowed_errors() -> tuple[type, ...]:
    from elelem.errors import InvalidArgumentError, InvalidTokenError
    return (InvalidTokenError, InvalidArgumentError)


def available_vocabs() -> list[str]:
    from .seeds import cached_real_models
    return list(TINY_VOCABS) + [p.name for p in cached_real_models()]


def tokenizer_for(vocab: str):
    if vocab not in _TOKENIZERS:
        from elelem.text.tokenizer import Tokenizer
        from .seeds import gpt2_vocab, spm_vocab
        if vocab == "tiny-gpt2":
            metadata = gpt2_vocab()
        elif vocab == "tiny-spm":
            metadata = spm_vocab()
        else:
            from elelem.gguf.reader import read_gguf
            from elelem.model.hub import cache_dir
            metadata = read_gguf(cache_dir() / vocab).metadata
        model = metadata["tokenizer.ggml.model"]
        _TOKENIZERS[vocab] = (Tokenizer.from_metadata(metadata), model, _round_trips(model, metadata))
    return _TOKENIZERS[vocab]


def _round_trips(model: str, metadata) -> bool:
    if model != "gpt2":
        return True
    from .seeds import bytes_to_unicode
    tokens = set(metadata["tokenizer.ggml.tokens"])
    return all(symbol in tokens for symbol in bytes_to_unicode().values())


def warm_up() -> None:
    import gc
    for vocab in available_vocabs():
        tokenizer, _, _ = tokenizer_for(vocab)
        # The first encode builds lookup structures (0.3 s for Gemma's 262k
        # pieces): not the cost of whichever case happens to come first.
        for special in (False, True):
            tokenizer.encode(_PROSE, special=special)
    # Millions of long-lived objects (three vocabularies): without this, a full
    # garbage collection now and then takes seconds on a loaded machine and
    # shows up as a "slow" encode of a 30-byte string.
    gc.freeze()


def case_input(case: dict):
    return base64.b64decode(case["bytes_b64"]) if "bytes_b64" in case else case["text"]


def execute(path: Path) -> Outcome:
    case = json.loads(path.read_text(encoding="utf-8"))
    try:
        tokenizer, model, round_trips = tokenizer_for(case["vocab"])
    except FileNotFoundError as error:  # a fixture for a model that is not in this cache
        return Outcome(PASS, "skipped", type(error).__name__, str(error))
    allowed = allowed_errors()
    text = case_input(case)
    special = case.get("special", False)
    stage = "encode"
    try:
        started = time.perf_counter()
        ids = tokenizer.encode(text, special=special, add_bos=case.get("add_bos"))
        elapsed = time.perf_counter() - started
        size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
        if elapsed > SLOW_BASE_S + SLOW_PER_BYTE_S * size:
            return Outcome(INVARIANT, stage, "slow", f"encode took {elapsed:.2f} s for {size} bytes")
        bad = [t for t in ids if type(t) is not int or not 0 <= t < tokenizer.n_vocab]
        if bad:
            return Outcome(INVARIANT, stage, "bad id", f"encode returned {bad[:5]}")
        stage = "decode"
        plain = tokenizer.decode(ids)
        tokenizer.decode(ids, special=True)
        expected = _round_trip_expectation(text, special) if round_trips else None
        if expected is not None and model == "llama":
            expected = expected.replace("\u2581".encode(), b" ")  # SentencePiece: U+2581 *is* the space
        if expected is not None and plain != expected:
            return Outcome(INVARIANT, stage, "round trip",
                           f"decode(encode(x)) != x: {plain[:200]!r} vs {expected[:200]!r}")
        stage = "stream"
        stream = tokenizer.stream_decoder(special=special)
        streamed = "".join(stream.feed(t) for t in ids) + stream.flush()
        whole = tokenizer.decode(ids, special=special).decode("utf-8", "replace")
        if streamed != whole:
            return Outcome(INVARIANT, stage, "stream", f"streamed {streamed[:200]!r} vs {whole[:200]!r}")
        stage = "decode ids"
        tokenizer.decode(case.get("ids", []), special=special)
    except Exception as error:  # noqa: BLE001 -- classified, not swallowed
        return from_exception(error, stage, allowed)
    return Outcome(PASS, "all")


def _round_trip_expectation(text, special: bool):
    """What ``decode(encode(text))`` must give back, or None when there is no exact rule."""
    if special:
        return None  # special-token text becomes control tokens, which plain decode drops
    if isinstance(text, str):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates become U+FFFD
            return None
    try:
        text.decode("utf-8")
        return text
    except UnicodeDecodeError:
        # Invalid bytes: byte-level BPE makes them U+FFFD; SentencePiece keeps
        # them, but a lead byte claims the bytes after it as llama.cpp does
        # (b"\xef a" takes two bytes of the space's U+2581), so no exact rule.
        return None


# ----------------------------------------------------------------------------- parent side

_SCRIPTS = (
    (0x20, 0x7E), (0xA0, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
    (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0xE0000, 0xE007F),
)
_ODD_CHARS = ("\x00", "\t", "\n", "\r", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u00a0", "\u200b", "\u200d",
              "\u2028", "\u2029", "\u3000", "\ufeff", "\ufffd", "\ufffe", "\uffff", "\U0010FFFF", "\ud800",
              "\udfff", "\udc80", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "e\u0301", "\u0130", "\u1e9e",
              "'s", "'ll", "'RE", "  ", "\n\n", " \n ", "1234567890", "\u0661\u0662\u0663")
_BAD_UTF8 = (b"\x80", b"\xbf", b"\xc0\xaf", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80",
             b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xef\xbb\xbf", b"\xe0\x80\x80")
_PROSE = ("The quick brown fox jumps over the lazy dog. It's 3.14159 o'clock; isn't it?\n"
          "def main(argv):\n    return {'key': [1, 2, 3]}  # comment\n"
          "Ünïcödé, 中文字符, 日本語のテキスト, 한국어, العربية, עברית, Ελληνικά, हिन्दी 😀👍🏽\n")


class TokenizerCases:
    """Writes tokenizer case files: one vocabulary and one input each."""

    target = "tokenizer"
    suffix = ".json"

    def __init__(self, vocabs: list[str] | None = None, *, max_len: int = 2000):
        self.vocabs = vocabs or available_vocabs()
        self.max_len = max_len
        self._pieces: dict[str, list[str]] = {}

    def write(self, seed: int, index: int, directory: Path) -> tuple[Path, dict]:
        case = self.make(seed, index)
        path = directory / f"tokenizer-{seed}-{index}{self.suffix}"
        path.write_text(json.dumps(case), encoding="utf-8")
        return path, {"vocab": case["vocab"], "input": case}

    def make(self, seed: int, index: int) -> dict:
        rng = random.Random(f"tokenizer:{seed}:{index}")
        vocab = rng.choice(self.vocabs)
        kind = rng.random()
        case: dict = {"vocab": vocab, "special": rng.random() < 0.4}
        if kind < 0.3:
            case["bytes_b64"] = base64.b64encode(self._random_bytes(rng)).decode()
        else:
            generator = rng.choice((self._random_unicode, self._vocab_soup, self._repetitive, self._mutated_prose))
            case["text"] = generator(rng, vocab)[: self.max_len * 4]
        case["add_bos"] = rng.choice((None, None, True, False))
        case["ids"] = self._random_ids(rng, vocab)
        return case

    def _random_bytes(self, rng: random.Random) -> bytes:
        out = bytearray()
        while len(out) < rng.randint(0, self.max_len):
            roll = rng.random()
            if roll < 0.3:
                out += rng.choice(_BAD_UTF8)
            elif roll < 0.6:
                out += rng.choice(_PROSE).encode()[rng.randrange(50):][: rng.randint(1, 40)]
            else:
                out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        return bytes(out)

    def _random_unicode(self, rng: random.Random, vocab: str) -> str:
        out = []
        for _ in range(rng.randint(0, self.max_len // 4)):
            if rng.random() < 0.15:
                out.append(rng.choice(_ODD_CHARS))
            else:
                lo, hi = rng.choice(_SCRIPTS)
                out.append(chr(rng.randint(lo, hi)))
        return "".join(out)

    def _vocab_soup(self, rng: random.Random, vocab: str) -> str:
        """Real vocabulary pieces (specials included), glued with odd separators."""
        pieces = self._vocab_pieces(vocab)
        out = []
        for _ in range(rng.randint(1, 60)):
            out.append(rng.choice(pieces))
            if rng.random() < 0.3:
                out.append(rng.choice(_ODD_CHARS + (" ", "", "<", ">", "|")))
        return "".join(out)

    def _repetitive(self, rng: random.Random, vocab: str) -> str:
        """Long runs: what makes a backtracking pattern or a quadratic merge loop show."""
        unit = rng.choice(("a", " ", "\n", "\t", "1", "'s", "😀", "中", "ab", " a", "\u00a0", "\r\n", "..", "ـ",
                           "<|im_start|>", "<", "▁", "Ġ", "\u0301"))
        return unit * rng.randint(1, max(1, self.max_len // len(unit)))

    def _mutated_prose(self, rng: random.Random, vocab: str) -> str:
        text = list("".join(_PROSE))
        for _ in range(rng.randint(0, 20)):
            pos = rng.randrange(len(text) + 1)
            roll = rng.random()
            if roll < 0.4:
                text.insert(pos, rng.choice(_ODD_CHARS))
            elif roll < 0.7 and pos < len(text):
                del text[pos]
            elif pos < len(text):
                text[pos] = chr(rng.randint(0, 0x10FFFF))
        return "".join(text)

    def _random_ids(self, rng: random.Random, vocab: str) -> list:
        n_vocab = len(self._vocab_pieces(vocab))
        ids = [rng.randrange(n_vocab) for _ in range(rng.randint(0, 30))]
        if rng.random() < 0.2:
            ids.insert(rng.randint(0, len(ids)), rng.choice((-1, n_vocab, 2**31 - 1, 2**63, -(2**63))))
        return ids

    def _vocab_pieces(self, vocab: str) -> list[str]:
        if vocab not in self._pieces:
            from .seeds import gpt2_vocab, spm_vocab
            if vocab in TINY_VOCABS:
                meta = gpt2_vocab() if vocab == "tiny-gpt2" else spm_vocab()
                self._pieces[vocab] = list(meta["tokenizer.ggml.tokens"])
            else:
                from elelem.gguf.reader import read_gguf
                from elelem.model.hub import cache_dir
                self._pieces[vocab] = list(read_gguf(cache_dir() / vocab).metadata["tokenizer.ggml.tokens"])
        return self._pieces[vocab]
