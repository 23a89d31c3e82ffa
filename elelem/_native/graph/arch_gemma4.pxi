# Gemma 4 (dense and MoE), after llama.cpp's gemma4 graph (src/models/gemma4.cpp),
# op for op:
# - embeddings scaled by sqrt(n_embd); RMSNorm before and after the attention
#   and the FFN; per-head norms of Q, K and (without weight) V; attention
#   scale 1; GeGLU FFN;
# - sliding-window and global layers with their own head widths, KV heads and
#   rotated dims (LayerShape); global layers rotate through rope_freqs, whose
#   huge factors leave the tail of each head unrotated (proportional RoPE);
# - the last layers attend over the K and V of the last earlier layer of
#   their kind instead of their own (attention.shared_kv_layers);
# - per-layer token embeddings: a table row per token and layer plus a
#   projection of the embeddings, mixed into each layer's output through a
#   GELU gate;
# - an MoE layer runs the dense FFN and the routed experts side by side, each
#   with its own norms, the router on its own normed input (experts.pxi's
#   ffn_moe, with GeGLU experts);
# - a layer output scale, and a final tanh soft cap of the logits.
# As llama.cpp's graph (embeddings_nextn_masked off), every row runs through
# every layer, and the unwanted ones are dropped after the output norm.

cdef ggml_tensor * _gemma4_per_layer_inputs(Step * st, Model m, ggml_tensor * x) noexcept:
    """llama.cpp's build_inp_per_layer + project_per_layer_inputs: from the
    scaled embeddings x (n_embd, n_tokens), every layer's input
    (n_embd_per_layer, n_tokens, n_layer).  x is not scaled in a step of image
    embeddings (embed_tokens)."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_pl = hp.n_embd_per_layer
    cdef ggml_tensor * table
    if st.inp_embd != NULL:
        # An image's rows take the table's row of token 0 (the padding token), every one of
        # them: llama.cpp's build_inp_per_layer for embeddings, broadcast over the rows.
        table = ggml_cast(ctx, ggml_view_1d(ctx, m.per_layer_tok_embd, n_pl * hp.n_layer, 0), GGML_TYPE_F32)
        table = ggml_reshape_3d(ctx, ggml_scale(ctx, table, sqrtf(<float> n_pl)), n_pl, hp.n_layer, 1)
    else:
        table = ggml_get_rows(ctx, m.per_layer_tok_embd, st.inp_tokens)
        table = ggml_reshape_3d(ctx, table, n_pl, hp.n_layer, st.n_tokens)
        table = ggml_scale(ctx, table, sqrtf(<float> n_pl))
    ggml_build_forward_expand(st.gf, table)
    cdef ggml_tensor * proj = matmul(st, m.per_layer_model_proj, x)
    proj = ggml_scale(ctx, proj, <float> 1.0 / sqrtf(<float> hp.n_embd))
    proj = ggml_reshape_3d(ctx, proj, n_pl, hp.n_layer, st.n_tokens)
    proj = norm_rms(st, proj, m.per_layer_proj_norm)
    proj = ggml_scale(ctx, ggml_add(ctx, proj, table), <float> 1.0 / sqrtf(<float> 2.0))
    return ggml_cont(ctx, ggml_permute(ctx, proj, 0, 2, 1, 3))


cdef ggml_tensor * build_gemma4(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef const LayerShape * shape
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * per_layer = NULL
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef ggml_tensor * attn_out
    cdef ggml_tensor * moe
    cdef ggml_tensor * logits
    cdef ggml_tensor * row
    cdef ggml_tensor * factors   # global layers' proportional RoPE
    cdef bint swa
    cdef float base, scale
    cdef int il
    cdef int64_t n_head = hp.n_head
    if m.per_layer_tok_embd != NULL:
        per_layer = _gemma4_per_layer_inputs(st, m, x)
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
        q = ggml_reshape_3d(ctx, linear(st, lw.wq, NULL, h), shape.head_dim_k, n_head, st.n_tokens)
        q = rope_dims(st, norm_rms(st, q, lw.q_norm), shape.n_rot, base, scale, factors)
        if shape.kv_source == il:
            k = linear(st, lw.wk, NULL, h)
            v = linear(st, lw.wv, NULL, h) if lw.wv != NULL else k   # no V projection: V is K (before its norm)
            k = ggml_reshape_3d(ctx, k, shape.head_dim_k, shape.n_head_kv, st.n_tokens)
            v = ggml_reshape_3d(ctx, v, shape.head_dim_v, shape.n_head_kv, st.n_tokens)
            k = norm_rms(st, k, lw.k_norm)
            v = ggml_rms_norm(ctx, v, hp.rms_eps)
            k = rope_dims(st, k, shape.n_rot, base, scale, factors)
            v = ggml_reshape_2d(ctx, v, shape.head_dim_v * shape.n_head_kv, st.n_tokens)
        else:   # attends over the cells of the layer it shares K and V with
            k = v = NULL
        h = linear(st, lw.wo, NULL,
                   attention(st, cache, il, q, k, v, st.inp_mask_swa if swa else st.inp_mask, 1.0))
        attn_out = ggml_add(ctx, norm_rms(st, h, lw.attn_post_norm), x)
        if lw.ffn_gate_inp != NULL:
            h = norm_rms(st, ffn_gated(st, lw, norm_rms(st, attn_out, lw.ffn_norm), True), lw.ffn_post_norm_1)
            # The router reads attn_out RMS-normed, scaled by 1/sqrt(n_embd) and its own scale.
            logits = ggml_scale(ctx, ggml_rms_norm(ctx, attn_out, hp.rms_eps), <float> 1.0 / sqrtf(<float> hp.n_embd))
            logits = linear(st, lw.ffn_gate_inp, NULL, ggml_mul(ctx, logits, lw.ffn_gate_inp_s))
            moe = ffn_moe(st, lw, norm_rms(st, attn_out, lw.ffn_pre_norm_2), logits)
            h = ggml_add(ctx, h, norm_rms(st, moe, lw.ffn_post_norm_2))
        else:
            h = ffn_gated(st, lw, norm_rms(st, attn_out, lw.ffn_norm), True)
        x = ggml_add(ctx, norm_rms(st, h, lw.ffn_post_norm), attn_out)
        if per_layer != NULL:
            h = ggml_gelu(ctx, linear(st, lw.per_layer_inp_gate, NULL, x))
            row = ggml_view_2d(ctx, per_layer, per_layer.ne[0], per_layer.ne[1],
                               ggml_row_size(per_layer.type, per_layer.ne[0]),
                               <size_t> il * per_layer.ne[0] * per_layer.ne[1] * ggml_element_size(per_layer))
            h = linear(st, lw.per_layer_proj, NULL, ggml_mul(ctx, h, row))
            x = ggml_add(ctx, x, norm_rms(st, h, lw.per_layer_post_norm))
        if lw.layer_out_scale != NULL:
            x = ggml_mul(ctx, x, lw.layer_out_scale)
    st.hidden = norm_rms(st, x, m.output_norm)   # every row's (llama.cpp's h_nextn): what a drafter reads
    x = select_outputs(st, st.hidden)
    x = output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)
    if hp.final_logit_softcap != 0.0 and not st.embeddings:
        x = ggml_scale(ctx, x, <float> 1.0 / hp.final_logit_softcap)
        x = ggml_scale(ctx, ggml_tanh(ctx, x), hp.final_logit_softcap)
    return x


_register_builder("gemma4", build_gemma4)
