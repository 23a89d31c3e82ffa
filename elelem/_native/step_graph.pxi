# A Context's step graph: reused while a step has the same shape (_graph_for),
# else built again in the context's metadata arena (_build_graph) and laid out
# from the step's rows: the runs of one sequence's tokens, the rows a one-token
# step would split under flash attention, the feature layers an EAGLE-3 head
# reads.  Included into core.pyx after context.pxi.


cdef bint _one_token_splits(KVCache cache, int n, int used_before, const int32_t * cells,
                            const int32_t * positions, int * split_kv) noexcept:
    """For a step of n generated tokens: whether any would, decoded in a step
    of its own, have ggml's flash attention split its cells between the
    threads (one query row, FA_SPLIT_CELLS cells or more, and no
    pair_lone_row); split_kv[i] gets that step's n_kv (0 where it would not
    split).  Its step would have seen the cells used before this one and
    those of the rows before it."""
    cdef int i, used = used_before, n_kv
    cdef bint any_split = False
    for i in range(n):
        used = max(used, cells[i] + 1)
        n_kv = min(cache.kv_size, ((used + KV_PAD - 1) // KV_PAD) * KV_PAD)
        split_kv[i] = 0
        if n_kv >= FA_SPLIT_CELLS and ((positions[i] + KV_PAD) // KV_PAD) * KV_PAD >= FA_SPLIT_CELLS:
            split_kv[i] = n_kv
            any_split = True
    return any_split


cdef int _sequence_runs(int n, const int32_t * seqs, int * run_length) noexcept:
    """The lengths of the runs of one sequence's tokens in a step, when there
    are 2 to MAX_RUNS of them; else 0 (the step is not split)."""
    cdef int i, runs = 1
    run_length[0] = 1
    for i in range(1, n):
        if seqs[i] == seqs[i - 1]:
            run_length[runs - 1] += 1
        elif runs == MAX_RUNS:
            return 0
        else:
            run_length[runs] = 1
            runs += 1
    return runs if runs > 1 else 0


cdef ggml_tensor * _concat_features(Step * st) except NULL:
    """The recorded inputs of the feature layers, side by side (Step.feature_layers)."""
    cdef ggml_tensor * out = NULL
    cdef int k
    for k in range(st.n_feature_layers):
        if st.feature_inputs[k] == NULL:
            raise errors.InvalidArgumentError("this model's graph does not give its layers' inputs")
        out = st.feature_inputs[k] if out == NULL else ggml_concat(st.ctx, out, st.feature_inputs[k], 0)
    return out


cdef Step * _graph_for(Context c, int n_tokens, int n_kv, int n_outputs, bint embeddings,
                       bint decode_kernels, const int32_t * seqs, int n_seqs=0,
                       bint pair_lone_row=False, const int * split_kv=NULL,
                       const int32_t * out_rows=NULL, bint rank=False, int lora_mask=0,
                       bint want_hidden=False, bint embd_input=False) except NULL:
    """The graph of a step of this shape: the last step's while the shape is
    the same (rebuilding and allocating it costs more than a small step), else
    one built and allocated anew."""
    cdef Step * st = &c.graph_step
    cdef int n_runs = 0
    cdef int run_length[MAX_RUNS]
    cdef int n_out_runs = 0
    cdef int out_run_length[MAX_RUNS]
    cdef int32_t * out_seqs
    cdef int i
    cdef bint split_rows = split_kv != NULL
    if not decode_kernels:
        n_runs = _sequence_runs(n_tokens, seqs, run_length)
        if n_runs > 1 and out_rows != NULL and n_outputs < n_tokens:
            # the sequences of the output rows, in their order (graph/blocks.pxi: Step.out_run_length)
            out_seqs = <int32_t *> malloc(n_outputs * sizeof(int32_t))
            if out_seqs == NULL:
                raise MemoryError()
            for i in range(n_outputs):
                out_seqs[i] = seqs[out_rows[i]]
            n_out_runs = _sequence_runs(n_outputs, out_seqs, out_run_length)
            free(out_seqs)
    if c.graph_ready and st.n_tokens == n_tokens and st.n_kv == n_kv and st.n_outputs == n_outputs \
            and st.embeddings == embeddings and st.rank == rank and st.decode_kernels == decode_kernels \
            and st.n_runs == n_runs \
            and st.n_seqs == n_seqs and st.pair_lone_row == pair_lone_row \
            and memcmp(st.run_length, run_length, n_runs * sizeof(int)) == 0 \
            and st.n_out_runs == n_out_runs \
            and memcmp(st.out_run_length, out_run_length, n_out_runs * sizeof(int)) == 0 \
            and st.split_rows == split_rows and st.lora_mask == lora_mask \
            and st.want_hidden == want_hidden and st.embd_input == embd_input \
            and (not split_rows or memcmp(st.split_kv, split_kv, n_tokens * sizeof(int)) == 0):
        return st
    c._drop_graph()
    memset(st, 0, sizeof(Step))
    st.n_tokens = n_tokens
    st.n_kv = n_kv
    st.n_outputs = n_outputs
    st.embeddings = embeddings
    st.rank = rank
    st.decode_kernels = decode_kernels
    st.n_runs = n_runs
    st.n_seqs = n_seqs
    st.pair_lone_row = pair_lone_row
    memcpy(st.run_length, run_length, n_runs * sizeof(int))
    st.n_out_runs = n_out_runs
    memcpy(st.out_run_length, out_run_length, n_out_runs * sizeof(int))
    st.split_rows = split_rows
    st.lora_mask = lora_mask
    st.want_hidden = want_hidden
    st.embd_input = embd_input
    if split_rows:
        memcpy(st.split_kv, split_kv, n_tokens * sizeof(int))
    _build_graph(c, st)
    if not c._sched_call(st.gf, 1, "allocating a step's graph"):
        c._drop_graph()
        raise MemoryError("ggml could not allocate the compute graph")
    c.graph_ready = True
    return st


cdef ggml_cgraph * _build_graph(Context c, Step * st) except NULL:
    """Step ``st``'s graph, in the context's metadata arena, from the model's builder."""
    cdef ggml_init_params p
    cdef int j
    p.mem_size = c.graph_meta_size
    p.mem_buffer = c.graph_meta
    p.no_alloc = True
    st.ctx = ggml_init(p)
    if st.ctx == NULL:
        raise MemoryError()
    st.gf = ggml_new_graph_custom(st.ctx, c.graph_size, False)
    st.hp = &c.model.hp
    st.widened = &c.model.widened
    st.kv_size = c.cache.kv_size
    st.v_row = c.cache.v_row
    st.flash_attn = c.flash_attn
    st.target_tok_embd = c.target.model.tok_embd if c.target is not None else NULL
    st.n_lora = 0
    for j in range(c.n_adapters):
        if st.lora_mask & (1 << j):
            st.lora[st.n_lora] = c.adapter_weights[j]
            st.lora_id[st.n_lora] = j
            st.n_lora += 1
    _make_inputs(st)
    if st.want_hidden:
        st.n_feature_layers = len(c.feature_layers)
        for j in range(st.n_feature_layers):
            st.feature_layers[j] = c.feature_layers[j]
    st.logits = _builders[c.model.builder_id](c.model, c.cache, st)
    if st.n_feature_layers:
        st.hidden = _concat_features(st)
    if st.rank:
        st.logits = rank_head(st, c.model, st.logits)
    ggml_set_output(st.logits)
    ggml_build_forward_expand(st.gf, st.logits)
    if st.want_hidden:
        if st.hidden == NULL:
            raise errors.InvalidArgumentError("this model's graph does not give its rows' hidden states")
        ggml_set_output(st.hidden)
        ggml_build_forward_expand(st.gf, st.hidden)
    return st.gf
