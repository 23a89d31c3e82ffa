# Context: the backends, their scheduler and the KV cache over one model, and
# the graph of each step.  Included into core.pyx.
#
# A step (``decode``) evaluates a batch of tokens from one or more sequences
# in one graph, as llama.cpp's llama_decode: each token goes to the next
# position of its sequence, in a cell the cache hands out, and attends to the
# cells its sequence sees.  Compute goes through ggml_backend_sched over the
# list of backends (today the CPU alone, with its repacked weights), with the
# GIL released.
#
# Beside it, as module functions taking the Context: new_context
# (context_new.pxi), the checks of a step's inputs (context_inputs.pxi), the
# step's graph (step_graph.pxi), a hybrid model's steps, trims and forks
# (context_hybrid.pxi), and a drafter's step over its target's cache
# (drafter.pxi).

DEF MAX_BACKENDS = 8
DEF MAX_SEQ_IDS = 64     # KVCache's MAX_SEQ


cdef class Context:
    cdef readonly Model model           # kept alive for as long as the context lives
    cdef readonly KVCache cache
    cdef ggml_backend_t backends[MAX_BACKENDS]   # in priority order; the CPU is last
    cdef ggml_backend_buffer_type_t bufts[MAX_BACKENDS]
    cdef int n_backends
    cdef ggml_backend_t cpu
    cdef ggml_threadpool * threadpool  # the CPU backend's worker threads (_new_cpu_threadpool)
    cdef ggml_backend_sched_t sched
    cdef void * graph_meta              # arena for the graph's metadata
    cdef size_t graph_meta_size
    cdef size_t graph_size              # max nodes in one step's graph
    # The last graph built and allocated, reused while the step's shape
    # (n_tokens, n_kv, n_outputs) stays the same: n_kv moves in steps of 256,
    # so decoding rebuilds the graph once every 256 tokens.
    cdef Step graph_step
    cdef bint graph_ready
    cdef readonly int n_batch
    cdef readonly int n_threads
    cdef readonly bint flash_attn
    cdef readonly long n_evaluated      # tokens evaluated over the context's life
    cdef volatile int abort_flag
    cdef bint busy                      # a step is running (in another thread)
    cdef bint closed
    # RPC servers among the backends: every call that may talk to one runs
    # guarded (rpc.pxi), and fails after rpc_timeout seconds without an answer.
    cdef readonly list rpc_endpoints
    cdef readonly double rpc_timeout
    cdef bint lost                      # a server was lost mid-call: the context is unusable
    cdef readonly RecurrentSnapshots snapshots   # a hybrid model's (snapshots.pxi)
    cdef readonly long n_replayed       # tokens evaluated again to rewind a recurrent state
    # LoRA adapters (adapter.pxi) the steps may apply, fixed at creation (the
    # graph's node budget counts their products), and each sequence's scale
    # of each: seq_lora[seq * MAX_ADAPTERS + adapter], 0 where it is not applied.
    cdef readonly tuple adapters
    cdef const AdapterWeights * adapter_weights[MAX_ADAPTERS]
    cdef int n_adapters
    cdef float seq_lora[MAX_SEQ_IDS * MAX_ADAPTERS]
    # The final normed hidden state of every row of the last step run with
    # keep_hidden, (n_tokens, n_embd) float32 in the batch's order: what an
    # MTP head drafts from (elelem.engine.mtp); None otherwise.  With feature
    # layers set (set_feature_layers), those layers' inputs instead.
    cdef readonly object last_hidden
    # A drafter's context that shares its target's cache (a Gemma 4 drafter):
    # the target's context, whose model's token table it embeds with; None otherwise.
    cdef readonly Context target
    cdef readonly tuple feature_layers  # the target layers an EAGLE-3 head reads (Step.feature_layers)

    def __cinit__(self):
        self.n_backends = 0
        self.cpu = NULL
        self.threadpool = NULL
        self.sched = NULL
        self.graph_meta = NULL
        self.graph_step.ctx = NULL
        self.graph_ready = False
        self.closed = True
        self.busy = False
        self.abort_flag = 0
        self.rpc_endpoints = []
        self.rpc_timeout = 0
        self.snapshots = RecurrentSnapshots()
        self.n_replayed = 0
        self.lost = False
        self.adapters = ()
        self.n_adapters = 0
        memset(self.seq_lora, 0, sizeof(self.seq_lora))
        self.last_hidden = None
        self.feature_layers = ()

    def __init__(self, *args, **kwargs):
        raise TypeError("Context objects are made by elelem._core.new_context()")

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        cdef _FreeJob job
        cdef int i
        self._drop_graph()
        memset(&job, 0, sizeof(job))
        job.sched = self.sched
        job.n_backends = self.n_backends
        job.backends = self.backends
        cdef bint guarded_cache = self.rpc_timeout > 0 and self.cache is not None
        if guarded_cache:
            # Cells on servers are freed here, guarded, not by the cache's
            # __dealloc__, which could wait on a lost server forever.
            job.n_buffers = self.cache.n_bufs
            job.buffers = self.cache.bufs
        _free_guarded(&job, self.rpc_timeout, self.rpc_endpoints)
        if self.threadpool != NULL:
            if not (self.rpc_timeout > 0 and _rpc_unsafe(self.rpc_endpoints)):
                _cpu_threadpool_free(self.threadpool)  # else a step given up on may still use it
            self.threadpool = NULL
        if guarded_cache:
            if _rpc_unsafe(self.rpc_endpoints):
                self.cache.leak_buffers = True
            else:
                for i in range(self.cache.n_bufs):
                    self.cache.bufs[i] = NULL  # freed by the job
        self.sched = NULL
        self.n_backends = 0
        self.cpu = NULL
        if self.graph_meta != NULL:
            if not (self.rpc_timeout > 0 and _rpc_unsafe(self.rpc_endpoints)):
                free(self.graph_meta)  # else a step given up on may still read its graph there
            self.graph_meta = NULL
        self.cache = None
        self.target = None
        self.closed = True

    def close(self):
        """Free the cache, the backends and the compute buffers (not during a step)."""
        if self.busy:
            raise errors.InvalidArgumentError("cannot close a context while a step runs on it")
        self._release()

    @property
    def is_closed(self):
        return self.closed

    @property
    def n_vocab(self):
        return self.model.hp.n_vocab

    @property
    def kv_size(self):
        return self.cache.kv_size if self.cache is not None else 0

    @property
    def n_seq_max(self):
        return self.cache.n_seq_max if self.cache is not None else 0

    @property
    def width_thresholds(self):
        """The widths of a prompt step at which a CPU kernel this context runs
        changes, ascending: a row's numbers differ between a step narrower
        than one of these and a step at least as wide.  2: one column takes
        the one-token kernels, not tinyBLAS; ggml's tiled K-quant matmul from
        _cpu_kernels.tiled_min_columns columns; flash attention's tiled kernel from
        FA_TILE_ROWS query rows (an F16 or F32 cache).  The engine
        re-evaluates a reused prompt's tail in a step of its fresh
        evaluation's class (engine.py, Engine.exact_tail)."""
        widths = {2}
        if _cpu_kernels.tiled_min_columns != INT64_MAX:
            widths.add(<int> _cpu_kernels.tiled_min_columns)
        if self.flash_attn and self.cache is not None and self.cache.type_k in ("f16", "f32"):
            widths.add(FA_TILE_ROWS)
        return tuple(sorted(widths))

    @property
    def fork_alignment(self):
        """A prefix shared with another sequence (seq_cp) is cut to a multiple
        of this many positions for the rest to attend as it would alone.
        Flash attention's tiled kernel (64 query rows or more) takes the
        cells in tiles of CELL_ALIGN, an online softmax from tile to tile:
        a sequence forked mid-tile has its next positions in another tile
        than the ones before them (the donor's own continuation holds the
        rest of theirs), and its sums group otherwise.  1 where that kernel
        never runs."""
        if self.flash_attn and self.cache is not None and self.cache.type_k in ("f16", "f32"):
            return CELL_ALIGN
        return 1

    @property
    def backend_names(self):
        """The scheduler's backends, in priority order."""
        return [ggml_backend_name(self.backends[i]).decode() for i in range(self.n_backends)]

    @property
    def compute_buffer_size(self):
        if self.sched == NULL:
            return 0
        return sum(ggml_backend_sched_get_buffer_size(self.sched, self.backends[i]) for i in range(self.n_backends))

    def compute_buffer_sizes(self):
        """What the scheduler reserved for a step, per backend: {"Vulkan0": bytes, "CPU": bytes}."""
        if self.sched == NULL:
            return {}
        return {ggml_backend_name(self.backends[i]).decode(): ggml_backend_sched_get_buffer_size(self.sched,
                                                                                                 self.backends[i])
                for i in range(self.n_backends)}

    cdef inline void _check_open(self) except *:
        if self.closed:
            raise errors.ClosedError("this context is closed")
        if self.lost:
            raise errors.RPCError(f"this model lost its RPC server ({', '.join(self.rpc_endpoints)}) "
                                  "and cannot be used any more; open it again", endpoints=self.rpc_endpoints)
        self.model._check_open()

    def set_n_threads(self, object n_threads):
        cdef int threads = _checked_count("n_threads", n_threads, MAX_N_THREADS)
        self._check_open()
        if self.busy:
            raise errors.InvalidArgumentError("cannot change n_threads while a step runs on this context")
        cdef ggml_threadpool * old = self.threadpool
        self.threadpool = _new_cpu_threadpool(self.cpu, threads)
        self.n_threads = threads
        if old != NULL:
            _cpu_threadpool_free(old)

    def set_feature_layers(self, layers):
        """Make ``keep_hidden`` keep the inputs of these layers, concatenated
        in this order ((n_tokens, len(layers) * n_embd) float32), in place of
        the final normed state: what an EAGLE-3 head reads (llama.cpp's
        llama_set_embeddings_layer_inp).  ``()`` turns it off."""
        self._check_idle()
        layers = tuple(int(il) for il in layers)
        if len(layers) > MAX_FEATURE_LAYERS or any(not 0 <= il < self.model.hp.n_layer for il in layers):
            raise errors.InvalidArgumentError(f"feature layers must be at most {MAX_FEATURE_LAYERS} of the "
                                              f"model's {self.model.hp.n_layer} layers, got {list(layers)}")
        self.feature_layers = layers
        self._drop_graph()

    def request_abort(self):
        """Ask a running step to stop (from another thread); it raises KeyboardInterrupt
        and leaves the cache as it was before the step."""
        self.abort_flag = 1

    # -- graphs (built and reused in step_graph.pxi) ------------------------------

    cdef void _drop_graph(self) noexcept:
        if self.graph_step.ctx != NULL:
            ggml_free(self.graph_step.ctx)
            self.graph_step.ctx = NULL
        self.graph_ready = False

    cdef void _reserve(self) except *:
        """Size the compute buffers from the largest step this context can run."""
        self._drop_graph()  # the reserve graph reuses the arena
        cdef Step st
        memset(&st, 0, sizeof(Step))
        st.n_tokens = min(self.n_batch, self.cache.kv_size)
        st.n_kv = self.cache.kv_size
        st.n_outputs = min(st.n_tokens, self.cache.n_seq_max)
        st.n_seqs = 1 if self.cache.hybrid else 0   # one sequence's prompt: the widest recurrent step
        st.lora_mask = (1 << self.n_adapters) - 1   # every adapter applied
        cdef ggml_cgraph * gf = _build_graph(self, &st)
        try:
            if not self._sched_call(gf, 2, "reserving the compute buffers"):
                raise MemoryError("ggml could not reserve the compute buffers")
        finally:
            ggml_free(st.ctx)

    cdef int _sched_call(self, ggml_cgraph * gf, int what, str description) except? -1:
        """A scheduler call, guarded when servers take part: one that does
        not finish leaves the context lost (its objects are never freed)."""
        cdef _SchedJob job
        job.sched = self.sched
        job.gf = gf
        job.what = what
        try:
            return _run_guarded(_sched_job, &job, sizeof(job), self.rpc_timeout, description, self.rpc_endpoints)
        except errors.RPCError:
            self.lost = True
            raise

    # -- a step ----------------------------------------------------------------

    def decode(self, tokens, seq_ids, outputs=None, bint embeddings=False, bint decode_kernels=False,
               bint rank=False, hidden_in=None, bint keep_hidden=False, bint causal=True):
        """Evaluate one batch (see :meth:`_decode`).  Without ``causal`` the
        batch's rows see each other both ways (a DFlash drafter's block).  A hybrid model's
        recurrent layers take a step as sequences of one token count, one
        after the other: the batch is arranged so, run as one step when its
        sequences have the same count and as one step per count otherwise,
        and the rows come back in the batch's order (``last_hidden`` too)."""
        self.last_hidden = None
        if not self.cache.hybrid:
            return self._decode(tokens, seq_ids, outputs, embeddings, decode_kernels, 0, rank, hidden_in, keep_hidden,
                                causal=causal)
        if not causal:
            raise errors.InvalidArgumentError("a hybrid model's steps are causal")
        if rank:
            raise errors.InvalidArgumentError("rank pooling is not supported for a hybrid model")
        if hidden_in is not None:
            raise errors.InvalidArgumentError("only an MTP head takes hidden states, and it is not hybrid")
        self._check_open()
        ids = _checked_ids(tokens, self.model.hp.n_vocab)
        if ids.shape[0] > self.n_batch:
            raise errors.InvalidArgumentError(f"a step takes at most n_batch={self.n_batch} tokens, got {ids.shape[0]}")
        seqs = _checked_seq_ids(seq_ids, ids.shape[0], self.cache.n_seq_max)
        if ids.shape[0] == 1 or (seqs == seqs[0]).all():
            return _one_sequence_step(self, ids, seqs, outputs, embeddings, decode_kernels, keep_hidden=keep_hidden)
        return _hybrid_decode(self, ids, seqs, outputs, embeddings, decode_kernels, keep_hidden)

    def decode_embeddings(self, embd, ids, seq_ids, outputs=None, bint causal=True, grid=None, int offset=0):
        """Evaluate one batch of given embeddings (an image's, from a
        projector) in place of tokens: row ``i`` of ``embd`` (float32
        ``(n, n_embd)``, or ``(n, n_embd * (1 + n_deepstack))`` for Qwen3-VL)
        goes to the next position of sequence ``seq_ids[i]``
        and its cell is marked with ``ids[i]``, a negative id standing for it
        (what prefix reuse compares; never a vocabulary id).  Without
        ``causal`` the rows attend to each other both ways (libmtmd's
        non-causal images).  Returns the logits of ``outputs`` as
        :meth:`_decode` does.  A hybrid model takes one sequence's rows a step
        (they pass through its recurrent state as tokens do: Qwen3.5's and
        LFM2-VL's images), with the same snapshots around it as a prompt's step."""
        self._check_open()
        if self.model.hp.encoder:
            raise errors.InvalidArgumentError("this model takes no embeddings in place of tokens")
        x = np.ascontiguousarray(embd, dtype=np.float32)
        marks = np.asarray(ids)
        cdef int width = embd_input_width(&self.model.hp)   # n_embd, and n_embd per deepstack part
        if x.ndim != 2 or x.shape[1] != width or x.shape[0] == 0:
            raise errors.InvalidArgumentError(f"embeddings must be (n, {width}) float32, got "
                                              f"{tuple(np.shape(embd))}")
        if marks.ndim != 1 or marks.shape[0] != x.shape[0] or marks.dtype.kind not in "iu" or marks.max() >= 0:
            raise errors.InvalidTokenError("embedding rows need one negative integer id each")
        if not np.isfinite(x).all():
            raise errors.InvalidArgumentError("the embeddings hold NaN or infinite values")
        cdef int grid_x = 0, grid_y = 0
        if grid is not None:   # an M-RoPE model places the rows in 2D (graph/mrope.pxi)
            grid_x, grid_y = int(grid[0]), int(grid[1])
            if grid_x <= 0 or grid_y <= 0 or offset < 0 or offset + x.shape[0] > grid_x * grid_y \
                    or (seq_ids is not None and np.unique(np.asarray(seq_ids)).size > 1):
                raise errors.InvalidArgumentError(f"rows {offset}..{offset + x.shape[0]} of one sequence's "
                                                  f"{grid_x} x {grid_y} image grid, got {grid}")
        if not self.cache.hybrid:
            return self._decode(marks, seq_ids, outputs, False, False, 0, embd=x, causal=causal, grid_x=grid_x,
                                grid_y=grid_y, grid_offset=offset)
        self.last_hidden = None
        seqs = _checked_seq_ids(seq_ids, x.shape[0], self.cache.n_seq_max)
        if (seqs != seqs[0]).any():
            raise errors.InvalidArgumentError("a hybrid model takes one sequence's embeddings a step")
        return _one_sequence_step(self, marks, seqs, outputs, False, False, keep_hidden=False, embd=x, causal=causal,
                                  grid_x=grid_x, grid_y=grid_y, grid_offset=offset)

    def _decode(self, tokens, seq_ids, outputs, bint embeddings, bint decode_kernels, int n_seqs, bint rank=False,
                hidden_in=None, bint keep_hidden=False, embd=None, bint causal=True, int grid_x=0, int grid_y=0,
                int grid_offset=0):
        """Evaluate one batch: ``tokens[i]`` goes to the next position of
        sequence ``seq_ids[i]`` (tokens of one sequence in order).

        ``outputs`` picks the rows whose logits come back: None, the last
        token of each sequence in the batch; True, every row; or a flag per
        token.  Returns float32 logits ``(n_outputs, n_vocab)`` in row order.
        The batch holds 1 .. n_batch tokens.  Anything that fails (a full
        cache, an abort, Ctrl-C) leaves the cache as it was.  With
        ``embeddings``, the rows are the final normed hidden states
        ``(n_outputs, n_embd)`` instead of logits.  With ``rank`` (and
        ``embeddings``), the batch is one sequence's and the one row back is
        the model's classification head on its first output row (an encoder)
        or its last (a causal model): ``(1, n_cls_out)`` (blocks.pxi, rank_head).

        ``decode_kernels`` says that every token is a generated one (the next
        token of a stream, or a drafted guess): a step of any width then
        runs its matmuls with elelem's small-batch kernels where the CPU has
        AVX2 (kernels/small_batch.h; one token too with AVX-512), else with
        ggml's kernels of a one-token step, and its attention row by row as
        one-token steps do -- every row rounding as decoding token by token
        does (graph/matmul.pxi, graph/blocks.pxi).  A prompt keeps the batch
        kernels, whose rounding is llama.cpp's for it.

        An MTP head (``HParams.mtp_head``) takes ``hidden_in`` besides the
        tokens: ``(n, n_embd)`` float32, the hidden state paired with each
        token.  With ``keep_hidden``, ``last_hidden`` gets every row's final
        normed hidden state (the builders of models with an MTP head give it).
        """
        self._check_open()
        if self.busy:
            raise errors.InvalidArgumentError("a step is already running on this context")
        cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] ids = (
            _checked_ids(tokens, self.model.hp.n_vocab) if embd is None else np.ascontiguousarray(tokens, np.int32))
        cdef int n = ids.shape[0]
        if n > self.n_batch:
            raise errors.InvalidArgumentError(f"a step takes at most n_batch={self.n_batch} tokens, got {n}")
        cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] seqs = _checked_seq_ids(seq_ids, n, self.cache.n_seq_max)
        if self.model.hp.encoder and not embeddings:
            raise errors.InvalidArgumentError("this model is an encoder (BERT family): it gives embeddings, not logits")
        if not self.model.hp.causal:
            _check_whole_sequences(self.cache, seqs)
        if rank and (not embeddings or not self.model.rank_outputs or (seqs != seqs[0]).any()):
            raise errors.InvalidArgumentError("rank pooling takes one sequence's embeddings, from a model with a "
                                              "classification head (cls / cls.output)")
        cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] rows = _output_rows(outputs, seqs)
        cdef int n_outputs = rows.shape[0]
        cdef cnp.ndarray h_in = _checked_hidden(hidden_in, n, &self.model.hp)
        cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] cells = np.empty(n, dtype=np.int32)
        cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] positions = np.empty(n, dtype=np.int32)
        if n >= 2 and not decode_kernels and self.model.widen_pending:
            self.model.prompt_tokens_seen += n
            if self.model.prompt_tokens_seen >= self.model.widen_after:
                _make_widened(self.model)   # the Q8_0 copies of Q5_0 weights pay from here (widen.pxi)
        cdef int used_before = self.cache.used_end
        self.cache.place(n, &ids[0], &seqs[0], &cells[0], &positions[0])
        if self.model.pos_embd != NULL and positions.max() >= self.model.hp.n_ctx_train:
            # A learned position table (BERT) has a row per trained position and no more.
            self.cache.unplace(n, &seqs[0], &cells[0])
            raise errors.ContextLimitError(f"this model's position table holds {self.model.hp.n_ctx_train} "
                                           f"positions; the step reaches position {positions.max()}")
        cdef Step * st
        cdef int n_kv = self.cache.n_kv()
        # A lone token whose sequence alone would see fewer than FA_SPLIT_CELLS
        # cells (KV_PAD-padded), in a cache grown past that by other sequences:
        # blocks.pxi, _flash_attention_lone_row.
        cdef bint pair_lone_row = (self.flash_attn and n == 1 and n_kv >= FA_SPLIT_CELLS
                                   and ((positions[0] + KV_PAD) // KV_PAD) * KV_PAD < FA_SPLIT_CELLS)
        cdef int split_kv[MAX_SPLIT_ROWS]
        cdef bint split_rows = (self.flash_attn and decode_kernels and 2 <= n <= MAX_SPLIT_ROWS
                                and _one_token_splits(self.cache, n, used_before, &cells[0], &positions[0], split_kv))
        cdef int lora_mask = self._lora_mask(n, &seqs[0])
        cdef int32_t * positions4 = NULL
        self.busy = True
        try:
            if self.model.hp.rope_type == GGML_ROPE_TYPE_MROPE or self.model.hp.rope_type == GGML_ROPE_TYPE_IMROPE:
                positions4 = mrope_positions(self.cache, n, &seqs[0], &positions[0], &cells[0], grid_x, grid_y,
                                             grid_offset)
            st = _graph_for(self, n, n_kv, n_outputs, embeddings, decode_kernels, &seqs[0], n_seqs, pair_lone_row,
                            <const int *> split_kv if split_rows else <const int *> NULL, &rows[0], rank, lora_mask,
                            keep_hidden, embd is not None)
            st.bidirectional = not causal
            _set_inputs(st, self.cache, &ids[0], &seqs[0], &positions[0], &cells[0], &rows[0], positions4)
            set_lora_inputs(st, &seqs[0], self.seq_lora)
            if h_in is not None:
                _set_input(st.inp_h, cnp.PyArray_DATA(h_in), ggml_nbytes(st.inp_h))
            if embd is not None:
                _set_input(st.inp_embd, cnp.PyArray_DATA(embd),
                           <size_t> n * embd_input_width(&self.model.hp) * sizeof(float))
            self._compute()
        except BaseException:
            self.cache.unplace(n, &seqs[0], &cells[0])
            raise
        finally:
            self.busy = False
            free(positions4)
        if n_seqs:
            self.cache.flip_slots(n, &seqs[0])
        if rank:
            out = np.empty((1, st.logits.ne[0]), dtype=np.float32)
        else:
            out = np.empty((n_outputs, st.logits.ne[0]), dtype=np.float32)   # n_embd, n_vocab, or a drafter's vocabulary
        ggml_backend_tensor_get(st.logits, cnp.PyArray_DATA(out), 0, ggml_nbytes(st.logits))
        if keep_hidden:
            hidden = np.empty((n, st.hidden.ne[0]), dtype=np.float32)
            ggml_backend_tensor_get(st.hidden, cnp.PyArray_DATA(hidden), 0, ggml_nbytes(st.hidden))
            self.last_hidden = hidden
        self.n_evaluated += n
        return out

    def draft_step(self, tokens, seq_ids, positions, hidden_in):
        """One step of a drafter that shares its target's cache (``target``):
        ``tokens[i]``, with the hidden state ``hidden_in[i]`` before it, at
        position ``positions[i]`` of sequence ``seq_ids[i]``, attends over the
        cells that sequence holds in the target's cache; nothing is stored.
        Returns every row's logits; ``last_hidden`` gets every row's hidden
        state for the next draft (llama.cpp's t_h_nextn)."""
        return _draft_step(self, tokens, seq_ids, positions, hidden_in)

    # -- LoRA adapters -----------------------------------------------------------

    cdef int _lora_mask(self, int n, const int32_t * seqs) noexcept:
        """The adapters some row of a step applies (scale not 0), as bits."""
        cdef int mask = 0, i, j
        for i in range(n):
            for j in range(self.n_adapters):
                if self.seq_lora[seqs[i] * MAX_ADAPTERS + j] != 0.0:
                    mask |= 1 << j
        return mask

    def set_lora_scales(self, seq, scales=None):
        """The scale of each of the context's adapters (``adapters``, in
        order) for sequence ``seq``'s next steps; None or 0: not applied.
        Cells already evaluated keep the numbers they got."""
        self._check_open()
        cdef int s = self.cache._check_seq(seq)
        values = [0.0] * self.n_adapters if scales is None else [float(v) for v in scales]
        if len(values) != self.n_adapters:
            raise errors.InvalidArgumentError(f"{len(values)} LoRA scales for {self.n_adapters} adapters")
        for v in values:
            if v != v or v in (float("inf"), float("-inf")):
                raise errors.InvalidArgumentError(f"a LoRA scale must be a finite number, got {v}")
        cdef int j
        for j in range(self.n_adapters):
            self.seq_lora[s * MAX_ADAPTERS + j] = values[j]

    def lora_scales(self, seq):
        """Sequence ``seq``'s scale of each adapter (set_lora_scales)."""
        cdef int s = self.cache._check_seq(seq)
        return tuple(self.seq_lora[s * MAX_ADAPTERS + j] for j in range(self.n_adapters))

    # -- trimming and forking: the cells, and a hybrid model's recurrent state -------

    def seq_rm(self, seq, p0=0):
        """Drop sequence ``seq``'s positions from ``p0`` on.

        A hybrid model's recurrent state holds every position it has seen, so
        it cannot drop a tail: it is set back to the latest snapshot at or
        before ``p0`` (taken before steps of several tokens, and after prompt
        steps: :meth:`_snapshot_before`), and the tokens from there to ``p0``
        are evaluated again (logged).  Never a wrong state."""
        replay, generated = self._rewind(seq, p0)
        if replay:
            _log.info("sequence %d: no snapshot of its recurrent state at position %d; evaluating positions "
                      "%d..%d again", seq, p0, p0 - len(replay), p0 - 1)
            self._replay(seq, replay, generated)

    def rewind(self, seq, p0):
        """Drop sequence ``seq``'s positions from ``p0`` on as :meth:`seq_rm`
        does, but leave the tokens a hybrid model must evaluate again to the
        caller: the sequence ends at the latest snapshot at or before ``p0``,
        and the tokens from there to ``p0`` are returned (none for a model
        without recurrent state).  The engine puts them before the sequence's
        next token, so that a refused draft costs its next step a few rows
        instead of a step of its own."""
        return self._rewind(seq, p0)[0]

    def _rewind(self, seq, p0):
        """:meth:`rewind`, and whether the tokens to evaluate again were generated ones."""
        if not self.cache.hybrid:   # the cells alone (also on a context lost with its server)
            self.cache.seq_rm(seq, p0)
            return [], False
        return _rewind_recurrent(self, seq, p0)

    def seq_cp(self, src, dst, n=None):
        """Let empty sequence ``dst`` see ``src``'s first ``n`` positions (all by
        default).  A hybrid model's recurrent state is copied with them: whole,
        or from a snapshot and the tokens after it evaluated again."""
        if not self.cache.hybrid:
            return self.cache.seq_cp(src, dst, n)
        return _fork_recurrent(self, src, dst, n)

    @property
    def max_prompt_runs(self):
        """The most sequences a step of prompts may hold for each to get the
        numbers of its own step (graph/blocks.pxi: Step.run_length)."""
        return MAX_RUNS

    def resume_point(self, seq, p):
        """The furthest position at or before ``p`` to which :meth:`seq_rm`
        trims, or :meth:`seq_cp` forks, sequence ``seq`` without evaluating
        tokens again: ``p`` itself, but on a hybrid model below the
        sequence's length, where it is the latest snapshot at or before
        ``p`` (0 without one).  The engine reuses prefixes only up to it and
        evaluates the rest with the prompt: in the prompt's step, as a fresh
        evaluation would, where a replay would be a step of its own."""
        cdef int s = self.cache._check_seq(seq)
        p = _as_integer("the position", p)
        if not self.cache.hybrid or p >= self.cache.seq_length[s]:
            return p
        return self.snapshots.resume_point(s, p)

    def _replay(self, int s, tokens, bint generated):
        """Evaluate ``tokens`` again on sequence ``s`` (its logits are not wanted)."""
        step = DECODE_KERNEL_COLUMNS if generated else self.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            self.decode(chunk, [s] * len(chunk), None, False, generated)
        self.n_replayed += len(tokens)

    def _snapshot_before(self, present, counts, bint generated):
        """Keep sequences' recurrent states before a step gives them several
        tokens (a prompt, or generated guesses to verify), which a rewind
        into them restores; at most max_snapshots a sequence besides the
        kept ones, the oldest dropped."""
        if self.snapshots.max_transient <= 0:
            return
        for q, c in zip(present, counts):
            if c >= 2:
                self.snapshots.take(self.cache, int(q), generated, False)

    @property
    def max_snapshots(self):
        """Transient snapshots kept a sequence (:meth:`_snapshot_before`)."""
        return self.snapshots.max_transient

    @max_snapshots.setter
    def max_snapshots(self, int n):
        self.snapshots.max_transient = n

    def keep_snapshot(self, seq):
        """Keep sequence ``seq``'s recurrent state where it ends now (the end of
        a prompt or of a generation) until :meth:`drop_snapshot`: a later
        prompt that parts from the sequence after this point resumes here."""
        self._check_idle()
        cdef int s = self.cache._check_seq(seq)
        if self.cache.hybrid and self.cache.seq_length[s] > 0:
            self.snapshots.take(self.cache, s, False, True)

    def kept_snapshots(self):
        """``[(last used, seq, position, bytes), ...]`` of every kept snapshot;
        states shared by forked sequences count once, under the first."""
        return self.snapshots.kept()

    def drop_snapshot(self, seq, p):
        """Forget sequence ``seq``'s snapshot at position ``p``, if any."""
        cdef int s = self.cache._check_seq(seq)
        self.snapshots.drop(s, p)

    def snapshot_state(self, seq, p):
        """The state of sequence ``seq``'s first ``p`` positions, as
        :meth:`seq_state` would have given it when the sequence ended at
        ``p``: their K and V, and the recurrent state of the kept snapshot
        at ``p`` (None when there is none)."""
        self._check_idle()
        cdef int s = self.cache._check_seq(seq)
        p = _as_integer("the position", p)
        if not self.cache.hybrid or not 0 < p <= self.cache.seq_length[s]:
            return None
        if p == self.cache.seq_length[s]:
            return self.seq_state(s)
        state = self.snapshots.state_at(s, p)
        if state is None:
            return None
        return np.concatenate([_read_seq_state(self.cache, s, p), state])

    @property
    def snapshot_bytes(self):
        """The memory the snapshots of recurrent states hold."""
        return self.snapshots.nbytes()

    def step_ops(self):
        """{op: count} of the graph the last step ran (ggml_op_desc names; elelem's
        own kernels are CUSTOM): which kernels the graph builder chose."""
        self._check_open()
        counts = {}
        if not self.graph_ready:
            return counts
        cdef int i
        for i in range(ggml_graph_n_nodes(self.graph_step.gf)):
            name = ggml_op_desc(ggml_graph_node(self.graph_step.gf, i)).decode()
            counts[name] = counts.get(name, 0) + 1
        return counts

    # -- states ----------------------------------------------------------------

    def seq_state(self, seq, n=None):
        """K and V of sequence ``seq``'s first ``n`` positions (all by default)
        as a uint8 array of ``n * cache.bytes_per_cell`` bytes (layout: kv_state.pxi)."""
        self._check_idle()
        cdef int s = self.cache._check_seq(seq)
        length = self.cache.seq_length[s]
        count = length if n is None else _as_integer("the number of positions", n)
        if not 0 <= count <= length:
            raise errors.InvalidArgumentError(f"sequence {s} holds {length} positions; cannot read {count}")
        if not self.cache.hybrid:
            return _read_seq_state(self.cache, s, count)
        # A hybrid model's state also holds the recurrent state, which is that
        # of the sequence's last position: so all of it, or nothing.
        if count != length:
            raise errors.InvalidArgumentError(f"a hybrid model's state is a whole sequence's ({length} positions), "
                                              f"not its first {count}")
        return np.concatenate([_read_seq_state(self.cache, s, count), self.cache.recurrent_state(s)])

    def seq_load(self, seq, tokens, state, stored=None):
        """Give empty sequence ``seq`` the first ``len(tokens)`` positions of
        ``state`` (from :meth:`seq_state`, of ``stored`` positions: by default
        ``len(tokens)``); ``tokens`` are the ids they hold."""
        self._check_idle()
        cdef int s = self.cache._check_seq(seq)
        ids = _checked_ids(tokens, self.model.hp.n_vocab) if len(tokens) else np.empty(0, dtype=np.int32)
        count = len(ids) if stored is None else _as_integer("the number of positions stored", stored)
        data = memoryview(state).cast("B")
        if not self.cache.hybrid:
            _load_seq_state(self.cache, s, ids, data, count)
            return
        if len(ids) != count:
            raise errors.InvalidArgumentError(f"a hybrid model loads a state whole ({count} positions), "
                                              f"not its first {len(ids)}")
        cells = <size_t> count * self.cache.bytes_per_cell
        if len(data) != cells + self.cache.state_bytes:
            raise errors.InvalidArgumentError(f"a state of {count} positions is {cells + self.cache.state_bytes:,} "
                                              f"bytes for this model, got {len(data):,}")
        _load_seq_state(self.cache, s, ids, data[:cells], count)
        self.cache.set_recurrent_state(s, np.frombuffer(data[cells:], dtype=np.uint8))
        self.snapshots.clear(s)

    cdef void _check_idle(self) except *:
        self._check_open()
        if self.busy:
            raise errors.InvalidArgumentError("a step is running on this context")

    cdef void _compute(self) except *:
        cdef ggml_status status
        cdef int watching = _threading.current_thread() is _threading.main_thread()  # signals reach the main thread
        self.abort_flag = 0
        if watching:   # (the GIL kept: letting it go costs a wait for it back when other threads run Python)
            watching = elelem_sigint_watch()
        try:
            if self.rpc_timeout > 0:
                status = <ggml_status> self._sched_call(self.graph_step.gf, 0, "computing a step")
            else:
                with nogil:
                    status = ggml_backend_sched_graph_compute(self.sched, self.graph_step.gf)
        finally:
            if watching:
                elelem_sigint_unwatch()
        if status == GGML_STATUS_ABORTED:
            PyErr_CheckSignals()  # raises the pending KeyboardInterrupt, if Ctrl-C was the cause
        _check_status(status, "computing a step")
