#!/usr/bin/env python3
"""A coding agent's workload: elelem beside llama-cpp-python, in one run.

    python benchmarks/agent_workload.py \\
        --llama-python "$(python scripts/reference_llamacpp.py --check)" \\
        [--models smollm2-135m qwen2.5-coder-0.5b] [--threads 2] [--repeats 1] \\
        [--workloads code-edit free-text long-context prompt-cache] [--json out.json]

Every figure is greedy (temperature 0), on the same GGUF file, the same prompt
token ids (rendered once with elelem's chat template) and the same threads.
Each task runs on each engine configuration in a subprocess of its own,
which loads the model, warms up and runs the task; the engines take turns
task by task.  elelem runs from this checkout, llama-cpp-python (0.3.36,
the reference build) under ``--llama-python``.  Timing is by wall clock around a streamed generation:
end-to-end (request to last token), time to first token, and decode tok/s
= (tokens - 1) / (last token - first token).

(a) code-edit: a 50-80 line Python file and one small change (a rename, a
    type hint, a new constant); the answer is the whole file.  elelem
    (defaults: speculative decoding by prompt lookup on) against
    llama-cpp-python's defaults and with ``LlamaPromptLookupDecoding`` as its
    draft model (num_pred_tokens 2, its advice for CPUs, and 10, its default).
    Goal: >= 2.0x the defaults' decode tok/s, and ahead of prompt lookup.
(b) free-text: answers that copy nothing.  elelem's defaults against
    llama-cpp-python's defaults and against elelem with speculative=False.
    Goal: >= 0.97x.
(c) long-context: 64 tokens decoded after 4,000 tokens of context (source
    code), with an f16 and a q8_0 KV cache (a quantized V turns flash
    attention on, in both engines).  Speculation off on both sides, so that
    the figures compare the caches.
(d) prompt-cache: the persistent prompt cache (see ``workload_prompt_cache``).

The machine is shared: the run waits (up to ``--wait-load`` seconds) for the
1-minute load average to fall below ``--max-load``, and prints the load
before and after each workload.  Prints figures and ratios; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# ---------------------------------------------------------------------------
# The tasks.

INVENTORY = '''"""A small inventory of parts, with reorder rules."""
from dataclasses import dataclass, field

REORDER_FACTOR = 1.5


@dataclass
class Part:
    sku: str
    name: str
    quantity: int
    minimum: int
    unit_cost: float
    tags: list = field(default_factory=list)

    def value(self):
        return self.quantity * self.unit_cost

    def needs_reorder(self):
        return self.quantity < self.minimum


class Inventory:
    def __init__(self):
        self.parts = {}

    def add(self, part):
        if part.sku in self.parts:
            raise ValueError(f"duplicate sku {part.sku}")
        self.parts[part.sku] = part

    def remove(self, sku, count):
        part = self.parts[sku]
        if count > part.quantity:
            raise ValueError(f"only {part.quantity} of {sku} left")
        part.quantity -= count
        return part.quantity

    def restock(self, sku, count):
        self.parts[sku].quantity += count

    def total_value(self):
        return sum(part.value() for part in self.parts.values())

    def reorder_list(self):
        orders = []
        for part in self.parts.values():
            if part.needs_reorder():
                wanted = int(part.minimum * REORDER_FACTOR) - part.quantity
                orders.append((part.sku, wanted))
        orders.sort()
        return orders

    def by_tag(self, tag):
        return [part for part in self.parts.values() if tag in part.tags]

    def report(self):
        lines = []
        for sku in sorted(self.parts):
            part = self.parts[sku]
            flag = " (reorder)" if part.needs_reorder() else ""
            lines.append(f"{sku:<10}{part.name:<24}{part.quantity:>6}{flag}")
        lines.append(f"total value: {self.total_value():.2f}")
        return "\\n".join(lines)
'''

RATE_LIMITER = '''"""A token-bucket rate limiter for outgoing requests."""
import threading
import time


class RateLimiter:
    def __init__(self, rate, burst):
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    def _refill(self):
        now = time.monotonic()
        elapsed = now - self.updated
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = now

    def try_acquire(self, cost=1):
        with self.lock:
            self._refill()
            if self.tokens >= cost:
                self.tokens -= cost
                return True
            return False

    def wait_time(self, cost=1):
        with self.lock:
            self._refill()
            missing = cost - self.tokens
            if missing <= 0:
                return 0.0
            return missing / self.rate

    def acquire(self, cost=1, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.try_acquire(cost):
                return True
            delay = self.wait_time(cost)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                delay = min(delay, left)
            time.sleep(delay)


class KeyedLimiters:
    def __init__(self, rate, burst):
        self.rate = rate
        self.burst = burst
        self.limiters = {}
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            limiter = self.limiters.get(key)
            if limiter is None:
                limiter = RateLimiter(self.rate, self.burst)
                self.limiters[key] = limiter
            return limiter

    def acquire(self, key, cost=1, timeout=None):
        return self.get(key).acquire(cost, timeout)
'''

CSV_REPORT = '''"""Summaries of a CSV file of sales, by region and by month."""
import csv
from collections import defaultdict


def read_rows(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        rows = []
        for row in reader:
            rows.append({
                "region": row["region"].strip(),
                "month": row["date"][:7],
                "amount": float(row["amount"]),
                "units": int(row["units"]),
            })
        return rows


def by_region(rows):
    totals = defaultdict(float)
    for row in rows:
        totals[row["region"]] += row["amount"]
    return dict(sorted(totals.items()))


def by_month(rows):
    totals = defaultdict(float)
    units = defaultdict(int)
    for row in rows:
        totals[row["month"]] += row["amount"]
        units[row["month"]] += row["units"]
    return {month: (totals[month], units[month]) for month in sorted(totals)}


def best_region(rows):
    totals = by_region(rows)
    if not totals:
        return None
    return max(totals, key=totals.get)


def average_price(rows):
    amount = sum(row["amount"] for row in rows)
    units = sum(row["units"] for row in rows)
    if units == 0:
        return 0.0
    return amount / units


def format_report(rows):
    lines = ["region totals:"]
    for region, total in by_region(rows).items():
        lines.append(f"  {region:<12}{total:>12.2f}")
    lines.append("monthly totals:")
    for month, (total, units) in by_month(rows).items():
        lines.append(f"  {month}  {total:>12.2f}  {units:>6} units")
    lines.append(f"best region: {best_region(rows)}")
    lines.append(f"average price: {average_price(rows):.2f}")
    return "\\n".join(lines)


def main(path):
    rows = read_rows(path)
    print(format_report(rows))
'''

# (file, the change asked for, a string the changed file contains)
CODE_EDITS = [
    ("inventory.py", INVENTORY, "Rename the method `needs_reorder` to `below_minimum` everywhere.",
     "below_minimum"),
    ("rate_limiter.py", RATE_LIMITER, "Add type hints to the parameters and return value of `try_acquire`.",
     "def try_acquire(self, cost: "),
    ("sales_report.py", CSV_REPORT, "Add a module constant `DEFAULT_ENCODING = \"utf-8\"` after the imports, "
     "and pass `encoding=DEFAULT_ENCODING` to `open` in `read_rows`.", "DEFAULT_ENCODING"),
]

FREE_TEXT = [
    "Write a short story about a lighthouse keeper who finds a map in a bottle.",
    "Explain to a new team member why code review matters, in a few friendly paragraphs.",
    "Describe a walk through a city market on a rainy morning.",
]
FREE_TEXT_TOKENS = 160

LONG_CONTEXT_TOKENS = 4000
LONG_DECODE_TOKENS = 64
KV_TYPES = ("f16", "q8_0")
GGML_TYPE_IDS = {"f16": 1, "q8_0": 8}   # llama.cpp's type_k / type_v values
PLD_TOKENS = (2, 10)


def code_edit_messages(name: str, source: str, change: str) -> list[dict]:
    return [{"role": "user", "content": f"{change} Reply with the whole updated file `{name}` only, in one "
             f"```python block, with nothing else changed.\n\n```python\n{source}```"}]


def long_context_text() -> str:
    """Real source code that does not repeat itself: Python's own standard library."""
    import argparse as a, textwrap as t, inspect as i  # noqa: E401 -- their sources are the text
    parts = []
    for module in (a, t, i):
        with open(module.__file__, encoding="utf-8") as f:
            parts.append(f.read())
    return "\n".join(parts)


