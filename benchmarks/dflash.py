"""One DFlash block's time, elelem against llama.cpp, on the same synthetic files.  DEV-ONLY.

    python benchmarks/dflash.py [--rounds 3] [--threads 1] [--block 16] [--flash-attn]

Writes a synthetic llama target (SmolLM2's vocabulary, 49152 ids; 8 layers of
width 64 unless --width/--layers say otherwise) and a DFlash drafter for it in
the converter's layout (two layers, borrowing the target's token table and
output: the output projection over the whole vocabulary is most of a block's
work), injects a prompt's features, then times blocks of --block tokens: the
median of 20 in each round, alternating elelem and llama.cpp (the reference
build, tests/support/fixtures/bench_dflash_block.py).  Prints each round and
the ratio elelem / llama.cpp of the medians (below 1: elelem is faster).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import elelem  # noqa: E402
from elelem.api.draft import open_draft  # noqa: E402
from elelem.model.hub import cached_path  # noqa: E402
from llamacpp_reference import builder, machine  # noqa: E402
from synthetic import TinyConfig, write_model  # noqa: E402
from synthetic_dflash import DFlashConfig, write_dflash  # noqa: E402
from vocab_metadata import vocab_writer  # noqa: E402


def elelem_block(target: Path, drafter: Path, args, layers: tuple) -> float:
    with elelem.LLM(target, n_threads=args.threads, kv_size=512, speculative=False, flash_attn=args.flash_attn,
                    amx=False) as llm:
        head = open_draft(str(drafter), target_gguf=llm.gguf, target_n_vocab=llm.spec.hparams["n_vocab"],
                          context=llm.engine.context, repack=True, use_mmap=True, amx=False, target_spec=llm.spec)
        try:
            tokens = [(7 * i + 1) % 1000 for i in range(args.prompt)]
            llm.engine.context.decode(tokens, 0, True, keep_hidden=True)
            head._held[0] = []
            head.inject(0, llm.engine.context.last_hidden)
            head._held[0] = tokens
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                head.block_logits(0, 11, args.block - 1)
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
        finally:
            head.close()


def llamacpp_block(target: Path, drafter: Path, args, layers: tuple) -> float:
    py = builder().reference_python(machine())
    if py is None:
        sys.exit("no llama.cpp reference build here (scripts/reference_llamacpp.py)")
    cmd = [str(py), str(ROOT / "tests/support/fixtures/bench_dflash_block.py"), "--target", str(target),
           "--drafter", str(drafter), "--layers", ",".join(map(str, layers)), "--prompt", str(args.prompt),
           "--block", str(args.block), "--threads", str(args.threads)] + (["--flash-attn"] if args.flash_attn else [])
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT / "tests/support/fixtures", check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["block_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--flash-attn", action="store_true")
    args = ap.parse_args()
    smollm = cached_path("smollm2-135m")
    layers = (1, args.layers // 2, args.layers - 1)
    with tempfile.TemporaryDirectory(prefix="elelem-bench-dflash-") as tmp:
        target, drafter = Path(tmp) / "target.gguf", Path(tmp) / "dflash.gguf"
        vocab = vocab_writer(smollm)
        write_model(target, TinyConfig(arch="llama", n_layer=args.layers, n_embd=args.width, n_head=4, n_head_kv=2,
                                       n_vocab=49152, seed=1), extra_metadata=vocab)
        write_dflash(drafter, DFlashConfig(n_embd=args.width, n_embd_target=args.width, target_layers=layers,
                                           block_size=args.block, seed=2), extra_metadata=vocab)
        ours, theirs = [], []
        for r in range(args.rounds):
            ours.append(elelem_block(target, drafter, args, layers))
            theirs.append(llamacpp_block(target, drafter, args, layers))
            print(f"round {r}: elelem {ours[-1] * 1e3:.3f} ms, llama.cpp {theirs[-1] * 1e3:.3f} ms per block of "
                  f"{args.block}", flush=True)
    print(f"elelem / llama.cpp: {statistics.median(ours) / statistics.median(theirs):.3f} "
          f"(medians of {args.rounds} rounds; {args.threads} thread(s), flash attention "
          f"{'on' if args.flash_attn else 'off'})")


if __name__ == "__main__":
    main()
