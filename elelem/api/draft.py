"""Opening the draft model of ``LLM(draft_model=...)``, and the MTP head a model's file carries.

The draft model is a path, a packaged model name, or an open ``LLM`` (whose
weights are then shared, not loaded again: keep it open while it drafts).
Its vocabulary is checked against the target's before its weights are
opened.  It gets a native context of its own, with one sequence per target
sequence and as many cells as the target's cache (a draft sequence holds
the same tokens as its target sequence, plus a few drafts).  The MTP head
(``open_mtp``) is opened the same way, from the model's own file, or from a
companion ``mtp-*.gguf`` given as the draft model; so is an EAGLE-3 head
(``eagle3`` files, elelem.engine.eagle3) and a DFlash drafter (``dflash``
files, elelem.engine.dflash), whose target then hands them the inputs of
the layers they read.  A Gemma 4 drafter file (``gemma4-assistant``)
given as the draft model gets a context that shares the target's cache (it
keeps no cells of its own).
"""
from __future__ import annotations

import logging
from typing import Optional, Union

import numpy as np

from .._core import borrow_target_weights, new_context, open_model
from ..cpu import amx_types
from ..engine.assistant import AssistantHead
from ..engine.dflash import DFlashHead
from ..engine.draft_model import DraftModel, check_same_vocabulary
from ..engine.eagle3 import Eagle3Head
from ..engine.mtp import MTPHead
from ..errors import ClosedError, UnsupportedArchitectureError
from ..gguf.reader import GGUFFile, read_gguf
from ..model.architectures import model_spec
from ..model.hub import resolve_model
from ..model.mtp import companion_spec, is_companion, mtp_matmul_weights, mtp_spec

log = logging.getLogger("elelem")


def open_draft(source, *, target_gguf: GGUFFile, target_n_vocab: int, context, repack: bool,
               use_mmap: bool, amx, target_spec=None) -> Union[DraftModel, MTPHead, AssistantHead]:
    """A DraftModel for the target whose native context is ``context``; or,
    where ``source`` is a companion MTP file (elelem.model.mtp.is_companion),
    the MTPHead it holds; for an EAGLE-3 file, its Eagle3Head; for a DFlash
    file, its DFlashHead; for a Gemma 4 drafter file, its AssistantHead."""
    if hasattr(source, "spec") and hasattr(source, "gguf"):  # an open LLM
        if source.closed:
            raise ClosedError("the draft model's LLM is closed")
        check_same_vocabulary(target_gguf, target_n_vocab, source.gguf, source.spec.hparams["n_vocab"])
        model, owned = source._model, None
    else:
        path = resolve_model(source)
        gguf = read_gguf(path)
        if is_companion(gguf):
            head_spec = companion_spec(gguf)
            check_same_vocabulary(target_gguf, target_n_vocab, gguf, head_spec.hparams["n_vocab"])
            return _open_head(path, gguf, head_spec, context=context, repack=repack, use_mmap=use_mmap, amx=amx)
        spec = model_spec(gguf)
        check_same_vocabulary(target_gguf, target_n_vocab, gguf, spec.hparams["n_vocab"])
        if spec.arch.name == "gemma4-assistant":
            return _open_assistant(path, gguf, spec, context=context, repack=repack, use_mmap=use_mmap, amx=amx)
        if spec.arch.name == "dflash":
            return _open_dflash(path, gguf, spec, target_spec or model_spec(target_gguf), context=context,
                                repack=repack, use_mmap=use_mmap, amx=amx)
        if spec.arch.name == "eagle3":
            return _open_eagle3(path, gguf, spec, target_spec or model_spec(target_gguf), context=context,
                                repack=repack, use_mmap=use_mmap, amx=amx)
        model = owned = open_model(
            path=path, builder=spec.arch.builder, hparams=spec.hparams, global_tensors=spec.global_tensors,
            layer_tensors=spec.layer_tensors, description=spec.description, matmul_weights=spec.matmul_weights(),
            repack=repack, use_mmap=use_mmap, amx_types=amx_types(amx), shards=gguf.shard_paths)
    try:
        draft_context = _context_beside(model, context)
    except BaseException:
        if owned is not None:
            owned.close()
        raise
    return DraftModel(draft_context, owned_model=owned)


