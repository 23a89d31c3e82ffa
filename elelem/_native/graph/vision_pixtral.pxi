# Mistral's projector (Pixtral; Mistral Small 3.x, Devstral, Ministral 3): a ViT over
# an image of any size (sides multiples of patch_size * n_merge), RMSNorms, a gated
# SiLU MLP, positions as a 2D RoPE over the patch grid (rows in the first half of each
# head, columns in the second, frequencies interleaved); then, for Mistral Small 3.1's
# layout, an RMSNorm and a merger that concatenates each n_merge x n_merge block of
# patches and projects it back to the encoder's width; then a GELU MLP to the text
# model's width, and the [IMG_BREAK] embedding after each row of tokens but the last.
# Follows llama.cpp's clip_graph_pixtral::build (tools/mtmd/models/pixtral.cpp).


cdef ggml_tensor * _pixtral_merge_patches(VitStep * st, ggml_tensor * x, int side_x, int side_y) noexcept:
    """Mistral3PatchMerger: x (n_embd, side_x * side_y) RMS-normed, then each k x k block
    of the grid taken as one row (torch's unfold: an im2col of a k x k kernel, stride k,
    over the grid as an image of n_embd channels) and projected: (n_embd, side_x * side_y / k^2)."""
    cdef ggml_context * ctx = st.ctx
    cdef int k = st.hp.n_merge
    x = ggml_mul(ctx, ggml_rms_norm(ctx, x, st.hp.eps), st.w.mm_input_norm)
    x = ggml_reshape_3d(ctx, x, st.hp.n_embd, side_x, side_y)
    x = ggml_cont(ctx, ggml_permute(ctx, x, 2, 0, 1, 3))                 # (side_x, side_y, n_embd)
    # im2col reads the kernel's shape alone: a view of the grid stands for a k x k kernel.
    cdef ggml_tensor * kernel = ggml_view_3d(ctx, x, k, k, x.ne[2], 0, 0, 0)
    x = ggml_im2col(ctx, kernel, x, k, k, 0, 0, 1, 1, True, GGML_TYPE_F32)  # (n_embd * k * k, side_x / k, side_y / k)
    x = ggml_reshape_2d(ctx, x, x.ne[0], x.ne[1] * x.ne[2])
    return ggml_mul_mat(ctx, st.w.mm_patch_merger, x)


cdef ggml_tensor * _pixtral_row_breaks(VitStep * st, ggml_tensor * x, int cols, int rows) noexcept:
    """x (n_embd_out, cols * rows) with the [IMG_BREAK] embedding after each row but the
    last: (n_embd_out, cols * rows + rows - 1).  clip.cpp fills the break rows as
    0 * (an unset tensor) + img_break; a repeat of img_break gives the same values
    without reading memory no op wrote."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_embd = x.ne[0]
    cdef int64_t n_out = <int64_t> cols * rows + rows - 1
    cdef ggml_tensor * grid = ggml_reshape_3d(ctx, x, n_embd, cols, rows)
    cdef ggml_tensor * breaks = ggml_repeat_4d(ctx, st.w.img_break, n_embd, 1, rows, 1)
    grid = ggml_concat(ctx, grid, breaks, 1)                               # (n_embd, cols + 1, rows)
    return ggml_cont(ctx, ggml_view_2d(ctx, grid, n_embd, n_out, ggml_row_size(grid.type, n_embd), 0))


cdef ggml_tensor * build_vision_pixtral(VitStep * st) except NULL:
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef int side_x = st.nx // hp.patch_size, side_y = st.ny // hp.patch_size
    cdef ggml_tensor * x = vit_patches(st)                                 # (n_embd, n_patches)
    vit_patch_positions(st)
    x = vit_encoder(st, x, NULL)
    if st.w.mm_patch_merger != NULL:
        x = _pixtral_merge_patches(st, x, side_x, side_y)
    # LlavaMultiModalProjector: linear, GELU, linear (biases where the file has them).
    x = vit_linear(st, NULL, 0, st.w.mm_0_w, st.w.mm_0_b, x)
    x = vit_linear(st, NULL, 0, st.w.mm_1_w, st.w.mm_1_b, ggml_gelu(ctx, x))   # (n_embd_out, n_tokens)
    return _pixtral_row_breaks(st, x, side_x // hp.n_merge, side_y // hp.n_merge)


_register_vision_builder("pixtral", build_vision_pixtral)
