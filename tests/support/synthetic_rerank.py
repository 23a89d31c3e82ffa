"""Tiny random rerankers written as llama.cpp's converter writes the real ones, and their NumPy scores.

* ``bge``: a cross-encoder, ``bert`` with a sequence classifier
  (BertModel / XLMRobertaModel in conversion/bert.py): ``cls.weight`` and
  ``cls.bias`` (HF's classifier.dense), ``cls.output.weight`` and
  ``cls.output.bias`` (classifier.out_proj, one label), and
  ``bert.classifier.output_labels = ["LABEL_0"]``; no pooling key (the
  converter writes none without a sentence-transformers Pooling module),
  the WordPiece vocabulary of tests/support/synthetic_bert.py.
* ``qwen3``: Qwen3-Reranker (Qwen3Model in conversion/qwen.py): a ``qwen3``
  causal LM with tied embeddings whose ``cls.output.weight`` holds the LM
  head's rows of "yes" and "no" (in that order), ``qwen3.pooling_type = 4``
  (rank), ``qwen3.classifier.output_labels = ["yes", "no"]`` and the rerank
  prompt under ``tokenizer.chat_template.rerank``; the vocabulary is the
  sdist's Qwen2 one (the caller passes its writer).

The scores follow llama.cpp's rank pooling (build_pooling): the first
token's hidden state through tanh(cls) and cls.output for the cross-encoder,
the last token's through cls.output and a softmax for Qwen3.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np

import synthetic
import synthetic_bert

#: The prompt Qwen3Model.set_gguf_parameters writes for a reranker.
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


@dataclass(frozen=True)
class BgeConfig:
    bert: synthetic_bert.BertConfig = synthetic_bert.BertConfig(pooling=None, n_layer=2, n_ctx_train=512, seed=11)
    labels: tuple = ("LABEL_0",)
    dense: bool = True              # cls.weight / cls.bias (a head without them projects directly)
    head_type: str = "f32"          # the head's matrices: f32 or f16


def write_bge(path: Path, cfg: BgeConfig = BgeConfig(),
              vocab: Optional[tuple[int, Callable[[gguf.GGUFWriter], None]]] = None) -> dict[str, np.ndarray]:
    """A bge-reranker-shaped file; returns its weights (head included) as stored.
    ``vocab`` = (its size, its writer) replaces the WordPiece vocabulary (and
    the token table, in F16): XLM-RoBERTa's Unigram one, as bge-reranker-v2-m3
    has (its ``tokenizer.ggml.token_type_count`` must be ``cfg.bert.n_token_types``)."""
    rng = np.random.default_rng(cfg.bert.seed + 100)
    e = cfg.bert.n_embd
    head = {}
    if cfg.dense:
        head["cls.weight"] = (rng.standard_normal((e, e)) / np.sqrt(e)).astype(np.float32)
        head["cls.bias"] = (0.1 * rng.standard_normal(e)).astype(np.float32)
    head["cls.output.weight"] = (rng.standard_normal((len(cfg.labels), e)) / np.sqrt(e)).astype(np.float32)
    head["cls.output.bias"] = (0.1 * rng.standard_normal(len(cfg.labels))).astype(np.float32)
    weights = synthetic_bert.make_weights(cfg.bert)
    writer = gguf.GGUFWriter(str(path), cfg.bert.arch)
    synthetic.add_shape_keys(writer, cfg.bert)
    if vocab is None:
        synthetic_bert._add_encoder_keys(writer, cfg.bert)
    else:
        writer.add_layer_norm_eps(cfg.bert.norm_eps)
        writer.add_causal_attention(False)
        vocab[1](writer)
        weights["token_embd.weight"] = rng.standard_normal((vocab[0], e)).astype(np.float16)
    writer.add_classifier_output_labels(list(cfg.labels))
    for name, arr in {**weights, **head}.items():
        if arr.dtype == np.float16:
            weights[name] = arr.astype(np.float32)
        elif cfg.head_type == "f16" and name in ("cls.weight", "cls.output.weight"):
            arr = arr.astype(np.float16)
            weights[name] = arr.astype(np.float32)
        else:
            weights[name] = arr
        writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def bge_score(weights: dict[str, np.ndarray], cfg: BgeConfig, tokens) -> np.ndarray:
    """The head's outputs for one sequence, float64."""
    x = synthetic_bert.reference_hidden(weights, cfg.bert, tokens)[0]
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    if "cls.weight" in w:
        x = np.tanh(w["cls.weight"] @ x + w["cls.bias"])
    return w["cls.output.weight"] @ x + w["cls.output.bias"]


def qwen3_config(n_vocab: int, seed: int = 21) -> synthetic.TinyConfig:
    return synthetic.TinyConfig(arch="qwen3", n_vocab=n_vocab, n_embd=64, n_head=4, n_head_kv=2, n_layer=2,
                                tied=True, embd_type="f16", seed=seed)


def write_qwen3_reranker(path: Path, cfg: synthetic.TinyConfig, yes_no: tuple[int, int],
                         vocab: Callable[[gguf.GGUFWriter], None]) -> dict[str, np.ndarray]:
    """A Qwen3-Reranker-shaped file whose head is token_embd's rows ``yes_no``
    (the tied LM head's); returns its weights as stored."""
    def metadata(writer: gguf.GGUFWriter) -> None:
        vocab(writer)
        writer.add_pooling_type(gguf.PoolingType.RANK)
        writer.add_classifier_output_labels(["yes", "no"])
        writer.add_chat_template([{"name": "rerank", "template": QWEN3_RERANK_TEMPLATE}])

    weights = synthetic.make_weights(cfg)
    embd = weights["token_embd.weight"].astype(np.float16).astype(np.float32)   # as stored (embd_type f16)
    weights["cls.output.weight"] = np.stack([embd[yes_no[0]], embd[yes_no[1]]])
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    synthetic.add_shape_keys(writer, cfg)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_rope_freq_base(cfg.rope_base)
    metadata(writer)
    return synthetic.write_tensors(writer, cfg, weights)


def qwen3_score(weights: dict[str, np.ndarray], cfg: synthetic.TinyConfig, tokens) -> np.ndarray:
    x = synthetic.reference_hidden(weights, cfg, tokens)[-1]
    logits = weights["cls.output.weight"].astype(np.float64) @ x
    p = np.exp(logits - logits.max())
    return p / p.sum()


