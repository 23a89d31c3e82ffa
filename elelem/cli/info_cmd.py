"""``elelem info MODEL``: what a GGUF file holds, read from its header alone."""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from ..api.embeddings import POOLING_TYPES
from ..errors import ElelemError
from ..gguf.reader import read_gguf
from ..model.hub import KNOWN_MODELS, cached_path, is_cached, is_hub_reference

# llama.cpp's llama_ftype values (general.file_type) for the common quantizations.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def describe(path) -> dict:
    """The facts ``info`` shows, as a JSON-ready dict."""
    from ..model.architectures import model_spec  # imported here: it is not needed for --help

    gguf = read_gguf(path)
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    parameters = sum(t.n_elements for t in gguf.tensors.values())
    active = parameters
    spec = None
    try:
        spec = model_spec(gguf)
        hparams = spec.hparams
        supported, reason = True, None
        shape = spec.arch.shape(hparams) if spec.arch.shape is not None else None
        if "n_expert" in hparams:  # a token reads only the experts it is routed to
            used, used_active = spec.parameter_counts(gguf.tensors)
            active = parameters - (used - used_active)
    except ElelemError as error:  # still describe what the header says
        hparams, supported, reason, shape = {}, False, str(error), None
    file_type = meta.get("general.file_type")
    tokens = meta.get("tokenizer.ggml.tokens")
    return {
        "path": str(path),
        "name": meta.get("general.name"),
        "architecture": arch,
        "supported": supported,
        "unsupported_reason": reason,
        "parameters": parameters,
        "active_parameters": active,
        "experts": hparams.get("n_expert", meta.get(f"{arch}.expert_count")),
        "experts_used": hparams.get("n_expert_used", meta.get(f"{arch}.expert_used_count")),
        "size_label": meta.get("general.size_label"),
        "layers": hparams.get("n_layer", meta.get(f"{arch}.block_count")),
        "embedding_length": hparams.get("n_embd", meta.get(f"{arch}.embedding_length")),
        "heads": hparams.get("n_head", meta.get(f"{arch}.attention.head_count")),
        "kv_heads": hparams.get("n_head_kv", meta.get(f"{arch}.attention.head_count_kv")),
        "shape": shape,
        "context_length": hparams.get("n_ctx_train", meta.get(f"{arch}.context_length")),
        "vocab_size": hparams.get("n_vocab", len(tokens) if tokens is not None else None),
        "tokenizer": meta.get("tokenizer.ggml.model"),
        "file_type": FILE_TYPES.get(file_type, file_type) if file_type is not None else None,
        "tensor_count": len(gguf.tensors),
        "tensor_types": dict(Counter(t.type_name for t in gguf.tensors.values()).most_common()),
        "chat_template": bool(meta.get("tokenizer.chat_template")),
        "attention": _attention(hparams),
        "encoder": bool(hparams.get("encoder")),
        # a hybrid's layers, a letter each (R recurrent, A attention, F an FFN alone), and one sequence's
        # recurrent state
        "layer_pattern": spec.layer_pattern() if spec else None,
        "recurrent_kind": (spec.arch.recurrent_kind or None) if spec else None,
        "recurrent_state_bytes": spec.recurrent_state_bytes() if spec else None,
        # what speculative decoding may draft with, besides a draft model given to it
        "drafters": _drafters(spec),
        # a drafter file's target architecture (a Gemma 4 drafter: gemma4-assistant), else None
        "drafter_for": "gemma4" if arch == "gemma4-assistant" else None,
        "draft_head": _draft_head(spec),
        "pooling": POOLING_TYPES.get(meta.get(f"{arch}.pooling_type", 0), meta.get(f"{arch}.pooling_type")),
        "file_size": gguf.total_size,
        "files": len(gguf.shard_paths),
        "gguf_version": gguf.version,
    }


