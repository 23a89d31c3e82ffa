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
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..errors import CapacityError, ClosedError, ContextLimitError, InvalidArgumentError, KVCacheFullError
from .media import MediaTable, next_prompt_run
from .prefix_reuse import MIN_SHARED_WAIT, MIXED_LORA, REUSE_ALIGNMENT, PrefixReuse  # noqa: F401 -- the reuse grid, for callers
from .prompt_cache import PromptCache
from .request import Request
from .mtp import DrafterChoice
from .speculative import PromptLookup
from .state_cache import DEFAULT_STATE_CACHE_MB, StateCache
from .step_costs import StepCosts, plan_drafts

log = logging.getLogger("elelem")

#: Generated tokens a consumer may leave unread before its request pauses:
#: a stream that is not being read stops computing after a few steps.
MAX_AHEAD = 8


@dataclass
class _Chunk:
    request: Request
    n: int                              # tokens taken from request.pending
    rows: list[int] = field(default_factory=list)  # their rows in the step's logits
    drafts: list[int] = field(default_factory=list)  # guesses evaluated after them
    base: int = 0                       # positions the sequence held before the step
    first: int = 0                      # the step's row of its first token ...
    draft_first: int = 0                # ... and of its first draft


@dataclass
class _Plan:
    chunks: list[_Chunk]
    tokens: list[int]
    seqs: list[int]
    outputs: list[bool]
    # Every token is a generated one (no prompt in the step): the core gives
    # each row its one-token step's numbers, at any width (Context.decode).
    generated: bool = False
    # Some request drafts with an MTP head, which reads the step's hidden states.
    keep_hidden: bool = False
    # A step of one image's embeddings (tokens holds their ids; media.py), and
    # whether its rows attend to each other causally.
    embd: Optional[np.ndarray] = None
    causal: bool = True
    # Its grid (columns, rows) and the index of its first row, where the text model places it in 2D.
    grid: Optional[tuple[int, int]] = None
    grid_offset: int = 0