def open_mtp(path, gguf: GGUFFile, spec, *, context, repack: bool, use_mmap: bool, amx) -> Optional[MTPHead]:
    """The MTP head of the model at ``path`` (elelem.model.mtp), with a native
    context of its own beside the model's ``context`` -- one sequence per
    target sequence, as many cells, the same cache types -- or None where
    the file carries none.  Its weights are the file's, mapped again (the
    model's token embeddings and output are shared through the page cache;
    repacked copies are made for it)."""
    head_spec = mtp_spec(spec, gguf)
    if head_spec is None:
        return None
    return _open_head(path, gguf, head_spec, context=context, repack=repack, use_mmap=use_mmap, amx=amx)


def _open_head(path, gguf: GGUFFile, head_spec, *, context, repack: bool, use_mmap: bool, amx) -> MTPHead:
    model = open_model(
        path=path, builder=head_spec.arch.mtp_builder, hparams=head_spec.hparams,
        global_tensors=head_spec.global_tensors, layer_tensors=head_spec.layer_tensors,
        description=f"{head_spec.arch.name} MTP head",
        matmul_weights=mtp_matmul_weights(head_spec), repack=repack, use_mmap=use_mmap, amx_types=amx_types(amx),
        shards=gguf.shard_paths)
    try:
        head_context = _context_beside(model, context)
    except BaseException:
        model.close()
        raise
    return MTPHead(head_context, owned_model=model, hybrid=context.cache.hybrid)


def _open_assistant(path, gguf: GGUFFile, spec, *, context, repack: bool, use_mmap: bool, amx) -> AssistantHead:
    """A Gemma 4 drafter over the target's ``context``: a native context
    with the target's batch, threads and sequences, and no cache but the
    target's (new_context's ``beside`` checks that its layers can read it)."""
    model = open_model(
        path=path, builder=spec.arch.builder, hparams=spec.hparams, global_tensors=spec.global_tensors,
        layer_tensors=spec.layer_tensors, description=spec.description, matmul_weights=spec.matmul_weights(),
        repack=repack, use_mmap=use_mmap, amx_types=amx_types(amx), shards=gguf.shard_paths)
    try:
        native = new_context(model=model, kv_size=context.kv_size, n_batch=context.n_batch,
                             n_threads=context.n_threads, n_seq_max=context.n_seq_max, beside=context)
    except BaseException:
        model.close()
        raise
    return AssistantHead(native, owned_model=model)


# The target builders that hand over their layers' inputs (keep_layer_input): those
# of llama.cpp's targets whose graphs set t_layer_inp (src/models/*.cpp): llama, qwen3,
# qwen3moe, gpt-oss and minimax-m2 (the decoder builder here), qwen35, qwen35moe and
# qwen3next (the qwen35 builder).
EAGLE3_TARGET_BUILDERS = ("decoder", "qwen35")


