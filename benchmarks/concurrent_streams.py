#!/usr/bin/env python3
"""Concurrent greedy streams over one model: aggregate tokens/s against one stream alone.

    python benchmarks/concurrent_streams.py [--models qwen2.5-coder-0.5b smollm2-135m]
        [--streams 1 4 8] [--tokens 64] [--threads 2] [--repeats 2]
        [--llama-python "$(python scripts/reference_llamacpp.py --check)"]
        [--llamacpp-batched] [--flash-attn] [--installed] [--elelem-options JSON] [--json out.json]

For each model and repeat, one fresh subprocess per engine:
- elelem: one ``LLM(path, n_ctx, n_threads)``, one session per stream
  (``llm.new_session()``); stream i gets coding prompt i, chat-formatted with
  the model's template (30-60 tokens), and ``session.generate_tokens(ids,
  --tokens)``, all N threads released together by a barrier.  Every prompt is
  first run alone (one after the other, on one session): those are the solo
  tokens, and their total tokens / total wall time is "one stream alone", the
  N=1 row and the denominator of every ratio.
- llama-cpp-python (``--llama-python``, the reference build of
  scripts/reference_llamacpp.py): the same prompt ids and token counts, greedy
  (argmax of the logits, as elelem's ``generate_tokens``), N threads sharing
  one ``Llama`` under a lock held for a whole request, as llama-cpp-python
  requires (one context, one sequence): it serializes, so about 1.0x.
- ``--llamacpp-batched``: llama.cpp's own batched decoding,
  ``llama-batched-bench -npp 32 -ntg TOKENS -npl 1,4,8`` (built, once and cached,
  by benchmarks/llamacpp_batched_bench.py from the same sdist), its S_TG
  column (aggregate generation tok/s over B parallel sequences) beside the
  others, ratios against B=1.  Its prompts are 32 random tokens, not ours.

Figures per configuration (range over the repeats, and the median):
- ``wall tok/s``: all streams' generated tokens / wall time from the barrier
  to the last stream's end, prefill included;
- ``decode tok/s``: the same with prefill taken out: each configuration also
  runs with 1 token per stream (prefill and the first token), and decode is
  (tokens - tokens at 1) / (wall - wall at 1);
- ``same``: streams whose tokens equal their prompt's solo tokens, and for the
  others how many tokens matched before the first difference.
Every worker first runs each prompt alone for 2 tokens, untimed (warm-up).
A stream that reaches an end-of-generation token stops early; the token
counts printed say so (``64`` when every stream made all it was asked).

``--flash-attn`` runs all three with flash attention (ggml_flash_attn_ext).
The streams share one KV cache, and without it every token attends over
every stream's cells (masked); the fused kernel skips the cells a token's
mask excludes.  elelem serve turns it on by default, as llama.cpp does.

elelem's cache is ``--n-ctx`` positions per stream; an elelem whose sequences
share one cache (``LLM(kv_size=...)``) gets ``--n-ctx`` x the most streams,
as llama-batched-bench gets ``-c 4096``.
The elelem worker imports this checkout's elelem (``--installed``: the one
installed for ``--elelem-python`` instead, e.g. to measure a build of the
code before a change).  The script prints numbers; it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Distinct coding requests that make small instruct models write code for
# well over 64 tokens, so that every stream generates the same count.
PROMPTS = (
    "Write a Python function that parses an ISO 8601 date string and returns a datetime. Include docstring and tests.",
    "Implement a thread-safe LRU cache class in Python with get and put methods, and explain each method briefly.",
    "Write a C function that reverses a singly linked list in place, with a struct definition and a main that tests it.",
    "Write a JavaScript function that debounces another function, with an example that uses it on window resize.",
    "Implement binary search in Rust over a sorted slice of i32, returning Option<usize>, with unit tests.",
    "Write a Bash script that finds the ten largest files under a directory and prints their sizes in megabytes.",
    "Write a SQL schema for a blog with users, posts and comments, then a query listing each post's comment count.",
    "Write a Go HTTP server with one handler that returns the current time as JSON, and show how to run it.",
    "Write a Python class for a min-heap priority queue with push, pop and peek, and a short usage example.",
    "Implement a C++ template function that merges two sorted vectors into one sorted vector, with a test in main.",
    "Write a TypeScript function that validates an email address with a regular expression, and explain the pattern.",
    "Write a Python script that counts word frequencies in a text file and prints the twenty most common words.",
    "Implement a Java method that checks whether a string is a palindrome, ignoring case and punctuation, with tests.",
    "Write a Rust struct for a 2D vector with add, subtract, dot product and length methods, and unit tests.",
    "Write a Python decorator that retries a function up to three times on exception, with exponential backoff.",
    "Write a Kotlin data class for a to-do item and a function that filters a list of them by completion status.",
)


# --------------------------------------------------------------------------
# Workers: one model, all stream counts; one JSON object on the last line.

def _run_streams(fn, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """Run fn(i, prompt, max_tokens) in one thread per prompt, started together; (wall, outputs)."""
    outs: list = [None] * len(prompts)
    errors: list = []
    barrier = threading.Barrier(len(prompts) + 1)

    def body(i: int) -> None:
        barrier.wait()
        try:
            outs[i] = fn(i, prompts[i], max_tokens)
        except BaseException as e:  # reported by the driver, not swallowed
            errors.append(repr(e))

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(errors[0])
    return wall, outs


def _solo(fn, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """Each prompt alone, one after the other."""
    t0 = time.perf_counter()
    outs = [fn(0, p, max_tokens) for p in prompts]
    return time.perf_counter() - t0, outs


def _measure(solo_fn, stream_fns, prompts: list[list[int]], streams: list[int], max_tokens: int) -> dict:
    """Solo runs, then each stream count; each at 1 token and at max_tokens."""
    result = {"prompt_tokens": [len(p) for p in prompts], "runs": {}}
    _solo(solo_fn, prompts, 2)  # untimed warm-up: page the weights in, build what is built on first use
    for n in sorted(set(streams) | {1}):
        run = {}
        for label, count in (("first", 1), ("full", max_tokens)):
            if n == 1:
                wall, outs = _solo(solo_fn, prompts, count)
            else:
                wall, outs = _run_streams(stream_fns, prompts[:n], count)
            run[label] = {"wall_s": wall, "tokens": outs}
        result["runs"][str(n)] = run
    return result


def worker_elelem(path: str, spec: dict) -> dict:
    if not spec["installed"]:
        sys.path.insert(0, str(REPO))
    import inspect

    import elelem
    options = dict(n_ctx=spec["n_ctx"], n_threads=spec["threads"])
    if spec["flash_attn"]:
        options["flash_attn"] = True
    if "kv_size" in inspect.signature(elelem.LLM).parameters:  # one cache shared by all sequences
        options["kv_size"] = spec["n_ctx"] * max(spec["streams"])  # room for every stream's n_ctx
    options.update(spec.get("elelem_options", {}))
    llm = elelem.LLM(path, **options)
    template = llm.chat_template
    prompts = [llm.tokenize(template.render([{"role": "user", "content": text}], add_generation_prompt=True),
                            special=True) for text in PROMPTS[:max(spec["streams"])]]
    sessions = [llm.new_session() for _ in range(max(spec["streams"]))]

    def generate(i: int, ids: list[int], max_tokens: int) -> list[int]:
        sessions[i].reset()  # no prefix reuse from an earlier run: every run prefills its whole prompt
        return sessions[i].generate_tokens(ids, max_tokens)

    out = _measure(generate, generate, prompts, spec["streams"], spec["tokens"])
    out.update(prompts=prompts, eos_ids=sorted(llm.eos_ids), elelem=elelem.__file__, options=options)
    llm.close()
    return out


def worker_llamacpp(path: str, spec: dict) -> dict:
    import numpy as np
    from llama_cpp import Llama
    llm = Llama(path, n_ctx=spec["n_ctx"], n_batch=512, n_threads=spec["threads"],
                n_threads_batch=spec["threads"], flash_attn=spec["flash_attn"], verbose=False)
    lock = threading.Lock()  # a Llama is one context: one request at a time
    stops = set(spec["eos_ids"])

    def generate(i: int, ids: list[int], max_tokens: int) -> list[int]:
        with lock:
            llm.reset()
            llm.eval(ids)
            out: list[int] = []
            while True:
                logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
                token = int(np.argmax(logits))
                if token in stops:
                    return out
                out.append(token)
                if len(out) >= max_tokens:
                    return out
                llm.eval([token])

    return _measure(generate, generate, spec["prompts"], spec["streams"], spec["tokens"])


# --------------------------------------------------------------------------
# Driver.

def run_worker(python: str, kind: str, path: str, spec: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        cmd = [python, os.path.abspath(__file__), "--worker", kind, path, f.name]
        out = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise SystemExit(f"{kind} worker failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    figures = summarize(result)  # progress on stderr: a long run shows what it has so far
    print(f"[{time.strftime('%H:%M:%S')}] {kind} {Path(path).name}: wall tok/s "
          + ", ".join(f"N={n} {f['wall_tok_s']:.1f}" for n, f in figures.items())
          + f" (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    return result


def _matched(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def summarize(run: dict) -> dict:
    """One worker's measurement as figures per stream count."""
    solo = run["runs"]["1"]["full"]["tokens"]  # N=1: every prompt alone, one after the other
    figures = {}
    for n, r in run["runs"].items():
        full, first = r["full"], r["first"]
        made, made_first = sum(map(len, full["tokens"])), sum(map(len, first["tokens"]))
        figures[n] = {
            "wall_tok_s": made / full["wall_s"],
            "decode_tok_s": (made - made_first) / (full["wall_s"] - first["wall_s"]),
            "counts": [len(t) for t in full["tokens"]],
            "matched": [_matched(t, solo[i]) for i, t in enumerate(full["tokens"])],
            "same": sum(t == solo[i] for i, t in enumerate(full["tokens"])),
        }
    return figures


