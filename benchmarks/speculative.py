#!/usr/bin/env python3
"""Speculative decoding (prompt lookup): decode tok/s with and without it.

    python benchmarks/speculative.py [--models smollm2-135m qwen2.5-coder-0.5b]
        [--tokens 200] [--threads 2] [--repeats 2] [--max-draft 4 8 12] [--json out.json]

Two tasks, chat-formatted with each model's template, greedy (temperature 0):
- ``code-edit``: rewrite a given 40-line Python function with one small
  change (a rename); the answer copies most of its prompt, as a coding
  agent's does;
- ``free-text``: "Write a story about ...": little to copy.

For each model, task and repeat: ``llm.stream(...)`` with ``speculative=False``
and ``True`` (and, with several ``--max-draft`` values, each of them), in one
process, the model loaded once.  Figures: decode tok/s (completion tokens - 1
over ``stream.decode_seconds``: the first token comes from the prefill), the
drafted and accepted tokens and the acceptance rate, and whether the text is
the same as without speculation (when not, the first differing token and
``gap``: the plain token's logit minus the speculative one's there, from a
fresh batch ``llm.eval`` of the prompt and the common prefix -- a third
arithmetic path, so its sign says nothing about which run was "right").
Every configuration first runs once untimed (warm-up).  Prints numbers; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import elelem  # noqa: E402
from elelem.engine import speculative as speculative_module  # noqa: E402

FUNCTION = '''def summarize_orders(orders, customers, min_total=0.0):
    """Group orders by customer and compute totals, counts and the largest order."""
    by_customer = {}
    for order in orders:
        customer_id = order["customer_id"]
        if customer_id not in customers:
            continue
        total = 0.0
        for item in order["items"]:
            price = item["price"]
            quantity = item.get("quantity", 1)
            discount = item.get("discount", 0.0)
            total += price * quantity * (1.0 - discount)
        if total < min_total:
            continue
        entry = by_customer.setdefault(customer_id, {
            "name": customers[customer_id]["name"],
            "orders": 0,
            "total": 0.0,
            "largest": 0.0,
        })
        entry["orders"] += 1
        entry["total"] += total
        if total > entry["largest"]:
            entry["largest"] = total
    result = []
    for customer_id, entry in by_customer.items():
        average = entry["total"] / entry["orders"]
        result.append({
            "customer_id": customer_id,
            "name": entry["name"],
            "orders": entry["orders"],
            "total": round(entry["total"], 2),
            "average": round(average, 2),
            "largest": round(entry["largest"], 2),
        })
    result.sort(key=lambda row: row["total"], reverse=True)
    return result
'''

TASKS = {
    "code-edit": [{"role": "user", "content": "Rewrite this function, renaming the parameter `orders` to "
                   "`order_list`. Reply with the whole function only.\n\n```python\n" + FUNCTION + "```"}],
    "free-text": [{"role": "user", "content": "Write a story about a lighthouse keeper who finds a map."}],
}


def run_once(llm, messages, tokens, speculative):
    stream = llm.chat_stream(messages, max_tokens=tokens, temperature=0, speculative=speculative)
    text = stream.text()
    decode = (stream.completion_tokens - 1) / stream.decode_seconds if stream.decode_seconds else float("nan")
    return {"text": text, "tokens": stream.completion_tokens, "decode_tok_s": decode,
            "drafted": stream.drafted_tokens, "accepted": stream.accepted_tokens}


def first_difference(llm, messages, a, b):
    """Where two answers' tokens first differ, and the logit gap there (plain decoding's view)."""
    from elelem.api.prompts import chat_prompt_ids
    ta, tb = llm.tokenize(a, add_bos=False), llm.tokenize(b, add_bos=False)
    i = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    if i >= min(len(ta), len(tb)):
        return {"token": i, "gap": None}
    ids = chat_prompt_ids(llm.assets, messages) + ta[:i]
    llm.reset()
    logits = llm.eval(ids)
    return {"token": i, "gap": float(logits[ta[i]] - logits[tb[i]]),
            "plain": llm.detokenize([ta[i]]).decode(errors="replace"),
            "speculative": llm.detokenize([tb[i]]).decode(errors="replace")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-draft", type=int, nargs="+", default=[speculative_module.DEFAULT_MAX_DRAFT])
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for model in args.models:
        with elelem.LLM(model, n_threads=args.threads) as llm:
            for task, messages in TASKS.items():
                configs = [("off", False, None)] + [(f"k={k}", True, k) for k in args.max_draft]
                results = {name: [] for name, _, _ in configs}
                for name, spec, k in configs:  # warm-up
                    if k is not None:
                        speculative_module.DEFAULT_MAX_DRAFT = k
                    run_once(llm, messages, 8, spec)
                for _ in range(args.repeats):
                    for name, spec, k in configs:
                        if k is not None:
                            speculative_module.DEFAULT_MAX_DRAFT = k
                        llm.reset()
                        results[name].append(run_once(llm, messages, args.tokens, spec))
                base = results["off"]
                base_rate = statistics.median(r["decode_tok_s"] for r in base)
                for name, spec, k in configs:
                    runs = results[name]
                    rate = statistics.median(r["decode_tok_s"] for r in runs)
                    drafted = sum(r["drafted"] for r in runs)
                    accepted = sum(r["accepted"] for r in runs)
                    same = all(r["text"] == b["text"] for r, b in zip(runs, base))
                    row = {"model": model, "task": task, "config": name, "tokens": runs[0]["tokens"],
                           "decode_tok_s": [round(r["decode_tok_s"], 1) for r in runs],
                           "median_tok_s": round(rate, 1), "speedup": round(rate / base_rate, 2),
                           "drafted": drafted, "accepted": accepted,
                           "acceptance": round(accepted / drafted, 3) if drafted else None, "same_text": same}
                    if not same:
                        row["difference"] = first_difference(llm, messages, base[0]["text"], runs[0]["text"])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
