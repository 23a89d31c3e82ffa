# Laguna (Poolside), after llama.cpp's laguna graph (src/models/laguna.cpp),
# op for op: per-head Q/K RMSNorm; each layer its own head count
# (LayerShape.n_head); full-attention layers turn by the model's RoPE (YaRN
# where the file says), sliding-window ones by plain RoPE of their own base
# and width; the attention's output, before attn_output, times softplus of
# a projection of the layer's normed input, one gate per head (XS.2,
# broadcast over the head) or per element (M.1); then the FFN of
# graph/experts.pxi: leading dense layers, sigmoid-routed experts with a
# selection bias plus one shared expert.

cdef inline ggml_tensor * _laguna_rope(Step * st, ggml_tensor * x, bint swa, int n_rot) noexcept:
    """RoPE of (head_dim, n_heads, n_tokens) at inp_pos.  A sliding-window
    layer's is plain: laguna.cpp zeroes YaRN's ext_factor and betas there, with
    attn_factor 1, freq_scale rope_freq_scale_train_swa (1) and the trained
    context as n_ctx_orig."""
    cdef const HParams * hp = st.hp
    if not swa:
        return rope_dims(st, x, n_rot, hp.rope_base, hp.rope_scale, NULL)
    return ggml_rope_ext(st.ctx, x, st.inp_pos, NULL, n_rot, hp.rope_type, hp.n_ctx_train,
                         hp.rope_base_swa, hp.rope_scale_swa, 0.0, 1.0, 0.0, 0.0)


cdef inline ggml_tensor * _laguna_gate(Step * st, ggml_tensor * attn, ggml_tensor * gate, int n_head,
                                       int head_dim) noexcept:
    """attn (head_dim * n_head, n) times softplus(gate): gate (n_head, n), one
    value a head broadcast over its head_dim values, or (head_dim * n_head, n)."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n = attn.ne[1]
    gate = ggml_softplus(ctx, gate)
    if gate.ne[0] != n_head:
        return ggml_mul(ctx, attn, gate)
    attn = ggml_mul(ctx, ggml_reshape_3d(ctx, attn, head_dim, n_head, n), ggml_reshape_3d(ctx, gate, 1, n_head, n))
    return ggml_reshape_2d(ctx, attn, <int64_t> head_dim * n_head, n)


cdef ggml_tensor * build_laguna(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef const LayerShape * shape
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef ggml_tensor * gate
    cdef bint swa
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        shape = &m.shapes[il]
        swa = m.swa_layers[il] != 0
        h = norm_rms(st, x, lw.attn_norm)
        q = linear(st, lw.wq, lw.bq, h)
        k = linear(st, lw.wk, lw.bk, h)
        v = linear(st, lw.wv, lw.bv, h)
        gate = linear(st, lw.attn_out_gate, NULL, h)   # from the layer's normed input, not its attention
        q = norm_rms(st, ggml_reshape_3d(ctx, q, hp.head_dim_k, shape.n_head, st.n_tokens), lw.q_norm)
        k = norm_rms(st, ggml_reshape_3d(ctx, k, hp.head_dim_k, hp.n_head_kv, st.n_tokens), lw.k_norm)
        q = _laguna_rope(st, q, swa, shape.n_rot)
        k = _laguna_rope(st, k, swa, shape.n_rot)
        h = attention(st, cache, il, q, k, v, st.inp_mask_swa if swa else st.inp_mask, hp.attn_scale)
        h = linear(st, lw.wo, NULL, _laguna_gate(st, h, gate, shape.n_head, hp.head_dim_v))
        if il == hp.n_layer - 1:
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = ggml_add(ctx, h, x)
        h = ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm))
        x = ggml_add(ctx, h, x)
    x = norm_rms(st, x, m.output_norm)
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


_register_builder("laguna", build_laguna)
