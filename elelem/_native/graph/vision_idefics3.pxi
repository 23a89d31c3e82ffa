# SmolVLM's projector (idefics3): a SigLIP ViT over one square (a slice or the
# overview), the patch grid pixel-shuffled (each n_merge x n_merge block of
# neighbours laid side by side in one row, n_merge^2 times as wide), then one
# linear without bias to the text model's width.  Follows llama.cpp's
# clip_graph_siglip::build for PROJECTOR_TYPE_IDEFICS3 (tools/mtmd/models/siglip.cpp)
# and clip_graph::build_patch_merge_permute (clip.cpp: vit_pixel_shuffle in vit.pxi).

cdef ggml_tensor * build_vision_idefics3(VitStep * st) except NULL:
    cdef ggml_tensor * x = vit_encoder(st, vit_patches(st), st.w.pos_embd)   # (n_embd, n_patches)
    x = vit_pixel_shuffle(st, x, st.hp.n_merge)
    return ggml_mul_mat(st.ctx, st.w.mm_input_proj, x)                        # (n_embd_out, n_tokens)


_register_vision_builder("idefics3", build_vision_idefics3)
