# The Mamba-2 layer, and the attention layer without RoPE beside it, included
# into core.pyx after blocks.pxi: shared by the builders of the Mamba-2
# hybrids (Nemotron-H, Granite 4.0 H).  Written after
# llama.cpp's llm_build_mamba_base::build_mamba2_layer (src/models/
# mamba-base.cpp) op for op, with one ubatch's state per sequence (its K = 1:
# no rollback snapshots, which elelem keeps itself: snapshots.pxi).
#
# A step's tokens are n_seqs sequences of the same count, sequence after
# sequence (Context.decode arranges that): the layer sees them as (channels,
# tokens per sequence, sequences).  Each sequence's convolution state is a
# row of the cache's r[il], its scan state a row of s[il] (the recurrent
# store, KVCache.rs_slot): read from its current slot, written to the other.


cdef ggml_tensor * mamba2_layer(Step * st, KVCache cache, int il, LayerWeights * lw, ggml_tensor * x) noexcept:
    """One Mamba-2 layer on x (n_embd, n_tokens), normed: (n_embd, n_tokens)."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_seqs = st.n_seqs
    cdef int64_t per = st.n_tokens // n_seqs                     # tokens of each sequence
    cdef int64_t d_inner = hp.ssm_d_inner, d_state = hp.ssm_d_state, n_group = hp.ssm_n_group
    cdef int64_t n_head = hp.ssm_dt_rank, head_dim = hp.ssm_d_inner // hp.ssm_dt_rank
    cdef int64_t channels = d_inner + 2 * n_group * d_state      # xBC
    cdef int64_t keep = hp.ssm_d_conv - 1                        # the convolution state's columns

    # z, xBC and dt of each token, from one 2-D product as llama.cpp's.
    cdef ggml_tensor * zxbcdt = linear(st, lw.mamba_in, NULL, x)
    zxbcdt = ggml_reshape_3d(ctx, zxbcdt, zxbcdt.ne[0], per, n_seqs)
    cdef size_t el = ggml_element_size(zxbcdt)
    cdef ggml_tensor * z = ggml_view_4d(ctx, zxbcdt, head_dim, n_head, per, n_seqs, head_dim * el, zxbcdt.nb[1],
                                        zxbcdt.nb[2], 0)
    cdef ggml_tensor * xbc = ggml_view_3d(ctx, zxbcdt, channels, per, n_seqs, zxbcdt.nb[1], zxbcdt.nb[2],
                                          d_inner * el)
    cdef ggml_tensor * dt = ggml_view_3d(ctx, zxbcdt, n_head, per, n_seqs, zxbcdt.nb[1], zxbcdt.nb[2],
                                         (d_inner + channels) * el)

    # The convolution: each sequence's last `keep` inputs, then this step's;
    # the last `keep` columns of that are the new state.
    cdef ggml_tensor * conv = ggml_reshape_3d(ctx, ggml_get_rows(ctx, cache.r[il], st.inp_rs_read),
                                              keep, channels, n_seqs)
    conv = ggml_concat(ctx, conv, ggml_transpose(ctx, xbc), 0)              # (keep + per, channels, n_seqs)
    cdef ggml_tensor * kept = ggml_view_3d(ctx, conv, keep, channels, n_seqs, conv.nb[1], conv.nb[2],
                                           ggml_row_size(conv.type, per))
    ggml_build_forward_expand(st.gf, ggml_set_rows(ctx, cache.r[il], ggml_cont_2d(ctx, kept, keep * channels,
                                                                                   n_seqs), st.inp_rs_write))
    xbc = ggml_silu(ctx, ggml_add(ctx, ggml_ssm_conv(ctx, conv, lw.ssm_conv1d), lw.mamba_conv_b))

    # The scan: x per head, B and C per group (V, K and Q of the state-space
    # duality), from each sequence's state in its slot of s[il].
    cdef size_t row = xbc.nb[1]
    cdef ggml_tensor * xs = ggml_view_4d(ctx, xbc, head_dim, n_head, per, n_seqs, head_dim * el, row, xbc.nb[2], 0)
    cdef ggml_tensor * b = ggml_view_4d(ctx, xbc, d_state, n_group, per, n_seqs, d_state * el, row, xbc.nb[2],
                                        d_inner * el)
    cdef ggml_tensor * c = ggml_view_4d(ctx, xbc, d_state, n_group, per, n_seqs, d_state * el, row, xbc.nb[2],
                                        (d_inner + n_group * d_state) * el)
    dt = ggml_add(ctx, ggml_cont(ctx, dt), lw.ssm_dt)                       # (n_head, per, n_seqs)
    cdef ggml_tensor * states = ggml_reshape_4d(ctx, cache.s[il], d_state, head_dim, n_head, cache.s[il].ne[1])
    # The outputs (head_dim, n_head, per, n_seqs), then each sequence's final state.
    cdef ggml_tensor * scan = ggml_ssm_scan(ctx, states, xs, dt, lw.mamba_a, b, c, st.inp_rs_read, 1)
    cdef int64_t state_floats = d_state * d_inner
    cdef size_t out_bytes = <size_t> ggml_nelements(xs) * ggml_element_size(xs)
    ggml_build_forward_expand(st.gf, ggml_set_rows(
        ctx, cache.s[il], ggml_view_2d(ctx, scan, state_floats, n_seqs, ggml_row_size(scan.type, state_floats),
                                       out_bytes), st.inp_rs_write))
    cdef size_t hrow = ggml_row_size(scan.type, head_dim)
    cdef ggml_tensor * y = ggml_view_4d(ctx, scan, head_dim, n_head, per, n_seqs, hrow, n_head * hrow,
                                        per * n_head * hrow, 0)

    # Skip, gate, grouped RMS norm, output projection.
    y = ggml_add(ctx, y, ggml_mul(ctx, xs, lw.mamba_d))
    y = ggml_swiglu_split(ctx, ggml_cont(ctx, z), y)
    y = norm_rms(st, ggml_reshape_4d(ctx, y, d_inner // n_group, n_group, per, n_seqs), lw.mamba_norm)
    return linear(st, lw.ssm_out, NULL, ggml_reshape_2d(ctx, y, d_inner, st.n_tokens))


cdef ggml_tensor * attention_without_rope(Step * st, KVCache cache, int il, LayerWeights * lw,
                                          ggml_tensor * x) noexcept:
    """The Mamba-2 hybrids' attention layer on x (n_embd, n_tokens): Q, K and V
    projected separately (optional biases), no positional encoding (their
    Mamba-2 layers order the tokens), Q.K times attn_scale."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * q = ggml_reshape_3d(ctx, linear(st, lw.wq, lw.bq, x), hp.head_dim_k, hp.n_head, st.n_tokens)
    cdef ggml_tensor * k = ggml_reshape_3d(ctx, linear(st, lw.wk, lw.bk, x), hp.head_dim_k,
                                           cache.shapes[il].n_head_kv, st.n_tokens)
    cdef ggml_tensor * v = linear(st, lw.wv, lw.bv, x)
    return linear(st, lw.wo, lw.bo, attention(st, cache, il, q, k, v, st.inp_mask, hp.attn_scale))
