"""What constrained decoding (llguidance) costs per token, against a decode step.

Run from the repository root: ``python benchmarks/constraint_mask.py``
(default model qwen2.5-coder-0.5b: a 151,936-token vocabulary).

For each scenario -- a ``response_format`` JSON schema, a forced tool call
(``tool_choice="required"``), a GBNF grammar -- the same request runs free
and constrained, greedy, ``--repeats`` times, interleaved.  Printed per
scenario:

* the mask time per token: llguidance computing the allowed-token bitmask
  and elelem unpacking it (``GrammarMatcher.allowed``), median and p95;
* the constraint's own work per token: everything the constraint's
  ``sample`` (``TokenConstraint``'s, or a tool call's ``LazyConstraint``)
  does beyond the plain sampler call (the mask, applying it to the logits,
  advancing the parser; before a call's marker, watching the text for it);
* both as a share of a free decode step (decode seconds / tokens of the
  unconstrained run, best of the repeats).  The goal is under 10%;
* one-off costs: the vocabulary read into llguidance (once per model) and
  compiling the grammar (once per request).

Timings of the constraint do not depend much on what else runs on the
machine; the decode step does, so run it on an idle machine.  Each figure
is also given in CPU time (the mask's thread time; the process's CPU time
per token of a free run whose prompt is cached), which a busy machine
disturbs far less: with ``--threads 1`` ggml computes in the calling thread,
so CPU time per token is the decode step's own cost.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run against the source tree

from elelem import LLM  # noqa: E402
from elelem.api.structured import output_constraint, output_grammar  # noqa: E402
from elelem.api.tools.request import plan_tools  # noqa: E402
from elelem.sampling.constrained import TokenConstraint  # noqa: E402
from elelem.sampling.grammar import GrammarMatcher  # noqa: E402
from elelem.sampling.lazy import LazyConstraint  # noqa: E402
from elelem.sampling.sampler import Sampler  # noqa: E402

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "languages", "email"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "email": {"type": "string", "format": "email"},
                         "languages": {"type": "array", "items": {"enum": ["python", "rust", "go", "c"]},
                                       "maxItems": 4},
                         "manager": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}
SEARCH = [{"type": "function", "function": {"name": "search_code", "parameters": {
    "type": "object", "properties": {
        "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1},
        "languages": {"type": "array", "items": {"enum": ["python", "rust", "go", "c"]}},
        "newest_first": {"type": "boolean"}},
    "required": ["query", "max_results", "languages"]}}}]
GBNF = r'''root ::= "def " name "(" params? "):\n" body
name ::= [a-z_] [a-z0-9_]*
params ::= name (", " name)*
body ::= ("    " [^\n]+ "\n")+
'''
SCENARIOS = {
    "response_format json_schema (bounds, format, enum, recursive $ref)": (
        "Describe a made-up software engineer as JSON: name, age, email, languages.",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}),
    "tool_choice required (nested arguments)": (
        "Find Python or Rust code about parsing JSON, at most 5 results, newest first.",
        {"tools": SEARCH, "tool_choice": "required"}),
    "grammar (GBNF: a Python function)": (
        "Write a Python function that adds two numbers.", {"grammar": GBNF}),
    # The lazy constraint watching free text for a call's marker: no mask, only its own bookkeeping.
    "tool_choice auto, answered in text (lazy: no call starts)": (
        "Write a haiku about the sea, in plain text.", {"tools": SEARCH, "tool_choice": "auto"}),
}


class Timer:
    """Wraps the constraint, its mask and the sampler to time the constraint's own work."""

    def __init__(self):
        self.masks: list[float] = []
        self.mask_cpu: list[float] = []
        self.constraint_s = self.sampler_s = 0.0
        self.tokens = 0
        self._saved = (TokenConstraint.sample, LazyConstraint.sample, GrammarMatcher.allowed, Sampler.sample)
        self._depth = 0  # a LazyConstraint calls its TokenConstraint: time the outer call only

    def __enter__(self):
        constraint_sample, lazy_sample, allowed, sampler_sample = self._saved
        timer = self

        def timing(sample):
            def timed_constraint(constraint, sampler, logits, recent):
                t0 = time.perf_counter()
                timer._depth += 1
                try:
                    return sample(constraint, sampler, logits, recent)
                finally:
                    timer._depth -= 1
                    if timer._depth == 0:
                        timer.constraint_s += time.perf_counter() - t0
                        timer.tokens += 1
            return timed_constraint

        def timed_allowed(matcher):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return allowed(matcher)
            finally:
                timer.masks.append(time.perf_counter() - t0)
                timer.mask_cpu.append(time.thread_time() - c0)

        def timed_sampler(sampler, logits, recent=()):
            t0 = time.perf_counter()
            try:
                return sampler_sample(sampler, logits, recent)
            finally:
                timer.sampler_s += time.perf_counter() - t0

        TokenConstraint.sample, LazyConstraint.sample = timing(constraint_sample), timing(lazy_sample)
        GrammarMatcher.allowed, Sampler.sample = timed_allowed, timed_sampler
        return self

    def __exit__(self, *exc):
        TokenConstraint.sample, LazyConstraint.sample, GrammarMatcher.allowed, Sampler.sample = self._saved


