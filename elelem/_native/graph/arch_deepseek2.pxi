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

cdef ggml_tensor * _mla_layer_attention(Step * st, KVCache cache, int il, LayerWeights * lw,
                                        ggml_tensor * h) noexcept:
    """Layer il's multi-head latent attention on its normed input h: (n_embd, n_tokens)."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t rank = hp.kv_lora_rank
    cdef ggml_tensor * q
    if lw.wq != NULL:
        q = linear(st, lw.wq, NULL, h)
    else:
        q = linear(st, lw.wq_b, NULL, norm_rms(st, linear(st, lw.wq_a, NULL, h), lw.q_a_norm))
    q = ggml_reshape_3d(ctx, q, hp.head_dim_k, hp.n_head, st.n_tokens)
    cdef ggml_tensor * kv = linear(st, lw.wkv_a_mqa, NULL, h)      # (kv_lora_rank + n_rot, n_tokens)
    cdef ggml_tensor * latent = ggml_view_2d(ctx, kv, rank, st.n_tokens, kv.nb[1], 0)
    cdef ggml_tensor * k_pe = ggml_view_3d(ctx, kv, hp.n_rot, 1, st.n_tokens, kv.nb[1], kv.nb[1],
                                           ggml_row_size(kv.type, rank))
    k_pe = rope(st, k_pe, hp.rope_base, hp.rope_scale, NULL)
    latent = norm_rms(st, latent, lw.kv_a_norm)
    h = attention_mla(st, cache, il, q, latent, k_pe, lw.wk_b, lw.wv_b, hp.attn_scale)
    return linear(st, lw.wo, NULL, h)


cdef ggml_tensor * build_deepseek2(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef ggml_tensor * every
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        h = _mla_layer_attention(st, cache, il, lw, norm_rms(st, x, lw.attn_norm))
        if il == hp.n_layer - 1:
            if st.want_hidden and st.inp_out_ids != NULL:
                # Every row's final state too, for the MTP head (as graph/arch_decoder.pxi).
                every = ggml_add(ctx, h, x)
                every = ggml_add(ctx, ffn_layer(st, lw, norm_rms(st, every, lw.ffn_norm)), every)
                st.hidden = norm_rms(st, every, m.output_norm)
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = ggml_add(ctx, h, x)
        h = ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm))
        x = ggml_add(ctx, h, x)
    x = norm_rms(st, x, m.output_norm)
    if st.want_hidden and st.hidden == NULL:   # every row is an output row
        st.hidden = x
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


cdef ggml_tensor * build_deepseek2_mtp(Model m, KVCache cache, Step * st) except NULL:
    """The multi-token-prediction head of GLM-4.7-Flash-style deepseek2 files
    (elelem.model.mtp), as llama.cpp's deepseek2 graph_mtp: the token's
    embedding and the hidden state of the row before it, each normed,
    concatenated and projected; one MLA block with experts (its own latent
    cache: layer 0 of this context's); the head's output norm and logits."""
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw = &m.layers[0]
    cdef ggml_tensor * table = lw.nextn_embed_tokens if lw.nextn_embed_tokens != NULL else m.tok_embd
    cdef ggml_tensor * e = norm_rms(st, ggml_get_rows(ctx, table, st.inp_tokens), lw.nextn_enorm)
    cdef ggml_tensor * x = linear(st, lw.nextn_eh_proj, NULL,
                                  ggml_concat(ctx, e, norm_rms(st, st.inp_h, lw.nextn_hnorm), 0))
    x = ggml_add(ctx, _mla_layer_attention(st, cache, 0, lw, norm_rms(st, x, lw.attn_norm)), x)
    x = ggml_add(ctx, ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm)), x)
    x = norm_rms(st, x, lw.nextn_shared_head_norm if lw.nextn_shared_head_norm != NULL else m.output_norm)
    if st.want_hidden:
        st.hidden = x
    x = select_outputs(st, x)
    if st.embeddings:
        return x
    return linear(st, lw.nextn_shared_head_head if lw.nextn_shared_head_head != NULL else m.output, NULL, x)


_register_builder("deepseek2", build_deepseek2)
_register_builder("deepseek2_mtp", build_deepseek2_mtp)