def _fmt_range(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def print_table(model: str, engines: dict[str, list[dict]], batched: list[dict] | None, tokens: int) -> None:
    print(f"\n{model}: aggregate tok/s over N greedy streams (range over repeats; ratio of medians to N=1)")
    print(f"  {'engine':<22}{'N':>3}{'wall tok/s':>14}{'ratio':>7}{'decode tok/s':>15}{'ratio':>7}"
          f"  tokens/stream  same as solo")
    for engine, runs in engines.items():
        base = {k: statistics.median(r["1"][k] for r in runs) for k in ("wall_tok_s", "decode_tok_s")}
        for n in runs[0]:
            wall = [r[n]["wall_tok_s"] for r in runs]
            dec = [r[n]["decode_tok_s"] for r in runs]
            counts = sorted({c for r in runs for c in r[n]["counts"]})
            count_text = str(counts[0]) if len(counts) == 1 else f"{counts[0]}..{counts[-1]}"
            same = min(r[n]["same"] for r in runs)
            diff = sorted({f"{m}/{c}" for r in runs for m, c in zip(r[n]["matched"], r[n]["counts"])
                           if m != c or c != tokens})
            same_text = "(solo)" if n == "1" else f"{same}/{n}" + (f"  matched {', '.join(diff)}" if diff else "")
            print(f"  {engine:<22}{n:>3}{_fmt_range(wall):>14}{statistics.median(wall) / base['wall_tok_s']:>7.2f}"
                  f"{_fmt_range(dec):>15}{statistics.median(dec) / base['decode_tok_s']:>7.2f}"
                  f"  {count_text:>13}  {same_text}")
    if batched:
        by_b: dict[int, list[float]] = {}
        for row in batched:
            by_b.setdefault(row["pl"], []).append(row["speed_tg"])
        base = statistics.median(by_b[min(by_b)])
        for b, values in by_b.items():
            print(f"  {'llama-batched-bench':<22}{b:>3}{'':>14}{'':>7}{_fmt_range(values):>15}"
                  f"{statistics.median(values) / base:>7.2f}  {tokens:>13}  (S_TG; 32 random prompt tokens)")


def _resolve(name: str) -> str:
    try:
        from elelem.model.hub import resolve_model
    except ImportError:  # elelem before the layer folders
        from elelem.hub import resolve_model
    return str(resolve_model(name))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m"])
    ap.add_argument("--streams", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per stream")
    ap.add_argument("--threads", type=int, default=2, help="n_threads of the model (and of llama.cpp)")
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--elelem-python", default=sys.executable)
    ap.add_argument("--installed", action="store_true",
                    help="import the elelem installed for --elelem-python, not this checkout's")
    ap.add_argument("--llama-python", help="a Python with llama_cpp (scripts/reference_llamacpp.py --check)")
    ap.add_argument("--llamacpp-batched", action="store_true",
                    help="also run llama.cpp's llama-batched-bench (built and cached on first use)")
    ap.add_argument("--flash-attn", action="store_true",
                    help="every engine with flash attention (elelem serve's default; llama.cpp's auto)")
    ap.add_argument("--elelem-options", default="{}", metavar="JSON",
                    help='more LLM() options for elelem, e.g. \'{"amx": false}\' to compare kernel paths')
    ap.add_argument("--json", help="also write every measurement to this file")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        kind, path, spec_file = args.worker
        spec = json.loads(Path(spec_file).read_text())
        fn = worker_elelem if kind == "elelem" else worker_llamacpp
        print(json.dumps(fn(path, spec)))
        return
    if max(args.streams) > len(PROMPTS):
        ap.error(f"at most {len(PROMPTS)} streams (one prompt each)")

    exe = None
    if args.llamacpp_batched:
        import llamacpp_batched_bench as batched_bench
        exe = batched_bench.build()
    spec = dict(streams=args.streams, tokens=args.tokens, threads=args.threads, n_ctx=args.n_ctx,
                installed=args.installed, flash_attn=args.flash_attn,
                elelem_options=json.loads(args.elelem_options))
    report = []
    for name in args.models:
        path = _resolve(name)
        raw: dict[str, list[dict]] = {"elelem": []}
        if args.llama_python:
            raw["llama-cpp-python"] = []
        batched = []
        for _ in range(args.repeats):  # engines interleaved, repeat by repeat
            run = run_worker(args.elelem_python, "elelem", path, spec)
            raw["elelem"].append(run)
            if args.llama_python:
                ref_spec = dict(spec, prompts=run["prompts"], eos_ids=run["eos_ids"])
                raw["llama-cpp-python"].append(run_worker(args.llama_python, "llamacpp", path, ref_spec))
            if exe:
                npl = sorted(set(args.streams) | {1})
                batched += batched_bench.run(exe, path, npl=npl, ntg=args.tokens, threads=args.threads,
                                             flash_attn=args.flash_attn)
                print(f"[{time.strftime('%H:%M:%S')}] llama-batched-bench {Path(path).name}: S_TG "
                      + ", ".join(f"B={r['pl']} {r['speed_tg']:.1f}" for r in batched[-len(npl):]),
                      file=sys.stderr, flush=True)
        engines = {engine: [summarize(r) for r in runs] for engine, runs in raw.items()}
        print(f"\n{name}: {path}; prompts of {raw['elelem'][0]['prompt_tokens']} tokens; "
              f"elelem from {raw['elelem'][0]['elelem']}")
        if args.llama_python:
            cross = [_matched(a, b) for a, b in zip(raw["elelem"][0]["runs"]["1"]["full"]["tokens"],
                                                    raw["llama-cpp-python"][0]["runs"]["1"]["full"]["tokens"])]
            print(f"  solo tokens, elelem vs llama-cpp-python: matched {cross} of {args.tokens}")
        print_table(name, engines, batched, args.tokens)
        report.append(dict(model=name, path=path, spec=spec, figures=engines, raw=raw, batched=batched))
        if args.json:  # after each model, so a long run keeps what it has measured
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
