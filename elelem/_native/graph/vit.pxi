# Vision encoders: the weights a projector file (an mmproj GGUF, general.architecture
# "clip") holds, one encoding's graph state, and the ViT blocks the projector
# builders (graph/vision_*.pxi) share.  Written to follow llama.cpp's
# tools/mtmd/clip.cpp (clip_graph::build_inp, build_vit, build_attn,
# build_ffn) op for op, so that an image's embeddings are libmtmd's.
# Shapes in ggml order: the first number is the contiguous dimension.

# The FFN activations clip.cpp knows (clip.use_gelu, clip.use_silu, else quick GELU).
DEF VIT_FFN_GELU = 0
DEF VIT_FFN_GELU_QUICK = 1
DEF VIT_FFN_SILU = 2


cdef struct VitLayerWeights:
    # One encoder layer; the order is VIT_LAYER_ROLES'.  Biases and the gate may be NULL.
    ggml_tensor * ln1_w     # (n_embd)
    ggml_tensor * ln1_b     # (n_embd)
    ggml_tensor * q_w       # (n_embd, n_head * d_head)
    ggml_tensor * q_b       # (n_head * d_head)
    ggml_tensor * k_w       # (n_embd, n_head * d_head)
    ggml_tensor * k_b
    ggml_tensor * v_w       # (n_embd, n_head * d_head)
    ggml_tensor * v_b
    ggml_tensor * o_w       # (n_head * d_head, n_embd)
    ggml_tensor * o_b       # (n_embd)
    ggml_tensor * ln2_w     # (n_embd)
    ggml_tensor * ln2_b
    ggml_tensor * up_w      # (n_embd, n_ff)
    ggml_tensor * up_b      # (n_ff)
    ggml_tensor * gate_w    # (n_embd, n_ff), gated FFNs only
    ggml_tensor * gate_b
    ggml_tensor * down_w    # (n_ff, n_embd)
    ggml_tensor * down_b    # (n_embd)

VIT_LAYER_ROLES = ("ln1_w", "ln1_b", "q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w", "o_b",
                   "ln2_w", "ln2_b", "up_w", "up_b", "gate_w", "gate_b", "down_w", "down_b")


cdef struct VisionWeights:
    # The tensors outside the layers; the order is VISION_GLOBAL_ROLES'.  Any may be NULL
    # where its projector type has none (elelem.model.projector says which are required).
    ggml_tensor * patch_embd        # (patch, patch, 3, n_embd): the patch convolution
    ggml_tensor * patch_bias        # (n_embd)
    ggml_tensor * pos_embd          # (n_embd, n_patches): learned positions
    ggml_tensor * pre_ln_w          # (n_embd)
    ggml_tensor * pre_ln_b
    ggml_tensor * post_ln_w         # (n_embd)
    ggml_tensor * post_ln_b
    ggml_tensor * mm_input_proj     # gemma3: (n_embd_out, n_embd), used transposed
    ggml_tensor * mm_soft_emb_norm  # gemma3: (n_embd)
    ggml_tensor * patch_embd_1      # qwen2vl: (patch, patch, 3, n_embd), the second temporal slice of the kernel
    ggml_tensor * mm_0_w            # qwen2vl: (4 * n_embd, 4 * n_embd), the merger's first linear
    ggml_tensor * mm_0_b            # (4 * n_embd)
    ggml_tensor * mm_1_w            # qwen2vl: (4 * n_embd, n_embd_out), the merger's second linear
    ggml_tensor * mm_1_b            # (n_embd_out)

VISION_GLOBAL_ROLES = ("patch_embd", "patch_bias", "pos_embd", "pre_ln_w", "pre_ln_b", "post_ln_w", "post_ln_b",
                       "mm_input_proj", "mm_soft_emb_norm", "patch_embd_1", "mm_0_w", "mm_0_b", "mm_1_w", "mm_1_b")


