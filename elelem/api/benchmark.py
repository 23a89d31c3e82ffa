"""Load, prefill, time-to-first-token and decode measurements.

One place for the numbers that ``elelem bench``, ``benchmarks/bench.py`` and
``benchmarks/compare_llamacpp.py`` print, so they all mean the same thing:

- load: from the constructor call until the model can evaluate;
- prefill: a fresh cache, ``n_prompt`` tokens evaluated in one call;
- time to first token: prefill plus picking the first token;
- decode: ``n_decode`` greedy steps of one token each, after the prompt.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class BenchResult:
    model: str
    description: str
    n_threads: int
    n_prompt: int
    n_decode: int
    load_s: float
    prefill_tok_s: float
    ttft_s: float
    decode_tok_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def bench_prompt(n_vocab: int, n_prompt: int, seed: int = 0) -> list[int]:
    """A fixed pseudo-random prompt: what is measured does not depend on the text."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, min(n_vocab, 30000), n_prompt)]


def run_benchmark(model_path: str | os.PathLike, *, n_threads: int | None = None,
                  n_prompt: int = 512, n_decode: int = 128, repeats: int = 3, n_ctx: int | None = None,
                  **llm_kwargs) -> BenchResult:
    """Median of ``repeats`` runs of each figure (the model is loaded afresh for each)."""
    from .llm import LLM

    loads, prefills, ttfts, decodes = [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm = LLM(model_path, n_threads=n_threads, n_ctx=n_ctx or n_prompt + n_decode + 16, **llm_kwargs)
        loads.append(time.perf_counter() - t0)
        with llm:
            prompt = bench_prompt(llm.n_vocab, n_prompt)
            t0 = time.perf_counter()
            logits = llm.eval(prompt)
            t_prefill = time.perf_counter() - t0
            token = int(np.argmax(logits))
            ttfts.append(time.perf_counter() - t0)
            prefills.append(n_prompt / t_prefill)
            t0 = time.perf_counter()
            for _ in range(n_decode):
                token = int(np.argmax(llm.eval([token])))
            decodes.append(n_decode / (time.perf_counter() - t0))
            threads, description = llm.n_threads, llm.description
    return BenchResult(str(model_path), description, threads, n_prompt, n_decode, float(np.median(loads)),
                       float(np.median(prefills)), float(np.median(ttfts)), float(np.median(decodes)))
