"""How long one call to ``Sampler.sample`` takes on a Qwen-sized vocabulary.

Run from the repository root: ``python benchmarks/sampling_speed.py``.
Prints microseconds per sample for a few parameter sets. The logits are
synthetic but shaped like a language model's: a broad mass of unlikely tokens
and a short head of likely ones.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run against the source tree

from elelem.sampling.sampler import Sampler, SamplingParams  # noqa: E402

N_VOCAB = 151_936  # Qwen2.5


def synthetic_logits(rng: np.random.Generator, n_vocab: int) -> np.ndarray:
    logits = rng.normal(-2.0, 2.5, n_vocab)
    head = rng.choice(n_vocab, 50, replace=False)
    logits[head] += rng.uniform(4.0, 12.0, head.size)
    return logits.astype(np.float32)


def microseconds_per_sample(params: SamplingParams, rows: list[np.ndarray], recent: list[int], repeats: int) -> float:
    sampler = Sampler(params)
    sampler.sample(rows[0], recent)  # warm up
    start = time.perf_counter()
    for i in range(repeats):
        sampler.sample(rows[i % len(rows)], recent)
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--vocab", type=int, default=N_VOCAB)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    rows = [synthetic_logits(rng, args.vocab) for _ in range(16)]
    recent = rng.integers(0, args.vocab, 256).tolist()
    cases = {
        "defaults": SamplingParams(seed=1),
        "greedy": SamplingParams(temperature=0.0),
        "penalties + bias": SamplingParams(
            seed=1, repeat_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1, logit_bias={7: -np.inf, 11: 2.0}
        ),
        "typical_p 0.9": SamplingParams(seed=1, typical_p=0.9),
        "top_k off (full-vocab top_p)": SamplingParams(seed=1, top_k=0),
    }
    print(f"vocab {args.vocab}, {args.repeats} samples per case")
    for name, params in cases.items():
        print(f"{name:>30}: {microseconds_per_sample(params, rows, recent, args.repeats):8.1f} us/sample")


if __name__ == "__main__":
    main()