# ---------------------------------------------------------------------------
# Workers: one engine configuration each, in a subprocess; a JSON job on
# stdin, a JSON list of results on the last line of stdout.

def _timed(tokens_or_deltas):
    """Drain a generator of one generation; (first-item time, end time, items)."""
    first, items = None, []
    for item in tokens_or_deltas:
        if first is None:
            first = time.perf_counter()
        items.append(item)
    return first, time.perf_counter(), items


def worker_elelem(job: dict) -> list[dict]:
    sys.path.insert(0, ROOT)
    from elelem import LLM
    llm = LLM(job["model"], n_ctx=job["n_ctx"], n_threads=job["threads"], n_batch=512, **job["options"])
    llm.generate(job["tasks"][0]["prompt_ids"][:16], max_tokens=8, temperature=0)  # warm-up
    results = []
    for task in job["tasks"]:
        llm.reset()
        t0 = time.perf_counter()
        stream = llm.stream(task["prompt_ids"], max_tokens=task["max_tokens"], temperature=0)
        first, end, deltas = _timed(stream)
        results.append(_figures(task, t0, first, end, stream.completion_tokens, "".join(deltas),
                                drafted=stream.drafted_tokens, accepted=stream.accepted_tokens))
    llm.close()
    return results


def worker_llamacpp(job: dict) -> list[dict]:
    import llama_cpp
    from llama_cpp import Llama
    options = dict(job["options"])
    pld = options.pop("prompt_lookup", None)
    if pld is not None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        options["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=pld)
        # Its drafts need every row's logits: without this its score buffer has n_batch
        # rows only, and a prompt past n_batch fails (llama-cpp-python 0.3.36).
        options["logits_all"] = True
    llm = Llama(job["model"], n_ctx=job["n_ctx"], n_batch=512, n_threads=job["threads"],
                n_threads_batch=job["threads"], verbose=False, **options)
    vocab = llm._model.vocab

    def generation(ids, max_tokens):
        made = 0
        for token in llm.generate(ids, temp=0.0):  # greedy; the other defaults are neutral then
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                return
            yield token
            made += 1
            if made >= max_tokens:
                return

    list(generation(job["tasks"][0]["prompt_ids"][:16], 8))  # warm-up
    results = []
    for task in job["tasks"]:
        llm.reset()
        t0 = time.perf_counter()
        first, end, tokens = _timed(generation(task["prompt_ids"], task["max_tokens"]))
        text = llm.detokenize(tokens).decode("utf-8", "replace")
        results.append(_figures(task, t0, first, end, len(tokens), text))
    return results


def _figures(task, t0, first, end, n_tokens, text, **extra) -> dict:
    first = end if first is None else first
    decode = (n_tokens - 1) / (end - first) if n_tokens > 1 and end > first else float("nan")
    return dict(task=task["id"], tokens=n_tokens, total_s=end - t0, ttft_s=first - t0, decode_tok_s=decode,
                text=text, **extra)


def run_worker(python: str, kind: str, job: dict) -> list[dict]:
    out = subprocess.run([python, os.path.abspath(__file__), "--worker", kind], input=json.dumps(job),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} worker failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# The driver.

class Bench:
    """One model: its path, its prompts, and the engines to run them on."""

    def __init__(self, args, model: str):
        sys.path.insert(0, ROOT)
        from elelem import LLM
        from elelem.model.hub import resolve_model
        self.args = args
        self.name = model
        self.path = str(resolve_model(model))
        self.llm = LLM(self.path, n_ctx=256, n_threads=1)  # the tokenizer and template only

    def chat_ids(self, messages) -> list[int]:
        from elelem.api.prompts import chat_prompt_ids
        return chat_prompt_ids(self.llm.assets, messages)

    def run(self, engines: dict, tasks: list[dict], n_ctx: int) -> dict:
        """{engine: [per task: the median run]}.  Engines take turns task by task
        (a worker per engine and task), so that a change in the machine's load
        falls on all of them alike."""
        runs = {name: [[] for _ in tasks] for name in engines}
        for _ in range(self.args.repeats):
            for i, task in enumerate(tasks):
                for name, (kind, options) in engines.items():
                    python = self.args.llama_python if kind == "llamacpp" else sys.executable
                    job = dict(model=self.path, n_ctx=n_ctx, threads=self.args.threads, options=options,
                               tasks=[task])
                    [result] = run_worker(python, kind, job)
                    runs[name][i].append(result)
                    # As each ends (stderr): a run cut short on a busy machine keeps what it measured.
                    print(f"    {task['id']} {name}: {result['tokens']} tokens, decode {result['decode_tok_s']:.1f} "
                          f"tok/s, {result['total_s']:.1f} s end to end (load {_load():.2f})",
                          file=sys.stderr, flush=True)
        return {name: [_median_run(task_runs) for task_runs in per_task] for name, per_task in runs.items()}


def _median_run(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key in ("total_s", "ttft_s", "decode_tok_s"):
        out[key] = statistics.median(r[key] for r in runs)
    return out


def workload_code_edit(bench: Bench) -> dict:
    tasks = []
    for name, source, change, marker in CODE_EDITS[:bench.args.code_edits]:
        ids = bench.chat_ids(code_edit_messages(name, source, change))
        n_file = len(bench.llm.tokenize(source, add_bos=False))
        tasks.append(dict(id=name, prompt_ids=ids, max_tokens=n_file + 96, marker=marker))
    engines = {"elelem": ("elelem", {}),
               "llama.cpp": ("llamacpp", {})}
    for k in PLD_TOKENS:
        engines[f"llama.cpp+PLD{k}"] = ("llamacpp", {"prompt_lookup": k})
    n_ctx = max(len(t["prompt_ids"]) + t["max_tokens"] for t in tasks) + 16
    results = bench.run(engines, tasks, n_ctx)
    base = "llama.cpp"
    print(f"  {'task':<18}{'engine':<18}{'tokens':>7}{'decode tok/s':>14}{'x defaults':>12}"
          f"{'end-to-end s':>14}{'x defaults':>12}{'TTFT s':>8}  accepted/drafted  edit made")
    for i, task in enumerate(tasks):
        ref = results[base][i]
        for name, rows in results.items():
            r = rows[i]
            drafts = f"{r['accepted']}/{r['drafted']}" if "drafted" in r else "-"
            made = task["marker"] in r["text"]
            print(f"  {task['id']:<18}{name:<18}{r['tokens']:>7}{r['decode_tok_s']:>14.1f}"
                  f"{r['decode_tok_s'] / ref['decode_tok_s']:>12.2f}{r['total_s']:>14.2f}"
                  f"{ref['total_s'] / r['total_s']:>12.2f}{r['ttft_s']:>8.2f}  {drafts:>16}  {made}")
        # Greedy texts: speculation verifies drafts in batches, whose logits differ a
        # little from one token's (f16 cache), so a near-tie may flip (README).
        text = results["elelem"][i]["text"]
        same = [name for name in results if name != "elelem" and results[name][i]["text"] == text]
        print(f"  {task['id']:<18}elelem's text is the same as: {', '.join(same) or 'none'}")
    summary = {}
    for name in results:
        decode = _decode_ratio(results[name], results[base])
        total = _geomean([b["total_s"] / r["total_s"] for r, b in zip(results[name], results[base])])
        summary[name] = dict(decode_x_defaults=decode, speedup_end_to_end=total)
    best_pld = max((n for n in results if "PLD" in n), key=lambda n: summary[n]["decode_x_defaults"])
    elelem = summary["elelem"]
    print(f"  geomean decode tok/s: elelem {elelem['decode_x_defaults']:.2f}x llama.cpp defaults (goal >= 2.0), "
          f"{elelem['decode_x_defaults'] / summary[best_pld]['decode_x_defaults']:.2f}x {best_pld} "
          f"(goal > 1); end-to-end {elelem['speedup_end_to_end']:.2f}x faster than the defaults")
    return dict(results=results, summary=summary)


def workload_free_text(bench: Bench) -> dict:
    tasks = [dict(id=f"story-{i}", prompt_ids=bench.chat_ids([{"role": "user", "content": p}]),
                  max_tokens=FREE_TEXT_TOKENS) for i, p in enumerate(FREE_TEXT)]
    engines = {"elelem": ("elelem", {}), "elelem-no-spec": ("elelem", {"speculative": False}),
               "llama.cpp": ("llamacpp", {})}
    n_ctx = max(len(t["prompt_ids"]) for t in tasks) + FREE_TEXT_TOKENS + 16
    results = bench.run(engines, tasks, n_ctx)
    print(f"  {'task':<10}{'engine':<16}{'tokens':>7}{'decode tok/s':>14}{'accepted/drafted':>18}")
    for i, task in enumerate(tasks):
        for name, rows in results.items():
            r = rows[i]
            drafts = f"{r['accepted']}/{r['drafted']}" if "drafted" in r else "-"
            print(f"  {task['id']:<10}{name:<16}{r['tokens']:>7}{r['decode_tok_s']:>14.1f}{drafts:>18}")
    vs_llama = _decode_ratio(results["elelem"], results["llama.cpp"])
    vs_off = _decode_ratio(results["elelem"], results["elelem-no-spec"])
    print(f"  geomean decode tok/s: elelem {vs_llama:.2f}x llama.cpp defaults, {vs_off:.2f}x elelem without "
          f"speculation (goal >= 0.97)")
    return dict(results=results, summary=dict(x_llamacpp=vs_llama, x_no_speculation=vs_off))


def workload_long_context(bench: Bench) -> dict:
    ids = bench.llm.tokenize(long_context_text(), add_bos=True)[:LONG_CONTEXT_TOKENS]
    tasks = [dict(id="4k", prompt_ids=ids, max_tokens=LONG_DECODE_TOKENS)]
    engines = {}
    for kv in KV_TYPES:
        engines[f"elelem {kv}"] = ("elelem", {"kv_type": kv, "speculative": False})
        quantized = {"type_k": GGML_TYPE_IDS[kv], "type_v": GGML_TYPE_IDS[kv], "flash_attn": True}
        llama = {} if kv == "f16" else quantized
        engines[f"llama.cpp {kv}"] = ("llamacpp", llama)
    results = bench.run(engines, tasks, LONG_CONTEXT_TOKENS + LONG_DECODE_TOKENS + 64)
    r = {name: rows[0] for name, rows in results.items()}
    print(f"  {'KV':<6}{'elelem tok/s':>14}{'llama.cpp tok/s':>17}{'ratio':>8}{'TTFT elelem/llama.cpp s':>26}")
    for kv in KV_TYPES:
        e, l = r[f"elelem {kv}"], r[f"llama.cpp {kv}"]
        print(f"  {kv:<6}{e['decode_tok_s']:>14.1f}{l['decode_tok_s']:>17.1f}"
              f"{e['decode_tok_s'] / l['decode_tok_s']:>8.2f}{e['ttft_s']:>14.2f} / {l['ttft_s']:.2f}")
    for engine in ("elelem", "llama.cpp"):
        ratio = r[f"{engine} q8_0"]["decode_tok_s"] / r[f"{engine} f16"]["decode_tok_s"]
        print(f"  {engine}: q8_0 / f16 decode = {ratio:.2f}")
    return dict(results=results)


def workload_prompt_cache(bench: Bench) -> dict:
    """(d) the persistent prompt cache: fresh processes under a 1,500-token
    system prompt, cold and warm, elelem's ``prompt_cache=`` beside
    llama-cpp-python's ``LlamaDiskCache`` (benchmarks/prompt_cache.py does
    the measuring; goal: warm TTFT <= 0.25x cold, the same greedy answer)."""
    import types
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import prompt_cache
    options = types.SimpleNamespace(threads=bench.args.threads, rules=0)
    options.rules = prompt_cache._rules_for(bench.llm, 1500)
    n_tokens = len(bench.llm.tokenize(prompt_cache.system_prompt(options.rules)))
    results = {}
    print(f"  {'engine':<18}{'cold TTFT s':>12}{'warm TTFT s':>12}{'warm/cold':>10}{'same':>6}{'MiB/1k':>8}")
    for label, kind, python in (("elelem", "elelem", sys.executable),
                                ("llama-cpp-python", "llamacpp", bench.args.llama_python)):
        r = results[label] = prompt_cache.measure(kind, python, bench.path, n_tokens, options)
        print(f"  {label:<18}{r['cold_ttft_s']:>12.3f}{r['warm_ttft_s']:>12.3f}{r['ratio']:>10.3f}"
              f"{str(r['same_answer']):>6}{r['disk_mib_per_1k']:>8.1f}")
    return dict(system_tokens=n_tokens, results=results)


WORKLOADS = {"code-edit": workload_code_edit, "free-text": workload_free_text,
             "long-context": workload_long_context, "prompt-cache": workload_prompt_cache}


def _decode_ratio(runs, baseline) -> float:
    """The geometric mean over tasks of decode tok/s, ``runs`` / ``baseline``."""
    return _geomean([r["decode_tok_s"] / b["decode_tok_s"] for r, b in zip(runs, baseline)])


def _geomean(values) -> float:
    import math
    values = [v for v in values if v == v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _load() -> float:
    return os.getloadavg()[0]


def wait_for_quiet(max_load: float, wait: float) -> float:
    deadline = time.monotonic() + wait
    while _load() >= max_load and time.monotonic() < deadline:
        print(f"  (load {_load():.2f} >= {max_load}: waiting)", file=sys.stderr, flush=True)
        time.sleep(15)
    return _load()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--code-edits", type=int, default=len(CODE_EDITS), metavar="N",
                    help=f"run the first N of the {len(CODE_EDITS)} code-edit tasks (a quick look)")
    ap.add_argument("--llama-python", required=False, default=None,
                    help="a Python that imports llama_cpp: python scripts/reference_llamacpp.py --check")
    ap.add_argument("--max-load", type=float, default=1.5, help="wait for the 1-minute load average to be below this")
    ap.add_argument("--wait-load", type=float, default=600, help="the most seconds to wait for it")
    ap.add_argument("--json", help="also write every figure here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        job = json.loads(sys.stdin.read())
        results = (worker_elelem if args.worker == "elelem" else worker_llamacpp)(job)
        print(json.dumps(results))
        return
    if args.llama_python is None:
        ap.error("--llama-python is needed (python scripts/reference_llamacpp.py --check prints it)")
    print(f"threads {args.threads}, repeats {args.repeats} (medians), greedy; llama-cpp-python under "
          f"{args.llama_python}")
    report = {}
    for model in args.models:
        bench = Bench(args, model)
        for name in args.workloads:
            before = wait_for_quiet(args.max_load, args.wait_load)
            print(f"\n== {model}: {name} (load average {before:.2f} before)", flush=True)
            report[f"{model}/{name}"] = WORKLOADS[name](bench)
            print(f"  (load average {_load():.2f} after)", flush=True)
            if args.json:  # after each workload: a long run on a busy machine keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(report, f, indent=2)
        bench.llm.close()


if __name__ == "__main__":
    main()
