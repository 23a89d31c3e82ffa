#!/usr/bin/env python3
"""Drafting with a Gemma 4 drafter file (gemma4-assistant) on synthetic pairs: decode tok/s of elelem
without drafts and with the drafter, alternating in one run.

    python benchmarks/gemma4_assistant.py [--repeats 3] [--threads 1] [--layers 12] [--tokens 128]

The pair (written once to ``$ELELEM_CACHE/bench/`` by tests/support/synthetic_gemma4_assistant.py):
a gemma4 target (n_embd 512, ``--layers`` layers, sliding ones with every third global, FFN 1536,
Q8_0, an 8192-token vocabulary) whose layers leave the residual stream alone, so that it predicts
from the token alone; and a two-layer drafter (n_embd 576) built to predict the same
(``agreeing_assistant_weights``), so its drafts are confirmed; and the same target with a drafter
of random weights ("disagree"), whose drafts are refused, so that the planner should turn drafting
off (its probes aside).  Each measurement evaluates a
64-token prompt, then times ``--tokens`` greedy tokens (the prompt reused from the cache), and
checks that both give the same tokens.  llama.cpp is not run: its drafter needs
common/speculative.cpp, which llama-cpp-python does not bind.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO))   # this checkout's elelem, not an installed one


def pair(layers: int, kind: str) -> tuple[Path, Path]:
    from synthetic import TinyConfig, make_weights
    from synthetic_gemma4_assistant import (AssistantConfig, agreeing_assistant_weights, quiet_target,
                                            write_assistant, write_gemma4_target)

    cache = Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem")) / "bench"
    target_path = cache / f"gemma4-quiet-{layers}l-512-q8_0.gguf"
    assistant_path = cache / f"gemma4-assistant-{kind}-{layers}l-576-q8_0.gguf"
    if not (target_path.exists() and assistant_path.exists()):
        cache.mkdir(parents=True, exist_ok=True)
        target = TinyConfig(arch="gemma4", n_vocab=8192, n_embd=512, n_layer=layers, n_head=8, n_head_kv=2,
                            head_dim=64, head_dim_swa=64, n_ff=1536, n_swa=256, n_ctx_train=4096,
                            wtype="q8_0", seed=7)
        weights = quiet_target(make_weights(target), layers)
        if not target_path.exists():
            write_gemma4_target(target_path, target, weights)
        assistant = AssistantConfig(n_embd=576, n_embd_out=512, n_head=8, n_head_kv=(2, 2), head_dim=64,
                                    head_dim_swa=64, n_ff=1536, n_swa=256, n_vocab=8192, wtype="q8_0", seed=8)
        if kind == "agree":
            assistant = assistant.but(weights=agreeing_assistant_weights(assistant, weights))
        write_assistant(assistant_path, assistant)
    return target_path, assistant_path


def decode_rate(target: Path, assistant: Path | None, threads: int, n: int) -> tuple[float, list[int], dict]:
    import numpy as np

    import elelem

    prompt = np.random.default_rng(3).integers(1, 8192, 64).tolist()
    options = dict(n_threads=threads, kv_size=1024, flash_attn=False, amx=False)
    if assistant is None:
        options["speculative"] = False
    else:
        options["draft_model"] = assistant
    with elelem.LLM(target, **options) as llm:
        llm.generate_tokens(prompt, 1)            # the prompt, evaluated once
        t0 = time.perf_counter()
        tokens = llm.generate_tokens(prompt, n)   # the prompt reused: decoding only
        seconds = time.perf_counter() - t0
        stats = llm.engine.drafter_stats()
    return n / seconds, tokens, stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    print(f"decode tok/s, {args.tokens} tokens, {args.threads} thread(s)")
    for kind in ("agree", "disagree"):
        target, assistant = pair(args.layers, kind)
        plain, drafting = [], []
        for _ in range(args.repeats):
            rate, want, _ = decode_rate(target, None, args.threads, args.tokens)
            plain.append(rate)
            rate, got, stats = decode_rate(target, assistant, args.threads, args.tokens)
            drafting.append(rate)
            if got != want:
                raise SystemExit("drafting changed the greedy tokens")
        ratio = statistics.median(drafting) / statistics.median(plain)
        print(f"{kind}: no drafts {statistics.median(plain):.1f} ({', '.join(f'{r:.1f}' for r in plain)}), "
              f"the drafter {statistics.median(drafting):.1f} ({', '.join(f'{r:.1f}' for r in drafting)}): "
              f"{ratio:.2f}x; drafters {stats}; load average {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
