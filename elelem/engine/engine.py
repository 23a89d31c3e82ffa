"""The engine: every active sequence of one model, stepped together.

One :class:`Engine` owns a native ``Context`` (backends, scheduler, and the
KV cache that all sequences share).  Each step takes the next token of every
generating request, plus prompt chunks of requests being prefilled, into one
batch of up to ``n_batch`` tokens (continuous batching, as llama.cpp's
server): a request that arrives mid-generation joins at the next step.

There is no engine thread.  Whoever waits for a result drives: it runs a step
for everyone when no step is running, and otherwise waits for the step in
progress (leader/follower).  One stream alone therefore steps in its own
thread with no hand-off, and N streams in N threads share every step.  The
native compute releases the GIL, so the waiting threads cost nothing.

Only the thread that holds the step (``_stepping``) touches the cache, so the
cache never changes under a running step.

Limits: ``n_seq_max`` sequences (each session holds one), ``kv_size`` cells
shared by all of them, ``n_ctx`` positions per sequence.  A request is
admitted when the cells it may take -- its prompt, and up to RESERVED_NEW of
its generation budget -- are free beyond those kept for the requests already
running; the cells of idle sequences (open sessions with nothing running) are
dropped for it, least recently used first.  Otherwise it waits for running
requests to end, and fails with :class:`~elelem.errors.KVCacheFullError` if
none runs (the cache is too small for it).  Should generations outgrow their
kept cells and fill the cache, the newest request fails the same way, so that
the others go on.  Nothing is truncated silently.

This module holds the engine's state, its public calls, admission and the
driving loop; the parts of a step have modules of their own, mixed into
:class:`Engine`: what a step evaluates (step_plan.py), what its results do to
the requests (step_settle.py), and what of a prompt need not be evaluated
(prefix_reuse.py).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Optional

import numpy as np

from ..errors import CapacityError, ClosedError, ContextLimitError, InvalidArgumentError, KVCacheFullError
from .media import MediaTable
from .prefix_reuse import MIN_SHARED_WAIT, MIXED_LORA, REUSE_ALIGNMENT, PrefixReuse  # noqa: F401 -- the reuse grid, for callers
from .prompt_cache import PromptCache
from .request import Request
from .mtp import DrafterChoice
from .speculative import PromptLookup
from .state_cache import DEFAULT_STATE_CACHE_MB, StateCache
from .step_costs import StepCosts
from .step_plan import StepPlanning
from .step_settle import StepSettling

log = logging.getLogger("elelem")


class Engine(StepPlanning, StepSettling, PrefixReuse):
    """Sequences and continuous batching over one native context (what of a
    prompt need not be evaluated: prefix_reuse.py; what a step evaluates:
    step_plan.py; what its results do: step_settle.py)."""

    def __init__(self, context, *, n_ctx: int, speculative: bool = False, draft=None, mtp=None,
                 prompt_cache: Optional[PromptCache] = None, state_cache_bytes: int = DEFAULT_STATE_CACHE_MB << 20):
        self._ctx = context
        # A hybrid model's kept snapshots and parked states, within one budget.
        self.states = StateCache(context, state_cache_bytes)
        # States of finished sequences on disk, loaded for prompts that share their prefix.
        self.prompt_cache = prompt_cache
        self._finished_seqs: list[int] = []  # retired in this step: offered to the prompt cache after it
        self.n_ctx = n_ctx                  # the most positions one sequence may hold
        # The default of generations: verify drafted tokens (see speculative.py),
        # from prompt lookup, or from ``draft`` (a DraftModel, see draft_model.py).
        self.speculative = speculative
        self.draft = draft
        # The model's MTP head (an MTPHead, see mtp.py, or a Gemma 4 drafter's
        # AssistantHead, assistant.py), drafting where it pays
        # better than prompt lookup; None where the model has none.
        self.mtp = mtp
        # The embeddings of the images prompts hold (media.py); the API adds them.
        self.media = MediaTable()
        self._interrupted: Optional[BaseException] = None  # Ctrl-C while a draft model computed
        # Reentrant only so that cancel() can tell that its own thread holds it
        # (a signal handler that interrupted the engine); nothing re-enters it.
        self._cv = threading.Condition(threading.RLock())
        self._deferred_cancels: collections.deque = collections.deque()
        self._stepping = False
        self._active: list[Request] = []
        self._free_seqs = list(range(context.n_seq_max))
        self._seq_request: dict[int, Request] = {}   # the request running on each sequence
        self._last_used: dict[int, float] = {}       # open sequences -> when last stepped
        # Per sequence: its first positions that hold what evaluating them as a
        # prompt afresh gives, bit for bit (not generated tokens': a step of
        # one token rounds otherwise).  Only a prefix of these is worth
        # re-evaluating a wider tail for (exact_tail).
        self._fresh_rows: dict[int, int] = {}
        # LoRA adapters (Context.adapters): the scales a request gets unless it
        # names its own (Request.lora), and the scales each sequence's cells
        # were evaluated at (prefix_reuse.py: a prompt reuses only its own).
        self.lora_scales: tuple[float, ...] = (0.0,) * len(getattr(context, "adapters", ()))
        self._seq_lora: dict[int, Any] = {}
        self._abort_for_cancel = False
        self._idle_waiters = 0              # callers waiting for a moment between two steps
        self._admissions = 0
        self._prompt_turn = False           # _plan: whether prompts or generated tokens step next
        self._closed = False
        self.steps = 0                      # statistics: steps run, tokens evaluated in them,
        self.batched_tokens = 0             # and steps that carried more than one sequence
        self.shared_steps = 0
        self.step_seconds = 0.0             # wall time of the steps run (compute and settling)
        self.prompt_tokens = 0              # prompt tokens admitted, and the ones evaluated
        self.prompt_tokens_evaluated = 0    # (not found in a cache)
        self.drafted_tokens = 0             # speculative decoding: draft tokens verified,
        self.accepted_tokens = 0            # and the ones kept
        self.drafter_tokens: dict[str, list[int]] = {}  # ... by drafter kind: [verified, kept]
        # What steps of each width cost here: how many drafts a step verifies.
        self.step_costs = StepCosts()

    # -- facts -----------------------------------------------------------------

    @property
    def n_seq_max(self) -> int:
        return self._ctx.n_seq_max

    @property
    def kv_size(self) -> int:
        return self._ctx.kv_size

    @property
    def n_batch(self) -> int:
        return self._ctx.n_batch

    @property
    def context(self):
        return self._ctx

    @property
    def closed(self) -> bool:
        return self._closed

    def restart_threads(self) -> None:
        """Start the worker threads of this engine's contexts again, from the calling thread.

        A thread takes its OS priority from the thread that starts it, and only a
        privileged process raises one again: a server that opened the model in a
        thread of the lowest priority gives its steps the caller's this way."""
        with self._cv:
            self._check_open()
            self._wait_idle()
            self._ctx.set_n_threads(self._ctx.n_threads)
            for drafter in (self.draft, self.mtp):
                if drafter is not None:
                    drafter.restart_threads()

    # -- sequences -------------------------------------------------------------

    def open_sequence(self) -> int:
        """A free sequence id, or CapacityError when all ``n_seq_max`` are open."""
        with self._cv:
            self._check_open()
            if not self._free_seqs:
                raise CapacityError(f"all {self.n_seq_max} sequences of this model are in use; close a "
                                    f"session, or open the model with a larger n_seq_max")
            seq = self._free_seqs.pop(0)
            self._last_used[seq] = time.monotonic()
            return seq

    def close_sequence(self, seq: int) -> None:
        """Free a sequence and its cells, at once (waits for a running step)."""
        with self._cv:
            self._wait_idle()
            request = self._seq_request.pop(seq, None)
            if request is not None:
                self._drop(request, ClosedError("the session was closed"))
            if self._closed or seq in self._free_seqs:
                return
            self._ctx.seq_rm(seq, 0)
            self._last_used.pop(seq, None)
            self._fresh_rows.pop(seq, None)
            self._seq_lora.pop(seq, None)
            self._free_seqs.append(seq)
            self._free_seqs.sort()
            self._cv.notify_all()

    def tokens(self, seq: int) -> list[int]:
        """The tokens sequence ``seq`` holds in the cache, in order."""
        with self._cv:
            self._wait_idle()
            self._check_open()
            return self._ctx.cache.seq_tokens(seq)

    def length(self, seq: int) -> int:
        with self._cv:
            self._wait_idle()
            self._check_open()
            return self._ctx.cache.seq_length_of(seq)

    def trim(self, seq: int, n: int) -> None:
        """Keep the first ``n`` positions of ``seq`` (rewind)."""
        with self._cv:
            self._wait_idle()
            self._check_open()
            self._ctx.seq_rm(seq, n)
            self._fresh_rows[seq] = min(self._fresh_rows.get(seq, 0), n)

    def read_state(self, seq: int) -> tuple[list[int], np.ndarray]:
        """The tokens ``seq`` holds and their K and V (see ``Context.seq_state``)."""
        with self._cv:
            self._wait_idle()
            self._check_open()
            return self._ctx.cache.seq_tokens(seq), self._ctx.seq_state(seq)

    def load_state(self, seq: int, tokens: list[int], state, stored: Optional[int] = None) -> None:
        """Replace what ``seq`` holds by the first ``len(tokens)`` positions of
        ``state``; idle sequences' cells are dropped for it if needed."""
        with self._cv:
            self._wait_idle()
            self._check_open()
            self._ctx.seq_rm(seq, 0)
            self._fresh_rows.pop(seq, None)
            self._seq_lora.pop(seq, None)
            self._make_room(len(tokens), {seq} | set(self._seq_request))
            self._ctx.seq_load(seq, tokens, state, stored)

    def new_drafter(self, seq: int, history):
        """The drafter of a generation on ``seq`` whose live token list is ``history``."""
        if self.draft is not None:
            return self.draft.drafter(seq, history)
        if self.mtp is not None:
            return DrafterChoice(PromptLookup(history), self.mtp.drafter(seq, history, self.step_costs))
        return PromptLookup(history)

    def drafter_stats(self) -> dict[str, dict[str, float]]:
        """Per drafter kind ("prompt lookup", "mtp", "draft model"): the draft
        tokens verified, those kept, and the rate kept."""
        return {kind: {"drafted": d, "accepted": a, "acceptance_rate": a / d if d else 0.0}
                for kind, (d, a) in sorted(self.drafter_tokens.items())}

    def embed(self, tokens: list[int], seq: Optional[int] = None) -> np.ndarray:
        """The final normed hidden state of each of ``tokens`` evaluated as a
        sequence of their own, ``(len(tokens), n_embd)`` float32 (llama.cpp's
        per-token embeddings): on a free sequence, or on ``seq`` (an open one
        with no request running, which is emptied).  The sequence holds
        nothing afterwards; the step is the engine's alone while it runs (its
        graph's output is not logits)."""
        def steps(seq_id: int) -> np.ndarray:
            step = self._ctx.n_batch
            rows = [self._ctx.decode(tokens[i:i + step], seq_id, True, embeddings=True)
                    for i in range(0, len(tokens), step)]
            return np.concatenate(rows, axis=0)
        return self._alone(tokens, seq, "embedding", steps)

    def rank(self, tokens: list[int], seq: Optional[int] = None) -> np.ndarray:
        """A reranker's outputs for ``tokens`` (its rerank prompt) evaluated alone as in :meth:`embed`:
        the classification head on the first token's final hidden state (an encoder) or the last's,
        float32 ``(n_cls_out,)``, the score first.  The last step outputs every row, as llama.cpp's
        steps with embeddings do, so the head reads the rounding llama.cpp's does."""
        if not self._ctx.model.rank_outputs:
            raise InvalidArgumentError("this model has no classification head (cls / cls.output): it cannot rank")

        def steps(seq_id: int) -> np.ndarray:
            step = self._ctx.n_batch
            for i in range(0, len(tokens) - step, step):   # a causal model's earlier chunks: their cells only
                self._ctx.decode(tokens[i:i + step], seq_id, None, embeddings=True)
            last = (len(tokens) - 1) // step * step
            return self._ctx.decode(tokens[last:], seq_id, True, embeddings=True, rank=True)[0]
        return self._alone(tokens, seq, "ranking", steps)

    def _alone(self, tokens: list[int], seq: Optional[int], what: str, steps) -> np.ndarray:
        """``steps(seq_id)`` on an empty sequence (``seq``, or a free one) while the engine's steps wait."""
        if not tokens:
            raise InvalidArgumentError(f"cannot run {what} on an empty list of tokens")
        if not self._ctx.model.causal and len(tokens) > self._ctx.n_batch:
            # Its tokens see the whole sequence, so it is one step (as in llama.cpp, whose n_ubatch must hold it).
            raise ContextLimitError(f"this model's tokens attend to their whole sequence, which must fit one "
                                    f"step: {len(tokens)} tokens, n_batch is {self._ctx.n_batch}")
        own = seq is None
        seq_id = self.open_sequence() if seq is None else seq
        try:
            with self._cv:
                self._wait_idle()
                self._check_open()
                if seq_id in self._seq_request:
                    raise InvalidArgumentError(f"sequence {seq_id} is running a request")
                self._ctx.seq_rm(seq_id, 0)
                self._fresh_rows.pop(seq_id, None)
                self._seq_lora.pop(seq_id, None)
                if self.lora_scales:
                    self._ctx.set_lora_scales(seq_id, self.lora_scales)
                if self._make_room(len(tokens), {seq_id} | set(self._seq_request)) < len(tokens):
                    raise KVCacheFullError(f"{what} {len(tokens)} tokens needs as many free KV cells; "
                                           f"{self._ctx.cache.n_free} of {self.kv_size} are free")
                self._stepping = True
            try:
                return steps(seq_id)
            finally:
                with self._cv:
                    self._ctx.seq_rm(seq_id, 0)
                    self._stepping = False
                    self._cv.notify_all()
        finally:
            if own:
                self.close_sequence(seq_id)

    # -- requests --------------------------------------------------------------

    def run(self, request: Request) -> Request:
        """Step until ``request`` is done; raises its error, if any."""
        self._drive(request, lambda: request.done)
        if request.error is not None:
            raise request.error
        return request

    def next_token(self, request: Request) -> Optional[int]:
        """The next generated token of ``request``, or None once it is done."""
        self._drive(request, lambda: bool(request.generated) or request.done)
        with self._cv:
            if request.generated:
                self._cv.notify_all()  # a request paused for its reader may go on
                return request.generated.popleft()
        if request.error is not None:
            raise request.error
        return None

    def cancel(self, request: Request, error: Optional[BaseException] = None) -> None:
        """Stop ``request``: at once if no step runs it, else when the step
        ends.  ``error`` is what its consumer then sees (None: it just ends);
        with an error, a running step is aborted (and re-run for the others).

        Safe from a signal handler: one that interrupts this thread while it
        holds the engine's lock only records the cancel (the interrupted code
        may be halfway through the engine's bookkeeping), and the driver
        applies it at its next safe point."""
        # Whether this thread holds the condition's RLock: CPython's Condition has the test,
        # typeshed does not declare it.
        if self._cv._is_owned():  # type: ignore[attr-defined]
            self._deferred_cancels.append((request, error))
            return
        with self._cv:
            self._cancel_locked(request, error)

    def _cancel_locked(self, request: Request, error: Optional[BaseException]) -> None:
        if request.done:
            return
        request.cancelled = True
        if request.in_step:
            request.cancel_error = error
            if error is not None:  # the caller is told at once: stop the step itself
                self._abort_for_cancel = True
                self._ctx.request_abort()
        else:
            self._drop(request, error)
        self._cv.notify_all()

    def close(self) -> None:
        """Fail every request, then free the native context (waits for a running step)."""
        with self._cv:
            if self._closed:
                return
            self._wait_idle()
            for request in list(self._active):
                self._drop(request, ClosedError("the model was closed"))
            self._closed = True
            if self.draft is not None:
                self.draft.close()
            if self.mtp is not None:
                self.mtp.close()
            self._ctx.close()
            self._cv.notify_all()

    # -- driving ---------------------------------------------------------------

    def _drive(self, own: Request, ready: Callable[[], bool]) -> None:
        if own.lora is None:
            own.lora = self.lora_scales
        if not own.prefetch_tried:
            self._prefetch_cached_prefix(own)
        with self._cv:
            if not own.done and own not in self._active:
                self._check_open()
                if self._ctx.model.encoder:
                    raise InvalidArgumentError("this model is an encoder (BERT family): it gives embeddings "
                                               "(embed, create_embedding), not generated text")
                self._active.append(own)
                self._seq_request[own.seq] = own
            while not ready():
                while self._deferred_cancels:   # recorded by a signal handler (see cancel)
                    self._cancel_locked(*self._deferred_cancels.popleft())
                if ready():
                    break
                if self._stepping or self._idle_waiters:
                    self._cv.wait()
                    continue
                self._check_open()
                plan = self._plan()
                if plan is None and not ready():
                    # What this request waits for (cells) is held by requests paused
                    # for their readers -- perhaps this very thread: run them ahead.
                    plan = self._plan(run_ahead=True)
                if plan is None:
                    if ready():
                        break
                    if len(self._active) > 1:
                        # Others hold what this request waits for (cells, or steps
                        # their readers have not caught up with): wait for them.
                        self._cv.wait(timeout=0.05)
                        continue
                    raise RuntimeError("the engine has nothing to run for a request that is not done (a bug)")
                t0 = time.perf_counter()
                # Nothing between setting _stepping and the try: a Ctrl-C landing there
                # would leave it set, and every later wait for an idle engine would hang.
                self._stepping = True
                try:
                    self._cv.release()
                    try:
                        if plan.embd is not None:
                            logits = self._ctx.decode_embeddings(plan.embd, plan.tokens, plan.seqs, plan.outputs,
                                                                 causal=plan.causal, grid=plan.grid,
                                                                 offset=plan.grid_offset)
                        else:
                            logits = self._ctx.decode(plan.tokens, plan.seqs, plan.outputs,
                                                      decode_kernels=plan.generated,
                                                      keep_hidden=plan.keep_hidden)
                        error = None
                        if len(logits) == len(plan.tokens):  # decoding and verification (StepCosts)
                            self.step_costs.record(len(plan.tokens), time.perf_counter() - t0)
                    except BaseException as exc:  # noqa: B902 -- Ctrl-C included, settled below
                        logits, error = None, exc
                    finally:
                        self._cv.acquire()
                    self._settle(plan, logits, error, own)
                finally:
                    self.step_seconds += time.perf_counter() - t0
                    self._stepping = False
                    self._cv.notify_all()
                if self._interrupted is not None:  # Ctrl-C reached a draft model: the driver's own request ends
                    interrupt, self._interrupted = self._interrupted, None
                    self._drop(own, interrupt)
                    raise interrupt

    def _admit(self, request: Request) -> None:
        """Bring a new request's sequence to its prompt, reusing the cache."""
        request.admitted = True
        self._admissions += 1
        request.admitted_at = self._admissions
        cache = self._ctx.cache
        if request.prompt is not None and not self._reuse_prefix(request, request.prompt):
            request.admitted = False  # admitted at a later step, forking a prefix another is evaluating
            return
        length = cache.seq_length_of(request.seq)
        if request.prompt is None and self._lora_of(request.seq) != request.lora:
            # Tokens appended at other adapter scales than the cells before them.
            self._seq_lora[request.seq] = MIXED_LORA if length else request.lora
        if self.lora_scales:
            self._ctx.set_lora_scales(request.seq, request.lora)
        limit = request.n_ctx if request.n_ctx is not None else self.n_ctx
        if length + len(request.pending) > limit:
            self._drop(request, ContextLimitError(
                f"{length} cached + {len(request.pending)} new tokens = {length + len(request.pending)} "
                f"exceeds n_ctx={limit}"))
            return
        # Cells: what this request may take must be free beyond what the
        # admitted ones may still take.  Otherwise it waits for them to end --
        # or, when none runs, the cache is simply too small for it.
        others = [r for r in self._active if r.admitted and r is not request]
        committed = sum(r.cells_needed for r in others)
        need = request.cells_needed
        free = self._make_room(committed + need, {r.seq for r in others} | {request.seq})
        if committed + need <= free:
            return
        if not others:
            self._drop(request, KVCacheFullError(
                f"this request needs {need} KV cells ({len(request.pending)} to evaluate, up to "
                f"{request.max_new} to generate) and the cache has {free} free of {self.kv_size}; "
                f"open the model with a larger kv_size, or ask for fewer tokens"))
            return
        request.admitted = False  # wait: cells come back as the others end

    def _make_room(self, need: int, running: set[int]) -> int:
        """Free cells for ``need`` tokens, dropping idle sequences' cells
        (least recently used first) if needed; returns the cells free."""
        cache = self._ctx.cache
        if cache.n_free < need:
            idle = sorted((t, s) for s, t in self._last_used.items()
                          if s not in running and s not in self._seq_request and cache.seq_length_of(s) > 0)
            for _, seq in idle:
                log.debug("KV cache full: dropping the cached prefix of idle sequence %d", seq)
                self._cut(seq, 0)
                self._fresh_rows.pop(seq, None)
                self._seq_lora.pop(seq, None)
                if cache.n_free >= need:
                    break
        return cache.n_free

    def _retire(self, request: Request) -> None:
        request.finish()
        self._forget(request)
        self._finished_seqs.append(request.seq)

    def _drop(self, request: Request, error: Optional[BaseException]) -> None:
        request.finish(error)
        self._forget(request)

    def _forget(self, request: Request) -> None:
        if request in self._active:
            self._active.remove(request)
        if self._seq_request.get(request.seq) is request:
            del self._seq_request[request.seq]

    def _wait_idle(self) -> None:
        """Wait for the step in progress to end.  Drivers let such waiters in
        between two steps: otherwise a driver that starts the next step at once
        would keep a trim or a read of the cache waiting for its whole request."""
        self._idle_waiters += 1
        try:
            while self._stepping:
                self._cv.wait()
        finally:
            self._idle_waiters -= 1
            self._cv.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this model is closed")
