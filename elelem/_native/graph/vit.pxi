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

# A layer's products, each with its clamp slot (VitLayerWeights.clamp; VIT_MM_ROLES' order).
DEF VIT_MM_Q = 0
DEF VIT_MM_K = 1
DEF VIT_MM_V = 2
DEF VIT_MM_O = 3
DEF VIT_MM_UP = 4
DEF VIT_MM_GATE = 5
DEF VIT_MM_DOWN = 6
DEF VIT_N_MM = 7


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
    ggml_tensor * q_norm    # (d_head) per head, or (n_head * d_head): gemma4v
    ggml_tensor * k_norm
    ggml_tensor * attn_post_norm   # (n_embd): gemma4v, the attention's output normed before the residual
    ggml_tensor * ffn_post_norm    # (n_embd): gemma4v, the same for the FFN
    ggml_tensor * out_scale        # (1) or (n_embd): gemma4v's layer_scalar, times the layer's output
    ggml_tensor * qkv_w            # (n_embd, 3 * n_head * d_head): qwen3vl's Q, K and V in one product
    ggml_tensor * qkv_b            # (3 * n_head * d_head)
    # qwen3vl's deepstack merger of this layer's output, where it has one: a LayerNorm over
    # each merged 2 x 2 block, then a GELU MLP to the text model's width.
    ggml_tensor * ds_norm_w        # (4 * n_embd)
    ggml_tensor * ds_norm_b        # (4 * n_embd)
    ggml_tensor * ds_fc1_w         # (4 * n_embd, 4 * n_embd)
    ggml_tensor * ds_fc1_b         # (4 * n_embd)
    ggml_tensor * ds_fc2_w         # (4 * n_embd, n_embd_out)
    ggml_tensor * ds_fc2_b         # (n_embd_out)
    # Gemma 4's clippable linears (clip.cpp's clamp_info_map): for the product VIT_MM_*, its
    # input clamped to [clamp[4i], clamp[4i+1]] and its output to [clamp[4i+2], clamp[4i+3]],
    # where bit i of clamped is set.  After the tensors: VIT_LAYER_ROLES index those alone.
    float clamp[4 * VIT_N_MM]
    int clamped

VIT_LAYER_ROLES = ("ln1_w", "ln1_b", "q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w", "o_b",
                   "ln2_w", "ln2_b", "up_w", "up_b", "gate_w", "gate_b", "down_w", "down_b",
                   "q_norm", "k_norm", "attn_post_norm", "ffn_post_norm", "out_scale",
                   "qkv_w", "qkv_b", "ds_norm_w", "ds_norm_b", "ds_fc1_w", "ds_fc1_b", "ds_fc2_w", "ds_fc2_b")
# The layer's products that may be clipped, in the order of their clamp slots.
VIT_MM_ROLES = ("q_w", "k_w", "v_w", "o_w", "up_w", "gate_w", "down_w")


cdef struct VisionWeights:
    # The tensors outside the layers; the order is VISION_GLOBAL_ROLES'.  Any may be NULL
    # where its projector type has none (elelem.model.projector says which are required).
    ggml_tensor * patch_embd        # (patch, patch, 3, n_embd): the patch convolution
    ggml_tensor * patch_bias        # (n_embd)
    ggml_tensor * pos_embd          # (n_embd, n_patches): learned positions; gemma4v: (n_embd, pos_size, 2),
                                    # a table for the column and one for the row
    ggml_tensor * pre_ln_w          # (n_embd)
    ggml_tensor * pre_ln_b
    ggml_tensor * post_ln_w         # (n_embd)
    ggml_tensor * post_ln_b
    ggml_tensor * mm_input_proj     # gemma3: (n_embd_out, n_embd), used transposed; gemma4v: (n_embd, n_embd_out)
    ggml_tensor * mm_soft_emb_norm  # gemma3: (n_embd)
    ggml_tensor * patch_embd_1      # qwen2vl: (patch, patch, 3, n_embd), the second temporal slice of the kernel
    ggml_tensor * mm_0_w            # qwen2vl: (4 * n_embd, 4 * n_embd), the merger's first linear
    ggml_tensor * mm_0_b            # (4 * n_embd)
    ggml_tensor * mm_1_w            # qwen2vl: (4 * n_embd, n_embd_out), the merger's second linear
    ggml_tensor * mm_1_b            # (n_embd_out)
    ggml_tensor * std_bias          # gemma4v: (n_embd), subtracted from the pooled tokens
    ggml_tensor * std_scale         # gemma4v: (n_embd), then multiplied
    ggml_tensor * mm_input_norm     # pixtral: (n_embd), the RMSNorm before the patch merger
    ggml_tensor * mm_patch_merger   # pixtral: (n_merge * n_merge * n_embd, n_embd), Mistral Small 3.1's merger
    ggml_tensor * img_break         # pixtral: (n_embd_out), the [IMG_BREAK] token's embedding
    ggml_tensor * mm_norm_w         # lfm2: (n_embd * n_merge^2), the LayerNorm before the projector's MLP
    ggml_tensor * mm_norm_b         # (n_embd * n_merge^2)
    # gemma4v: mm_input_proj's clamps (as VitLayerWeights.clamp), where mm_clamped
    float mm_clamp[4]
    bint mm_clamped

