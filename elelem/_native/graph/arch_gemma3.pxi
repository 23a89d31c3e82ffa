# Gemma 3: embeddings scaled by sqrt(n_embd); RMSNorm before and after both
# the attention and the FFN; per-head Q/K norms; Q scaled before attention;
# GeGLU (tanh) FFN; five of every six layers attend over a sliding window with
# their own RoPE base.  Written to follow llama.cpp's gemma3 graph op for op.

cdef ggml_tensor * build_gemma3(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef bint swa
    cdef float base
    cdef float scale
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        swa = m.swa_layers[il] != 0
        base = hp.rope_base_swa if swa else hp.rope_base
        scale = hp.rope_scale_swa if swa else hp.rope_scale
        h = norm_rms(st, x, lw.attn_norm)
        q = ggml_reshape_3d(ctx, linear(st, lw.wq, NULL, h), hp.head_dim_k, hp.n_head, st.n_tokens)
        k = ggml_reshape_3d(ctx, linear(st, lw.wk, NULL, h), hp.head_dim_k, hp.n_head_kv, st.n_tokens)
        v = linear(st, lw.wv, NULL, h)
        q = rope(st, norm_rms(st, q, lw.q_norm), base, scale, NULL)
        k = rope(st, norm_rms(st, k, lw.k_norm), base, scale, NULL)
        q = ggml_scale(ctx, q, hp.attn_scale)
        h = linear(st, lw.wo, NULL,
                   attention(st, cache, il, q, k, v, st.inp_mask_swa if swa else st.inp_mask, 1.0))
        if il == hp.n_layer - 1:
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = ggml_add(ctx, norm_rms(st, h, lw.attn_post_norm), x)
        h = ffn_gated(st, lw, norm_rms(st, x, lw.ffn_norm), True)
        x = ggml_add(ctx, norm_rms(st, h, lw.ffn_post_norm), x)
    x = norm_rms(st, x, m.output_norm)
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


_register_builder("gemma3", build_gemma3)
