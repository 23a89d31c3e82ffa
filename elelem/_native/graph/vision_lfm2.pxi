# LFM2-VL's projector (lfm2): a SigLIP2 NaFlex ViT over an image of any size
# (multiples of patch_size * n_merge), its learned position table (a square grid)
# resized bilinearly, with antialiasing, to the image's patch grid; then the grid
# pixel-unshuffled (vit_pixel_shuffle), an optional LayerNorm (epsilon 1e-5,
# PyTorch's default) and a two-layer GELU MLP to the text model's width.  Follows
# llama.cpp's clip_graph_siglip::build for PROJECTOR_TYPE_LFM2
# (tools/mtmd/models/siglip.cpp) and clip_graph::resize_position_embeddings (clip.cpp).

cdef ggml_tensor * _lfm2_positions(VitStep * st) noexcept:
    """The position table (n_embd, side * side) as (n_embd, w * h) for a w x h patch grid."""
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * table = st.w.pos_embd
    cdef int64_t n_embd = table.ne[0]
    cdef int side = <int> sqrtf(<float> table.ne[1])
    cdef int w = st.nx // st.hp.patch_size, h = st.ny // st.hp.patch_size
    if w == side and h == side:
        return table
    table = ggml_reshape_3d(ctx, table, n_embd, side, side)
    table = ggml_permute(ctx, table, 2, 0, 1, 3)                          # (side, side, n_embd)
    table = ggml_interpolate(ctx, table, w, h, n_embd, 1, GGML_SCALE_MODE_BILINEAR | GGML_SCALE_FLAG_ANTIALIAS)
    table = ggml_permute(ctx, table, 1, 2, 0, 3)                          # (n_embd, w, h)
    return ggml_cont_2d(ctx, table, n_embd, w * h)


cdef ggml_tensor * build_vision_lfm2(VitStep * st) except NULL:
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * x = vit_patches(st)
    x = vit_encoder(st, x, _lfm2_positions(st))                           # (n_embd, n_patches)
    x = vit_pixel_shuffle(st, x, st.hp.n_merge)
    if st.w.mm_norm_w != NULL:
        x = ggml_mul(ctx, ggml_norm(ctx, x, 1e-5), st.w.mm_norm_w)
    if st.w.mm_norm_b != NULL:
        x = ggml_add(ctx, x, st.w.mm_norm_b)
    x = ggml_add(ctx, ggml_mul_mat(ctx, st.w.mm_0_w, x), st.w.mm_0_b)
    x = ggml_gelu(ctx, x)
    return ggml_add(ctx, ggml_mul_mat(ctx, st.w.mm_1_w, x), st.w.mm_1_b)  # (n_embd_out, n_tokens)


_register_vision_builder("lfm2", build_vision_lfm2)
