# SmolVLM's projector (idefics3): a SigLIP ViT over one square (a slice or the
# overview), the patch grid pixel-shuffled (each n_merge x n_merge block of
# neighbours laid side by side in one row, n_merge^2 times as wide), then one
# linear without bias to the text model's width.  Follows llama.cpp's
# clip_graph_siglip::build for PROJECTOR_TYPE_IDEFICS3 (tools/mtmd/models/siglip.cpp)
# and clip_graph::build_patch_merge_permute (clip.cpp).

cdef ggml_tensor * vit_pixel_shuffle(VitStep * st, ggml_tensor * x, int k) noexcept:
    """x (n_embd, w * h), patches row by row -> (n_embd * k * k, (w / k) * (h / k)), blocks row
    by row: block (bx, by)'s row holds patch (bx k + dx, by k + dy) at n_embd (dx + k dy), the
    order clip.cpp's reshapes and permutes give (w and h multiples of k; the converter's
    files have no other)."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_embd = x.ne[0]
    cdef int w = st.nx // st.hp.patch_size, h = st.ny // st.hp.patch_size
    x = ggml_reshape_3d(ctx, x, n_embd * k, w // k, h)
    x = ggml_permute(ctx, x, 0, 2, 1, 3)
    x = ggml_cont_3d(ctx, x, n_embd * k * k, h // k, w // k)
    x = ggml_permute(ctx, x, 0, 2, 1, 3)
    return ggml_cont_2d(ctx, x, x.ne[0], x.ne[1] * x.ne[2])


cdef ggml_tensor * build_vision_idefics3(VitStep * st) except NULL:
    cdef ggml_tensor * x = vit_encoder(st, vit_patches(st), st.w.pos_embd)   # (n_embd, n_patches)
    x = vit_pixel_shuffle(st, x, st.hp.n_merge)
    return ggml_mul_mat(st.ctx, st.w.mm_input_proj, x)                        # (n_embd_out, n_tokens)


_register_vision_builder("idefics3", build_vision_idefics3)
