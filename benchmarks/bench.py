#!/usr/bin/env python3
"""Load time, prefill and decode speed of elelem on one model.

    python benchmarks/bench.py [--model qwen2.5-coder-0.5b] [--threads 2] [--json]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's elelem, not site-packages'

from elelem.api.benchmark import run_benchmark  # noqa: E402
from elelem.model.hub import DEFAULT_MODEL, resolve_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a path or a packaged model name")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run_benchmark(resolve_model(args.model), n_threads=args.threads, n_prompt=args.prompt_tokens,
                      n_decode=args.decode_tokens, repeats=args.repeats)
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return
    print(f"model    {r.model}")
    print(f"threads  {r.n_threads}")
    print(f"load     {r.load_s:.3f} s")
    print(f"prefill  {r.prefill_tok_s:.1f} tok/s ({r.n_prompt} tokens)")
    print(f"ttft     {r.ttft_s * 1000:.0f} ms")
    print(f"decode   {r.decode_tok_s:.1f} tok/s ({r.n_decode} tokens)")


if __name__ == "__main__":
    main()
