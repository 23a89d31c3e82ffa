"""The vocabulary as llama.cpp sees it: pieces, attributes, scores and special ids.

Everything here follows ``llama_vocab::impl::load`` (llama-vocab.cpp), including
its text-based fix-ups: tokens such as ``<|im_end|>`` or ``</s>`` become control
tokens and end-of-generation tokens even when the GGUF marks them otherwise,
because that changes both how text is split and what ``decode`` renders.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ...errors import GGUFError
from ...gguf.short_holds import dict_in_slices

log = logging.getLogger("elelem")

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

# tokenizer.ggml.token_type values (llama_token_type) -> attribute
_TYPE_TO_ATTR = {
    0: ATTR_UNDEFINED,
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}

# Token texts llama.cpp treats as end-of-generation (and forces to control).
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
    "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
_EOT_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<end_of_utterance>",
})
_EOM_TEXTS = frozenset({"<|eom_id|>"})
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
                "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
                "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
                "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# gpt-oss: always rendered, never control.
_FORCED_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

_KEY = "tokenizer.ggml."
#: the tokenizer.ggml.model values elelem reads
MODELS = ("gpt2", "llama", "bert", "gemma4", "t5")


@dataclass
class Vocab:
    """Token pieces and what llama.cpp derives from them."""

    model: str                      # tokenizer.ggml.model: "gpt2", "llama", "bert", "gemma4" or "t5"
    # Tuples, as every big table that lives as long as a model: the cyclic GC
    # visits each item of a list at every full collection (about 25 ms a
    # collection for Qwen2's tables), and a tuple of strings or numbers only once.
    tokens: tuple[str, ...]
    attrs: tuple[int, ...]
    scores: Optional[tuple[float, ...]]
    token_to_id: dict[str, int]
    bos_id: Optional[int]
    eos_id: Optional[int]
    unk_id: Optional[int]
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    special_ids: dict[str, Optional[int]] = field(default_factory=dict)
    # llama.cpp's add_sep (a separator between a reranker's query and document): WordPiece's
    # default, or tokenizer.ggml.add_sep_token
    add_sep: bool = False
    # Unigram (t5): tokenizer.ggml.remove_extra_whitespaces
    remove_extra_whitespaces: bool = False

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _as_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _get_bool(meta: Mapping[str, Any], key: str) -> Optional[bool]:
    value = meta.get(_KEY + key)
    if value is None:
        return None
    # A GGUF BOOL reads as a Python or numpy bool; anything else (an array,
    # a string) is a malformed file, which llama.cpp refuses too.
    if not isinstance(value, (bool, np.bool_)):
        raise GGUFError(f"{_KEY + key} must be a bool, got {type(value).__name__}")
    return bool(value)


def load_vocab(meta: Mapping[str, Any], *, pre_add_bos: bool = False, pre_has_bos: bool = True) -> Vocab:
    """Build a :class:`Vocab` from GGUF metadata (``key -> value``).

    ``pre_add_bos`` is the BPE pre-tokenizer's own add_bos default (Llama 3 style
    tokenizers add BOS when the GGUF does not say); ``pre_has_bos=False`` drops
    byte-level BPE's default BOS id 11, as llama.cpp does for ChatGLM4 / GLM-4.5
    (``tokenizer.ggml.bos_token_id`` still sets one).
    """
    model = meta.get(_KEY + "model")
    if model not in MODELS:
        raise unsupported_model(model)
    raw_tokens = meta.get(_KEY + "tokens")
    if raw_tokens is None or len(raw_tokens) == 0:
        raise GGUFError("GGUF has no tokenizer.ggml.tokens")
    # The vocabulary's per-token steps are C loops (list, all, map), not bytecode per token:
    # a server builds this beside the models it is running, which wait for the GIL meanwhile.
    tokens = _as_list(raw_tokens)
    if not all(tokens):
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if any(not isinstance(t, str) for t in tokens[:1]):
        raise GGUFError("tokenizer.ggml.tokens must be a list of strings")
    n = len(tokens)

    raw_types = meta.get(_KEY + "token_type")
    if raw_types is None:
        attrs = [ATTR_NORMAL] * n
    else:
        types = _as_list(raw_types)
        if len(types) < n:
            raise GGUFError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        attrs = list(map(_TYPE_TO_ATTR.get, types[:n], repeat(ATTR_UNDEFINED)))

    raw_scores = meta.get(_KEY + "scores")
    scores = None
    if raw_scores is not None:
        scores = list(map(float, _as_list(raw_scores)[:n]))
        if len(scores) < n:
            raise GGUFError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")

    # A later duplicate wins, as in llama.cpp's token_to_id map.
    token_to_id = dict_in_slices(zip(tokens, range(n)))

    spm = model == "llama"
    if spm:
        ids: dict[str, Optional[int]] = {"bos": 1, "eos": 2, "unk": 0}
        add_bos, add_eos, add_space_prefix = True, False, True
    elif model == "bert":
        # bert-base's [CLS], [UNK], [SEP], [PAD], [MASK] ids are llama.cpp's defaults.
        ids = {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103}
        add_bos, add_eos, add_space_prefix = True, False, False
    elif model == "t5":
        # SentencePiece Unigram (T5, XLM-RoBERTa): llama.cpp's UGM defaults.
        ids = {"bos": None, "eos": 1, "unk": 2, "pad": 0}
        add_bos, add_eos, add_space_prefix = False, True, False
    elif model == "gemma4":
        # Gemma 4: BPE with no default special ids (the GGUF gives them).
        ids = {"bos": None, "eos": None, "unk": None}
        add_bos, add_eos, add_space_prefix = True, False, False
    else:
        ids = {"bos": 11 if pre_has_bos else None, "eos": 11, "unk": None}
        add_bos, add_eos, add_space_prefix = pre_add_bos, False, False
    for name in ("eot", "eom", "sep", "pad", "mask", *_FIM_TEXTS):
        ids.setdefault(name, None)

    for name, value in list(ids.items()):
        if value is not None and value >= n:
            ids[name] = None  # a default outside the vocab is disabled
    keys = {
        "bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
        "eom": "eom_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
        "pad": "padding_token_id", "mask": "mask_token_id",
        "fim_pre": "fim_pre_token_id", "fim_suf": "fim_suf_token_id",
        "fim_mid": "fim_mid_token_id", "fim_pad": "fim_pad_token_id",
        "fim_rep": "fim_rep_token_id", "fim_sep": "fim_sep_token_id",
    }
    deprecated = {"fim_pre": "prefix_token_id", "fim_suf": "suffix_token_id",
                  "fim_mid": "middle_token_id"}
    for name, key in list(keys.items()) + list(deprecated.items()):
        value = meta.get(_KEY + key)
        if value is None:
            continue
        value = int(value)
        if 0 <= value < n:
            ids[name] = value
        else:
            log.warning("tokenizer: %s = %d is outside the vocabulary of %d tokens; ignored", key, value, n)

    for key, current in (("add_bos_token", add_bos), ("add_eos_token", add_eos),
                         ("add_space_prefix", add_space_prefix)):
        value = _get_bool(meta, key)
        if value is not None:
            if key == "add_bos_token":
                add_bos = value
            elif key == "add_eos_token":
                add_eos = value
            else:
                add_space_prefix = value
    if not spm and model != "t5":
        add_space_prefix = False  # llama.cpp: BPE vocabs never add a space prefix
    add_sep = _get_bool(meta, "add_sep_token")
    add_sep = model == "bert" if add_sep is None else add_sep
    remove_extra_whitespaces = bool(_get_bool(meta, "remove_extra_whitespaces"))
    if model == "gemma4":
        add_bos = True  # llama.cpp overrides a false add_bos_token for Gemma 4 (llama.cpp#21500)

    eog = _detect_special_by_text(tokens, attrs, token_to_id, ids)

    if add_bos and ids["bos"] is None:
        log.warning("tokenizer: the model asks for BOS but has no BOS token; not adding one")
        add_bos = False
    if add_eos and ids["eos"] is None:
        log.warning("tokenizer: the model asks for EOS but has no EOS token; not adding one")
        add_eos = False

    return Vocab(
        model=model, tokens=tuple(tokens), attrs=tuple(attrs), scores=None if scores is None else tuple(scores),
        token_to_id=token_to_id,
        bos_id=ids["bos"], eos_id=ids["eos"], unk_id=ids["unk"], eog_ids=frozenset(eog),
        add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix, special_ids=ids,
        add_sep=add_sep, remove_extra_whitespaces=remove_extra_whitespaces,
    )


def unsupported_model(model: Any) -> GGUFError:
    return GGUFError(f"unsupported tokenizer.ggml.model {model!r} (elelem reads "
                     + ", ".join(repr(m) for m in MODELS) + ")")


def wordpiece_options(meta: Mapping[str, Any]) -> tuple[bool, bool]:
    """llama.cpp's BertNormalizer options ``(lowercase, strip_accents)``: lowercase
    unless the GGUF says not, accents stripped by default when lowercasing."""
    lowercase = _get_bool(meta, "normalizer.lowercase")
    lowercase = True if lowercase is None else lowercase
    strip_accents = _get_bool(meta, "normalizer.strip_accents")
    return lowercase, lowercase if strip_accents is None else strip_accents


def _force_control(attrs: list[int], token_id: int) -> None:
    attrs[token_id] |= ATTR_CONTROL


def _first_present(token_to_id: Mapping[str, int], texts: Sequence[str]) -> Optional[int]:
    # llama.cpp scans an unordered map, so with several candidates its pick is
    # arbitrary; the lowest id is at least stable.
    found = [token_to_id[t] for t in texts if t in token_to_id]
    return min(found) if found else None


def _detect_special_by_text(tokens: list[str], attrs: list[int],
                            token_to_id: Mapping[str, int], ids: dict) -> set[int]:
    """llama.cpp's text-based detection of EOT/EOM/FIM and end-of-generation tokens.

    Mutates ``attrs`` (forced control / user-defined) and ``ids``; returns the EOG set.
    """
    if ids["eot"] is None:
        ids["eot"] = _first_present(token_to_id, sorted(_EOT_TEXTS))
        if ids["eot"] is not None:
            _force_control(attrs, ids["eot"])
    if ids["eom"] is None:
        ids["eom"] = _first_present(token_to_id, sorted(_EOM_TEXTS))
        if ids["eom"] is not None:
            _force_control(attrs, ids["eom"])
    for name, texts in _FIM_TEXTS.items():
        if ids[name] is None:
            ids[name] = _first_present(token_to_id, texts)
            if ids[name] is not None:
                _force_control(attrs, ids[name])

    eog: set[int] = set()
    for name in ("fim_pad", "fim_rep", "fim_sep"):
        if ids[name] is not None:
            eog.add(ids[name])
    for text in _EOG_TEXTS:
        token_id = token_to_id.get(text)
        if token_id is not None:
            eog.add(token_id)
            _force_control(attrs, token_id)
    for text in _FORCED_USER_DEFINED:
        token_id = token_to_id.get(text)
        if token_id is not None:
            attrs[token_id] = ATTR_USER_DEFINED
    for name in ("eos", "eot", "eom"):
        if ids[name] is not None:
            eog.add(ids[name])

    # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
    eog_texts = {tokens[i]: i for i in eog}
    if "<|end|>" in eog_texts and (("<|return|>" in eog_texts and ("<|call|>" in eog_texts or "<|calls|>" in eog_texts))
                                   or (("<|call|>" in eog_texts or "<|calls|>" in eog_texts)
                                       and "<|flush|>" in eog_texts)):
        end_id = eog_texts["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = ATTR_USER_DEFINED
    # gemma4 / plamo: "</s>" is an ordinary token there.
    if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
        s_id = eog_texts["</s>"]
        eog.discard(s_id)
        attrs[s_id] = ATTR_NORMAL
    return eog
