# A drafter that reads its target's cache (a Gemma 4 drafter, llama.cpp's
# create_memory share callback): whether its layers fit the target's, and its
# steps, which attend over the target's cells and store nothing.  Included into
# core.pyx after context.pxi.


cdef void _check_beside(Model model, Context target) except *:
    """A drafter's layers read its target's cache as llama.cpp's Gemma 4
    drafter does (create_memory's share callback): a sliding layer the
    target's second-to-last layer, which must slide too, a global layer the
    last, which must not; the head widths and KV head counts the same
    (llama.cpp views the target's cells with the drafter's own)."""
    target._check_open()
    if model.hp.n_embd_out != target.model.hp.n_embd or not model.hp.mtp_head:
        raise errors.ModelShapeError(f"this drafter takes hidden states {model.hp.n_embd_out} wide; "
                                     f"its target's are {target.model.hp.n_embd}")
    if target.n_backends > 1:   # its cells would live on a device this context has no backend for
        raise errors.InvalidArgumentError("a drafter sharing its target's cache runs beside a model on the "
                                          "CPU alone, for now")
    if target.cache.hybrid or target.model.hp.n_layer < 2:
        raise errors.ModelShapeError("a drafter sharing its target's cache needs a target of 2 or more "
                                     "attention layers and no recurrent ones")
    cdef int il, src
    cdef int n_target = target.model.hp.n_layer
    for il in range(model.hp.n_layer):
        src = n_target - 2 if model.swa_layers[il] else n_target - 1
        if (target.model.swa_layers[src] != 0) != (model.swa_layers[il] != 0) \
                or target.cache.shapes[src].head_dim_k != model.shapes[il].head_dim_k \
                or target.cache.shapes[src].head_dim_v != model.shapes[il].head_dim_v \
                or model.shapes[il].n_head_kv != target.cache.shapes[src].n_head_kv:
            raise errors.ModelShapeError(
                f"drafter layer {il} ({'sliding' if model.swa_layers[il] else 'global'}, heads "
                f"{model.shapes[il].head_dim_k} wide) cannot read its target's layer {src} "
                f"({'sliding' if target.model.swa_layers[src] else 'global'}, heads "
                f"{target.cache.shapes[src].head_dim_k} wide, {target.cache.shapes[src].n_head_kv} KV heads)")


cdef object _draft_step(Context c, tokens, seq_ids, positions, hidden_in):
    """Context.draft_step: every row's logits, and ``last_hidden`` every row's hidden state."""
    c._check_open()
    if c.target is None:
        raise errors.InvalidArgumentError("draft_step is for a drafter sharing its target's cache")
    c.target._check_open()
    if c.busy or c.target.busy:
        raise errors.InvalidArgumentError("a step is already running on this context or its target")
    c.last_hidden = None
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] ids = _checked_ids(tokens, c.model.hp.n_vocab)
    cdef int n = ids.shape[0]
    if n > c.n_batch:
        raise errors.InvalidArgumentError(f"a step takes at most n_batch={c.n_batch} tokens, got {n}")
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] seqs = _checked_seq_ids(seq_ids, n, c.cache.n_seq_max)
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] pos = np.ascontiguousarray(positions, dtype=np.int32)
    if pos.ndim != 1 or pos.shape[0] != n or pos.min() < 0:
        raise errors.InvalidArgumentError(f"need one position (>= 0) per token ({n}), got {positions!r}")
    cdef cnp.ndarray h_in = _checked_hidden(hidden_in, n, &c.model.hp)
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] rows = np.arange(n, dtype=np.int32)
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] cells = np.zeros(n, dtype=np.int32)  # nothing is stored
    cdef int n_kv = c.cache.n_kv()
    cdef bint pair_lone_row = (c.flash_attn and n == 1 and n_kv >= FA_SPLIT_CELLS
                               and ((pos[0] + KV_PAD) // KV_PAD) * KV_PAD < FA_SPLIT_CELLS)
    cdef Step * st
    c.busy = True
    try:
        st = _graph_for(c, n, n_kv, n, False, n == 1, &seqs[0], 0, pair_lone_row, NULL, &rows[0],
                        False, 0, True, False)
        _set_inputs(st, c.cache, &ids[0], &seqs[0], &pos[0], &cells[0], &rows[0])
        _set_input(st.inp_h, cnp.PyArray_DATA(h_in), ggml_nbytes(st.inp_h))
        c._compute()
    finally:
        c.busy = False
    out = np.empty((n, c.model.hp.n_vocab), dtype=np.float32)
    ggml_backend_tensor_get(st.logits, cnp.PyArray_DATA(out), 0, ggml_nbytes(st.logits))
    hidden = np.empty((n, hidden_width(&c.model.hp)), dtype=np.float32)
    ggml_backend_tensor_get(st.hidden, cnp.PyArray_DATA(hidden), 0, ggml_nbytes(st.hidden))
    c.last_hidden = hidden
    c.n_evaluated += n
    return out
