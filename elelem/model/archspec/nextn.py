"""Multi-token-prediction (MTP, "NextN") heads: the tensors of the block
that follows a model's own layers in its file (Qwen3.5/3.6, GLM-4.5+), and
the hyperparameter that makes a model view of it a head.

The head drafts the token after next: it takes the token ``x[p]`` and the
final normed hidden state ``h[p-1]`` of the model at the position before,
normalizes each (``enorm``, ``hnorm``), projects their concatenation back to
``n_embd`` (``eh_proj``), runs one decoder block of the model's own kind and
its output head (``shared_head_norm`` and ``shared_head_head``, or the
model's output norm and output where the file has none) -- llama.cpp's
``graph_mtp`` of src/models/qwen35.cpp and glm4-moe.cpp.  elelem opens it as
a model of its own over the same file (elelem.model.mtp), with one layer.
"""
from __future__ import annotations

from .spec import HParam, Role


def _e(h):
    return h["n_embd"]


ROLES = (
    Role("nextn_eh_proj", "blk.{i}.nextn.eh_proj.weight", lambda h: (2 * _e(h), _e(h)),
         "MTP head: (2 * n_embd, n_embd), the token's and the hidden state's norms concatenated -> n_embd",
         matmul=True),
    Role("nextn_enorm", "blk.{i}.nextn.enorm.weight", lambda h: (_e(h),), "MTP head: the token embedding's norm"),
    Role("nextn_hnorm", "blk.{i}.nextn.hnorm.weight", lambda h: (_e(h),), "MTP head: the hidden state's norm"),
    Role("nextn_embed_tokens", "blk.{i}.nextn.embed_tokens.weight", lambda h: (_e(h), h["n_vocab"]),
         "MTP head, optional: its own token embeddings (n_embd, n_vocab); the model's otherwise"),
    Role("nextn_shared_head_head", "blk.{i}.nextn.shared_head_head.weight", lambda h: (_e(h), h["n_vocab"]),
         "MTP head, optional: its own output (n_embd, n_vocab); the model's otherwise", matmul=True),
    Role("nextn_shared_head_norm", "blk.{i}.nextn.shared_head_norm.weight", lambda h: (_e(h),),
         "MTP head, optional: its own output norm; the model's otherwise"),
)

NEXTN_REQUIRED = ("nextn_eh_proj", "nextn_enorm", "nextn_hnorm")
NEXTN_OPTIONAL = ("nextn_embed_tokens", "nextn_shared_head_head", "nextn_shared_head_norm")

HPARAMS = (
    HParam("mtp_head", "bool", False,
           "the model is an MTP head: its step's inputs are tokens and the hidden states before them"),
)
