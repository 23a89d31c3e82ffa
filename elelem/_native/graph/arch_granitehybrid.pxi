# IBM Granite 4.0 H (granitehybrid): each layer an RMS norm, a Mamba-2 layer
# (graph/mamba2.pxi) or attention without positional encoding, then an RMS
# norm and the FFN -- SwiGLU, or softmax-routed experts beside one shared
# SwiGLU expert (graph/experts.pxi) -- with Granite's scalars: the embeddings
# times embd_scale (embed_tokens), each branch times residual_multiplier before
# its residual add, Q.K times attn_scale, the logits divided by logits_scaling.
# Written after llama.cpp's granitehybrid graph (src/models/granite-hybrid.cpp)
# op for op; its last layer keeps only the wanted rows before the FFN.


cdef inline ggml_tensor * _granite_residual(Step * st, ggml_tensor * branch, ggml_tensor * x) noexcept:
    if st.hp.residual_multiplier != 0.0:
        branch = ggml_scale(st.ctx, branch, st.hp.residual_multiplier)
    return ggml_add(st.ctx, branch, x)


cdef ggml_tensor * build_granitehybrid(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        h = norm_rms(st, x, lw.attn_norm)
        if m.recurrent_layers[il]:
            h = mamba2_layer(st, cache, il, lw, h)
        else:
            h = attention_without_rope(st, cache, il, lw, h)
        if il == hp.n_layer - 1:
            h = select_outputs(st, h)
            x = select_outputs(st, x)
        x = _granite_residual(st, h, x)
        x = _granite_residual(st, ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm)), x)
    x = norm_rms(st, x, m.output_norm)
    x = output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)
    if hp.logits_scaling != 0.0 and not st.embeddings:
        x = ggml_scale(ctx, x, (<float> 1.0) / hp.logits_scaling)
    return x


_register_builder("granitehybrid", build_granitehybrid)
