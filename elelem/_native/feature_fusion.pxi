# EAGLE-3's encoder (llama.cpp's llama_model_eagle3::graph<true>): the
# target's layer inputs, side by side, to the head's g.  No cache, no
# positions: a graph of one normed product, run on the head's context.

def eagle3_fuse(Context ctx, features):
    """g of each row of ``features``, (n, 3 * n_embd_target) float32: fc of
    the target's states (normed first where norm_before_fc), (n, n_embd)
    float32.  ``ctx`` is an EAGLE-3 head's context; n is 1 .. n_batch."""
    ctx._check_idle()
    cdef Model m = ctx.model
    cdef LayerWeights * lw = &m.layers[0]
    if lw.eagle3_fc == NULL:
        raise errors.InvalidArgumentError("this context's model is not an EAGLE-3 head")
    cdef cnp.ndarray x = np.ascontiguousarray(features, dtype=np.float32)
    cdef int64_t width = lw.eagle3_fc.ne[0]
    if x.ndim != 2 or x.shape[1] != width or not 1 <= x.shape[0] <= ctx.n_batch:
        raise errors.InvalidArgumentError(f"features must be (1 .. {ctx.n_batch}, {width}), got {np.shape(x)}")
    if not np.isfinite(x).all():
        raise errors.InvalidArgumentError("the features hold NaN or infinite values")
    cdef int n = x.shape[0]
    ctx._drop_graph()
    cdef Step * st = &ctx.graph_step
    memset(st, 0, sizeof(Step))
    cdef ggml_init_params p
    p.mem_size = ctx.graph_meta_size
    p.mem_buffer = ctx.graph_meta
    p.no_alloc = True
    st.ctx = ggml_init(p)
    if st.ctx == NULL:
        raise MemoryError()
    st.gf = ggml_new_graph_custom(st.ctx, ctx.graph_size, False)
    st.hp = &m.hp
    st.widened = &m.widened
    st.n_tokens = st.n_outputs = n
    st.flash_attn = ctx.flash_attn
    cdef ggml_tensor * inp = ggml_new_tensor_2d(st.ctx, GGML_TYPE_F32, width, n)
    ggml_set_input(inp)
    cdef ggml_tensor * cur = inp
    if m.hp.norm_before_fc:
        cur = norm_rms(st, cur, lw.eagle3_fc_norm)
    cur = linear(st, lw.eagle3_fc, NULL, cur)
    ggml_set_output(cur)
    ggml_build_forward_expand(st.gf, cur)
    st.logits = cur
    cdef cnp.ndarray out = np.empty((n, cur.ne[0]), dtype=np.float32)
    try:
        if not ctx._sched_call(st.gf, 1, "allocating the feature fusion's graph"):
            raise MemoryError("ggml could not allocate the feature fusion's graph")
        ggml_backend_tensor_set(inp, cnp.PyArray_DATA(x), 0, ggml_nbytes(inp))
        ctx.busy = True
        try:
            ctx._compute()
        finally:
            ctx.busy = False
        ggml_backend_tensor_get(cur, cnp.PyArray_DATA(out), 0, ggml_nbytes(cur))
    finally:
        ctx._drop_graph()   # not a step's graph: the next step builds its own
    return out
