# Multi-head latent attention (MLA), included into core.pyx after blocks.pxi:
# llama.cpp's absorbed form (llm_build_deepseek2 with build_attn's v_mla,
# over llm_graph_input_attn_k), which it runs for prompts and for decoding
# alike.  Each token caches one row, its normed latent (kv_lora_rank) then
# the RoPE part of K (n_rot), shared by every head; V is a view of the
# latent (KVCache.v_in_k).  Each head's no-RoPE query is taken into latent
# space by wk_b, so the attention runs as one KV head of kv_lora_rank +
# n_rot; the result, per head still latent, goes through wv_b to the head's
# V width.  elelem.model.archspec.mla checks the shapes.


cdef ggml_tensor * _per_head_product(Step * st, ggml_tensor * w, ggml_tensor * x) noexcept:
    """w (n_in, n_out, n_head) times x (n_in, n_tokens, n_head), head by
    head: (n_out, n_tokens, n_head), as llama.cpp's ggml_mul_mat of wk_b and
    of wv_b.  The CPU kernel of such a product depends on its width (vec_dot
    for one column, tinyBLAS or the tiled kernel for more), so where a
    step's rows stand for steps of their own each gets the numbers it would
    get there: a step of generated tokens takes one column per head and
    token (tokens along dim 3, which w broadcasts over), a prompt step of
    several sequences one product per sequence's run -- copied to a
    contiguous one where x is contiguous, since ggml's CPU mul_mat takes
    tinyBLAS for a contiguous F32 operand and vec_dot otherwise."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n = x.ne[1]
    cdef ggml_tensor * y
    cdef ggml_tensor * part
    cdef int r, start = 0, length
    cdef bint contiguous = ggml_is_contiguous(x)
    if st.decode_kernels and n >= 2:
        y = ggml_mul_mat(ctx, w, ggml_view_4d(ctx, x, x.ne[0], 1, x.ne[2], n, x.nb[1], x.nb[2], x.nb[1], 0))
        # (n_out, 1, n_head, n_tokens) -> (n_out, n_tokens, n_head)
        return ggml_permute(ctx, ggml_reshape_3d(ctx, y, y.ne[0], y.ne[2], n), 0, 2, 1, 3)
    if st.n_runs > 1 and n == st.n_tokens:
        y = NULL
        for r in range(st.n_runs):
            length = st.run_length[r]
            part = ggml_view_3d(ctx, x, x.ne[0], length, x.ne[2], x.nb[1], x.nb[2], <size_t> start * x.nb[1])
            part = ggml_mul_mat(ctx, w, ggml_cont(ctx, part) if contiguous else part)
            y = part if y == NULL else ggml_concat(ctx, y, part, 1)
            start += length
        return y
    return ggml_mul_mat(ctx, w, x)


cdef ggml_tensor * attention_mla(Step * st, KVCache cache, int il, ggml_tensor * q, ggml_tensor * latent,
                                 ggml_tensor * k_pe, ggml_tensor * wk_b, ggml_tensor * wv_b,
                                 float kq_scale) noexcept:
    """Store this step's latent and RoPE part in its cells, then attend over
    cells [0, n_kv), in the absorbed form.

    q: (head_dim_k, n_head, n_tokens), each head's no-RoPE part then its
    RoPE part, not yet rotated; latent: (kv_lora_rank, n_tokens), normed;
    k_pe: (n_rot, 1, n_tokens), rotated.  wk_b (head_dim_k - n_rot,
    kv_lora_rank, n_head), wv_b (kv_lora_rank, head_dim_v, n_head).
    Returns (head_dim_v * n_head, n_tokens).  The flash-attention and
    per-token paths are attention()'s (graph/blocks.pxi), over K's rows."""
    cdef ggml_context * ctx = st.ctx
    cdef const HParams * hp = st.hp
    cdef int64_t n_head = q.ne[1], n_rot = k_pe.ne[0], rank = latent.ne[0]
    cdef int64_t nope = q.ne[0] - n_rot, row = rank + n_rot
    cdef ggml_tensor * kc = cache.k[il]   # (kv_lora_rank + n_rot, kv_size)
    cdef ggml_tensor * vc = cache.v[il]   # its first kv_lora_rank values of each row

    cdef ggml_tensor * q_nope = ggml_view_3d(ctx, q, nope, n_head, st.n_tokens, q.nb[1], q.nb[2], 0)
    cdef ggml_tensor * q_pe = ggml_view_3d(ctx, q, n_rot, n_head, st.n_tokens, q.nb[1], q.nb[2],
                                           ggml_row_size(q.type, nope))
    q_pe = rope(st, q_pe, hp.rope_base, hp.rope_scale, NULL)
    # wk_b absorbed into Q: (nope, n_tokens, n_head) -> (kv_lora_rank, n_tokens, n_head)
    q = _per_head_product(st, wk_b, ggml_permute(ctx, q_nope, 0, 2, 1, 3))
    q = ggml_concat(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), q_pe, 0)   # (kv_lora_rank + n_rot, n_head, n_tokens)
    cdef ggml_tensor * k = ggml_concat(ctx, ggml_reshape_3d(ctx, latent, rank, 1, st.n_tokens), k_pe, 0)

    # The write is expanded first, so that it runs before the reads below.
    ggml_build_forward_expand(st.gf, ggml_set_rows(ctx, kc, ggml_reshape_2d(ctx, k, row, st.n_tokens),
                                                   st.inp_k_idx))
    cdef ggml_tensor * keys = ggml_view_3d(ctx, kc, row, st.n_kv, 1, kc.nb[1], kc.nb[1], 0)   # (row, n_kv, 1)
    cdef ggml_tensor * values
    cdef ggml_tensor * out
    q = ggml_permute(ctx, q, 0, 2, 1, 3)   # (row, n_tokens, n_head)
    if st.flash_attn:
        values = ggml_view_3d(ctx, kc, rank, st.n_kv, 1, kc.nb[1], kc.nb[1], 0)
        if st.split_rows or (st.decode_kernels and st.n_tokens >= FA_TILE_ROWS):
            out = _flash_attention_as_one_token_steps(st, q, kc, vc, row, rank, 1, st.inp_mask, kq_scale, NULL)
        elif st.n_runs > 1 and st.n_tokens >= FA_TILE_ROWS:
            out = _flash_attention_per_run(st, q, keys, values, st.inp_mask, kq_scale, NULL)
        elif st.pair_lone_row:
            out = _flash_attention_lone_row(st, q, keys, values, st.inp_mask, kq_scale, NULL)
        else:
            out = ggml_flash_attn_ext(ctx, q, keys, values, st.inp_mask, kq_scale, 0.0, 0.0)
        # (kv_lora_rank, n_head, n_tokens) -> (kv_lora_rank, n_tokens, n_head), as llama.cpp permutes it
        out = ggml_permute(ctx, ggml_reshape_3d(ctx, out, rank, n_head, st.n_tokens), 0, 2, 1, 3)
    else:
        # V transposed for a plain mul_mat: copied out of K's rows each step, as llama.cpp
        # does for a V that is a view of K (build_attn_mha's ggml_cont of the transpose)
        values = ggml_cont(ctx, ggml_transpose(ctx, ggml_view_2d(ctx, kc, rank, st.n_kv, kc.nb[1], 0)))
        if st.decode_kernels and st.n_tokens >= 2:
            out = _attention_per_token(st, q, keys, values, st.inp_mask, kq_scale, NULL)
            out = ggml_permute(ctx, ggml_reshape_3d(ctx, out, rank, n_head, st.n_tokens), 0, 2, 1, 3)
        else:
            out = ggml_mul_mat(ctx, keys, q)                              # (n_kv, n_tokens, n_head)
            out = ggml_soft_max_ext(ctx, out, st.inp_mask, kq_scale, 0.0)
            out = ggml_mul_mat(ctx, values, out)                          # (kv_lora_rank, n_tokens, n_head)
    out = _per_head_product(st, wv_b, out)                                # (head_dim_v, n_tokens, n_head)
    out = ggml_permute(ctx, out, 0, 2, 1, 3)                              # (head_dim_v, n_head, n_tokens)
    if st.flash_attn:
        return ggml_reshape_2d(ctx, ggml_cont(ctx, out), out.ne[0] * n_head, st.n_tokens)
    return ggml_cont_2d(ctx, out, out.ne[0] * n_head, st.n_tokens)
