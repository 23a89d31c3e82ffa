# LoRA adapters in the graph, included into core.pyx after matmul.pxi.
# Written to follow llama.cpp's build_lora_mm, build_lora_mm_id and
# build_inp_embd (llama-graph.cpp) op for op: a weight's product first (and
# its per-expert scale), then for each adapter that adapts the weight
#     y = y + scale * B(A x)
# with scale = alpha ? user_scale * alpha / rank : user_scale (lora_scale,
# adapter.pxi), then the caller's bias.
#
# The scale is a row's own: an input of one number per row of the step
# (Step.lora_scale), so that sequences with different adapters, or one
# adapter at different scales, share a step.  llama.cpp multiplies by one
# scale (ggml_scale); ggml_mul by each row's is the same float product, and a
# row whose scale is 0 adds 0: its numbers are those of a step without the
# adapter.  A and B go through matmul(), which keeps each row's numbers those
# of its own step (graph/matmul.pxi: LoRA factors, MatmulCase.adapter).


cdef inline bint _lora_rows_known(Step * st, int64_t n) noexcept:
    """Whether a product of n columns is one of the step's rows each (its
    tokens, or its output rows past select_outputs), whose scales the step has."""
    return n == (st.n_outputs if st.output_rows else st.n_tokens)


cdef ggml_tensor * _lora_row_scales(Step * st, int j, int rank_slot, int64_t n, bint experts) noexcept:
    """Adapter j's scale for each of n rows from st.lora_row0 (of the output
    rows past select_outputs): (1, n), or (1, 1, n) for expert products."""
    cdef int k = j * MAX_ADAPTER_RANKS + rank_slot
    cdef ggml_tensor * s = st.lora_scale[k]
    if st.output_rows and st.inp_out_ids != NULL:
        if st.lora_scale_out[k] == NULL:
            st.lora_scale_out[k] = ggml_get_rows(st.ctx, s, st.inp_out_ids)   # (1, n_outputs)
        s = st.lora_scale_out[k]
    cdef size_t offset = <size_t> st.lora_row0 * s.nb[1]
    if experts:
        return ggml_view_3d(st.ctx, s, 1, 1, n, s.nb[1], s.nb[1], offset)
    return ggml_view_2d(st.ctx, s, 1, n, s.nb[1], offset)


cdef ggml_tensor * add_lora(Step * st, const ggml_tensor * w, ggml_tensor * x, ggml_tensor * y) noexcept:
    """y = x @ w, plus each of the step's adapters' product for w (build_lora_mm)."""
    cdef int j
    cdef const LoraPair * p
    cdef ggml_tensor * ab
    if x.ne[2] != 1 or x.ne[3] != 1 or not _lora_rows_known(st, x.ne[1]):
        return y
    for j in range(st.n_lora):
        p = lora_pair(st.lora[j], w)
        if p == NULL:
            continue
        ab = matmul(st, p.b, matmul(st, p.a, x))
        ab = ggml_mul(st.ctx, ab, _lora_row_scales(st, j, p.rank_slot, x.ne[1], False))
        y = ggml_add(st.ctx, y, ab)
    return y


cdef ggml_tensor * add_lora_id(Step * st, const ggml_tensor * w, ggml_tensor * x, ggml_tensor * ids,
                               ggml_tensor * y) noexcept:
    """y = the chosen experts of w times x (matmul_id), plus each adapter's
    product for those experts (build_lora_mm_id): x (n_in, 1 or n_used, n)
    of n rows from st.lora_row0."""
    cdef int j
    cdef const LoraPair * p
    cdef ggml_tensor * ab
    for j in range(st.n_lora):
        p = lora_pair(st.lora[j], w)
        if p == NULL:
            continue
        ab = matmul_id(st, p.b, matmul_id(st, p.a, x, ids), ids)
        ab = ggml_mul(st.ctx, ab, _lora_row_scales(st, j, p.rank_slot, x.ne[2], True))
        y = ggml_add(st.ctx, y, ab)
    return y


cdef ggml_tensor * add_lora_embedding(Step * st, ggml_tensor * x) noexcept:
    """The token embeddings x (n_embd, n_tokens) plus each adapter's (build_inp_embd):
    B times A's rows of the tokens."""
    cdef int j, i
    cdef const LoraPair * p
    cdef ggml_tensor * d
    for j in range(st.n_lora):
        for i in range(st.lora[j].n_pairs):
            p = &st.lora[j].pairs[i]
            if not p.embedding:
                continue
            d = matmul(st, p.b, ggml_get_rows(st.ctx, p.a, st.inp_tokens))
            d = ggml_mul(st.ctx, d, _lora_row_scales(st, j, p.rank_slot, st.n_tokens, False))
            x = ggml_add(st.ctx, x, d)
    return x


cdef void make_lora_inputs(Step * st) noexcept:
    """One F32 (1, n_tokens) input for each rank of each adapter of the step."""
    cdef int j, r, k
    for k in range(MAX_ADAPTERS * MAX_ADAPTER_RANKS):
        st.lora_scale[k] = st.lora_scale_out[k] = NULL
    for j in range(st.n_lora):
        for r in range(st.lora[j].n_ranks):
            k = j * MAX_ADAPTER_RANKS + r
            st.lora_scale[k] = ggml_new_tensor_2d(st.ctx, GGML_TYPE_F32, 1, st.n_tokens)
            ggml_set_input(st.lora_scale[k])


cdef void set_lora_inputs(Step * st, const int32_t * seqs, const float * seq_scales) except *:
    """Each row's scale of each adapter: seq_scales[seq * MAX_ADAPTERS + adapter]
    (the user's), as the adapter's pairs of each rank take it (lora_scale)."""
    if st.n_lora == 0:
        return
    cdef float * values = <float *> malloc(st.n_tokens * sizeof(float))
    cdef int j, r, i
    if values == NULL:
        raise MemoryError()
    try:
        for j in range(st.n_lora):
            for r in range(st.lora[j].n_ranks):
                for i in range(st.n_tokens):
                    values[i] = lora_scale(st.lora[j], r, seq_scales[seqs[i] * MAX_ADAPTERS + st.lora_id[j]])
                _set_input(st.lora_scale[j * MAX_ADAPTER_RANKS + r], values, st.n_tokens * sizeof(float))
    finally:
        free(values)