def _drafters(spec) -> list[str]:
    """The drafters a generation of this model chooses between (engine/step_costs.py plans which runs)."""
    from ..model.mtp import has_mtp

    if spec is None or spec.arch.encoder or spec.arch.name in ("gemma4-assistant", "dflash") \
            or spec.hparams.get("mtp_head"):
        return []
    if has_mtp(spec):
        return ["prompt lookup", f"mtp ({spec.hparams['n_layer_nextn']} NextN block"
                                 f"{'s' if spec.hparams['n_layer_nextn'] > 1 else ''} in the file; the first drafts)"]
    return ["prompt lookup"]


def _draft_head(spec) -> str | None:
    """What a drafter head's file drafts from (an EAGLE-3 head or a DFlash drafter is no model of its own)."""
    if spec is None or spec.arch.name not in ("eagle3", "dflash"):
        return None
    h = spec.hparams
    if spec.arch.name == "dflash":
        tables = "its own" if spec.global_tensors.get("tok_embd") else "the target's (borrowed)"
        return (f"DFlash drafter for a target of width {h['n_embd_target']}: reads the inputs of its layers "
                f"{', '.join(map(str, h['target_layers']))}; drafts blocks of {h['block_size']} (mask token "
                f"{h['mask_token']}); token table and output {tables}; give it as the target's draft model")
    vocab = f"{h['n_vocab_draft']} draft ids mapped by d2t" if h["n_vocab_draft"] != h["n_vocab"] else "the target's"
    own = {"token table": spec.global_tensors.get("tok_embd"), "output": spec.layer_tensors[0].get("eagle3_output")}
    borrowed = [what for what, name in own.items() if not name]
    uses = f"; uses the target's {' and '.join(borrowed)}" if borrowed else ""
    return (f"EAGLE-3 head for a target of width {h['n_embd_target']}: reads the inputs of its layers "
            f"{', '.join(map(str, h['target_layers']))}; vocabulary {vocab}{uses}; give it as the target's "
            f"draft model")


def _attention(h: dict) -> str | None:
    """The attention's shape where it is not plain multi-head (or grouped) attention."""
    if h.get("kv_lora_rank"):
        q = f"q_lora_rank {h['q_lora_rank']}" if h["q_lora_rank"] else "q_lora_rank 0 (Q projected directly)"
        return (f"multi-head latent: kv_lora_rank {h['kv_lora_rank']}, {q}, {h['n_rot']} RoPE dims, "
                f"{h['n_head']} heads of {h['head_dim_k']} (K) / {h['head_dim_v']} (V)")
    return None


