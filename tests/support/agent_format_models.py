"""Tiny random models with the agent families' chat templates and control tokens (MiniMax-M2,
Seed-OSS, Nemotron Nano 2, DeepSeek V3.1, Kimi K2, LFM2), for constrained calls in their formats.

As tests/support/format_models.py: a byte-level vocabulary, the family's control tokens as
single tokens, and its real template (llama.cpp's corpus, models/templates/ of the pinned sdist).
"""
from __future__ import annotations

from pathlib import Path

from elelem.text.tokenizer.bpe import BYTE_TO_CHAR
from format_models import MERGES, FormatModel
from synthetic import TinyConfig, write_model

#: family -> (template file, control tokens, end-of-generation token, the token a call starts with)
AGENT_FAMILIES = {
    "minimax-m2": ("MiniMax-M2.jinja", ["]~!b[", "]~b]", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>",
                                         "<think>", "</think>"], "[e~[", "<minimax:tool_call>"),
    "seed-oss": ("ByteDance-Seed-OSS.jinja", ["<seed:bos>", "<seed:eos>", "<seed:think>", "</seed:think>",
                                              "<seed:tool_call>", "</seed:tool_call>"], "<seed:eos>",
                 "<seed:tool_call>"),
    "nemotron-nano-2": ("NVIDIA-Nemotron-Nano-v2.jinja", ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>",
                                                          "<TOOLCALL>", "</TOOLCALL>", "<think>", "</think>"],
                        "<SPECIAL_12>", "<TOOLCALL>"),
    "deepseek-v3.1": ("deepseek-ai-DeepSeek-V3.1.jinja",
                      ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                       "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                       "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<think>", "</think>"],
                      "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>"),
    "kimi-k2": ("Kimi-K2-Thinking.jinja", ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                                            "<|im_middle|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                            "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                                            "<think>", "</think>"], "<|im_end|>", "<|tool_calls_section_begin|>"),
    "lfm2": ("LFM2-8B-A1B.jinja", ["<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_call_start|>",
                                   "<|tool_call_end|>", "<|tool_list_start|>", "<|tool_list_end|>", "<think>",
                                   "</think>"], "<|im_end|>", "<|tool_call_start|>"),
}


def write_agent_model(path: Path, family: str, source: str, seed: int = 7) -> FormatModel:
    _, control, eos, _ = AGENT_FAMILIES[family]
    tokens = BYTE_TO_CHAR + ["".join(pair) for pair in MERGES] + control
    cfg = TinyConfig(n_embd=64, n_layer=2, seed=seed).but(n_vocab=len(tokens))

    def vocabulary(writer):
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(tokens)
        writer.add_token_types([3 if t in control else 1 for t in tokens])
        writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
        writer.add_eos_token_id(tokens.index(eos))
        writer.add_add_bos_token(False)
        writer.add_chat_template(source)

    write_model(path, cfg, extra_metadata=vocabulary)
    return FormatModel(path, tokens)
