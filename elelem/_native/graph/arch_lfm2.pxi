# Liquid LFM2 / LFM2.5 (lfm2) and LFM2 with experts (lfm2moe): short gated
# convolution layers beside attention layers.  Written after llama.cpp's
# lfm2 graph (src/models/lfm2.cpp, which lfm2moe's shares) op for op:
# - a convolution layer projects its normed input to B, C and x (n_embd
#   each), convolves B*x causally over the last shortconv_l_cache positions
#   (ggml_ssm_conv, one kernel per channel), and projects C times that back
#   (build_shortconv_block);
# - an attention layer: per-head RMS norms on Q and K, NEOX RoPE, no biases;
# - every layer then the dense SwiGLU FFN, or (lfm2moe, from
#   n_layer_dense_lead on) the experts, routed by a sigmoid with a selection
#   bias (graph/experts.pxi);
# - the unwanted rows are dropped in the last layer before its residual add.
#
# A step's tokens are n_seqs sequences of the same count, sequence after
# sequence (Context.decode arranges that): the convolution sees them as
# (channels, tokens per sequence, sequences), each sequence's state read
# from its slot in the cache's recurrent store and written to the other one.


cdef ggml_tensor * _short_conv(Step * st, KVCache cache, int il, LayerWeights * lw, ggml_tensor * x) noexcept:
    """One convolution layer on x (n_embd, n_tokens): (n_embd, n_tokens), its
    sequences' convolution states read and written in the cache."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_seqs = st.n_seqs
    cdef int64_t per = st.n_tokens // n_seqs                 # tokens of each sequence
    cdef int64_t e = hp.n_embd
    cdef int64_t keep = hp.shortconv_l_cache - 1             # the state's columns
    # The input projection over the step's tokens as one 2-D batch, where
    # llama.cpp multiplies a 3-D one: the same numbers per column through
    # elelem's matmul (see _delta_net in arch_qwen35.pxi on AMX).
    cdef ggml_tensor * bcx = ggml_reshape_3d(ctx, linear(st, lw.shortconv_in_proj, NULL, x), 3 * e, per, n_seqs)
    cdef size_t el = ggml_element_size(bcx)
    cdef ggml_tensor * b = ggml_view_3d(ctx, bcx, e, per, n_seqs, bcx.nb[1], bcx.nb[2], 0)
    cdef ggml_tensor * c = ggml_view_3d(ctx, bcx, e, per, n_seqs, bcx.nb[1], bcx.nb[2], e * el)
    cdef ggml_tensor * xs = ggml_view_3d(ctx, bcx, e, per, n_seqs, bcx.nb[1], bcx.nb[2], 2 * e * el)
    cdef ggml_tensor * bx = ggml_transpose(ctx, ggml_mul(ctx, b, xs))      # (per, n_embd, n_seqs)

    # Each sequence's last `keep` values of B*x, then this step's; the last
    # `keep` columns of that are the new state.
    cdef ggml_tensor * conv = ggml_reshape_3d(ctx, ggml_get_rows(ctx, cache.r[il], st.inp_rs_read), keep, e, n_seqs)
    conv = ggml_concat(ctx, conv, bx, 0)                                   # (keep + per, n_embd, n_seqs)
    cdef ggml_tensor * kept = ggml_view_3d(ctx, conv, keep, e, n_seqs, conv.nb[1], conv.nb[2],
                                           ggml_row_size(conv.type, per))
    ggml_build_forward_expand(st.gf, ggml_set_rows(ctx, cache.r[il], ggml_cont_2d(ctx, kept, keep * e, n_seqs),
                                                   st.inp_rs_write))
    cdef ggml_tensor * y = ggml_mul(ctx, c, ggml_ssm_conv(ctx, conv, lw.shortconv_conv))   # (n_embd, per, n_seqs)
    return linear(st, lw.shortconv_out_proj, NULL, ggml_reshape_2d(ctx, y, e, st.n_tokens))


cdef ggml_tensor * _lfm2_attention(Step * st, KVCache cache, int il, LayerWeights * lw, ggml_tensor * x) noexcept:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * q = ggml_reshape_3d(ctx, linear(st, lw.wq, NULL, x), hp.head_dim_k, hp.n_head, st.n_tokens)
    cdef ggml_tensor * k = ggml_reshape_3d(ctx, linear(st, lw.wk, NULL, x), hp.head_dim_k, hp.n_head_kv,
                                           st.n_tokens)
    cdef ggml_tensor * v = linear(st, lw.wv, NULL, x)
    q = rope(st, norm_rms(st, q, lw.q_norm), hp.rope_base, hp.rope_scale, NULL)
    k = rope(st, norm_rms(st, k, lw.k_norm), hp.rope_base, hp.rope_scale, NULL)
    return linear(st, lw.wo, NULL, attention(st, cache, il, q, k, v, st.inp_mask, hp.attn_scale))


cdef ggml_tensor * build_lfm2(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        h = norm_rms(st, x, lw.attn_norm)
        if m.recurrent_layers[il]:
            h = _short_conv(st, cache, il, lw, h)
        else:
            h = _lfm2_attention(st, cache, il, lw, h)
        if il == hp.n_layer - 1:
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = ggml_add(ctx, x, h)
        h = ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm))
        x = ggml_add(ctx, x, h)
    x = norm_rms(st, x, m.output_norm)
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


# lfm2moe runs through it too: what differs is in its weights (the experts).
_register_builder("lfm2", build_lfm2)
