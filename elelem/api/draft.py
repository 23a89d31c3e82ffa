"""Opening the draft model of ``LLM(draft_model=...)``.

The draft model is a path, a packaged model name, or an open ``LLM`` (whose
weights are then shared, not loaded again: keep it open while it drafts).
Its vocabulary is checked against the target's before its weights are
opened.  It gets a native context of its own, with one sequence per target
sequence and as many cells as the target's cache (a draft sequence holds
the same tokens as its target sequence, plus a few drafts).
"""
from __future__ import annotations

from .._core import new_context, open_model
from ..cpu import amx_types
from ..engine.draft_model import DraftModel, check_same_vocabulary
from ..errors import ClosedError
from ..gguf.reader import GGUFFile, read_gguf
from ..model.architectures import model_spec
from ..model.hub import resolve_model


def open_draft(source, *, target_gguf: GGUFFile, target_n_vocab: int, context, repack: bool,
               use_mmap: bool, amx) -> DraftModel:
    """A DraftModel for the target whose native context is ``context``."""
    if hasattr(source, "spec") and hasattr(source, "gguf"):  # an open LLM
        if source.closed:
            raise ClosedError("the draft model's LLM is closed")
        check_same_vocabulary(target_gguf, target_n_vocab, source.gguf, source.spec.hparams["n_vocab"])
        model, owned = source._model, None
    else:
        path = resolve_model(source)
        gguf = read_gguf(path)
        spec = model_spec(gguf)
        check_same_vocabulary(target_gguf, target_n_vocab, gguf, spec.hparams["n_vocab"])
        model = owned = open_model(
            path=path, builder=spec.arch.builder, hparams=spec.hparams, global_tensors=spec.global_tensors,
            layer_tensors=spec.layer_tensors, description=spec.description, matmul_weights=spec.matmul_weights(),
            repack=repack, use_mmap=use_mmap, amx_types=amx_types(amx), shards=gguf.shard_paths)
    try:
        # The target's cache types: a model drafting for itself then computes what the target does.
        cache = context.cache
        draft_context = new_context(model=model, kv_size=context.kv_size, n_batch=context.n_batch,
                                    n_threads=context.n_threads, kv_type=cache.type_k, type_v=cache.type_v,
                                    flash_attn=context.flash_attn, n_seq_max=context.n_seq_max)
    except BaseException:
        if owned is not None:
            owned.close()
        raise
    return DraftModel(draft_context, owned_model=owned)