VISION_GLOBAL_ROLES = ("patch_embd", "patch_bias", "pos_embd", "pre_ln_w", "pre_ln_b", "post_ln_w", "post_ln_b",
                       "mm_input_proj", "mm_soft_emb_norm", "patch_embd_1", "mm_0_w", "mm_0_b", "mm_1_w", "mm_1_b",
                       "std_bias", "std_scale", "mm_input_norm", "mm_patch_merger", "img_break",
                       "mm_norm_w", "mm_norm_b")


cdef struct VisionHParams:
    int n_embd          # the encoder's width
    int n_head
    int d_head          # n_embd / n_head unless the file says otherwise
    int n_ff
    int n_layer
    int n_embd_out      # the text model's width: what the projector gives per image token
    int image_size      # the square the encoder was trained at
    int patch_size
    int n_merge         # gemma3, gemma4v: the side of the pooling window; qwen2vl: of the patch merger (2)
    int ffn_op          # VIT_FFN_*
    float eps           # LayerNorm's epsilon (and the soft-embedding RMSNorm's)
    bint rms_norm       # the encoder's norms are RMSNorms (clip's NORM_TYPE_RMS: qwen25vl, gemma4v), else LayerNorms
    int n_wa_pattern    # qwen25vl: every n_wa_pattern-th layer attends fully, the others within windows; 0: all fully
    bint v_norm         # V RMS-normed (no weight) before the attention: gemma4v
    float kq_scale      # the attention's scale; 0: 1 / sqrt(d_head)
    float rope_theta    # the 2D RoPE's base, where the builder rotates Q and K
    bint dynamic_size   # images of any size (multiples of patch_size * n_merge), else image_size square
    int pos_size        # gemma4v: the rows of each position table: patches a side at most (0: no such table)
    bint rope_2d_interleaved   # pixtral: the 2D RoPE's halves by row then column, frequencies interleaved


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
    ggml_tensor * pos_x     # I32 (n_patches): each patch's column, where the builder asks (vit_patch_positions)
    ggml_tensor * pos_y     # I32 (n_patches): its row


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
    """LayerNorm (or RMSNorm, hp.rms_norm) over the first dimension with the file's epsilon,
    then scale and shift (clip_graph::build_norm)."""
    x = ggml_rms_norm(st.ctx, x, st.hp.eps) if st.hp.rms_norm else ggml_norm(st.ctx, x, st.hp.eps)
    if w != NULL:
        x = ggml_mul(st.ctx, x, w)
    return ggml_add(st.ctx, x, b) if b != NULL else x


cdef inline ggml_tensor * vit_mm(VitStep * st, ggml_tensor * w, ggml_tensor * x, const float * clamp) noexcept:
    """w x; with clamp (4 floats, or NULL) the input and the output clamped, as
    clip_graph_gemma4v::build_mm does for Gemma 4's clippable linears."""
    if clamp == NULL:
        return ggml_mul_mat(st.ctx, w, x)
    x = ggml_mul_mat(st.ctx, w, ggml_clamp(st.ctx, x, clamp[0], clamp[1]))
    return ggml_clamp(st.ctx, x, clamp[2], clamp[3])


cdef inline const float * vit_layer_clamp(const VitLayerWeights * lw, int which) noexcept:
    if lw == NULL or not (lw.clamped & (1 << which)):
        return NULL
    return &lw.clamp[4 * which]


cdef inline ggml_tensor * vit_linear(VitStep * st, const VitLayerWeights * lw, int which, ggml_tensor * w,
                                     ggml_tensor * b, ggml_tensor * x) noexcept:
    """One of a layer's products (VIT_MM_*), clamped where the file says, plus its bias."""
    x = vit_mm(st, w, x, vit_layer_clamp(lw, which))
    return ggml_add(st.ctx, x, b) if b != NULL else x


