# DeepSeek-V2 and its descendants (GLM-4.7-Flash, Moonlight, Kimi-K2), after
# llama.cpp's llm_build_deepseek2 (src/models/deepseek2.cpp) in its MLA form:
# - Q projected directly (attn_q: DeepSeek-V2-Lite, Moonlight) or through a
#   low-rank bottleneck with a norm (attn_q_a, attn_q_a_norm, attn_q_b);
# - the latent and K's RoPE part from one projection (attn_kv_a_mqa), the
#   latent normed, then multi-head latent attention (graph/mla.pxi);
# - leading dense layers, then routed experts (softmax or sigmoid, with a
#   selection bias where the file has one) plus shared experts
#   (graph/experts.pxi).  attn_scale is llama.cpp's kq_scale, YaRN's
#   magnitude scale folded in (elelem.model.archspec.mla).

cdef ggml_tensor * build_deepseek2(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * kv
    cdef ggml_tensor * latent
    cdef ggml_tensor * k_pe
    cdef int64_t rank = hp.kv_lora_rank
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        h = norm_rms(st, x, lw.attn_norm)
        if lw.wq != NULL:
            q = linear(st, lw.wq, NULL, h)
        else:
            q = linear(st, lw.wq_b, NULL, norm_rms(st, linear(st, lw.wq_a, NULL, h), lw.q_a_norm))
        q = ggml_reshape_3d(ctx, q, hp.head_dim_k, hp.n_head, st.n_tokens)
        kv = linear(st, lw.wkv_a_mqa, NULL, h)                   # (kv_lora_rank + n_rot, n_tokens)
        latent = ggml_view_2d(ctx, kv, rank, st.n_tokens, kv.nb[1], 0)
        k_pe = ggml_view_3d(ctx, kv, hp.n_rot, 1, st.n_tokens, kv.nb[1], kv.nb[1], ggml_row_size(kv.type, rank))
        k_pe = rope(st, k_pe, hp.rope_base, hp.rope_scale, NULL)
        latent = norm_rms(st, latent, lw.kv_a_norm)
        h = attention_mla(st, cache, il, q, latent, k_pe, lw.wk_b, lw.wv_b, hp.attn_scale)
        h = linear(st, lw.wo, NULL, h)
        if il == hp.n_layer - 1:
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = ggml_add(ctx, h, x)
        h = ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm))
        x = ggml_add(ctx, h, x)
    x = norm_rms(st, x, m.output_norm)
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


_register_builder("deepseek2", build_deepseek2)
