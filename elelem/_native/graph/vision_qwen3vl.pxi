# Qwen3-VL's projector (also Qwen3.5's and 3.6's vision half): Qwen2-VL's patches,
# 2D rotary positions and 2 x 2 merger, plus a patch bias, learned position
# embeddings resized to the image's grid, one Q/K/V product, and "deepstack"
# features: the outputs of some layers, each merged 2 x 2 and projected to the
# text model's width by a merger of its own, concatenated after the main
# embedding.  A row is (1 + n_deepstack) * n_embd_out wide, as libmtmd hands
# it to the text model (which adds the extra parts after its first layers).
# Follows llama.cpp's clip_graph_qwen3vl::build (tools/mtmd/models/qwen3vl.cpp).
#
# Input besides the pixels: "positions", as for qwen2vl (elelem/vision/qwen.py).


cdef ggml_tensor * _qwen_merge_order(VitStep * st, ggml_tensor * x, int npx, int npy) noexcept:
    """x (n_embd, npx * npy) in raster order -> each 2 x 2 merge block's four rows together."""
    cdef ggml_context * ctx = st.ctx
    cdef int n_embd = st.hp.n_embd
    x = ggml_cont_4d(ctx, x, n_embd * 2, npx // 2, npy, 1)
    x = ggml_reshape_4d(ctx, x, n_embd * 2, npx // 2, 2, npy // 2)
    x = ggml_permute(ctx, x, 0, 2, 1, 3)
    return ggml_cont_3d(ctx, x, n_embd, npx * npy, 1)


cdef ggml_tensor * _qwen3vl_positions_table(VitStep * st, int npx, int npy) noexcept:
    """The learned position table, (n_embd, side * side), resized bilinearly (corners
    aligned) to npx x npy where the grid differs (clip_graph::resize_position_embeddings)."""
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * pos = st.w.pos_embd
    cdef int n_embd = st.hp.n_embd
    cdef int side = <int> sqrtf(<float> pos.ne[1])
    if npx == side and npy == side:
        return pos
    pos = ggml_permute(ctx, ggml_reshape_3d(ctx, pos, n_embd, side, side), 2, 0, 1, 3)   # (side, side, n_embd)
    pos = ggml_interpolate(ctx, pos, npx, npy, n_embd, 1, GGML_SCALE_MODE_BILINEAR | GGML_SCALE_FLAG_ALIGN_CORNERS)
    pos = ggml_permute(ctx, pos, 1, 2, 0, 3)                                              # (n_embd, npx, npy)
    return ggml_cont_2d(ctx, pos, n_embd, npx * npy)


cdef ggml_tensor * _qwen3vl_merger(VitStep * st, ggml_tensor * x, ggml_tensor * w1, ggml_tensor * b1,
                                   ggml_tensor * w2, ggml_tensor * b2) noexcept:
    """A merger's MLP, x (4 * n_embd, n_pos / 4) -> (n_embd_out, n_pos / 4) through GELU (build_ffn, FFN_GELU)."""
    return vit_linear(st, NULL, 0, w2, b2, ggml_gelu(st.ctx, vit_linear(st, NULL, 0, w1, b1, x)))


cdef ggml_tensor * build_vision_qwen3vl(VitStep * st) except NULL:
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef const VitLayerWeights * lw
    cdef int npx = st.nx // hp.patch_size, npy = st.ny // hp.patch_size
    cdef int n_pos = npx * npy
    cdef int width = hp.n_head * hp.d_head
    cdef float kq_scale = 1.0 / sqrtf(<float> hp.d_head)
    cdef int sections[4]
    sections[0] = sections[1] = sections[2] = sections[3] = hp.d_head // 4
    cdef ggml_tensor * x = ggml_add(ctx, _qwen2vl_patches(st), st.w.patch_bias)
    x = ggml_add(ctx, x, _qwen_merge_order(st, _qwen3vl_positions_table(st, npx, npy), npx, npy))
    cdef ggml_tensor * positions = _named_input(st, GGML_TYPE_I32, 4 * n_pos, 0, b"positions")
    cdef ggml_tensor * deepstack = NULL
    cdef ggml_tensor * cur
    cdef ggml_tensor * feat
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef size_t row
    cdef int il
    if st.w.pre_ln_w != NULL:
        x = vit_norm(st, x, st.w.pre_ln_w, st.w.pre_ln_b)
    for il in range(hp.n_layer):
        lw = &st.layers[il]
        cur = vit_norm(st, x, lw.ln1_w, lw.ln1_b)
        cur = vit_linear(st, NULL, 0, lw.qkv_w, lw.qkv_b, cur)   # (3 * width, n_pos)
        row = ggml_row_size(cur.type, hp.d_head)
        q = ggml_view_3d(ctx, cur, hp.d_head, hp.n_head, n_pos, row, cur.nb[1], 0)
        k = ggml_view_3d(ctx, cur, hp.d_head, hp.n_head, n_pos, row, cur.nb[1], ggml_row_size(cur.type, width))
        v = ggml_view_3d(ctx, cur, hp.d_head, hp.n_head, n_pos, row, cur.nb[1], ggml_row_size(cur.type, 2 * width))
        # 2D M-RoPE over half of each head (clip.cpp's constants: theta 10000, no scaling).
        q = ggml_rope_multi(ctx, q, positions, NULL, hp.d_head // 2, sections, GGML_ROPE_TYPE_VISION,
                            32768, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        k = ggml_rope_multi(ctx, k, positions, NULL, hp.d_head // 2, sections, GGML_ROPE_TYPE_VISION,
                            32768, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        x = ggml_add(ctx, vit_attention(st, lw, q, k, v, kq_scale), x)
        x = ggml_add(ctx, x, vit_ffn(st, lw, vit_norm(st, x, lw.ln2_w, lw.ln2_b)))
        if lw.ds_fc1_w != NULL:
            feat = vit_norm(st, ggml_reshape_3d(ctx, x, hp.n_embd * 4, n_pos // 4, 1), lw.ds_norm_w, lw.ds_norm_b)
            feat = _qwen3vl_merger(st, feat, lw.ds_fc1_w, lw.ds_fc1_b, lw.ds_fc2_w, lw.ds_fc2_b)
            deepstack = feat if deepstack == NULL else ggml_concat(ctx, deepstack, feat, 0)
    if st.w.post_ln_w != NULL:
        x = vit_norm(st, x, st.w.post_ln_w, st.w.post_ln_b)
    x = _qwen3vl_merger(st, ggml_reshape_3d(ctx, x, hp.n_embd * 4, n_pos // 4, 1),
                        st.w.mm_0_w, st.w.mm_0_b, st.w.mm_1_w, st.w.mm_1_b)
    if deepstack != NULL:
        x = ggml_concat(ctx, x, deepstack, 0)
    return ggml_reshape_2d(ctx, x, x.ne[0], n_pos // 4)


_register_vision_builder("qwen3vl_merger", build_vision_qwen3vl)
