#!/usr/bin/env python3
"""Reranking against llama-cpp-python on a bge-reranker-base-shaped file.

    python benchmarks/rerank.py --llama-python "$(python scripts/reference_llamacpp.py --check)" \
        [--documents 16] [--words 120] [--repeats 3] [--threads 2]

The model: bge-reranker-base's shape (``bert``, 12 layers, hidden 768, 12 heads, FFN 3072, F16
matrices, a classification head ``cls`` + ``cls.output``) with random weights and the small
WordPiece vocabulary of tests/support/synthetic_bert.py, written once to ``$ELELEM_CACHE/bench/``
by tests/support/synthetic_rerank.py.  One query against ``--documents`` documents of
``--words`` words: elelem's ``LLM.rerank`` (flash attention off, as llama-cpp-python's
default), and llama.cpp as llama-server runs it (each document's prompt decoded alone with
``pooling_type=RANK``, its score read with ``llama_get_embeddings_seq``), in a child process
under the reference python.  Prints documents per second for each (best of ``--repeats``) and
the largest difference between their scores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

_LLAMA_CHILD = r"""
import ctypes, json, sys, time
import llama_cpp
args = json.loads(sys.argv[1])
llm = llama_cpp.Llama(args["path"], embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
                      n_ctx=args["n_ctx"], n_batch=args["n_ctx"], n_ubatch=args["n_ctx"],
                      n_threads=args["threads"], verbose=False)
memory = llama_cpp.llama_get_memory(llm.ctx)
best, scores = None, []
for _ in range(args["repeats"]):
    t0 = time.perf_counter()
    scores = []
    for ids in args["prompts"]:
        llama_cpp.llama_memory_clear(memory, True)
        llm._batch.reset()
        llm._batch.add_sequence(ids, 0, True)
        llm._ctx.decode(llm._batch)
        out = ctypes.cast(llama_cpp.llama_get_embeddings_seq(llm.ctx, 0), ctypes.POINTER(ctypes.c_float))
        scores.append(float(out[0]))
    elapsed = time.perf_counter() - t0
    best = elapsed if best is None else min(best, elapsed)
print(json.dumps({"seconds": best, "scores": scores}))
"""


def model_path() -> Path:
    import synthetic_bert
    from synthetic_rerank import BgeConfig, write_bge

    cache = Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem"))
    path = cache / "bench" / "bge-reranker-base-shape-f16.gguf"
    if not path.exists():
        bert = synthetic_bert.BertConfig(n_embd=768, n_layer=12, n_head=12, n_ff=3072, n_ctx_train=512,
                                         pooling=None, wtype="f16", seed=5)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        write_bge(partial, BgeConfig(bert=bert))
        partial.replace(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--documents", type=int, default=16)
    ap.add_argument("--words", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import elelem
    from elelem.api.rerank import rerank_ids
    from synthetic_bert import WORDS

    path, n_ctx = model_path(), 512
    query = "the cat sat on the mat"
    documents = [" ".join(WORDS[(7 * d + 3 * i) % len(WORDS)] for i in range(args.words))
                 for d in range(args.documents)]
    with elelem.LLM(path, n_ctx=n_ctx, n_threads=args.threads, flash_attn=False, amx=False) as llm:
        prompts = [rerank_ids(llm.assets, query, d) for d in documents]
        llm.rerank(query, documents[:1])   # warm-up
        best = None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            results = llm.rerank(query, documents)
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
    ours = {r["index"]: r["relevance_score"] for r in results}
    child = subprocess.run([args.llama_python, "-c", _LLAMA_CHILD, json.dumps(
        {"path": str(path), "n_ctx": n_ctx, "threads": args.threads, "repeats": args.repeats, "prompts": prompts})],
        capture_output=True, text=True, check=True)
    theirs = json.loads(child.stdout.strip().splitlines()[-1])
    tokens = sum(len(p) for p in prompts)
    print(f"{args.documents} documents, {tokens} tokens, {args.threads} threads")
    print(f"elelem          {args.documents / best:8.2f} documents/s  ({best:.3f} s)")
    print(f"llama-cpp-python {args.documents / theirs['seconds']:7.2f} documents/s  ({theirs['seconds']:.3f} s)")
    print(f"largest score difference: {max(abs(ours[i] - s) for i, s in enumerate(theirs['scores'])):.3g}")


if __name__ == "__main__":
    main()
