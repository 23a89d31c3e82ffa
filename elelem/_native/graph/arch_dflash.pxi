# DFlash drafters (elelem.model.archs.dflash), after llama.cpp's
# src/models/dflash.cpp (llama_model_dflash::graph<false>), op for op.  One
# builder, two kinds of step, told apart as there by what the step takes:
# - given embeddings (Context.decode_embeddings: the target's layer inputs
#   side by side, n_embd_inp wide; llama.cpp's ubatch.embd): fc, its norm,
#   then each layer's K (normed, rotated) and V of them stored at the rows'
#   positions -- nothing attends; the step's output is the fused rows;
# - tokens (the picked token and the mask tokens of a block, embedded by the
#   target's table where the file has none, borrow_target_weights):
#   Qwen3 layers whose attention sees the injected cells and the whole block
#   both ways (the step is run without a causal mask: Context.decode's
#   causal), the output norm and the (target's) output.
# llama.cpp's graph selects no output rows: every row goes through the output
# norm and projection, and the wanted rows are taken from the logits after,
# so that the projection's width is the step's as there.

cdef ggml_tensor * _dflash_kv(Step * st, Model m, LayerWeights * lw, ggml_tensor * h, ggml_tensor ** v) noexcept:
    """Layer lw's K of h, per head, normed and rotated, (head_dim, n_head_kv,
    n_tokens); its V, (head_dim * n_head_kv, n_tokens), into v."""
    cdef const HParams * hp = st.hp
    cdef ggml_tensor * k = ggml_reshape_3d(st.ctx, linear(st, lw.wk, NULL, h), hp.head_dim_k, hp.n_head_kv,
                                           st.n_tokens)
    v[0] = linear(st, lw.wv, NULL, h)
    return rope(st, norm_rms(st, k, lw.k_norm), hp.rope_base, hp.rope_scale, m.rope_freqs)


cdef ggml_tensor * _dflash_inject(Model m, KVCache cache, Step * st) except NULL:
    cdef ggml_tensor * g = norm_rms(st, linear(st, m.layers[0].dflash_fc, NULL, st.inp_embd),
                                    m.layers[0].dflash_fc_norm)   # (n_embd, n_tokens)
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef int il
    for il in range(st.hp.n_layer):
        k = _dflash_kv(st, m, &m.layers[il], g, &v)
        store_kv(st, cache, il, k, v)
    return select_outputs(st, g)


cdef ggml_tensor * build_dflash(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef int il
    if m.tok_embd == NULL or m.output == NULL:
        raise errors.InvalidArgumentError("this DFlash drafter has no token table or output: it borrows its "
                                          "target's (borrow_target_weights)")
    if st.inp_embd != NULL:
        return _dflash_inject(m, cache, st)
    x = ggml_get_rows(ctx, m.tok_embd, st.inp_tokens)   # (n_embd, n_tokens)
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        h = norm_rms(st, x, lw.attn_norm)
        q = ggml_reshape_3d(ctx, linear(st, lw.wq, NULL, h), hp.head_dim_k, hp.n_head, st.n_tokens)
        q = rope(st, norm_rms(st, q, lw.q_norm), hp.rope_base, hp.rope_scale, m.rope_freqs)
        k = _dflash_kv(st, m, lw, h, &v)
        h = linear(st, lw.wo, NULL, attention(st, cache, il, q, k, v, st.inp_mask, hp.attn_scale))
        x = ggml_add(ctx, h, x)
        x = ggml_add(ctx, ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm)), x)
    x = norm_rms(st, x, m.output_norm)
    if st.embeddings:
        return select_outputs(st, x)
    return select_outputs(st, linear(st, m.output, NULL, x))


_register_builder("dflash", build_dflash)