cdef struct VisionHParams:
    int n_embd          # the encoder's width
    int n_head
    int d_head          # n_embd / n_head unless the file says otherwise
    int n_ff
    int n_layer
    int n_embd_out      # the text model's width: what the projector gives per image token
    int image_size      # the square the encoder was trained at
    int patch_size
    int n_merge         # gemma3: the side of the pooling window; qwen2vl: of the patch merger (2)
    int ffn_op          # VIT_FFN_*
    float eps           # LayerNorm's epsilon (and the soft-embedding RMSNorm's)
    bint norm_rms       # the encoder's norms are RMSNorms (qwen25vl), not LayerNorms
    int n_wa_pattern    # qwen25vl: every n_wa_pattern-th layer attends fully, the others within windows; 0: all fully


cdef struct VitStep:
    ggml_context * ctx
    ggml_cgraph * gf
    const VisionHParams * hp
    const VisionWeights * w
    const VitLayerWeights * layers
    int nx                  # the image's width and height in pixels, multiples of patch_size
    int ny
    bint flash_attn         # ggml_flash_attn_ext over F16 K and V (clip's CLIP_FLASH_ATTN_TYPE_ENABLED)
    ggml_tensor * inp_raw   # F32 (nx, ny, 3): the normalised pixels, one plane per channel


ctypedef ggml_tensor * (*VisionBuilder)(VitStep * st) except NULL

DEF MAX_VISION_BUILDERS = 16
cdef VisionBuilder _vision_builders[MAX_VISION_BUILDERS]
cdef list _vision_builder_names = []


cdef void _register_vision_builder(str name, VisionBuilder build) except *:
    if name in _vision_builder_names or len(_vision_builder_names) >= MAX_VISION_BUILDERS:
        raise RuntimeError(f"vision builder {name!r} registered twice, or too many builders")
    _vision_builders[len(_vision_builder_names)] = build
    _vision_builder_names.append(name)


def vision_builders():
    """The projector types whose encoders are compiled into the core."""
    return list(_vision_builder_names)


cdef inline ggml_tensor * vit_norm(VitStep * st, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b) noexcept:
    """LayerNorm (or RMSNorm, norm_rms) over the first dimension with the file's epsilon,
    then scale and shift (clip_graph::build_norm)."""
    x = ggml_rms_norm(st.ctx, x, st.hp.eps) if st.hp.norm_rms else ggml_norm(st.ctx, x, st.hp.eps)
    if w != NULL:
        x = ggml_mul(st.ctx, x, w)
    return ggml_add(st.ctx, x, b) if b != NULL else x


cdef inline ggml_tensor * vit_linear(VitStep * st, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x) noexcept:
    x = ggml_mul_mat(st.ctx, w, x)
    return ggml_add(st.ctx, x, b) if b != NULL else x


cdef ggml_tensor * vit_patches(VitStep * st) except NULL:
    """The pixels cut into patches and projected (clip_graph::build_inp):
    a convolution with the patch as kernel and stride; (n_embd, n_patches)."""
    cdef ggml_context * ctx = st.ctx
    cdef int p = st.hp.patch_size
    cdef int n_patches = (st.nx // p) * (st.ny // p)
    st.inp_raw = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, st.nx, st.ny, 3, 1)
    ggml_set_input(st.inp_raw)
    cdef ggml_tensor * x = ggml_conv_2d(ctx, st.w.patch_embd, st.inp_raw, p, p, 0, 0, 1, 1)
    x = ggml_reshape_3d(ctx, x, n_patches, st.hp.n_embd, 1)
    x = ggml_cont(ctx, ggml_transpose(ctx, x))
    if st.w.patch_bias != NULL:
        x = ggml_add(ctx, x, st.w.patch_bias)
    return x


