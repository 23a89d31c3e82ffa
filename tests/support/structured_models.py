"""A tiny random model with a byte-level vocabulary, for structured-output tests.

Its weights are random (tests/support/synthetic.py), so its preferences are
arbitrary: whatever it writes under a constraint must still be valid.  The
vocabulary is the 256 GPT-2 byte characters (any text can be written), a few
merged pieces JSON uses (so tokens span several characters), and ChatML's
control tokens; ``<|im_end|>`` is the end of a turn.
"""
from __future__ import annotations

from pathlib import Path

from elelem.text.tokenizer.bpe import BYTE_TO_CHAR
from synthetic import TinyConfig, write_model

# (left, right) pieces merged into one token each, in priority order.
MERGES = [('{', '"'), ('"', ':'), ('Ġ', '"'), (',', 'Ġ'), ('"', ','), ('Ġ', 'Ġ'), ('Ċ', 'ĠĠ'), ('t', 'r'),
          ('tr', 'u'), ('tru', 'e'), ('n', 'u'), ('nu', 'l'), ('nul', 'l'), ('"', '}')]
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENS = BYTE_TO_CHAR + ["".join(pair) for pair in MERGES] + CONTROL
CONFIG = TinyConfig(n_vocab=len(TOKENS), n_embd=64, n_layer=2, seed=16)


def write_structured_model(path: Path, config: TinyConfig = CONFIG) -> Path:
    """``config`` (its n_vocab: len(TOKENS)) with this vocabulary."""
    def vocabulary(writer):
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(TOKENS)
        writer.add_token_types([3 if t in CONTROL else 1 for t in TOKENS])
        writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
        writer.add_eos_token_id(TOKENS.index("<|im_end|>"))
        writer.add_add_bos_token(False)

    write_model(path, config, extra_metadata=vocabulary)
    return path