def main(args: argparse.Namespace) -> int:
    if args.system:
        return show_system(args)
    if args.devices:
        return show_devices(args)
    path = args.model
    if path in KNOWN_MODELS:
        if not is_cached(path):
            print(f"elelem: error: {path} is not in the cache; run 'elelem pull {path}' first", file=sys.stderr)
            return 1
        path = cached_path(path)
    elif is_hub_reference(path):
        from .loading import model_path
        path = model_path(path)  # pulled, with the bar, if not cached yet
    facts = describe(path)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    types = ", ".join(f"{name} x{count}" for name, count in facts["tensor_types"].items())
    supported = "yes" if facts["supported"] else f"no ({facts['unsupported_reason']})"
    rows = [
        ("file", facts["path"]),
        ("name", facts["name"] or "-"),
        ("architecture", f"{facts['architecture']} (supported: {supported})"),
        ("size", f"{_count(facts['parameters'])} parameters, {facts['layers']} layers, "
                 f"n_embd {facts['embedding_length']}, {facts['heads']} heads ({facts['kv_heads']} KV)"),
        *([("shape", facts["shape"])] if facts["shape"] else []),
        *([("experts", f"{facts['experts']}, {facts['experts_used']} used per token: "
                        f"{_count(facts['active_parameters'])} of the {_count(facts['parameters'])} "
                        f"parameters active")] if facts["experts"] else []),
        *_hybrid_rows(facts),
        *([("attention", facts["attention"])] if facts["attention"] else []),
        *([("drafters", ", ".join(facts["drafters"]))] if facts["drafters"] else []),
        *([("draft head", facts["draft_head"])] if facts["draft_head"] else []),
        ("context length", f"{facts['context_length']} tokens (trained)"),
        ("vocabulary", f"{facts['vocab_size']} tokens ({facts['tokenizer']})"),
        ("quantization", f"{facts['file_type'] or '-'}; tensors: {types}"),
        ("tensors", str(facts["tensor_count"])),
        ("use", f"embeddings only: an encoder (pooling {facts['pooling']})" if facts["encoder"]
         else f"a drafter for a {facts['drafter_for']} model (its --draft-model)" if facts["drafter_for"]
         else "text generation and embeddings"),
        *([] if facts["encoder"] else [("chat template", "yes" if facts["chat_template"] else "no (ChatML is used)")]),
        ("file size", f"{facts['file_size'] / 1e6:.1f} MB ({facts['file_size']} bytes)"
                      + (f" in {facts['files']} files (a split model)" if facts["files"] > 1 else "")),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def _hybrid_rows(facts: dict) -> list[tuple[str, str]]:
    """A hybrid's layer pattern and the recurrent state a sequence holds."""
    pattern = facts["layer_pattern"]
    if not pattern:
        return []
    kind = facts["recurrent_kind"] or "recurrent"
    ffn = f", {pattern.count('F')} FFN" if "F" in pattern else ""   # layers that are an FFN alone (Nemotron-H)
    rows = [("layer pattern", f"{pattern.count('R')} {kind}, {pattern.count('A')} attention{ffn}: {pattern}")]
    state = facts["recurrent_state_bytes"]
    if state:
        parts = ", ".join(f"{part} {_kib(n)}" for part, n in state.items())
        rows.append(("recurrent state", f"{_kib(sum(state.values()))} a sequence ({parts})"))
    return rows


def _kib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def show_system(args: argparse.Namespace) -> int:
    from ..cpu import system_info  # loads the native core

    facts = system_info()
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    scores = ", ".join(f"{name} {'(cannot run here)' if score <= 0 else score}"
                       for name, score in sorted(facts["cpu_variants"].items(), key=lambda kv: -kv[1]))
    rows = [
        ("cpu", facts["cpu"]),
        ("cpu flags", " ".join(facts["cpu_flags"]) or "-"),
        ("cpu variant", facts["cpu_variant"] + (" (forced by ELELEM_CPU_VARIANT)" if facts["cpu_variant_forced"]
                                                else " (the best this CPU runs)")),
        ("variants", scores),
        ("compiled with", " ".join(facts["compiled_features"]) or "-"),
        ("repack buffers", ", ".join(facts["repack_buffer_types"]) or "none"),
        ("amx", ("on: " if facts["amx"] else "off: ") + facts["amx_reason"]),
        ("q5_0 widening", ("on: " if facts["widen_q5_0"] else "off: ") + facts["widen_q5_0_reason"]),
        ("small-batch kernels", ("on: " if facts["small_batch_kernels"] else "off: ")
         + facts["small_batch_kernels_reason"]),
        ("module", facts["cpu_module"]),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def show_devices(args: argparse.Namespace) -> int:
    from ..api.offload import device_table  # loads the native core and the GPU modules; connects to --rpc

    table = device_table(args.rpc or [])
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    rows = table["devices"]
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        where = f"RPC server {row['endpoint']}" if row["endpoint"] else row["description"]
        print(f"{row['name']:<{width}}  {row['kind']:<4}  {row['free_bytes'] / 2**20:>9,.0f} MiB free of "
              f"{row['total_bytes'] / 2**20:,.0f} MiB  {where}")
    for module in table["modules"]:
        state = {"loaded": f"loaded, {module['devices']} device(s)", "absent": "not built",
                 "failed": "failed to load"}[module["state"]]
        print(f"{module['backend']} module: {state}" + (f" ({module['note']})" if module["note"] else ""))
    if table["memory_limit_bytes"] is not None:
        print(f"ELELEM_GPU_MEMORY_LIMIT: each GPU counts at most {table['memory_limit_bytes'] / 2**20:,.0f} MiB free")
    return 0
