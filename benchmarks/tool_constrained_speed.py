"""How much constrained tool calls ("required" / named tool_choice) slow decoding.

Run from the repository root: ``python benchmarks/tool_constrained_speed.py``
(uses the default model, qwen2.5-coder-0.5b).

For each scenario the same request runs unconstrained (``tool_choice="auto"``:
plain sampling, calls parsed afterwards) and constrained (``"required"``),
greedy, ``--repeats`` times, interleaved; the best decode time per token of
each is compared.  Because wall-clock decode speed on a shared machine is
noisy, the script also times the constraint itself (everything its
``sample`` does beyond the plain sampler call) and reports it as a share
of the unconstrained per-token decode time: that figure does not depend on
what else the machine is doing.  The one-off cost of reading the
vocabulary's token texts (once per tokenizer) is reported separately.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run against the source tree

from elelem import LLM  # noqa: E402
from elelem.sampling.sampler import Sampler  # noqa: E402
from elelem.api.tools import TokenTexts  # noqa: E402
from elelem.sampling.constrained import TokenConstraint  # noqa: E402

SCENARIOS = {
    "weather (the model's own choice)": (
        "What is the weather in Paris?",
        [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]),
    "search (nested schema, numbers, arrays, enums)": (
        "Find Python or Rust code about parsing JSON, at most 5 results, newest first.",
        [{"type": "function", "function": {"name": "search_code", "parameters": {
            "type": "object", "properties": {
                "query": {"type": "string"}, "max_results": {"type": "integer"},
                "languages": {"type": "array", "items": {"enum": ["python", "rust", "go", "c"]}},
                "newest_first": {"type": "boolean"}, "min_score": {"type": "number"}},
            "required": ["query", "max_results", "languages"]}}}]),
}


class Timer:
    """Wraps TokenConstraint.sample and Sampler.sample to time the constraint's own work."""

    def __init__(self):
        self.constraint_s = self.sampler_s = 0.0
        self.tokens = 0
        self._constraint_sample = TokenConstraint.sample
        self._sampler_sample = Sampler.sample

    def __enter__(self):
        timer = self

        def constraint_sample(constraint, sampler, logits, recent):
            t0 = time.perf_counter()
            try:
                return timer._constraint_sample(constraint, sampler, logits, recent)
            finally:
                timer.constraint_s += time.perf_counter() - t0
                timer.tokens += 1

        def sampler_sample(sampler, logits, recent=()):
            t0 = time.perf_counter()
            try:
                return timer._sampler_sample(sampler, logits, recent)
            finally:
                timer.sampler_s += time.perf_counter() - t0

        TokenConstraint.sample = constraint_sample
        Sampler.sample = sampler_sample
        return self

    def __exit__(self, *exc):
        TokenConstraint.sample = self._constraint_sample
        Sampler.sample = self._sampler_sample


def per_token(llm, messages, tools, choice, max_tokens):
    stream = llm.chat_stream(messages, tools=tools, tool_choice=choice, temperature=0, max_tokens=max_tokens)
    text = stream.text()
    # The first sampled token follows the prefill, so decode covers tokens 2..n.
    return stream.decode_seconds / max(1, stream.completion_tokens), stream.completion_tokens, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=80)
    args = parser.parse_args()
    with LLM(args.model, n_ctx=1024) as llm:
        t0 = time.perf_counter()
        TokenTexts.of(llm.tokenizer)
        print(f"token texts: {time.perf_counter() - t0:.3f} s once per tokenizer ({llm.n_vocab} tokens)")
        for name, (question, tools) in SCENARIOS.items():
            messages = [{"role": "user", "content": question}]
            free, forced = [], []
            overhead = 0.0
            forced_tokens = 0
            for _ in range(args.repeats):
                free.append(per_token(llm, messages, tools, "auto", args.max_tokens))
                with Timer() as timer:
                    forced.append(per_token(llm, messages, tools, "required", args.max_tokens))
                overhead += timer.constraint_s - timer.sampler_s
                forced_tokens += timer.tokens
            best_free, best_forced = min(r[0] for r in free), min(r[0] for r in forced)
            own = overhead / max(1, forced_tokens)
            print(f"\n{name}")
            print(f"  unconstrained: {best_free * 1e3:6.1f} ms/token ({free[0][1]} tokens): {free[0][2]!r}")
            print(f"  constrained:   {best_forced * 1e3:6.1f} ms/token ({forced[0][1]} tokens): {forced[0][2]!r}")
            print(f"  wall-clock slowdown (best of {args.repeats}): {100 * (best_forced / best_free - 1):+.1f}%")
            print(f"  constraint's own work: {own * 1e6:.0f} us/token = "
                  f"{100 * own / best_free:.1f}% of an unconstrained decode step")


if __name__ == "__main__":
    main()
