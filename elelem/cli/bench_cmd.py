"""``elelem bench``: load time, prefill and decode speed (elelem.api.benchmark)."""
from __future__ import annotations

import argparse
import json

from .loading import flash_attn_option, gpu_options, model_path


def main(args: argparse.Namespace) -> int:
    from ..api.benchmark import run_benchmark

    r = run_benchmark(model_path(args.model), n_threads=args.threads, n_prompt=args.prompt_tokens,
                      n_decode=args.gen_tokens, repeats=1, n_ctx=args.ctx, use_mmap=args.use_mmap,
                      repack=args.repack, amx=args.amx, rpc_servers=args.rpc, lora=args.lora,
                      flash_attn=flash_attn_option(args), **gpu_options(args))
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0
    print(f"model    {r.model} ({r.n_threads} threads)")
    print(f"         {r.description}")
    print(f"load     {r.load_s:.3f} s")
    print(f"prefill  {r.prefill_tok_s:.1f} tok/s ({r.n_prompt} tokens)")
    print(f"ttft     {r.ttft_s * 1000:.0f} ms")
    print(f"decode   {r.decode_tok_s:.1f} tok/s ({r.n_decode} tokens)")
    return 0
