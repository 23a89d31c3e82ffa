"""``GET /metrics``: Prometheus' text format, from the server's counts and each engine's.

Step time: ``elelem_engine_step_seconds_total`` over ``elelem_engine_steps_total``
is the mean duration of an engine step; the interval between a stream's
tokens (``elelem_token_interval_seconds``) is what one client sees.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Iterable


class Metrics:
    """Counts shared by every request (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()    # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.reused_tokens = 0                # prompt tokens found in the cache (prefix reuse)
        self.waiting = 0                      # accepted, no token out yet (loading, prefilling)
        self.running = 0                      # generating
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.interval_sum = 0.0
        self.interval_count = 0

    def request_done(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def tokens(self, prompt: int, completion: int, reused: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion
            self.reused_tokens += reused

    def queued(self, delta: int) -> None:
        with self._lock:
            self.waiting += delta

    def started(self, ttft: float) -> None:
        """A request's first output: it moves from waiting to running."""
        with self._lock:
            self.waiting -= 1
            self.running += 1
            self.ttft_sum += ttft
            self.ttft_count += 1

    def stopped(self) -> None:
        with self._lock:
            self.running -= 1

    def interval(self, seconds: float) -> None:
        with self._lock:
            self.interval_sum += seconds
            self.interval_count += 1

    def render(self, models: Iterable) -> str:
        with self._lock:
            lines = [
                *_family("elelem_requests_total", "counter", "HTTP requests answered, by endpoint and status",
                         [(f'{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in sorted(self.requests.items())]),
                *_family("elelem_prompt_tokens_total", "counter", "prompt tokens of finished requests",
                         [("", self.prompt_tokens)]),
                *_family("elelem_prompt_tokens_reused_total", "counter", "prompt tokens found in the cache "
                         "(a prefix an idle or running session held), not computed again", [("", self.reused_tokens)]),
                *_family("elelem_completion_tokens_total", "counter", "tokens generated",
                         [("", self.completion_tokens)]),
                *_family("elelem_queue_depth", "gauge", "requests accepted that have not produced a token yet",
                         [("", self.waiting)]),
                *_family("elelem_running_sequences", "gauge", "requests generating now", [("", self.running)]),
                *_family("elelem_time_to_first_token_seconds", "summary", "from accepting a request to its "
                         "first output", [("_sum", self.ttft_sum), ("_count", self.ttft_count)]),
                *_family("elelem_token_interval_seconds", "summary", "between a stream's successive chunks "
                         "(one engine step each while decoding)",
                         [("_sum", self.interval_sum), ("_count", self.interval_count)]),
            ]
        lines += _engine_lines(list(models))
        return "\n".join(lines) + "\n"


def _engine_lines(models: list) -> list[str]:
    loaded = [(m, m.llm) for m in models]
    engines = [(m, llm.engine) for m, llm in loaded if llm is not None and not llm.closed]
    per_model = [
        ("elelem_model_loaded", "gauge", "1 while the model is loaded",
         [(m, int(llm is not None and not llm.closed)) for m, llm in loaded]),
        ("elelem_model_in_flight", "gauge", "requests holding a slot of the model",
         [(m, m.in_flight) for m in models]),
        ("elelem_model_idle_sessions", "gauge", "sessions kept with their caches for the next requests",
         [(m, m.idle_sessions) for m in models]),
        ("elelem_model_queued", "gauge", "requests waiting for a slot of the model (the queue)",
         [(m, m.queued) for m in models]),
        ("elelem_engine_steps_total", "counter", "engine steps (batched graphs) run",
         [(m, e.steps) for m, e in engines]),
        ("elelem_engine_step_seconds_total", "counter", "wall time of those steps (compute and sampling)",
         [(m, float(e.step_seconds)) for m, e in engines]),
        ("elelem_engine_batched_tokens_total", "counter", "tokens evaluated in those steps",
         [(m, e.batched_tokens) for m, e in engines]),
        ("elelem_engine_shared_steps_total", "counter", "steps that carried more than one sequence",
         [(m, e.shared_steps) for m, e in engines]),
        ("elelem_engine_prompt_tokens_total", "counter", "prompt tokens the engine received",
         [(m, e.prompt_tokens) for m, e in engines]),
        ("elelem_engine_prompt_tokens_evaluated_total", "counter", "of those, the ones it evaluated "
         "(the rest came from a cached prefix, a kept recurrent state or the prompt cache)",
         [(m, e.prompt_tokens_evaluated) for m, e in engines]),
        ("elelem_engine_state_cache_bytes", "gauge", "recurrent states kept for conversations to resume from "
         "(hybrid models; bounded by --state-cache-mb)",
         [(m, e.states.used) for m, e in engines]),
        ("elelem_images_encoded_total", "counter", "images the projector encoded (an image seen before, "
         "found by its pixels' hash, is not encoded again)",
         [(m, llm.images.projector.n_encoded) for m, llm in loaded
          if llm is not None and not llm.closed and llm.images is not None]),
        ("elelem_images_evaluated_total", "counter", "images whose embeddings the model evaluated (an image "
         "already in a reused prefix of the cache is not evaluated again)",
         [(m, e.media.images_evaluated) for m, e in engines]),
        ("elelem_kv_cells_used", "gauge", "KV cache cells in use", [(m, e.context.cache.n_used) for m, e in engines]),
        ("elelem_kv_cells", "gauge", "KV cache cells", [(m, e.kv_size) for m, e in engines]),
        ("elelem_model_layers", "gauge", "the model's layers",
         [(m, o["n_layer"]) for m in models if (o := m.offload) is not None]),
        ("elelem_model_gpu_layers", "gauge", "of those, the layers on a GPU (0: the model runs on the CPU)",
         [(m, o["n_gpu_layers"]) for m in models if (o := m.offload) is not None]),
    ]
    lines = []
    for name, kind, help_text, values in per_model:
        lines += _family(name, kind, help_text, [(f'{{model="{_label(m.id)}"}}', v) for m, v in values])
    # Speculative decoding, by drafter ("prompt lookup", "mtp", "draft model"): which runs, and how well.
    drafters = [(m, kind, stats) for m, e in engines for kind, stats in e.drafter_stats().items()]
    for name, kind, help_text, field in (
            ("elelem_draft_tokens_total", "counter", "draft tokens verified, by drafter", "drafted"),
            ("elelem_draft_tokens_accepted_total", "counter", "of those, the ones kept", "accepted"),
            ("elelem_draft_acceptance_rate", "gauge", "the share of a drafter's verified tokens kept",
             "acceptance_rate")):
        lines += _family(name, kind, help_text, [(f'{{model="{_label(m.id)}",drafter="{_label(d)}"}}', stats[field])
                                                 for m, d, stats in drafters])
    return lines


def _family(name: str, kind: str, help_text: str, samples: list) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for suffix, value in samples:
        # A summary's samples are name_sum and name_count; the others carry labels or nothing.
        lines.append(f"{name}{suffix} {value:g}" if isinstance(value, float) else f"{name}{suffix} {value}")
    return lines


def _label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
