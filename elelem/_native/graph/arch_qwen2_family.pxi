# Qwen2: RMSNorm, GQA attention with Q/K/V biases and NEOX RoPE, SwiGLU FFN.
# (Llama and Qwen3 share this block shape; what differs is data: no biases,
# normal RoPE, rope_freqs, or per-head Q/K norms.  Absent tensors are NULL.)

cdef ggml_tensor * build_qwen2_family(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        h = norm_rms(st, x, lw.attn_norm)
        q = ggml_reshape_3d(ctx, linear(st, lw.wq, lw.bq, h), hp.head_dim_k, hp.n_head, st.n_tokens)
        k = ggml_reshape_3d(ctx, linear(st, lw.wk, lw.bk, h), hp.head_dim_k, hp.n_head_kv, st.n_tokens)
        v = linear(st, lw.wv, lw.bv, h)
        if lw.q_norm != NULL:
            q = norm_rms(st, q, lw.q_norm)
            k = norm_rms(st, k, lw.k_norm)
        q = rope(st, q, hp.rope_base, hp.rope_scale, m.rope_freqs)
        k = rope(st, k, hp.rope_base, hp.rope_scale, m.rope_freqs)
        h = linear(st, lw.wo, lw.bo, attention(st, cache, il, q, k, v, st.inp_mask, hp.attn_scale))
        if il == hp.n_layer - 1:
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = ggml_add(ctx, h, x)
        h = ffn_gated(st, lw, norm_rms(st, x, lw.ffn_norm), False)
        x = ggml_add(ctx, h, x)
    x = norm_rms(st, x, m.output_norm)
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


_register_builder("qwen2_family", build_qwen2_family)