cdef ggml_tensor * vit_patches(VitStep * st, bint signed_pixels=False) except NULL:
    """The pixels cut into patches and projected (clip_graph::build_inp):
    a convolution with the patch as kernel and stride; (n_embd, n_patches).
    signed_pixels: the pixels taken as 2 v - 1 first (gemma4v)."""
    cdef ggml_context * ctx = st.ctx
    cdef int p = st.hp.patch_size
    cdef int n_patches = (st.nx // p) * (st.ny // p)
    st.inp_raw = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, st.nx, st.ny, 3, 1)
    ggml_set_input(st.inp_raw)
    cdef ggml_tensor * px = ggml_scale_bias(ctx, st.inp_raw, 2.0, -1.0) if signed_pixels else st.inp_raw
    cdef ggml_tensor * x = ggml_conv_2d(ctx, st.w.patch_embd, px, p, p, 0, 0, 1, 1)
    x = ggml_reshape_3d(ctx, x, n_patches, st.hp.n_embd, 1)
    x = ggml_cont(ctx, ggml_transpose(ctx, x))
    if st.w.patch_bias != NULL:
        x = ggml_add(ctx, x, st.w.patch_bias)
    return x


cdef void vit_patch_positions(VitStep * st) noexcept:
    """Each patch's column (pos_x) and row (pos_y), inputs set by VisionModel.encode."""
    cdef int n_patches = (st.nx // st.hp.patch_size) * (st.ny // st.hp.patch_size)
    st.pos_x = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I32, n_patches)
    st.pos_y = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I32, n_patches)
    ggml_set_input(st.pos_x)
    ggml_set_input(st.pos_y)


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
    return vit_linear(st, lw, VIT_MM_O, lw.o_w, lw.o_b, out)


cdef ggml_tensor * vit_ffn(VitStep * st, const VitLayerWeights * lw, ggml_tensor * x) noexcept:
    """clip_graph::build_ffn: up (and gate), the activation, down."""
    cdef ggml_context * ctx = st.ctx
    cdef ggml_tensor * up = vit_linear(st, lw, VIT_MM_UP, lw.up_w, lw.up_b, x)
    cdef ggml_tensor * gate
    if lw.gate_w != NULL:
        gate = vit_linear(st, lw, VIT_MM_GATE, lw.gate_w, lw.gate_b, x)
        if st.hp.ffn_op == VIT_FFN_SILU:
            x = ggml_swiglu_split(ctx, gate, up)
        elif st.hp.ffn_op == VIT_FFN_GELU:
            x = ggml_geglu_split(ctx, gate, up)
        else:
            x = ggml_geglu_quick_split(ctx, gate, up)
    elif st.hp.ffn_op == VIT_FFN_GELU:
        x = ggml_gelu(ctx, up)
    elif st.hp.ffn_op == VIT_FFN_SILU:
        x = ggml_silu(ctx, up)
    else:
        x = ggml_gelu_quick(ctx, up)
    return vit_linear(st, lw, VIT_MM_DOWN, lw.down_w, lw.down_b, x)


cdef ggml_tensor * vit_qk_norm(VitStep * st, ggml_tensor * t, ggml_tensor * w) noexcept:
    """A per-head norm of Q or K, t (d_head, n_head, n_pos) (clip.cpp's norm_per_head), or
    over the whole row where the weight is that wide."""
    cdef int64_t d_head = t.ne[0], n_head = t.ne[1], n_pos = t.ne[2]
    if w.ne[0] == d_head:
        return vit_norm(st, t, w, NULL)
    t = vit_norm(st, ggml_reshape_2d(st.ctx, t, d_head * n_head, n_pos), w, NULL)
    return ggml_reshape_4d(st.ctx, t, d_head, n_head, n_pos, 1)


