#!/usr/bin/env python3
"""Where a loaded model's requests lose time while another model loads, without wall clocks.

    python benchmarks/load_gil.py [--model smollm2-135m] [--third qwen2.5-coder-0.5b] [--requests 30]

In one process, as ``elelem serve`` holds them: ``--model`` is loaded and
answers 8-token greedy completions one after the other in a request thread,
first with nothing else running (quiet), then while ``--third`` is loaded,
dropped and loaded again back to back the way the pool loads it (its own
thread at nice 19, :mod:`elelem.server.quiet_load`).  For every request the
kernel's per-thread accounting (``/proc/self/task/<tid>/schedstat``) splits
its wall time into:

- ``cpu``: the request thread's own CPU time (with ``--threads 1`` all of
  the model's compute);
- ``runqueue``: time it was ready to run but the OS ran something else (the
  machine's load: this moves with other jobs, not with what this process does);
- ``blocked``: the rest, time it slept: waiting for the GIL (nothing else
  blocks a 1-thread step).

A load that costs the other model's requests only CPU the machine had
spare leaves ``cpu`` and ``blocked`` as they were quiet.  The load thread's
own CPU time per load is printed too, split into ``LLM()`` and the
tokenizer and chat template.  The figures are medians and p99 over the
requests; their ratios loading/quiet are what to compare between checkouts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def schedstat(tid: int) -> tuple[float, float]:
    """(CPU seconds, run-queue wait seconds) of thread ``tid`` so far."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        cpu, wait, _ = f.read().split()
    return int(cpu) / 1e9, int(wait) / 1e9


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def requests(llm, count: int, no_end: dict, spans: list | None = None) -> list[tuple[float, float, float, float]]:
    """``count`` 8-token completions: (wall, cpu, runqueue, blocked) seconds each; with
    ``spans``, each request's (start, end, blocked) is appended there too."""
    tid = threading.get_native_id()
    out = []
    for i in range(count):
        t0, (c0, q0) = time.perf_counter(), schedstat(tid)
        llm.create_completion(f"Question {i}: how does binary search work?", max_tokens=8, temperature=0,
                              logit_bias=no_end)
        t1, (c1, q1) = time.perf_counter(), schedstat(tid)
        wall = t1 - t0
        out.append((wall, c1 - c0, q1 - q0, wall - (c1 - c0) - (q1 - q0)))
        if spans is not None:
            spans.append((t0, t1, out[-1][3]))
    return out


def blamed(spans: list, phases: list, at_least: float = 0.02) -> dict[str, int]:
    """For each request blocked ``at_least`` seconds: the load's phases its time overlapped."""
    counts: dict[str, int] = {}
    for t0, t1, blocked in spans:
        if blocked < at_least:
            continue
        names = sorted({name for name, p0, p1 in phases if p0 < t1 and p1 > t0}) or ["none"]
        key = " + ".join(names)
        counts[key] = counts.get(key, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="answers while the other loads")
    parser.add_argument("--third", default="qwen2.5-coder-0.5b", help="loaded back to back meanwhile")
    parser.add_argument("--requests", type=int, default=30, help="requests per phase")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--keep-tokenizer", action="store_true",
                        help="keep each load's tokenizer for the next, as the server's pool does: "
                             "the loads after the first build none")
    args = parser.parse_args()
    import elelem
    from elelem.model.hub import resolve_model
    from elelem.server.quiet_load import load_window, run_beside
    model, third = str(resolve_model(args.model)), str(resolve_model(args.third))
    started_load = os.getloadavg()[0]
    llm = elelem.LLM(model, n_ctx=512, n_threads=args.threads)
    no_end = {t: -100.0 for t in llm.tokenizer.eog_ids}
    requests(llm, 3, no_end)  # warm-up
    quiet = requests(llm, args.requests, no_end)

    stop, loads = threading.Event(), []

    phases: list[tuple[str, float, float]] = []  # what the load thread did when: (name, start, end)
    kept: list = []   # the tokenizer of the load before, with --keep-tokenizer

    def load_once() -> tuple[float, float]:
        with load_window():
            c0, t0 = time.thread_time(), time.perf_counter()
            other = elelem.LLM(third, n_ctx=512, n_threads=args.threads)
            c1, t1 = time.thread_time(), time.perf_counter()
            other.tokenizer, other.chat_template  # as the server's ServedModel.open
            c2, t2 = time.thread_time(), time.perf_counter()
        other.close()  # as the pool's unload (ServedModel.unload), in the load's thread, outside the load window
        t3 = time.perf_counter()
        if args.keep_tokenizer:   # as the pool, which keeps it for the next load to share
            kept[:] = [other.tokenizer]
        del other   # the rest of its Python objects
        phases.extend([("LLM()", t0, t1), ("tokenizer", t1, t2), ("close", t2, t3), ("free", t3, time.perf_counter())])
        return c1 - c0, c2 - c1

    def load_in_turn() -> None:
        while not stop.is_set():
            loads.append(run_beside(load_once, "elelem-load-probe", low_priority=True))
    loader = threading.Thread(target=load_in_turn)
    loader.start()
    while not loads:
        time.sleep(0.01)
    spans: list = []
    loading = requests(llm, args.requests, no_end, spans)
    stop.set()
    loader.join()
    llm.close()

    print(f"{args.model} answering, {args.third} loading back to back beside it ({len(loads)} loads), "
          f"{args.threads} thread(s), {args.requests} requests a phase; load average {started_load:.1f} "
          f"at the start, {os.getloadavg()[0]:.1f} at the end")
    names = ("wall", "cpu", "runqueue", "blocked")
    print(f"{'ms per request':>14} | {'quiet p50':>9} {'p99':>7} | {'loading p50':>11} {'p99':>7} | "
          f"{'ratio p50':>9} {'p99':>6} | {'added p50':>9} {'p99':>7}")
    for k, name in enumerate(names):
        q = [r[k] * 1000 for r in quiet]
        b = [r[k] * 1000 for r in loading]
        qp50, qp99, bp50, bp99 = percentile(q, .5), percentile(q, .99), percentile(b, .5), percentile(b, .99)
        # blocked is near 0 when nothing holds the GIL long: its ratio means nothing, its difference does
        ratios = (f"{bp50 / qp50:9.2f} {bp99 / qp99:6.2f}" if name != "blocked" and min(qp50, qp99) > 1
                  else f"{'-':>9} {'-':>6}")
        print(f"{name:>14} | {qp50:9.1f} {qp99:7.1f} | {bp50:11.1f} {bp99:7.1f} | {ratios} | "
              f"{bp50 - qp50:+9.1f} {bp99 - qp99:+7.1f}")
    print(f"requests blocked 20 ms or more beside loads, by the load's phases they overlapped: "
          f"{blamed(spans, phases) or 'none'}")
    if loads:
        print(f"the load thread's CPU per load: LLM() {statistics.median(l[0] for l in loads) * 1000:.0f} ms, "
              f"tokenizer and chat template {statistics.median(l[1] for l in loads) * 1000:.0f} ms "
              f"(medians of {len(loads)})")


if __name__ == "__main__":
    main()