class Engine(PrefixReuse):
    """Sequences and continuous batching over one native context (what of a
    prompt need not be evaluated: prefix_reuse.py)."""

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

    def _plan(self, run_ahead: bool = False) -> Optional[_Plan]:
        """The next batch: one token of every generating request first, then
        prompt chunks, up to n_batch tokens and the free cells."""
        for request in list(self._active):
            if not request.admitted:
                self._admit(request)
        budget = self._ctx.n_batch
        runnable = [r for r in self._active
                    if r.admitted and r.wants_more and (run_ahead or len(r.generated) < MAX_AHEAD)]
        if not runnable:
            return None
        runnable.sort(key=lambda r: len(r.pending) > 1)  # decoding requests first, stable otherwise
        prompting = [r for r in runnable if not r.decoding]
        if prompting and len(prompting) < len(runnable):
            # Streams' generated tokens take the one-token kernels, prompts the
            # batch ones (Context.decode's decode_kernels); in one step every row
            # would take the prompt's, and a running stream whose step a new
            # prompt joined would part from its solo tokens at a near-tie.  So
            # steps of the two kinds alternate (a prompt chunk waits one step of
            # generated tokens, which then reads the weights once more).
            self._prompt_turn = not self._prompt_turn
            runnable = prompting if self._prompt_turn else [r for r in runnable if r.decoding]
        if not runnable[0].decoding:
            # A prompt step is split by sequence where its kernels depend on its
            # width (attention tiles, repacked and tiled matmuls) for at most
            # Context.max_prompt_runs sequences: the others wait a step.
            runnable = runnable[:self._ctx.max_prompt_runs]
        budget = min(budget, self._make_room(len(runnable), {r.seq for r in runnable}))
        if budget == 0:
            # Generations grew past the cells kept for them and nothing idle is
            # left to drop: end the newest, so that the others can go on.
            newest = max(runnable, key=lambda r: r.admitted_at)
            self._drop(newest, KVCacheFullError(
                f"the KV cache ({self.kv_size} cells) is full: {len(runnable)} running sequences hold every "
                f"cell; open the model with a larger kv_size, or run fewer requests at once"))
            return self._plan(run_ahead)
        chunks: list[_Chunk] = []
        tokens: list[int] = []
        seqs: list[int] = []
        outputs: list[bool] = []
        n_outputs = 0
        drafting = []                   # chunks of generating requests that may verify drafts
        embd = None
        grid, grid_offset = None, 0
        for request in runnable:
            if budget == 0 or embd is not None:
                break
            n = min(len(request.pending), budget)
            if not request.decoding:   # an image's embeddings are a step of their own (media.py)
                n, image = next_prompt_run(request.pending, n)
                if image and chunks:
                    continue
                if image:
                    try:
                        embd = self.media.rows(request.pending[:n])
                        grid, grid_offset = self.media.placement(request.pending[:n])
                    except InvalidArgumentError as error:
                        self._drop(request, error)
                        continue
            if request.checkpoint and not request.decoding:   # a step ends there, for its snapshot
                before = request.checkpoint - self._ctx.cache.seq_length_of(request.seq)
                # An image's rows split there too (causal rows give the same either way), unless they
                # attend to each other both ways: then the image stays whole.
                if 0 < before < n and not (embd is not None and self.media.bidirectional):
                    n = before
                    if embd is not None:
                        embd = embd[:n]
            budget -= n
            chunk = _Chunk(request, n, first=len(tokens), base=self._ctx.cache.seq_length_of(request.seq))
            ends = n == len(request.pending)
            for i, token in enumerate(request.pending[:n]):
                wanted = request.all_logits or (ends and i == n - 1)
                if wanted:
                    chunk.rows.append(n_outputs)
                    n_outputs += 1
                tokens.append(token)
                seqs.append(request.seq)
                outputs.append(wanted)
            if ends and n == 1 and request.drafter is not None and request.pick is not None:
                drafting.append(chunk)
            request.in_step = True
            chunks.append(chunk)
        if drafting and budget > 0:
            # Each sequence's drafts go after every first token: a sequence's tokens stay in order.
            for chunk in self._plan_drafts(drafting, len(tokens), budget):
                chunk.draft_first = len(tokens)
                for token in chunk.drafts:  # every draft's row: the model's choice after it
                    chunk.rows.append(n_outputs)
                    n_outputs += 1
                    tokens.append(token)
                    seqs.append(chunk.request.seq)
                    outputs.append(True)
        if not chunks:
            return None
        if not n_outputs:  # a step must return some row; the last one is cheap
            outputs[-1] = True
        self.media.images_evaluated += embd is not None
        return _Plan(chunks, tokens, seqs, outputs, generated=embd is None and all(c.request.decoding for c in chunks),
                     keep_hidden=any(getattr(c.request.drafter, "wants_hidden", False) for c in chunks),
                     embd=embd, causal=not self.media.bidirectional, grid=grid, grid_offset=grid_offset)

    def _plan_drafts(self, drafting: list[_Chunk], base_tokens: int, budget: int) -> list[_Chunk]:
        """Ask each drafting request for its guesses, and keep as many as pay
        for the wider step (step_costs.plan_drafts); the chunks given drafts."""
        proposals = [self._drafts(chunk.request, chunk.base, budget) for chunk in drafting]
        offers = [(chunk.request.drafter.acceptance.rate, len(proposal)) for chunk, proposal in zip(drafting, proposals)]
        counts = plan_drafts(base_tokens, offers, self.step_costs, budget)
        given = []
        for chunk, proposal, count in zip(drafting, proposals, counts):
            if count:
                chunk.drafts = proposal[:count]
                given.append(chunk)
            elif proposal:
                chunk.request.drafter.unverified(proposal)
        return given

    def _drafts(self, request: Request, length: int, budget: int) -> list[int]:
        """Guesses to verify after a generating request's next token: within
        the batch, its context (a draft cell past n_ctx could never be kept)
        and its generation budget."""
        limit = request.n_ctx if request.n_ctx is not None else self.n_ctx
        # ``max_new`` picks are left: the next token's row gives the first, and
        # only a draft whose own row is used (not the last pick) can be kept.
        room = min(budget, limit - length - 1, request.max_new - 1)
        if room <= 0:
            return []
        try:
            proposal = request.drafter.propose(room)
        except KeyboardInterrupt as interrupt:  # the step is half planned: raised once it is settled
            self._interrupted = interrupt
            return []
        for i, token in enumerate(proposal):
            if token in request.ends:  # the row before it picks the end; the rest would be wasted
                return proposal[:i]
            if token < 0:              # an image's id (media.py), copied from the history: never a guess
                return proposal[:i]
        return proposal

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

    def _settle(self, plan: _Plan, logits: Optional[np.ndarray], error: Optional[BaseException],
                own: Request) -> None:
        hidden = self._ctx.last_hidden if plan.keep_hidden and error is None else None
        for chunk in plan.chunks:
            chunk.request.in_step = False
        if error is not None:
            self._settle_failure(plan, error, own)
            return
        assert logits is not None, "a step that did not fail has its logits"
        self.steps += 1
        self.batched_tokens += len(plan.tokens)
        self.shared_steps += len(plan.chunks) > 1
        now = time.monotonic()
        for chunk in plan.chunks:
            request = chunk.request
            self._last_used[request.seq] = now
            del request.pending[:chunk.n]
            request.evaluated += chunk.n
            if not request.decoding and self._ctx.cache.hybrid and (
                    not request.pending or self._ctx.cache.seq_length_of(request.seq) == request.checkpoint):
                self.states.keep(request.seq)
            if request.cancelled:
                self._keep_drafts(chunk, 0)
                self._drop(request, request.cancel_error)
                continue
            if not chunk.rows:
                continue
            rows = logits[chunk.rows]
            if request.pick is None:
                request.logit_rows.append(rows)
                if not request.pending:
                    self._retire(request)
                continue
            kept = 0
            if chunk.drafts:
                kept = self._pick_verified(chunk, rows)
            else:
                self._pick_next(request, rows[-1], self._ctx.cache.seq_length_of(request.seq))
            if hidden is not None and getattr(request.drafter, "wants_hidden", False):
                # The rows the sequence keeps: its tokens', then its confirmed drafts'.
                request.drafter.observe(chunk.base, np.concatenate(
                    [hidden[chunk.first:chunk.first + chunk.n], hidden[chunk.draft_first:chunk.draft_first + kept]]))
        self._offer_finished()

    def _pick_next(self, request: Request, logits: np.ndarray, held: int, draft: Optional[int] = None) -> bool:
        """Pick the token after ``held`` positions.  True when it is ``draft``,
        already evaluated, whose row the caller goes on to; otherwise the
        token is queued to be evaluated next, or the request ends."""
        pick = request.pick
        assert pick is not None, "only a request that picks its tokens gets here"
        try:
            token, go_on = pick(logits)
        except BaseException as exc:  # noqa: B902 -- the consumer gets it
            self._drop(request, exc)
            return False
        if token is not None and request.streamed:
            request.generated.append(token)
        if token is None or not go_on or held >= (request.n_ctx or self.n_ctx):
            self._retire(request)
            return False
        request.max_new = max(0, request.max_new - 1)
        request.decoding = True
        if draft is not None and token == draft:
            return True
        request.pending = [token]
        return False

    def _pick_verified(self, chunk: _Chunk, rows: np.ndarray) -> int:
        """Walk the rows of a token and its drafts: pick after each, in order,
        going on while the pick is the next draft, so that the picker sees
        exactly what decoding token by token would show it."""
        drafts = chunk.drafts
        kept = 0
        for i, row in enumerate(rows):
            draft = drafts[i] if i < len(drafts) else None
            if not self._pick_next(chunk.request, row, chunk.base + i + 1, draft):
                break
            kept += 1
        self._keep_drafts(chunk, kept)
        return kept

    def _keep_drafts(self, chunk: _Chunk, kept: int) -> None:
        """Keep the cells of the first ``kept`` drafts and trim the rest."""
        if not chunk.drafts:
            return
        request = chunk.request
        if request in self._active and request.pending:
            # A hybrid model's refused drafts are in its recurrent state: it goes
            # back to the snapshot before the step, and the tokens kept since
            # then are evaluated again in the next step, before the next token.
            replay = self._ctx.rewind(request.seq, chunk.base + 1 + kept)
            request.pending[:0] = replay
            request.evaluated -= len(replay)
        else:
            self._ctx.seq_rm(request.seq, chunk.base + 1 + kept)
        request.evaluated += kept
        request.drafted += len(chunk.drafts)
        request.accepted += kept
        self.drafted_tokens += len(chunk.drafts)
        self.accepted_tokens += kept
        counts = self.drafter_tokens.setdefault(getattr(request.drafter, "kind", "prompt lookup"), [0, 0])
        counts[0] += len(chunk.drafts)
        counts[1] += kept
        request.drafter.record(kept, len(chunk.drafts))

    def _settle_failure(self, plan: _Plan, error: BaseException, own: Request) -> None:
        """A step failed and left the cache as it was.  An abort made for a
        cancel ends the cancelled requests only; Ctrl-C ends the driver's own
        request; any other error ends every request of the step."""
        if isinstance(error, KeyboardInterrupt) and self._abort_for_cancel:
            self._abort_for_cancel = False
            for chunk in plan.chunks:
                if chunk.request.cancelled:
                    self._drop(chunk.request, chunk.request.cancel_error)
            return
        victims = [own] if isinstance(error, KeyboardInterrupt) else [c.request for c in plan.chunks] + [own]
        for request in victims:
            self._drop(request, error)

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