def _open_eagle3(path, gguf: GGUFFile, spec, target_spec, *, context, repack: bool, use_mmap: bool,
                 amx) -> Eagle3Head:
    h, t = spec.hparams, target_spec.hparams
    if target_spec.arch.builder not in EAGLE3_TARGET_BUILDERS:
        raise UnsupportedArchitectureError(f"an EAGLE-3 head drafts for llama, qwen3, qwen3moe, gpt-oss, qwen35, "
                                           f"qwen3next, ... targets here, not {target_spec.arch.name}")
    if h["n_embd_target"] != t["n_embd"] or any(il >= t["n_layer"] for il in h["target_layers"]):
        raise UnsupportedArchitectureError(
            f"this EAGLE-3 head reads layers {h['target_layers']} of a target of width {h['n_embd_target']}; "
            f"the model has {t['n_layer']} layers of width {t['n_embd']}")
    d2t = None
    if "d2t" in gguf.tensors:
        info = gguf.tensors["d2t"]
        if info.shard:
            raise UnsupportedArchitectureError("this EAGLE-3 head's d2t is in a later file of a split model")
        d2t = np.fromfile(gguf.shard_paths[info.shard], dtype="<i8", count=info.shape[0],
                          offset=gguf.data_offset + info.offset)
        if d2t.min() < 0 or d2t.max() >= t["n_vocab"]:
            raise UnsupportedArchitectureError("this EAGLE-3 head's d2t maps outside the target's vocabulary")
    model = open_model(
        path=path, builder=spec.arch.builder, hparams=h, global_tensors=spec.global_tensors,
        layer_tensors=spec.layer_tensors, description=spec.description,
        # its token embeddings are read by rows only (its output is eagle3_output)
        matmul_weights=[n for n in spec.matmul_weights() if n != spec.global_tensors["tok_embd"]],
        repack=repack, use_mmap=use_mmap, amx_types=amx_types(amx), shards=gguf.shard_paths)
    try:
        # a head without a token table or output of its own uses the target's, shared
        borrowed = borrow_target_weights(model, context.model)
        if borrowed:
            log.info("the EAGLE-3 head uses its target's %s", " and ".join(borrowed))
        head_context = _context_beside(model, context)
        context.set_feature_layers(h["target_layers"])
    except BaseException:
        model.close()
        raise
    return Eagle3Head(head_context, owned_model=model, d2t=d2t, n_features=3 * h["n_embd_target"],
                      hybrid=context.cache.hybrid)


def _open_dflash(path, gguf: GGUFFile, spec, target_spec, *, context, repack: bool, use_mmap: bool,
                 amx) -> DFlashHead:
    """A DFlash drafter beside the target's ``context``: its own cache (the
    injected target features), the target's token table and output where
    the file has none (llama.cpp's ctx_other), and the target handing over
    the inputs of the layers it reads."""
    h, t = spec.hparams, target_spec.hparams
    if target_spec.arch.builder not in EAGLE3_TARGET_BUILDERS:
        raise UnsupportedArchitectureError(f"a DFlash drafter drafts for llama, qwen3, qwen3moe, gpt-oss, qwen35, "
                                           f"qwen3next, ... targets here, not {target_spec.arch.name}")
    if h["n_embd_target"] != t["n_embd"] or any(il >= t["n_layer"] for il in h["target_layers"]):
        raise UnsupportedArchitectureError(
            f"this DFlash drafter reads layers {h['target_layers']} of a target of width {h['n_embd_target']}; "
            f"the model has {t['n_layer']} layers of width {t['n_embd']}")
    borrowed = [role for role in ("tok_embd", "output") if spec.global_tensors.get(role) is None]
    model = open_model(
        path=path, builder=spec.arch.builder, hparams=h, global_tensors=spec.global_tensors,
        layer_tensors=spec.layer_tensors, description=spec.description,
        matmul_weights=spec.matmul_weights(),
        repack=repack, use_mmap=use_mmap, amx_types=amx_types(amx), shards=gguf.shard_paths)
    try:
        if borrowed:
            borrow_target_weights(model, context.model)
        head_context = _context_beside(model, context)
        context.set_feature_layers(h["target_layers"])
    except BaseException:
        model.close()
        raise
    return DFlashHead(head_context, owned_model=model, block_size=h["block_size"], mask_token=h["mask_token"],
                      n_features=h["n_embd_inp"], hybrid=context.cache.hybrid)


def _context_beside(model, context):
    """A native context for a drafter's ``model`` shaped as the target's
    ``context``: as many cells and sequences, the same batch, threads, cache
    types and flash attention (a model drafting for itself then computes what
    the target does)."""
    cache = context.cache
    return new_context(model=model, kv_size=context.kv_size, n_batch=context.n_batch,
                       n_threads=context.n_threads, kv_type=cache.type_k, type_v=cache.type_v,
                       flash_attn=context.flash_attn, n_seq_max=context.n_seq_max)