cdef ggml_tensor * vit_rope_2d_neox(VitStep * st, ggml_tensor * t) noexcept:
    """Gemma 4's 2D RoPE (clip_graph_gemma4v's add_pos): the first half of each head
    turned by the patch's column, the second half by its row, NeoX ordering in each."""
    cdef int n_half = <int> (t.ne[0] // 2)
    t = ggml_rope_ext(st.ctx, t, st.pos_x, NULL, n_half, GGML_ROPE_TYPE_NEOX, 0, st.hp.rope_theta,
                      1.0, 0.0, 1.0, 0.0, 0.0)
    t = ggml_rope_ext(st.ctx, t, st.pos_y, NULL, n_half, GGML_ROPE_TYPE_NEOX, 0, st.hp.rope_theta,
                      1.0, 0.0, 1.0, 0.0, 0.0)
    return ggml_rope_set_offset(t, n_half)


cdef ggml_tensor * vit_rope_2d_interleaved(VitStep * st, ggml_tensor * t) noexcept:
    """Pixtral's 2D RoPE (clip_graph::build_rope_2d with interleave_freq): the first half
    of each head turned by the patch's row, the second half by its column, adjacent pairs.
    The head's frequencies alternate between the halves: the first takes the even ones
    (a half-width RoPE's own), the second the odd ones, through a frequency scale of
    theta^(-2 / d_head)."""
    cdef int n_dim = <int> t.ne[0]
    cdef int n_half = n_dim // 2
    cdef float exponent = <float> -2.0
    exponent = exponent / <float> n_dim      # in float, as clip.cpp's (float) -2 / n_dim
    cdef float odd = powf(st.hp.rope_theta, exponent)
    t = ggml_rope_ext(st.ctx, t, st.pos_y, NULL, n_half, 0, 0, st.hp.rope_theta, 1.0, 0.0, 1.0, 0.0, 0.0)
    t = ggml_rope_ext(st.ctx, t, st.pos_x, NULL, n_half, 0, 0, st.hp.rope_theta, odd, 0.0, 1.0, 0.0, 0.0)
    return ggml_rope_set_offset(t, n_half)


cdef ggml_tensor * vit_encoder(VitStep * st, ggml_tensor * x, ggml_tensor * pos_embd) noexcept:
    """The pre-norm transformer over the patches (clip_graph::build_vit, one image):
    x (n_embd, n_pos) -> (n_embd, n_pos), learned positions added first.  Where the
    layers have them: per-head Q/K norms, the 2D RoPE (st.pos_x set), V normed
    (hp.v_norm), norms after the attention and the FFN, and a scale of the output."""
    cdef ggml_context * ctx = st.ctx
    cdef const VisionHParams * hp = st.hp
    cdef const VitLayerWeights * lw
    cdef int64_t n_pos = x.ne[1]
    cdef float kq_scale = hp.kq_scale if hp.kq_scale != 0.0 else 1.0 / sqrtf(<float> hp.d_head)
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
        q = ggml_reshape_4d(ctx, vit_linear(st, lw, VIT_MM_Q, lw.q_w, lw.q_b, cur), hp.d_head, hp.n_head, n_pos, 1)
        k = ggml_reshape_4d(ctx, vit_linear(st, lw, VIT_MM_K, lw.k_w, lw.k_b, cur), hp.d_head, hp.n_head, n_pos, 1)
        v = ggml_reshape_4d(ctx, vit_linear(st, lw, VIT_MM_V, lw.v_w, lw.v_b, cur), hp.d_head, hp.n_head, n_pos, 1)
        if lw.q_norm != NULL:
            q = vit_qk_norm(st, q, lw.q_norm)
        if lw.k_norm != NULL:
            k = vit_qk_norm(st, k, lw.k_norm)
        if st.pos_x != NULL and hp.rope_2d_interleaved:
            q = vit_rope_2d_interleaved(st, q)
            k = vit_rope_2d_interleaved(st, k)
        elif st.pos_x != NULL:
            q = vit_rope_2d_neox(st, q)
            k = vit_rope_2d_neox(st, k)
        if hp.v_norm:
            v = ggml_rms_norm(ctx, v, hp.eps)
        cur = vit_attention(st, lw, q, k, v, kq_scale)
        if lw.attn_post_norm != NULL:
            cur = vit_norm(st, cur, lw.attn_post_norm, NULL)
        x = ggml_add(ctx, cur, x)                                   # clip.cpp: cur + residual
        cur = vit_ffn(st, lw, vit_norm(st, x, lw.ln2_w, lw.ln2_b))
        if lw.ffn_post_norm != NULL:
            cur = vit_norm(st, cur, lw.ffn_post_norm, NULL)
        x = ggml_add(ctx, x, cur)                                   # ... and residual + cur
        if lw.out_scale != NULL:
            x = ggml_mul(ctx, x, lw.out_scale)
    if st.w.post_ln_w != NULL:
        x = vit_norm(st, x, st.w.post_ln_w, st.w.post_ln_b)
    return x


cdef ggml_tensor * vit_pixel_shuffle(VitStep * st, ggml_tensor * x, int k) noexcept:
    """clip_graph::build_patch_merge_permute (idefics3's pixel shuffle, lfm2's unshuffle):
    x (n_embd, w * h), patches row by row -> (n_embd * k * k, (w / k) * (h / k)), blocks row
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
