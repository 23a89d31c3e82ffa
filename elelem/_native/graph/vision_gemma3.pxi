# Gemma 3's projector: a SigLIP ViT over the image's patches, the patch grid
# averaged in n_merge x n_merge windows (64 x 64 patches -> 256 tokens), an
# RMSNorm ("soft embedding norm") and a projection to the text model's width.
# Follows llama.cpp's clip_graph_siglip::build (tools/mtmd/models/siglip.cpp).

cdef ggml_tensor * build_vision_gemma3(VitStep * st) except NULL:
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef int side = st.nx // hp.patch_size               # patches per side: the image is square
    cdef ggml_tensor * x = vit_encoder(st, vit_patches(st), st.w.pos_embd)   # (n_embd, side * side)
    x = ggml_cont_4d(ctx, ggml_transpose(ctx, x), side, side, hp.n_embd, 1)  # (side, side, n_embd)
    x = ggml_pool_2d(ctx, x, GGML_OP_POOL_AVG, hp.n_merge, hp.n_merge, hp.n_merge, hp.n_merge, 0, 0)
    x = ggml_reshape_3d(ctx, x, x.ne[0] * x.ne[0], hp.n_embd, 1)
    x = ggml_cont(ctx, ggml_transpose(ctx, x))                                # (n_embd, n_tokens)
    x = ggml_mul(ctx, ggml_rms_norm(ctx, x, hp.eps), st.w.mm_soft_emb_norm)
    # The file holds the projection as (n_embd_out, n_embd): clip.cpp transposes it in the graph.
    return ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, st.w.mm_input_proj)), x)   # (n_embd_out, n_tokens)


_register_vision_builder("gemma3", build_vision_gemma3)
