# The pre-norm decoder: llama, qwen2, qwen3, qwen3moe, gpt-oss, glm4moe,
# mistral3, seed_oss, smollm3 and minimax-m2, after llama.cpp's graphs of
# those names (src/models/).  One block, its features switched by what the
# model has:
# - Q/K/V/output biases (Qwen2, gpt-oss, Seed-OSS), per-head Q/K norms
#   (Qwen3), or Q/K norms over all heads together (MiniMax-M2), RoPE
#   frequency factors (Llama 3.1+), layers without RoPE (SmolLM3's NoPE);
# - layers that attend over a sliding window, with their own RoPE base
#   (gpt-oss: every other layer), and attention sinks (gpt-oss);
# - the attention temperature of mistral3 (Q scaled per position);
# - the FFN: routed experts, shared experts, or the dense SwiGLU of dense
#   models and leading dense layers (graph/experts.pxi).
# A switch that is off adds no op: a dense Llama's graph is llama.cpp's llama
# graph op for op.  gpt-oss keeps every row through the last layer and drops
# the unwanted ones before the output norm, as its llama.cpp graph does (the
# last layer's matmuls then see the step's full width, and round as there).

cdef ggml_tensor * _decoder_attention(Step * st, Model m, KVCache cache, int il, LayerWeights * lw,
                                      ggml_tensor * h) noexcept:
    """Layer il's attention on its normed input h: (n_embd, n_tokens)."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef bint swa = m.swa_layers[il] != 0
    cdef float base = hp.rope_base_swa if swa else hp.rope_base
    cdef float scale = hp.rope_scale_swa if swa else hp.rope_scale
    cdef ggml_tensor * q = linear(st, lw.wq, lw.bq, h)
    cdef ggml_tensor * k = linear(st, lw.wk, lw.bk, h)
    cdef ggml_tensor * v = linear(st, lw.wv, lw.bv, h)
    if lw.q_norm_all != NULL:   # minimax-m2: each of Q and K normed whole, before the split into heads
        q = norm_rms(st, q, lw.q_norm_all)
        k = norm_rms(st, k, lw.k_norm_all)
    q = ggml_reshape_3d(ctx, q, hp.head_dim_k, hp.n_head, st.n_tokens)
    k = ggml_reshape_3d(ctx, k, hp.head_dim_k, hp.n_head_kv, st.n_tokens)
    if lw.q_norm != NULL:
        q = norm_rms(st, q, lw.q_norm)
    if lw.k_norm != NULL:
        k = norm_rms(st, k, lw.k_norm)
    # smollm3: every n_no_rope_layer_step-th layer attends without RoPE (its use_rope)
    if hp.n_no_rope_layer_step == 0 or (il + 1) % hp.n_no_rope_layer_step != 0:
        q = rope(st, q, base, scale, m.rope_freqs)
        k = rope(st, k, base, scale, m.rope_freqs)
    if st.inp_attn_scale != NULL:
        q = ggml_mul(ctx, q, st.inp_attn_scale)
    return linear(st, lw.wo, lw.bo, attention(st, cache, il, q, k, v, st.inp_mask_swa if swa else st.inp_mask,
                                              hp.attn_scale, lw.attn_sinks))


cdef ggml_tensor * build_decoder(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef ggml_tensor * every
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        keep_layer_input(st, il, x)
        h = _decoder_attention(st, m, cache, il, lw, norm_rms(st, x, lw.attn_norm))
        if il == hp.n_layer - 1 and not hp.late_output_rows:
            if st.want_hidden and st.inp_out_ids != NULL and st.n_feature_layers == 0:
                # Every row's final state too, for an MTP head (llama.cpp's h_nextn,
                # unmasked): the last FFN once more over all the rows, so that the
                # output rows keep the numbers of a step that keeps none.
                every = ggml_add(ctx, h, x)
                every = ggml_add(ctx, ffn_layer(st, lw, norm_rms(st, every, lw.ffn_norm)), every)
                st.hidden = norm_rms(st, every, m.output_norm)
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = ggml_add(ctx, h, x)
        h = ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm))
        x = add_deepstack(st, ggml_add(ctx, h, x), il)
    if hp.late_output_rows:
        if st.want_hidden and st.n_feature_layers == 0:
            st.hidden = norm_rms(st, x, m.output_norm)
            return output_head(st, m, select_outputs(st, st.hidden))
        x = select_outputs(st, x)
    x = norm_rms(st, x, m.output_norm)
    if st.want_hidden and st.hidden == NULL:   # every row is an output row
        st.hidden = x
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


cdef ggml_tensor * build_decoder_mtp(Model m, KVCache cache, Step * st) except NULL:
    """The multi-token-prediction head of GLM-4.5+ (glm4moe; elelem.model.mtp),
    as llama.cpp's glm4-moe graph_mtp: the token's embedding and the hidden
    state of the row before it, each normed, concatenated and projected; one
    decoder block (its own K and V: layer 0 of this context's cache, its
    experts and shared expert); the head's output norm, then its logits."""
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw = &m.layers[0]
    cdef ggml_tensor * table = lw.nextn_embed_tokens if lw.nextn_embed_tokens != NULL else m.tok_embd
    cdef ggml_tensor * e = norm_rms(st, ggml_get_rows(ctx, table, st.inp_tokens), lw.nextn_enorm)
    cdef ggml_tensor * x = linear(st, lw.nextn_eh_proj, NULL,
                                  ggml_concat(ctx, e, norm_rms(st, st.inp_h, lw.nextn_hnorm), 0))
    x = ggml_add(ctx, _decoder_attention(st, m, cache, 0, lw, norm_rms(st, x, lw.attn_norm)), x)
    x = ggml_add(ctx, ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm)), x)
    x = norm_rms(st, x, lw.nextn_shared_head_norm if lw.nextn_shared_head_norm != NULL else m.output_norm)
    if st.want_hidden:
        st.hidden = x
    x = select_outputs(st, x)
    if st.embeddings:
        return x
    return linear(st, lw.nextn_shared_head_head if lw.nextn_shared_head_head != NULL else m.output, NULL, x)


_register_builder("decoder", build_decoder)
_register_builder("decoder_mtp", build_decoder_mtp)
