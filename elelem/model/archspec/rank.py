"""Rerankers' classification head (llama.cpp's rank pooling, build_pooling
with LLAMA_POOLING_TYPE_RANK): its tensors and its output width, as
llama.cpp reads them (blocks.pxi: rank_head builds it).

A cross-encoder (bge-reranker: ``bert`` with a sequence classifier) reads
the first token's final hidden state through ``cls`` (a dense layer, tanh)
and ``cls.output`` (the projection to the labels); Qwen3-Reranker (a
``qwen3`` causal LM) reads the last token's through ``cls.output`` alone,
the rows of its LM head for "yes" and "no" that the converter keeps, and a
softmax over the two.  The score is the first output.
"""
from __future__ import annotations

from typing import Any, Sequence

from ...errors import ModelShapeError
from .hparams import array
from .spec import HParam, Role

GLOBAL_ROLES = (
    Role("cls", "cls.weight", lambda h: (h["n_embd"], h["n_embd"]),
         "optional (n_embd, n_embd): the classifier's dense layer, before tanh", matmul=True),
    Role("cls_b", "cls.bias", lambda h: (h["n_embd"],)),
    Role("cls_out", "cls.output.weight", lambda h: (h["n_embd"], h.get("n_cls_out", 1)),
         "optional (n_embd, n_cls_out): the projection to the classifier's labels", matmul=True),
    Role("cls_out_b", "cls.output.bias", lambda h: (h.get("n_cls_out", 1),)),
)

HPARAMS = (
    HParam("n_cls_out", "int", 1, "the classifier's outputs (classifier.output_labels; 1 without labels)"),
    HParam("rank_softmax", "bool", False, "the classifier's outputs are a softmax over them (Qwen3-Reranker)"),
)

# The head's roles, for an architecture's global_optional.
HEAD = ("cls", "cls_b", "cls_out", "cls_out_b")

#: llama.cpp caps the labels it prints; elelem caps what it allocates per sequence.
MAX_LABELS = 1024


def classifier_hparams(h: dict, gguf: Any, arch_name: str) -> None:
    """``n_cls_out``: the length of ``{arch}.classifier.output_labels``, 1
    without it (llama_model::load_hparams)."""
    key = f"{arch_name}.classifier.output_labels"
    raw = gguf.get(key)
    if raw is None:
        return
    labels = list(raw) if isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)) else array(raw)
    if labels is None or not all(isinstance(x, str) for x in labels) or not 0 < len(labels) <= MAX_LABELS:
        raise ModelShapeError(f"{key} must be a list of 1..{MAX_LABELS} strings")
    h["n_cls_out"] = len(labels)


def softmax_scores(h: dict, key: Any, gguf: Any) -> None:
    """Qwen3-Reranker: llama.cpp turns its two outputs (the "yes" and "no"
    logits) into probabilities (build_pooling: arch QWEN3)."""
    h["rank_softmax"] = True
