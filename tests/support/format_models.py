"""Tiny random models that speak a chat family's markup, for the tool-call format and reasoning tests.

Each has a byte-level vocabulary (any text can be written), the family's
control tokens (``<|channel|>``, ``[TOOL_CALLS]``, ``<|im_end|>``, ...) and
its user-defined ones (``<tool_call>``, ``<think>``, ...) as single tokens,
and a real chat template from llama.cpp's corpus.  Its weights are random:
what it writes under a constraint must still be a valid call; free text is
whatever it likes (``logit_bias`` steers it where a test needs an end).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional, Sequence

from elelem.text.tokenizer.bpe import BYTE_TO_CHAR
from synthetic import TinyConfig, write_model

#: Real chat templates of llama.cpp's corpus (tests/support/fixtures/make_tool_format_templates.py).
TEMPLATES = json.loads((Path(__file__).parent / "fixtures" / "tool_format_templates.json").read_text(
    encoding="utf-8"))["templates"]
MERGES = [('{', '"'), ('"', ':'), ('Ġ', '"'), (',', 'Ġ'), ('"', ','), ('"', '}')]


def template(name: str) -> str:
    """The source of a template of llama.cpp's corpus (``name`` without ``.jinja``)."""
    return TEMPLATES[name]["source"]


#: Per family: the template, control tokens, user-defined tokens, the end-of-generation token.
FAMILIES = {
    "hermes": ("Qwen-Qwen3-0.6B", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
               ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"],
               "<|im_end|>"),
    "qwen3_coder": ("Qwen3.5-4B", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                    ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>",
                     "\n</parameter>\n"], "<|im_end|>"),
    "harmony": ("openai-gpt-oss-120b", ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                        "<|constrain|>", "<|return|>", "<|call|>"], [], "<|return|>"),
    "mistral": ("mistralai-Ministral-3-14B-Reasoning-2512",
                ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]",
                 "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                 "[THINK]", "[/THINK]"], [], "</s>"),
    "llama3": ("meta-llama-Llama-3.2-3B-Instruct",
               ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                "<|python_tag|>"], [], "<|eot_id|>"),
    "glm": ("GLM-4.6", ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                        "<|observation|>"],
            ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>",
             "</think>", "<tool_response>", "</tool_response>"], "<|user|>"),
}


class FormatModel:
    """A written model: its path and its token ids by text."""

    def __init__(self, path: Path, tokens: Sequence[str]):
        self.path = path
        self.ids = {t: i for i, t in enumerate(tokens)}


@contextmanager
def family_models(tmp_path_factory, open_model: Optional[Callable] = None):
    """Each family's model, written and opened on first use (``open_model(path)``: by default an
    ``elelem.LLM`` with a 2048-token context), closed at the end: gives ``get(family)``, which
    returns ``(FormatModel, the opened model)``."""
    import elelem
    open_model = open_model or (lambda path: elelem.LLM(path, n_threads=1, n_ctx=2048))
    made = {}

    def get(family):
        if family not in made:
            model = write_format_model(tmp_path_factory.mktemp(family) / f"{family}.gguf", family)
            made[family] = (model, open_model(model.path))
        return made[family]
    try:
        yield get
    finally:
        for _, opened in made.values():
            opened.close()


def write_format_model(path: Path, family: str, *, source: Optional[str] = None, seed: int = 7,
                       base: Optional[TinyConfig] = None) -> FormatModel:
    """A tiny model with ``family``'s chat template and vocabulary; ``base``, when
    given, is the architecture's config (its vocabulary size is set here)."""
    name, control, user_defined, eos = FAMILIES[family]
    source = template(name) if source is None else source
    tokens = BYTE_TO_CHAR + ["".join(pair) for pair in MERGES] + control + user_defined
    cfg = (base or TinyConfig(n_embd=64, n_layer=2, seed=seed)).but(n_vocab=len(tokens))

    def vocabulary(writer):
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(tokens)
        writer.add_token_types([3 if t in control else 4 if t in user_defined else 1 for t in tokens])
        writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
        writer.add_eos_token_id(tokens.index(eos))
        writer.add_add_bos_token(False)
        writer.add_chat_template(source)

    write_model(path, cfg, extra_metadata=vocabulary)
    return FormatModel(path, tokens)
