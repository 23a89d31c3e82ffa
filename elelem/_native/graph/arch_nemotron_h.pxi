# NVIDIA Nemotron-H (nemotron_h) and Nemotron-3-Nano (nemotron_h_moe): each
# layer one RMS norm, then one of a Mamba-2 layer (graph/mamba2.pxi), an
# attention layer, or an FFN -- a squared-ReLU MLP, or experts routed by a
# sigmoid with a selection bias beside a squared-ReLU shared expert --
# then the residual add.  Written after llama.cpp's nemotron_h graph
# (src/models/nemotron-h.cpp, which nemotron_h_moe's shares) op for op:
# - attention without positional encoding (no RoPE), kq_scale 1/sqrt(head_dim),
#   Q/K/V projected separately with optional biases;
# - every row kept through the last layer, the unwanted ones dropped before
#   the final norm (its embeddings_nextn_masked is off by default).


cdef inline ggml_tensor * relu_sqr_ffn(Step * st, ggml_tensor * up, ggml_tensor * down, ggml_tensor * x) noexcept:
    """down(relu(up(x))^2): llama.cpp's build_ffn with LLM_FFN_RELU_SQR and no gate."""
    return linear(st, down, NULL, ggml_sqr(st.ctx, ggml_relu(st.ctx, linear(st, up, NULL, x))))


cdef ggml_tensor * _nemotron_ffn(Step * st, LayerWeights * lw, ggml_tensor * x) noexcept:
    if lw.ffn_gate_inp == NULL:
        return relu_sqr_ffn(st, lw.ffn_up, lw.ffn_down, x)
    cdef ggml_tensor * routed = ffn_moe(st, lw, x)
    return ggml_add(st.ctx, routed, relu_sqr_ffn(st, lw.ffn_up_shexp, lw.ffn_down_shexp, x))


cdef ggml_tensor * build_nemotron_h(Model m, KVCache cache, Step * st) except NULL:
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
        elif lw.ffn_up != NULL or lw.ffn_gate_inp != NULL:
            h = _nemotron_ffn(st, lw, h)
        else:
            h = attention_without_rope(st, cache, il, lw, h)
        x = ggml_add(ctx, h, x)
    x = norm_rms(st, select_outputs(st, x), m.output_norm)
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


# nemotron_h_moe runs through it too: what differs is in its weights (the experts).
_register_builder("nemotron_h", build_nemotron_h)
