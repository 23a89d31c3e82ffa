# Gemma 4's projector: a ViT over a variable-resolution patch grid (pixels taken as
# 2 v - 1, no patch bias), positions from two learned tables (column and row) plus a
# 2D RoPE in NeoX halves; RMSNorms throughout with norms after the attention and the
# FFN, per-head Q/K norms, V normed, attention scale 1, a scale on each layer's output;
# then the grid averaged in n_merge x n_merge windows and scaled by sqrt(n_embd),
# optionally standardised (std_bias, std_scale), RMS-normed and projected to the
# text model's width, every product clipped where the file says (Gemma4ClippableLinear).
# Follows llama.cpp's clip_graph_gemma4v::build (tools/mtmd/models/gemma4v.cpp).

cdef ggml_tensor * _gemma4v_positions(VitStep * st, ggml_tensor * x) noexcept:
    """x plus the column table's row pos_x and the row table's row pos_y of each patch."""
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * table = st.w.pos_embd                 # (n_embd, pos_size, 2)
    cdef size_t row = ggml_row_size(table.type, st.hp.n_embd)
    cdef int64_t pos_size = table.ne[1]
    cdef ggml_tensor * tbl_x = ggml_view_2d(ctx, table, st.hp.n_embd, pos_size, row, 0)
    cdef ggml_tensor * tbl_y = ggml_view_2d(ctx, table, st.hp.n_embd, pos_size, row, pos_size * row)
    x = ggml_add(ctx, x, ggml_get_rows(ctx, tbl_x, st.pos_x))
    return ggml_add(ctx, x, ggml_get_rows(ctx, tbl_y, st.pos_y))


cdef ggml_tensor * build_vision_gemma4v(VitStep * st) except NULL:
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef int side_x = st.nx // hp.patch_size, side_y = st.ny // hp.patch_size
    cdef int k = hp.n_merge
    cdef ggml_tensor * x = vit_patches(st, True)                          # (n_embd, n_patches)
    vit_patch_positions(st)
    x = vit_encoder(st, _gemma4v_positions(st, x), NULL)
    # Gemma4VisionPooler: the grid (side_x, side_y) averaged in k x k windows.
    x = ggml_cont_4d(ctx, ggml_transpose(ctx, x), side_x, side_y, hp.n_embd, 1)
    x = ggml_pool_2d(ctx, x, GGML_OP_POOL_AVG, k, k, k, k, 0, 0)
    x = ggml_reshape_3d(ctx, x, (side_x // k) * (side_y // k), hp.n_embd, 1)
    x = ggml_cont(ctx, ggml_transpose(ctx, x))                            # (n_embd, n_tokens)
    x = ggml_scale(ctx, x, sqrtf(<float> hp.n_embd))
    if st.w.std_bias != NULL and st.w.std_scale != NULL:
        x = ggml_mul(ctx, ggml_sub(ctx, x, st.w.std_bias), st.w.std_scale)
    # Gemma4MultimodalEmbedder: an RMSNorm without weight, then the projection.
    x = ggml_rms_norm(ctx, x, hp.eps)
    cdef const float * clamp = NULL
    if st.w.mm_clamped:
        clamp = &st.w.mm_clamp[0]
    return vit_mm(st, st.w.mm_input_proj, x, clamp)                      # (n_embd_out, n_tokens)


_register_vision_builder("gemma4v", build_vision_gemma4v)
