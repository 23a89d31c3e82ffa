# EAGLE-3 drafter heads (elelem.model.archs.eagle3), after llama.cpp's
# src/models/eagle3.cpp.  Two graphs, as there:
# - the encoder (feature_fusion.pxi, eagle3_fuse): the target's three layer
#   inputs side by side, normed where norm_before_fc, through fc: g;
# - the decoder, built here: a step of tokens, each with the g of the position
#   before it (Step.inp_h, as an MTP head's hidden states), through the one layer.
# llama.cpp's decoder selects no output rows: every row goes through the
# output norm and projection, and the wanted rows are taken from the logits
# afterwards, so that the projection's width is the step's as there.

cdef ggml_tensor * build_eagle3(Model m, KVCache cache, Step * st) except NULL:
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw = &m.layers[0]
    cdef ggml_tensor * g = st.inp_h                    # (n_embd, n_tokens)
    if m.tok_embd == NULL or lw.eagle3_output == NULL:   # a head without them takes its target's first
        raise errors.ModelShapeError("this EAGLE-3 head has no token_embd or output of its own: "
                                     "borrow_target_weights lends it its target's")
    cdef ggml_tensor * e = norm_rms(st, ggml_get_rows(ctx, m.tok_embd, st.inp_tokens), lw.attn_norm)
    cdef ggml_tensor * g_norm = norm_rms(st, g, lw.attn_norm_2)
    # Q, K and V project the token's and g's norms side by side (2 * n_embd)
    cdef ggml_tensor * x = _decoder_attention(st, m, cache, 0, lw, ggml_concat(ctx, e, g_norm, 0))
    x = ggml_add(ctx, x, g_norm if st.hp.norm_before_residual else g)
    x = ggml_add(ctx, ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm)), x)
    if st.want_hidden:
        st.hidden = x      # the pre-norm state: a chained draft step's g (llama.cpp's t_h_nextn)
    if st.embeddings:
        return select_outputs(st, norm_rms(st, x, m.output_norm))
    return select_outputs(st, linear(st, lw.eagle3_output, NULL, norm_rms(st, x, m.output_norm)))


_register_builder("eagle3", build_eagle3)
