"""The files the GGUF fuzzer starts from.

Synthetic seeds are tiny (tens of KB) but complete: a model of each graph
builder with a small tokenizer of each kind and a chat template, so a mutated
seed can get through every stage (reader, shape checks, ggml's parser,
evaluation, tokenizer, template) in milliseconds.  They are written with the
``gguf`` package, deterministically (same bytes for the same code).

Real seeds are the packaged models already in elelem's cache; they are never
downloaded here.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA_STYLE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
    "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Seed:
    name: str
    arch: str
    tokenizer: str        # "gpt2" or "llama"
    wtype: str = "f32"    # f32, f16 or q8_0 for the matmul weights
    tied: bool = False
    n_swa: int = 0
    rope_freqs: bool = False
    template: str | None = CHATML
    extra_keys: tuple[tuple[str, int], ...] = ()  # more hyperparameters (TinyConfig.extra_keys)
    layer_types: str = ""  # LFM2's layer kinds (TinyConfig.layer_types)
    config: tuple[tuple[str, object], ...] = ()   # more TinyConfig fields (head widths, layers)


SYNTHETIC_SEEDS = (
    Seed("qwen2-f32-gpt2", "qwen2", "gpt2"),
    Seed("llama-q8_0-gpt2-tied", "llama", "gpt2", wtype="q8_0", tied=True, rope_freqs=True),
    # Two layers: pattern 2 makes layer 0 local and layer 1 global, so both masks are used.
    Seed("gemma3-f16-spm-swa", "gemma3", "llama", wtype="f16", n_swa=4, template=GEMMA_STYLE,
         extra_keys=(("{arch}.attention.sliding_window_pattern", 2),)),
    Seed("qwen3-f32-spm", "qwen3", "llama", template=None),
    # A hybrid: a short-convolution layer, then attention; its recurrent state in the cache.
    Seed("lfm2-q8_0-gpt2", "lfm2", "gpt2", wtype="q8_0", layer_types="CA"),
    # heads wider than n_embd / n_head, with biases
    Seed("seed_oss-f32-gpt2", "seed_oss", "gpt2", config=(("head_dim", 32),)),
    # four layers: the last attends without RoPE
    Seed("smollm3-q8_0-gpt2-tied", "smollm3", "gpt2", wtype="q8_0", tied=True, config=(("n_layer", 4),)),
    # experts, Q/K norms over all heads, RoPE over half of each head
    Seed("minimax-m2-f32-gpt2", "minimax-m2", "gpt2", config=(("head_dim", 16), ("n_rot", 8), ("n_ff", 32))),
    # multi-head latent attention, Q through q_lora_rank, a dense layer then experts
    Seed("deepseek2-q8_0-gpt2", "deepseek2", "gpt2", wtype="q8_0"),
    # Mamba-2 hybrids: a Mamba-2 layer, experts, attention (Nemotron-3-Nano); Mamba-2 and
    # attention each followed by experts and a shared expert, Granite's scales (Granite 4.0 H)
    Seed("nemotron_h_moe-q8_0-gpt2", "nemotron_h_moe", "gpt2", wtype="q8_0"),
    Seed("granitehybrid-f32-gpt2", "granitehybrid", "gpt2"),
    # per-layer heads, a full layer then a sliding one, a softplus gate per head, a dense layer then experts
    Seed("laguna-f32-gpt2", "laguna", "gpt2", n_swa=4),
    # a DFlash drafter borrowing its target's token table and output; opened as the draft
    # model of DRAFTER_TARGET (gguf_target.execute), whose first layer's input it reads
    Seed("dflash-f32-gpt2", "dflash", "gpt2", template=None),
    # interleaved multi-section RoPE, Q/K norms, a deepstack part added after layer 0 (image rows only)
    Seed("qwen3vl-f32-gpt2", "qwen3vl", "gpt2", extra_keys=(("{arch}.n_deepstack_layers", 1),)),
)
#: The seed a drafter seed drafts for: its vocabulary and width.
DRAFTER_TARGET = SYNTHETIC_SEEDS[0]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def gpt2_vocab() -> dict:
    """A byte-level BPE vocabulary: specials, the 256 byte symbols, and merges that agree."""
    byte_chars = bytes_to_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + [byte_chars[b] for b in range(256)]
    merges = []
    for pair in ("Ġ t", "h e", "i n", "Ġt he", "e r", "o n", "Ġ a", "r e", "a t", "Ġ s", "e n", "Ġ w", "o r",
                 "Ġ Ġ", "ĠĠ ĠĠ", "l l", "he ll", "hell o", "Ġ h", "Ġh e", "l o", "l lo", "Ġhe llo"):
        left, right = pair.split(" ")
        merges.append(pair)
        if left + right not in tokens:
            tokens.append(left + right)
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
    }


def spm_vocab() -> dict:
    """A SentencePiece-style vocabulary: specials, 256 byte tokens, scored pieces."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    special_types = [3, 3, 3, 2, 3, 3]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    types = special_types + [6] * 256
    pieces = ["▁", "▁t", "h", "e", "he", "▁the", "l", "o", "▁h", "ll", "llo", "▁hello", "a", "n", "▁a", "▁an",
              "s", "▁s", "w", "r", "i", "in", "▁in", "▁w", "or", "▁wor", "d", "▁world", "\n", "▁▁", "▁▁▁▁"]
    tokens += pieces
    types += [1] * len(pieces)
    scores = [-1000.0] * len(specials) + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, np.float32),
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": True,
    }


