# BERT-family encoders (bert, nomic-bert, nomic-bert-moe): token embeddings
# plus token type 0 plus, for BERT, learned absolute positions, LayerNormed;
# then post-norm blocks: attention (RoPE for the nomic ones) over the whole
# sequence, add, LayerNorm; FFN (GELU with biases for BERT and
# nomic-bert-moe, SwiGLU for nomic-bert, routed experts in nomic-bert-moe's
# expert layers), add, LayerNorm.  No output head: the last hidden state is the output.  Written
# to follow llama.cpp's bert graph op for op.

cdef ggml_tensor * build_bert(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = ggml_get_rows(ctx, m.tok_embd, st.inp_tokens)   # (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef ggml_tensor * ffn_in
    cdef int il
    if m.type_embd != NULL:  # every token is of type 0 ("sentence A"), as in llama.cpp
        x = ggml_add(ctx, x, ggml_view_1d(ctx, m.type_embd, hp.n_embd, 0))
    if m.pos_embd != NULL:
        x = ggml_add(ctx, ggml_get_rows(ctx, m.pos_embd, st.inp_pos), x)
    x = norm_layer(st, x, m.tok_norm, m.tok_norm_b)
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        _bert_qkv(st, lw, x, &q, &k, &v)
        if m.pos_embd == NULL:  # nomic-bert: rotary positions instead of learned ones
            q = rope(st, q, hp.rope_base, hp.rope_scale, NULL)
            k = rope(st, k, hp.rope_base, hp.rope_scale, NULL)
        elif lw.wqkv != NULL:   # views of the fused projection; attention() reshapes K
            k = ggml_cont(ctx, k)
        h = linear(st, lw.wo, lw.bo, attention(st, cache, il, q, k, v, st.inp_mask, hp.attn_scale))
        if il == hp.n_layer - 1:
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        ffn_in = norm_layer(st, ggml_add(ctx, h, x), lw.attn_out_norm, lw.attn_out_norm_b)
        if lw.ffn_gate_inp != NULL:   # nomic-bert-moe's expert layers
            h = ffn_moe(st, lw, ffn_in)
        elif lw.ffn_gate != NULL:
            h = ffn_gated(st, lw, ffn_in, False)
        else:
            h = linear(st, lw.ffn_down, lw.ffn_down_b, ggml_gelu(ctx, linear(st, lw.ffn_up, lw.ffn_up_b, ffn_in)))
        x = norm_layer(st, ggml_add(ctx, h, ffn_in), lw.layer_out_norm, lw.layer_out_norm_b)
    return x   # (n_embd, n_outputs): the embeddings


cdef void _bert_qkv(Step * st, LayerWeights * lw, ggml_tensor * x,
                    ggml_tensor ** q, ggml_tensor ** k, ggml_tensor ** v) noexcept:
    """Q and K as (head_dim, n_heads, n_tokens), V as (width, n_tokens): from
    separate projections, or as views of one fused QKV projection."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * qkv
    cdef size_t el
    cdef int64_t n_q = <int64_t> hp.head_dim_k * hp.n_head
    cdef int64_t n_k = <int64_t> hp.head_dim_k * hp.n_head_kv
    if lw.wqkv == NULL:
        q[0] = ggml_reshape_3d(ctx, linear(st, lw.wq, lw.bq, x), hp.head_dim_k, hp.n_head, st.n_tokens)
        k[0] = ggml_reshape_3d(ctx, linear(st, lw.wk, lw.bk, x), hp.head_dim_k, hp.n_head_kv, st.n_tokens)
        v[0] = linear(st, lw.wv, lw.bv, x)
        return
    qkv = linear(st, lw.wqkv, lw.bqkv, x)
    el = ggml_element_size(qkv)
    q[0] = ggml_view_3d(ctx, qkv, hp.head_dim_k, hp.n_head, st.n_tokens, hp.head_dim_k * el, qkv.nb[1], 0)
    k[0] = ggml_view_3d(ctx, qkv, hp.head_dim_k, hp.n_head_kv, st.n_tokens, hp.head_dim_k * el, qkv.nb[1], n_q * el)
    # attention() stores V as rows of its cells: a contiguous copy of V's slice.
    v[0] = ggml_cont(ctx, ggml_view_2d(ctx, qkv, hp.head_dim_v * hp.n_head_kv, st.n_tokens, qkv.nb[1],
                                       (n_q + n_k) * el))


_register_builder("bert", build_bert)