cdef ggml_tensor * vit_attention(VitStep * st, const VitLayerWeights * lw, ggml_tensor * q, ggml_tensor * k,
                                 ggml_tensor * v, float kq_scale, ggml_tensor * mask=NULL) noexcept:
    """Every patch attends to every patch (clip_graph::build_attn), or where ``mask``
    (F32 (n_pos, n_pos), 0 or the lowest float; F16 for flash attention) allows.
    q, k, v: (d_head, n_head, n_pos); returns (n_embd, n_pos) after the output projection.
    With flash attention K and V are cast to F16 and the sum kept in F32, as clip.cpp does."""
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * out
    cdef ggml_tensor * kq
    q = ggml_permute(ctx, q, 0, 2, 1, 3)   # (d_head, n_pos, n_head)
    k = ggml_permute(ctx, k, 0, 2, 1, 3)
    if st.flash_attn:
        v = ggml_permute(ctx, v, 0, 2, 1, 3)
        if mask != NULL and mask.type != GGML_TYPE_F16:
            mask = ggml_cast(ctx, mask, GGML_TYPE_F16)
        out = ggml_flash_attn_ext(ctx, q, ggml_cast(ctx, k, GGML_TYPE_F16), ggml_cast(ctx, v, GGML_TYPE_F16), mask,
                                  kq_scale, 0.0, 0.0)
        ggml_prec_set_acc(out, GGML_PREC_F32)
        out = ggml_reshape_2d(ctx, out, out.ne[0] * out.ne[1], out.ne[2] * out.ne[3])
    else:
        v = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3))   # (n_pos, d_head, n_head)
        kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k, q), mask, kq_scale, 0.0)   # (n_pos, n_pos, n_head)
        out = ggml_permute(ctx, ggml_mul_mat(ctx, v, kq), 0, 2, 1, 3)              # (d_head, n_head, n_pos)
        out = ggml_cont_2d(ctx, out, out.ne[0] * out.ne[1], out.ne[2] * out.ne[3])
    return vit_linear(st, lw.o_w, lw.o_b, out)


cdef ggml_tensor * vit_ffn(VitStep * st, const VitLayerWeights * lw, ggml_tensor * x) noexcept:
    """clip_graph::build_ffn: up (and gate), the activation, down."""
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * up = vit_linear(st, lw.up_w, lw.up_b, x)
    cdef ggml_tensor * gate
    if lw.gate_w != NULL:
        gate = vit_linear(st, lw.gate_w, lw.gate_b, x)
        if st.hp.ffn_op == VIT_FFN_SILU:
            x = ggml_swiglu_split(ctx, gate, up)
        else:
            x = ggml_geglu_split(ctx, gate, up)
    elif st.hp.ffn_op == VIT_FFN_GELU:
        x = ggml_gelu(ctx, up)
    elif st.hp.ffn_op == VIT_FFN_SILU:
        x = ggml_silu(ctx, up)
    else:
        x = ggml_gelu_quick(ctx, up)
    return vit_linear(st, lw.down_w, lw.down_b, x)


cdef ggml_tensor * vit_encoder(VitStep * st, ggml_tensor * x, ggml_tensor * pos_embd) noexcept:
    """The pre-norm transformer over the patches (clip_graph::build_vit, one image):
    x (n_embd, n_pos) -> (n_embd, n_pos), learned positions added first."""
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef const VitLayerWeights * lw
    cdef int64_t n_pos = x.ne[1]
    cdef float kq_scale = 1.0 / sqrtf(<float> hp.d_head)
    cdef ggml_tensor * cur
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef int il
    if pos_embd != NULL:
        x = ggml_add(ctx, x, pos_embd)
    x = ggml_reshape_2d(ctx, x, hp.n_embd, n_pos)
    if st.w.pre_ln_w != NULL:
        x = vit_norm(st, x, st.w.pre_ln_w, st.w.pre_ln_b)
    for il in range(hp.n_layer):
        lw = &st.layers[il]
        cur = vit_norm(st, x, lw.ln1_w, lw.ln1_b)
        q = ggml_reshape_4d(ctx, vit_linear(st, lw.q_w, lw.q_b, cur), hp.d_head, hp.n_head, n_pos, 1)
        k = ggml_reshape_4d(ctx, vit_linear(st, lw.k_w, lw.k_b, cur), hp.d_head, hp.n_head, n_pos, 1)
        v = ggml_reshape_4d(ctx, vit_linear(st, lw.v_w, lw.v_b, cur), hp.d_head, hp.n_head, n_pos, 1)
        cur = vit_attention(st, lw, q, k, v, kq_scale)
        x = ggml_add(ctx, cur, x)                                   # clip.cpp: cur + residual
        cur = vit_ffn(st, lw, vit_norm(st, x, lw.ln2_w, lw.ln2_b))
        x = ggml_add(ctx, x, cur)                                   # ... and residual + cur
    if st.w.post_ln_w != NULL:
        x = vit_norm(st, x, st.w.post_ln_w, st.w.post_ln_b)
    return x