def write_seed(path: Path, seed: Seed) -> Path:
    """Write one synthetic seed model with the tests' writer; its vocabulary size is the tokenizer's."""
    import gguf

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    try:
        from synthetic import TinyConfig, write_model
        from synthetic_mamba2 import Mamba2Config
        from synthetic_laguna import LagunaConfig
        from synthetic_mla import MLAConfig
        from synthetic_dflash import DFlashConfig, write_dflash
    finally:
        sys.path.remove(str(ROOT / "tests" / "support"))

    vocab = gpt2_vocab() if seed.tokenizer == "gpt2" else spm_vocab()

    def add_tokenizer(writer: gguf.GGUFWriter) -> None:
        for key, value in vocab.items():
            if isinstance(value, str):
                writer.add_string(key, value)
            elif isinstance(value, bool):
                writer.add_bool(key, value)
            elif isinstance(value, int):
                writer.add_uint32(key, value)
            elif isinstance(value, np.ndarray):
                element = gguf.GGUFValueType.INT32 if value.dtype == np.int32 else gguf.GGUFValueType.FLOAT32
                writer.add_key_value(key, value.tolist(), gguf.GGUFValueType.ARRAY, element)
            else:
                writer.add_array(key, value)
        if seed.template is not None:
            writer.add_chat_template(seed.template)

    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    if seed.arch == "deepseek2":
        mla = MLAConfig(n_vocab=n_vocab, n_embd=32, n_layer=2, n_head=2, q_lora_rank=32, kv_lora_rank=32, qk_nope=32,
                        qk_rope=16, v_head_dim=32, n_ff=64, n_expert=4, n_ctx_train=256, tied=seed.tied,
                        wtype=seed.wtype, seed=len(seed.name), extra_keys=seed.extra_keys)
        write_model(path, mla, extra_metadata=add_tokenizer)
        return path
    if seed.arch in ("nemotron_h_moe", "granitehybrid"):
        granite = seed.arch == "granitehybrid"
        mamba2 = Mamba2Config(arch=seed.arch, n_vocab=n_vocab, n_embd=32, pattern="M*" if granite else "ME*",
                              n_head=2, n_head_kv=1, head_dim=16, n_ff=32, n_expert=4, n_ff_exp=32, n_ff_shexp=64,
                              ssm_n_group=1 if granite else 2, n_ctx_train=256, tied=seed.tied, wtype=seed.wtype,
                              seed=len(seed.name), extra_keys=seed.extra_keys)
        write_model(path, mamba2, extra_metadata=add_tokenizer)
        return path
    if seed.arch == "dflash":
        dflash = DFlashConfig(n_vocab=n_vocab, n_embd=32, n_embd_target=32, target_layers=(1,), n_layer=1, n_head=2,
                              n_head_kv=1, n_ff=64, n_ctx_train=256, block_size=4, mask_token=4, wtype=seed.wtype,
                              seed=len(seed.name))
        write_dflash(path, dflash, extra_metadata=add_tokenizer)
        return path
    if seed.arch == "laguna":
        laguna = LagunaConfig(n_vocab=n_vocab, n_embd=32, n_layer=2, heads_full=2, heads_swa=4, n_head_kv=1,
                              head_dim=16, n_ff=64, n_expert=4, n_ctx_train=256, n_swa=seed.n_swa, tied=seed.tied,
                              wtype=seed.wtype, seed=len(seed.name), extra_keys=seed.extra_keys)
        write_model(path, laguna, extra_metadata=add_tokenizer)
        return path
    cfg = TinyConfig(arch=seed.arch, n_vocab=n_vocab, n_embd=32, n_layer=2,
                     n_head=2, n_head_kv=1, n_ff=64, n_ctx_train=256, tied=seed.tied, wtype=seed.wtype,
                     n_swa=seed.n_swa, rope_freqs=seed.rope_freqs, seed=len(seed.name), extra_keys=seed.extra_keys,
                     layer_types=seed.layer_types).but(**dict(seed.config))
    write_model(path, cfg, extra_metadata=add_tokenizer)
    return path


def write_synthetic_seeds(directory: Path) -> list[Path]:
    """Every synthetic seed, written into ``directory`` (reused when already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in SYNTHETIC_SEEDS:
        path = directory / f"{seed.name}.gguf"
        if not path.is_file():
            partial = path.with_suffix(".part")
            write_seed(partial, seed)
            partial.replace(path)
        paths.append(path)
    return paths


REAL_MODEL_NAMES = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")


def cached_real_models(names: tuple[str, ...] = REAL_MODEL_NAMES) -> list[Path]:
    """The packaged models already in elelem's cache (never downloads)."""
    from elelem.model.hub import cached_path, is_cached
    return [cached_path(name) for name in names if is_cached(name)]