def run(llm, question, options, max_tokens):
    """(wall seconds per decode step, CPU seconds per token, tokens, text) of one greedy request."""
    c0 = time.process_time()
    stream = llm.chat_stream([{"role": "user", "content": question}], temperature=0, max_tokens=max_tokens,
                             **options)
    text = stream.text()
    cpu = (time.process_time() - c0) / max(1, stream.completion_tokens)
    # The first sampled token follows the prefill, so decode covers tokens 2..n.
    return stream.decode_seconds / max(1, stream.completion_tokens - 1), cpu, stream.completion_tokens, text


def compile_seconds(session, options) -> float:
    """The time to build the request's constraint: the grammar compiled against the vocabulary."""
    assets = session.assets
    t0 = time.perf_counter()
    if "tools" in options:
        plan_tools(options["tools"], options["tool_choice"], assets.chat_template.source).constraint(assets)
    else:
        output_constraint(assets, output_grammar(options.get("response_format"), options.get("grammar")))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with LLM(args.model, n_ctx=1024, n_threads=args.threads) as llm:
        session = llm.new_session()
        t0 = time.perf_counter()
        session.assets.grammar_tokenizer
        print(f"{llm.n_vocab} tokens read into llguidance in {time.perf_counter() - t0:.2f} s (once per model)")
        for name, (question, options) in SCENARIOS.items():
            free, forced, timers = [], [], []
            # One session each, their prompts cached: the CPU time per token is then the decode's.
            free_session, forced_session = llm.new_session(), llm.new_session()
            run(free_session, question, {}, 4)
            run(forced_session, question, options, 4)
            for _ in range(args.repeats):
                free.append(run(free_session, question, {}, args.max_tokens))
                with Timer() as timer:
                    forced.append(run(forced_session, question, options, args.max_tokens))
                timers.append((timer, compile_seconds(session, options)))
            free_session.close()
            forced_session.close()
            step = min(r[0] for r in free)
            step_cpu = min(r[1] for r in free)
            masks = sorted(m for t, _ in timers for m in t.masks) or [0.0]  # none: no grammar ever ran
            mask_median = statistics.median(masks)
            mask_p95 = masks[min(len(masks) - 1, math.ceil(0.95 * len(masks)) - 1)]
            mask_cpu = statistics.median([m for t, _ in timers for m in t.mask_cpu] or [0.0])
            own = sum(t.constraint_s - t.sampler_s for t, _ in timers) / max(1, sum(t.tokens for t, _ in timers))
            print(f"\n{name}")
            print(f"  free decode step:     {step * 1e3:7.2f} ms/token wall, {step_cpu * 1e3:.2f} ms CPU "
                  f"({free[0][2]} tokens)")
            print(f"  constrained decode:   {min(r[0] for r in forced) * 1e3:7.2f} ms/token wall, "
                  f"{min(r[1] for r in forced) * 1e3:.2f} ms CPU ({forced[0][2]} tokens): {forced[0][3][:100]!r}")
            print(f"  mask per token:       {mask_median * 1e3:7.3f} ms median, {mask_p95 * 1e3:.3f} ms p95 "
                  f"= {100 * mask_median / step:.2f}% / {100 * mask_p95 / step:.2f}% of a decode step "
                  f"({len(masks)} masks); CPU {mask_cpu * 1e3:.3f} ms median = "
                  f"{100 * mask_cpu / step_cpu:.2f}% of a decode step's CPU time")
            print(f"  constraint's own work:{own * 1e3:7.3f} ms/token = {100 * own / step:.2f}% of a decode step")
            print(f"  compiling the grammar (per request): {min(c for _, c in timers) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
