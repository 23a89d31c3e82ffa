# Gemma 4's drafter (gemma4-assistant), after llama.cpp's
# src/models/gemma4-assistant.cpp, op for op:
# - the token embedded by the *target's* table, scaled by sqrt(n_embd_out),
#   concatenated with the target's hidden state before it (st.inp_h), and
#   projected to the drafter's width (nextn_proj_pre);
# - Gemma 4 layers (norms before and after attention and FFN, Q's per-head
#   norm, attention scale 1, GeGLU, the layer output scale) whose attention
#   stores nothing: a sliding layer reads the target's cache at its
#   second-to-last layer (its last sliding one), a global layer at its last
#   (llama.cpp's share callback in create_memory), through the target's
#   KVCache, which this context shares (Context.target);
# - the output norm, then the logits through the drafter's own token table
#   (tied), and the hidden state for the next draft through nextn_proj_post
#   (st.hidden, n_embd_out wide: llama.cpp's t_h_nextn).

cdef ggml_tensor * build_gemma4_assistant(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef const LayerShape * shape
    cdef ggml_tensor * x
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * attn_out
    cdef ggml_tensor * factors
    cdef bint swa
    cdef float base, scale
    cdef int il
    if st.target_tok_embd == NULL or st.inp_h == NULL:
        raise errors.InvalidArgumentError("a Gemma 4 drafter runs in a context sharing its target's cache")
    x = ggml_get_rows(ctx, st.target_tok_embd, st.inp_tokens)
    x = ggml_scale(ctx, x, sqrtf(<float> hp.n_embd_out))
    x = linear(st, m.nextn_proj_pre, NULL, ggml_concat(ctx, x, st.inp_h, 0))   # (n_embd, n_tokens)
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        shape = &m.shapes[il]
        swa = m.swa_layers[il] != 0
        base = hp.rope_base_swa if swa else hp.rope_base
        scale = hp.rope_scale_swa if swa else hp.rope_scale
        factors = m.rope_freqs
        if swa:
            factors = NULL
        h = norm_rms(st, x, lw.attn_norm)
        q = ggml_reshape_3d(ctx, linear(st, lw.wq, NULL, h), shape.head_dim_k, hp.n_head, st.n_tokens)
        q = rope_dims(st, norm_rms(st, q, lw.q_norm), shape.n_rot, base, scale, factors)
        h = attention(st, cache, cache.n_layer - 2 if swa else cache.n_layer - 1, q, NULL, NULL,
                      st.inp_mask_swa if swa else st.inp_mask, 1.0)
        h = linear(st, lw.wo, NULL, h)
        attn_out = ggml_add(ctx, norm_rms(st, h, lw.attn_post_norm), x)
        h = ffn_gated(st, lw, norm_rms(st, attn_out, lw.ffn_norm), True)
        x = ggml_add(ctx, norm_rms(st, h, lw.ffn_post_norm), attn_out)
        x = ggml_mul(ctx, x, lw.layer_out_scale)
    x = select_outputs(st, norm_rms(st, x, m.output_norm))
    st.hidden = linear(st, m.nextn_proj_post, NULL, x)   # (n_embd_out, n_outputs)
    return output_head(st, m, x)


_register_builder("gemma4_assistant", build_gemma4_assistant)
