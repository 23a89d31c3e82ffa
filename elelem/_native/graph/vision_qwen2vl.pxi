# Qwen2-VL's and Qwen2.5-VL's projector: a ViT over an image of any size (both
# sides multiples of 2 * patch_size), 2D rotary positions over the patches, and
# a merger that concatenates each 2 x 2 block of patches and projects it to the
# text model's width through a GELU MLP.  Qwen2.5-VL adds RMSNorms, a gated
# SiLU MLP, and window attention in every layer but each n_wa_pattern-th.
# Follows llama.cpp's clip_graph_qwen2vl::build (tools/mtmd/models/qwen2vl.cpp).
#
# Inputs besides the pixels, made in Python (elelem/vision/qwen.py, as
# clip.cpp's clip_image_batch_encode makes them) and set by name:
#   "positions"       I32 (4 * n_pos): each patch's (y, x, y, x), patches in merge-block order
#   "window_idx"      I32 (n_pos / 4): qwen25vl with windows: merged token -> its place in window order
#   "inv_window_idx"  I32 (n_pos / 4): ... and back
#   "window_mask"     F32 (n_pos, n_pos): 0 within a window, the lowest float across


cdef ggml_tensor * _qwen2vl_patches(VitStep * st) except NULL:
    """The pixels through both temporal slices of the Conv3D kernel (a still image
    is its two identical frames), then the patches reordered so that each 2 x 2
    merge block is contiguous: (n_embd, n_pos)."""
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef int p = hp.patch_size
    cdef int npx = st.nx // p, npy = st.ny // p
    st.inp_raw = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, st.nx, st.ny, 3, 1)
    ggml_set_input(st.inp_raw)
    cdef ggml_tensor * x = ggml_add(ctx, ggml_conv_2d(ctx, st.w.patch_embd, st.inp_raw, p, p, 0, 0, 1, 1),
                                    ggml_conv_2d(ctx, st.w.patch_embd_1, st.inp_raw, p, p, 0, 0, 1, 1))
    x = ggml_permute(ctx, x, 1, 2, 0, 3)                                  # (npx, npy, n_embd) -> (n_embd, npx, npy)
    x = ggml_cont_4d(ctx, x, hp.n_embd * 2, npx // 2, npy, 1)
    x = ggml_reshape_4d(ctx, x, hp.n_embd * 2, npx // 2, 2, npy // 2)
    x = ggml_permute(ctx, x, 0, 2, 1, 3)
    return ggml_cont_3d(ctx, x, hp.n_embd, npx * npy, 1)


cdef ggml_tensor * _named_input(VitStep * st, ggml_type type, int64_t ne0, int64_t ne1, const char * name) noexcept:
    cdef ggml_tensor * t = (ggml_new_tensor_1d(st.ctx, type, ne0) if ne1 == 0
                            else ggml_new_tensor_2d(st.ctx, type, ne0, ne1))
    ggml_set_name(t, name)
    ggml_set_input(t)
    return t


cdef ggml_tensor * build_vision_qwen2vl(VitStep * st) except NULL:
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef const VitLayerWeights * lw
    cdef int n_pos = (st.nx // hp.patch_size) * (st.ny // hp.patch_size)
    cdef bint use_windows = hp.n_wa_pattern > 0
    cdef float kq_scale = 1.0 / sqrtf(<float> hp.d_head)
    cdef int sections[4]
    sections[0] = sections[1] = sections[2] = sections[3] = hp.d_head // 4
    cdef ggml_tensor * x = _qwen2vl_patches(st)
    cdef ggml_tensor * positions = _named_input(st, GGML_TYPE_I32, 4 * n_pos, 0, b"positions")
    cdef ggml_tensor * window_mask = NULL
    cdef ggml_tensor * cur
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef int il
    if st.w.pre_ln_w != NULL:
        x = vit_norm(st, x, st.w.pre_ln_w, st.w.pre_ln_b)
    if use_windows:
        window_mask = _named_input(st, GGML_TYPE_F32, n_pos, n_pos, b"window_mask")
        if st.flash_attn:
            window_mask = ggml_cast(ctx, window_mask, GGML_TYPE_F16)
        # The merge blocks put in window order, four patches at a time.
        x = ggml_reshape_2d(ctx, x, hp.n_embd * 4, n_pos // 4)
        x = ggml_get_rows(ctx, x, _named_input(st, GGML_TYPE_I32, n_pos // 4, 0, b"inv_window_idx"))
        x = ggml_reshape_3d(ctx, x, hp.n_embd, n_pos, 1)
    for il in range(hp.n_layer):
        lw = &st.layers[il]
        cur = vit_norm(st, x, lw.ln1_w, lw.ln1_b)
        q = ggml_reshape_3d(ctx, vit_linear(st, lw, VIT_MM_Q, lw.q_w, lw.q_b, cur), hp.d_head, hp.n_head, n_pos)
        k = ggml_reshape_3d(ctx, vit_linear(st, lw, VIT_MM_K, lw.k_w, lw.k_b, cur), hp.d_head, hp.n_head, n_pos)
        v = ggml_reshape_3d(ctx, vit_linear(st, lw, VIT_MM_V, lw.v_w, lw.v_b, cur), hp.d_head, hp.n_head, n_pos)
        # 2D M-RoPE over half of each head (clip.cpp's constants: theta 10000, no scaling).
        q = ggml_rope_multi(ctx, q, positions, NULL, hp.d_head // 2, sections, GGML_ROPE_TYPE_VISION,
                            32768, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        k = ggml_rope_multi(ctx, k, positions, NULL, hp.d_head // 2, sections, GGML_ROPE_TYPE_VISION,
                            32768, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        cur = vit_attention(st, lw, q, k, v, kq_scale,
                            window_mask if use_windows and (il + 1) % hp.n_wa_pattern != 0 else NULL)
        x = ggml_add(ctx, cur, x)
        cur = vit_ffn(st, lw, vit_norm(st, x, lw.ln2_w, lw.ln2_b))
        x = ggml_add(ctx, x, cur)
    if st.w.post_ln_w != NULL:
        x = vit_norm(st, x, st.w.post_ln_w, st.w.post_ln_b)
    # The merger: each 2 x 2 block's four patches side by side, through a GELU MLP.
    x = ggml_reshape_3d(ctx, x, hp.n_embd * 4, n_pos // 4, 1)
    x = vit_linear(st, NULL, 0, st.w.mm_1_w, st.w.mm_1_b,
                   ggml_gelu(ctx, vit_linear(st, NULL, 0, st.w.mm_0_w, st.w.mm_0_b, x)))
    if use_windows:   # back from window order to raster order
        x = ggml_reshape_2d(ctx, x, hp.n_embd_out, n_pos // 4)
        x = ggml_get_rows(ctx, x, _named_input(st, GGML_TYPE_I32, n_pos // 4, 0, b"window_idx"))
    return ggml_reshape_2d(ctx, x, hp.n_embd_out, n_pos // 4)


_register_vision_builder("qwen2vl_merger", build_vision_qwen2vl)
_register_vision_builder("qwen2.5vl_merger", build_vision_qwen2vl)
