# Shared graph blocks, included into core.pyx.  Each architecture's builder
# (graph/arch_*.pxi) is straight-line code over these.  Shapes are in ggml
# order: the first number is the contiguous dimension.

# ggml's CPU flash attention takes its tiled kernel for 64 query rows or
# more (GGML_FA_TILE_Q), its one-row kernel below; the two round differently.
DEF FA_TILE_ROWS = 64
# ... and with a single query row it splits the cells between its threads
# from this many cells on (its split-KV path), summing them otherwise.
DEF FA_SPLIT_CELLS = 512
# A step of generated tokens (up to this many rows) whose rows' one-token
# steps would split their cells: Step.split_kv (_flash_attention_as_one_token_steps).
DEF MAX_SPLIT_ROWS = 128
DEF FA_ROW_NODES = 10      # graph nodes of one such row's op (its views, the op, its place in the output)
DEF MAX_RUNS = 8           # runs of sequences in a prompt step split as above, at most
# Generated tokens evaluated again (Context._replay) go in steps of this many
# rows.  (A step of generated tokens of any width keeps every row's one-token
# numbers: graph/matmul.pxi, attention below, graph/experts.pxi.)
DEF DECODE_KERNEL_COLUMNS = 8
# The most target layers a step hands a drafter (EAGLE-3 reads three, DFlash five or so).
DEF MAX_FEATURE_LAYERS = 8


cdef struct Step:
    ggml_context * ctx
    ggml_cgraph * gf
    const HParams * hp
    const WidenedWeights * widened   # the model's Q8_0 copies of Q5_0 weights (widen.pxi)
    int n_tokens            # tokens in this step (of one or more sequences)
    int n_outputs           # rows whose logits are wanted
    int n_kv                # cells attended to (KVCache.n_kv: padded, masked)
    int kv_size             # cells in the cache
    int v_row               # a cell's transposed V: KVCache.v_row
    bint flash_attn         # ggml_flash_attn_ext, else mul_mat + softmax (llama.cpp's default)
    bint embeddings         # the output is the final normed hidden state (n_embd rows), not logits
    bint rank               # ... read by the classification head (rank_head): one row, the step's one sequence's
    bint decode_kernels     # every token is a generated one: small matmuls as one-token steps run them
    bint pair_lone_row      # flash attention takes the step's one row twice (_flash_attention_lone_row)
    # Flash attention in a step of generated tokens, some of whose rows would
    # take ggml's split-KV path as one-token steps: per row, the n_kv of its
    # one-token step where that step would split the cells, 0 where not
    # (Context._decode; _flash_attention_as_one_token_steps).
    bint split_rows
    int split_kv[MAX_SPLIT_ROWS]
    ggml_tensor * paired_of     # the activations last prepared for elelem's small-batch kernels ...
    ggml_tensor * paired        # ... and that preparation, reused by the matmuls that share them (q/k/v, gate/up)
    ggml_type paired_type       # its quantized type (Q8_0, Q8_1 or Q8_K)
    ggml_tensor * inp_tokens    # I32 (n_tokens)
    # A step of given embeddings (an image's, from a projector) in place of
    # tokens: inp_embd is read instead of the token table, as llama.cpp's
    # ubatch.embd.  A step is all tokens or all embeddings.
    bint embd_input
    ggml_tensor * inp_embd      # F32 (n_embd * (1 + n_deepstack), n_tokens); NULL in a step of tokens
    # Its rows see every cell of their sequence, the later rows of the step
    # too (an image's tokens attend to each other both ways where libmtmd
    # says so: mtmd_decode_use_non_causal).  Set per step; the mask only.
    bint bidirectional
    ggml_tensor * inp_pos       # I32 (n_tokens): each token's position in its sequence
    ggml_tensor * inp_mask      # (n_kv, n_tokens): 0 or -inf, from the cells; F16 for flash attention, else F32 (as llama.cpp)
    ggml_tensor * inp_mask_swa  # the same, also windowed; NULL without SWA
    ggml_tensor * inp_k_idx     # I64 (n_tokens): the cells this step's K (and V) go to
    ggml_tensor * inp_v_idx     # I64 (v_row * n_tokens): cache elements of transposed V; NULL with flash_attn
    ggml_tensor * inp_out_ids   # I32 (n_outputs): rows kept for the output; NULL when every row is
    ggml_tensor * inp_attn_scale  # F32 (1, 1, n_tokens): attention temperature per token (mistral3); NULL if none
    # A hybrid model's recurrent layers: the step holds n_seqs sequences of
    # n_tokens / n_seqs tokens each, sequence after sequence (Context.decode
    # arranges it so); each reads its state from one slot, writes the next
    # state to the other (KVCache.rs_slot).
    int n_seqs
    ggml_tensor * inp_rs_read     # I32 (n_seqs): the slots holding the sequences' states
    ggml_tensor * inp_rs_write    # I64 (n_seqs): the slots their new states go to
    ggml_tensor * inp_pos4        # I32 (4 * n_tokens): positions for multi-section RoPE; NULL without
    ggml_tensor * logits        # F32 (n_vocab, n_outputs); (n_embd, n_outputs) for embeddings; (n_cls_out, 1) for rank
    # Multi-token prediction: a step may also keep the final normed hidden
    # state of every row, which an MTP head drafts from (llama.cpp's t_h_nextn,
    # embeddings_nextn unmasked); the builders that support it set hidden.
    bint want_hidden
    ggml_tensor * hidden        # F32 (n_embd, n_tokens) when want_hidden, else NULL
    ggml_tensor * inp_h         # an MTP head's (HParams.mtp_head) F32 (hidden_width, n_tokens): h of the row before each token
    ggml_tensor * target_tok_embd   # a drafter's that embeds tokens by its target's table (gemma4-assistant), else NULL
    # EAGLE-3's target: with want_hidden, the hidden rows are instead the inputs of
    # these layers (llama.cpp's t_layer_inp, llama_set_embeddings_layer_inp),
    # concatenated in this order: (n_feature_layers * n_embd, n_tokens).  The
    # builders that support it record each layer's input (keep_layer_input).
    int n_feature_layers
    int feature_layers[MAX_FEATURE_LAYERS]
    ggml_tensor * feature_inputs[MAX_FEATURE_LAYERS]   # F32 (n_embd, n_tokens) each, all rows
    # A prompt step that mixes sequences: the lengths of its runs of one
    # sequence's tokens (n_runs 0 otherwise, and for steps of generated
    # tokens).  Flash attention over FA_TILE_ROWS rows or more and repacked
    # weights' matmuls then run once per run (see attention and matmul).
    int n_runs
    int run_length[MAX_RUNS]
    # ... and the lengths of the runs of its output rows (one sequence's
    # outputs each), where there are 2 to MAX_RUNS of them (0 otherwise): the
    # last layer's FFN and the output head run on those rows alone
    # (select_outputs), which width-dependent kernels then take a run at a
    # time, as each sequence's own step would (matmul, ffn_moe).
    int n_out_runs
    int out_run_length[MAX_RUNS]
    bint output_rows            # the graph being built is past select_outputs: its rows are the output rows
    # LoRA adapters (graph/lora.pxi): those of the context's whose scale is
    # not 0 for some row of the step, in the context's order.
    int lora_mask                           # their bits in the context's list of adapters
    int n_lora
    const AdapterWeights * lora[MAX_ADAPTERS]
    int lora_id[MAX_ADAPTERS]               # their indices in the context's list
    # F32 (1, n_tokens) inputs: each row's scale for adapter j's pairs of rank
    # slot r, at j * MAX_ADAPTER_RANKS + r; and the same of the output rows (made on first use)
    ggml_tensor * lora_scale[MAX_ADAPTERS * MAX_ADAPTER_RANKS]
    ggml_tensor * lora_scale_out[MAX_ADAPTERS * MAX_ADAPTER_RANKS]
    int lora_row0               # the first row of those being built (a group of rows through the experts), else 0


cdef void _make_inputs(Step * st) except *:
    st.inp_tokens = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I32, st.n_tokens)
    st.inp_pos = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I32, st.n_tokens)
    cdef ggml_type mask_type = GGML_TYPE_F16 if st.flash_attn else GGML_TYPE_F32
    st.inp_mask = ggml_new_tensor_2d(st.ctx, mask_type, st.n_kv, st.n_tokens)
    ggml_set_input(st.inp_tokens)
    ggml_set_input(st.inp_pos)
    if st.embd_input:
        st.inp_embd = ggml_new_tensor_2d(st.ctx, GGML_TYPE_F32, embd_input_width(st.hp), st.n_tokens)
        ggml_set_input(st.inp_embd)
    else:
        st.inp_embd = NULL
    ggml_set_input(st.inp_mask)
    st.inp_k_idx = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I64, st.n_tokens)
    ggml_set_input(st.inp_k_idx)
    if st.flash_attn or st.v_row == 0:   # V per cell, or V a view of K (KVCache.v_in_k)
        st.inp_v_idx = NULL
    else:
        st.inp_v_idx = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I64, <int64_t> st.v_row * st.n_tokens)
        ggml_set_input(st.inp_v_idx)
    if st.hp.n_swa > 0:
        st.inp_mask_swa = ggml_new_tensor_2d(st.ctx, mask_type, st.n_kv, st.n_tokens)
        ggml_set_input(st.inp_mask_swa)
    else:
        st.inp_mask_swa = NULL
    if st.n_outputs < st.n_tokens:
        st.inp_out_ids = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I32, st.n_outputs)
        ggml_set_input(st.inp_out_ids)
    else:
        st.inp_out_ids = NULL
    if st.hp.attn_temp_scale != 0.0:
        st.inp_attn_scale = ggml_new_tensor_3d(st.ctx, GGML_TYPE_F32, 1, 1, st.n_tokens)
        ggml_set_input(st.inp_attn_scale)
    else:
        st.inp_attn_scale = NULL
    st.inp_rs_read = st.inp_rs_write = st.inp_pos4 = NULL
    if st.n_seqs > 0:
        st.inp_rs_read = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I32, st.n_seqs)
        st.inp_rs_write = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I64, st.n_seqs)
        ggml_set_input(st.inp_rs_read)
        ggml_set_input(st.inp_rs_write)
    if st.hp.rope_type == GGML_ROPE_TYPE_IMROPE or st.hp.rope_type == GGML_ROPE_TYPE_MROPE:
        st.inp_pos4 = ggml_new_tensor_1d(st.ctx, GGML_TYPE_I32, 4 * st.n_tokens)
        ggml_set_input(st.inp_pos4)
    make_lora_inputs(st)
    st.hidden = NULL
    st.inp_h = NULL
    if st.hp.mtp_head:
        st.inp_h = ggml_new_tensor_2d(st.ctx, GGML_TYPE_F32, hidden_width(st.hp), st.n_tokens)
        ggml_set_input(st.inp_h)


cdef inline int embd_input_width(const HParams * hp) noexcept:
    """The width of an embedding row given in place of a token (llama.cpp's
    hparams.n_embd_inp): n_embd_inp where the model sets it (a DFlash drafter's
    target features), else n_embd and n_embd more per deepstack part (Qwen3-VL)."""
    return hp.n_embd_inp if hp.n_embd_inp > 0 else hp.n_embd * (1 + hp.n_deepstack)


cdef inline ggml_tensor * add_deepstack(Step * st, ggml_tensor * x, int il) noexcept:
    """x plus part il + 1 of the given embedding rows, after layer il < n_deepstack
    (llama.cpp's qwen3vl graph: a view of t_inp_embd, "deepstack_out").  A step of
    tokens has no such parts (llama.cpp adds the zeros its padding gives them)."""
    if st.inp_embd == NULL or il >= st.hp.n_deepstack:
        return x
    return ggml_add(st.ctx, x, ggml_view_2d(st.ctx, st.inp_embd, st.hp.n_embd, st.n_tokens, st.inp_embd.nb[1],
                                            (il + 1) * st.hp.n_embd * sizeof(float)))


cdef inline int hidden_width(const HParams * hp) noexcept:
    """The width of the hidden states an MTP head or drafter takes and
    gives: its target's (n_embd_out, a Gemma 4 drafter's), else n_embd."""
    return hp.n_embd_out if hp.n_embd_out > 0 else hp.n_embd


cdef inline void keep_layer_input(Step * st, int il, ggml_tensor * x) noexcept:
    """Record x, the input of layer il, where the step hands it to a drafter (Step.feature_layers)."""
    cdef int k
    for k in range(st.n_feature_layers):
        if st.feature_layers[k] == il:
            st.feature_inputs[k] = x


cdef inline void _set_input(ggml_tensor * t, const void * data, size_t size) noexcept:
    # An input no node reads (the global mask of a model whose layers all
    # slide, say) gets no memory from the allocator: skip it.
    if t != NULL and t.buffer != NULL:
        ggml_backend_tensor_set(t, data, 0, size)


cdef size_t BIG_MASK = 1 << 16   # mask elements (of a step's tokens by its cells) worth letting the GIL go for


cdef void _fill_step_mask(Step * st, KVCache cache, void * mask, const int32_t * seqs, const int32_t * positions,
                          int n_swa, bint causal) noexcept:
    """The step's mask, without the GIL when it is a prompt step's (megabytes).  A generated
    token's is a few thousand cells, microseconds, which letting the GIL go would turn into a
    wait to have it back whenever another thread runs Python (a model loading in a server)."""
    if <size_t> st.n_kv * st.n_tokens >= BIG_MASK:
        with nogil:
            cache.fill_mask(mask, st.n_tokens, st.n_kv, seqs, positions, n_swa, st.flash_attn, causal)
    else:
        cache.fill_mask(mask, st.n_tokens, st.n_kv, seqs, positions, n_swa, st.flash_attn, causal)


cdef void _set_inputs(Step * st, KVCache cache, const int32_t * tokens, const int32_t * seqs,
                      const int32_t * positions, const int32_t * cells, const int32_t * out_rows,
                      const int32_t * positions4=NULL) except *:
    cdef size_t n_mask = <size_t> st.n_kv * st.n_tokens
    cdef int64_t v_row = st.v_row
    cdef size_t n_idx = st.n_tokens * (v_row if st.inp_v_idx != NULL else 1)
    cdef size_t mask_el = 2 if st.flash_attn else 4
    cdef void * mask = malloc(n_mask * mask_el)
    cdef int64_t * idx = <int64_t *> malloc(n_idx * sizeof(int64_t))
    cdef int64_t i, c
    if mask == NULL or idx == NULL:
        free(mask)
        free(idx)
        raise MemoryError()
    try:
        for i in range(st.n_tokens):
            idx[i] = cells[i]
        _set_input(st.inp_tokens, tokens, st.n_tokens * sizeof(int32_t))
        _set_input(st.inp_pos, positions, st.n_tokens * sizeof(int32_t))
        _set_input(st.inp_k_idx, idx, st.n_tokens * sizeof(int64_t))
        if st.inp_out_ids != NULL:
            _set_input(st.inp_out_ids, out_rows, st.n_outputs * sizeof(int32_t))
        if st.inp_attn_scale != NULL:
            _set_attn_scale(st, positions)
        if st.inp_rs_read != NULL:
            _set_recurrent_slots(st, cache, seqs)
        if st.inp_pos4 != NULL and positions4 != NULL:   # M-RoPE's own (graph/mrope.pxi)
            _set_input(st.inp_pos4, positions4, 4 * st.n_tokens * sizeof(int32_t))
        elif st.inp_pos4 != NULL:
            _set_positions4(st, positions)
        if st.inp_v_idx != NULL:
            # V is stored transposed: element (channel c, cell j) at c * kv_size + j;
            # this step's V, flattened, holds (c, token t) at c + t * v_row.
            for i in range(st.n_tokens):
                for c in range(v_row):
                    idx[c + i * v_row] = c * st.kv_size + cells[i]
            _set_input(st.inp_v_idx, idx, n_idx * sizeof(int64_t))
        # Gemma 4's global layers stay causal in a non-causal step (LLAMA_NON_CAUSAL_TYPE_SWA_ONLY:
        # llama_kv_cache::set_input_kq_mask makes only the sliding cache non-causal).
        _fill_step_mask(st, cache, mask, seqs, positions, 0,
                   st.hp.causal and not (st.bidirectional and not st.hp.non_causal_swa_only))
        _set_input(st.inp_mask, mask, n_mask * mask_el)
        if st.inp_mask_swa != NULL:
            _fill_step_mask(st, cache, mask, seqs, positions, st.hp.n_swa, st.hp.causal and not st.bidirectional)
            _set_input(st.inp_mask_swa, mask, n_mask * mask_el)
    finally:
        free(mask)
        free(idx)


cdef void _set_recurrent_slots(Step * st, KVCache cache, const int32_t * seqs) except *:
    """Each sequence's current slot, and the other one, which it writes."""
    cdef int32_t read[MAX_SEQ]
    cdef int64_t write[MAX_SEQ]
    cdef int j, q, per = st.n_tokens // st.n_seqs
    for j in range(st.n_seqs):
        q = seqs[j * per]
        cache.ready_state(q)
        read[j] = cache.rs_slot[q]
        write[j] = q + cache.n_seq_max if cache.rs_slot[q] == q else q
    _set_input(st.inp_rs_read, read, st.n_seqs * sizeof(int32_t))
    _set_input(st.inp_rs_write, write, st.n_seqs * sizeof(int64_t))


cdef void _set_positions4(Step * st, const int32_t * positions) except *:
    """Text positions for multi-section RoPE, as llama.cpp gives a text token:
    its position in the first three streams, 0 in the fourth."""
    cdef int32_t * pos = <int32_t *> calloc(4 * st.n_tokens, sizeof(int32_t))
    cdef int i, k
    if pos == NULL:
        raise MemoryError()
    for k in range(3):
        for i in range(st.n_tokens):
            pos[k * st.n_tokens + i] = positions[i]
    _set_input(st.inp_pos4, pos, 4 * st.n_tokens * sizeof(int32_t))
    free(pos)


cdef void _set_attn_scale(Step * st, const int32_t * positions) except *:
    """llama.cpp's llm_graph_input_attn_temp: each token's Q scale,
    log(floor(pos / floor_scale) + 1) * temp_scale + 1, with the float and
    double steps it takes."""
    cdef float * scale = <float *> malloc(st.n_tokens * sizeof(float))
    cdef int i
    cdef float quotient
    if scale == NULL:
        raise MemoryError()
    for i in range(st.n_tokens):
        quotient = (<float> positions[i]) / (<float> st.hp.attn_temp_floor)
        scale[i] = <float> (log(<double> floorf(quotient) + 1.0) * <double> st.hp.attn_temp_scale + 1.0)
    _set_input(st.inp_attn_scale, scale, st.n_tokens * sizeof(float))
    free(scale)


cdef inline ggml_tensor * norm_rms(Step * st, ggml_tensor * x, ggml_tensor * weight) noexcept:
    """RMSNorm over the first dimension, then the learned scale."""
    x = ggml_rms_norm(st.ctx, x, st.hp.rms_eps)
    return ggml_mul(st.ctx, x, weight) if weight != NULL else x


cdef inline ggml_tensor * norm_layer(Step * st, ggml_tensor * x, ggml_tensor * weight, ggml_tensor * bias) noexcept:
    """LayerNorm over the first dimension, then the learned scale and shift."""
    x = ggml_norm(st.ctx, x, st.hp.norm_eps)
    if weight != NULL:
        x = ggml_mul(st.ctx, x, weight)
    return ggml_add(st.ctx, x, bias) if bias != NULL else x


cdef inline ggml_tensor * linear(Step * st, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x) noexcept:
    """x @ w (+ b): (n_in, n) -> (n_out, n); b may be NULL.  The step's LoRA
    adapters add their products before the bias (graph/lora.pxi)."""
    cdef ggml_tensor * y = matmul(st, w, x)
    if st.n_lora:
        y = add_lora(st, w, x, y)
    return ggml_add(st.ctx, y, b) if b != NULL else y


cdef inline ggml_tensor * rope(Step * st, ggml_tensor * x, float freq_base, float freq_scale,
                               ggml_tensor * freq_factors) noexcept:
    """Rotary position embedding of (head_dim, n_heads, n_tokens) at inp_pos."""
    return rope_dims(st, x, st.hp.n_rot, freq_base, freq_scale, freq_factors)


cdef inline ggml_tensor * rope_dims(Step * st, ggml_tensor * x, int n_rot, float freq_base, float freq_scale,
                                    ggml_tensor * freq_factors) noexcept:
    """rope() over the first n_rot dims of each head (a layer's own: LayerShape.n_rot)."""
    cdef const HParams * hp = st.hp
    cdef int sections[4]
    if hp.rope_type == GGML_ROPE_TYPE_MROPE or hp.rope_type == GGML_ROPE_TYPE_IMROPE:   # Qwen2-VL, Qwen3-VL
        sections[0], sections[1], sections[2], sections[3] = (hp.rope_sections[0], hp.rope_sections[1],
                                                              hp.rope_sections[2], hp.rope_sections[3])
        return ggml_rope_multi(st.ctx, x, st.inp_pos4, freq_factors, n_rot, sections, hp.rope_type, hp.n_ctx_orig,
                               freq_base, freq_scale, hp.rope_ext_factor, hp.rope_attn_factor,
                               hp.yarn_beta_fast, hp.yarn_beta_slow)
    return ggml_rope_ext(st.ctx, x, st.inp_pos, freq_factors, n_rot, hp.rope_type, hp.n_ctx_orig,
                         freq_base, freq_scale, hp.rope_ext_factor, hp.rope_attn_factor,
                         hp.yarn_beta_fast, hp.yarn_beta_slow)  # without YaRN: ext_factor 0, attn_factor 1


cdef void store_kv(Step * st, KVCache cache, int il, ggml_tensor * k, ggml_tensor * v) noexcept:
    """Store this step's K (head_dim_k, n_head_kv, n_tokens) and V
    (head_dim_v * n_head_kv, n_tokens) of layer il in its cells (attention's
    first half; a DFlash drafter's injection stores without attending).  The
    destinations come from index inputs, not from view offsets, so one graph
    serves every step of the same shape."""
    cdef ggml_context * ctx = st.ctx
    cdef const LayerShape * shape = &cache.shapes[il]
    cdef ggml_tensor * kc = cache.k[il]
    cdef ggml_tensor * vc = cache.v[il]
    cdef int64_t k_row = shape.head_dim_k * shape.n_head_kv
    cdef int64_t v_row = shape.head_dim_v * shape.n_head_kv
    ggml_build_forward_expand(st.gf, ggml_set_rows(ctx, kc, ggml_reshape_2d(ctx, k, k_row, st.n_tokens),
                                                   st.inp_k_idx))
    if st.flash_attn:
        ggml_build_forward_expand(st.gf, ggml_set_rows(ctx, vc, v, st.inp_k_idx))
    else:  # one element per "row" of the flattened, transposed V, padded to the widest layer's
        if v_row < st.v_row:
            v = ggml_pad(ctx, v, st.v_row - v_row, 0, 0, 0)
        ggml_build_forward_expand(st.gf, ggml_set_rows(
            ctx, ggml_reshape_2d(ctx, vc, 1, st.v_row * cache.kv_size),
            ggml_reshape_2d(ctx, v, 1, st.v_row * st.n_tokens), st.inp_v_idx))


cdef ggml_tensor * attention(Step * st, KVCache cache, int il, ggml_tensor * q, ggml_tensor * k,
                             ggml_tensor * v, ggml_tensor * mask, float kq_scale,
                             ggml_tensor * sinks=NULL) noexcept:
    """Store this step's K and V in its cells, then attend over cells [0, n_kv).

    q: (head_dim_k, n_head, n_tokens), k: (head_dim_k, n_head_kv, n_tokens),
    v: (head_dim_v * n_head_kv, n_tokens).  Returns (head_dim_v * n_head, n_tokens).
    The widths are layer il's (KVCache.shapes).  k and v NULL: the layer
    stores nothing and attends over the K and V of the layer it shares them
    with (Gemma 4), which the cache's k[il] and v[il] are.
    sinks, optional (n_head): a logit per head that joins every softmax
    without a value (gpt-oss), as llama.cpp's soft_max/flash_attn add_sinks.

    K rows are stored per cell: (head_dim_k * n_head_kv, kv_size).  V is
    stored the same way for flash attention, and transposed otherwise, so
    that softmax(KQ) @ V is a plain mul_mat over contiguous rows, as in
    llama.cpp, whose summation order this path reproduces.
    """
    cdef ggml_context * ctx = st.ctx
    cdef const LayerShape * shape = &cache.shapes[il]
    cdef int64_t n_head = q.ne[1], n_head_kv = shape.n_head_kv
    cdef int64_t head_dim_k = shape.head_dim_k, head_dim_v = shape.head_dim_v
    cdef ggml_tensor * kc = cache.k[il]
    cdef ggml_tensor * vc = cache.v[il]
    cdef size_t v_el = ggml_element_size(vc)

    # The writes into the cache are expanded first, so they run before the reads below.
    if k != NULL:
        store_kv(st, cache, il, k, v)

    cdef ggml_tensor * keys = ggml_view_3d(ctx, kc, head_dim_k, st.n_kv, n_head_kv,
                                           kc.nb[1], ggml_row_size(kc.type, head_dim_k), 0)
    cdef ggml_tensor * values
    cdef ggml_tensor * out
    q = ggml_permute(ctx, q, 0, 2, 1, 3)  # (head_dim_k, n_tokens, n_head)
    if st.flash_attn:
        values = ggml_view_3d(ctx, vc, head_dim_v, st.n_kv, n_head_kv,
                              vc.nb[1], ggml_row_size(vc.type, head_dim_v), 0)
        if st.split_rows or (st.decode_kernels and st.n_tokens >= FA_TILE_ROWS):
            return _flash_attention_as_one_token_steps(st, q, kc, vc, head_dim_k, head_dim_v, n_head_kv, mask,
                                                       kq_scale, sinks)
        if st.n_runs > 1 and st.n_tokens >= FA_TILE_ROWS:
            return _flash_attention_per_run(st, q, keys, values, mask, kq_scale, sinks)
        if st.pair_lone_row:
            return _flash_attention_lone_row(st, q, keys, values, mask, kq_scale, sinks)
        out = ggml_flash_attn_ext(ctx, q, keys, values, mask, kq_scale, 0.0, 0.0)
        ggml_flash_attn_ext_add_sinks(out, sinks)
        return ggml_reshape_2d(ctx, out, head_dim_v * n_head, st.n_tokens)
    values = ggml_view_3d(ctx, vc, st.n_kv, head_dim_v, n_head_kv,
                          cache.kv_size * v_el, cache.kv_size * v_el * head_dim_v, 0)  # (n_kv, head_dim_v, n_head_kv)
    if st.decode_kernels and st.n_tokens >= 2:
        return _attention_per_token(st, q, keys, values, mask, kq_scale, sinks)
    out = ggml_mul_mat(ctx, keys, q)                                       # (n_kv, n_tokens, n_head)
    out = ggml_soft_max_ext(ctx, out, mask, kq_scale, 0.0)
    ggml_soft_max_add_sinks(out, sinks)
    out = ggml_mul_mat(ctx, values, out)                                   # (head_dim_v, n_tokens, n_head)
    out = ggml_permute(ctx, out, 0, 2, 1, 3)                               # (head_dim_v, n_head, n_tokens)
    return ggml_cont_2d(ctx, out, head_dim_v * n_head, st.n_tokens)


cdef ggml_tensor * _flash_attention_per_run(Step * st, ggml_tensor * q, ggml_tensor * keys, ggml_tensor * values,
                                            ggml_tensor * mask, float kq_scale, ggml_tensor * sinks) noexcept:
    """attention()'s flash attention for a step holding several sequences'
    tokens, FA_TILE_ROWS rows or more (prompts that arrived together): one op
    per run of a sequence's tokens, so that each takes the kernel it takes in
    a step of its own -- the one-row kernel below 64 rows, whose result does
    not depend on the other sequences' cells -- where one op for the step
    would take the tiled kernel and round every sequence otherwise.
    q: (head_dim_k, n_tokens, n_head), permuted; values (head_dim_v, n_kv, n_head_kv)."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_head = q.ne[2], head_dim_v = values.ne[0]
    cdef ggml_tensor * out = NULL
    cdef ggml_tensor * part
    cdef int r, start = 0, n, first, rows
    for r in range(st.n_runs):
        n = st.run_length[r]
        # A lone row (a stream's next token) goes with a neighbour's: with one
        # row and 512 cells or more ggml splits the cells between its threads,
        # which a short sequence alone (fewer cells) never sees; rows are
        # computed each on their own, and the neighbour's is dropped.
        rows = 2 if n == 1 else n
        first = start if n > 1 or start + 2 <= st.n_tokens else start - 1
        part = ggml_flash_attn_ext(
            ctx, ggml_view_3d(ctx, q, q.ne[0], rows, q.ne[2], q.nb[1], q.nb[2], <size_t> first * q.nb[1]),
            keys, values, ggml_view_2d(ctx, mask, mask.ne[0], rows, mask.nb[1], <size_t> first * mask.nb[1]),
            kq_scale, 0.0, 0.0)
        ggml_flash_attn_ext_add_sinks(part, sinks)
        part = ggml_reshape_2d(ctx, part, head_dim_v * n_head, rows)
        if rows != n:
            part = ggml_view_2d(ctx, part, part.ne[0], 1, part.nb[1], <size_t> (start - first) * part.nb[1])
        out = part if out == NULL else ggml_concat(ctx, out, part, 1)
        start += n
    return out


cdef ggml_tensor * _flash_attention_as_one_token_steps(Step * st, ggml_tensor * q, ggml_tensor * kc, ggml_tensor * vc,
                                                      int64_t head_dim_k, int64_t head_dim_v, int64_t n_head_kv,
                                                      ggml_tensor * mask, float kq_scale,
                                                      ggml_tensor * sinks) noexcept:
    """attention()'s flash attention for a step of generated tokens (drafts
    being verified, streams), each row with the numbers of its one-token step,
    where one op for the step would not give them:
    - a row that, decoded in a step of its own, would have one query row over
      FA_SPLIT_CELLS cells or more: ggml then splits the cells between its
      threads (its split-KV path, in chunks of n_kv / threads, the partial
      sums reduced after), while a step of several rows sums every row's
      cells in one pass, and the two round otherwise (0.3-0.5 apart on
      Qwen2.5-Coder's logits at position 256; a verified draft then parted
      from the one-token answer).  Such a row takes an op of its own over the
      n_kv its one-token step would have seen (Step.split_kv);
    - the other rows, in runs between those, take the one-row kernel in
      groups of at most FA_TILE_ROWS - 1 rows (a step of FA_TILE_ROWS rows or
      more would take the tiled kernel, which rounds otherwise); a group of
      one row as a pair with a copy of itself (as _flash_attention_lone_row).
      The one-row kernel's sum skips the masked cells, so it does not depend
      on n_kv nor on the group's other rows.
    q: (head_dim_k, n_tokens, n_head), permuted."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_head = q.ne[2]
    cdef ggml_tensor * out = NULL
    cdef ggml_tensor * part
    cdef ggml_tensor * rows_q
    cdef ggml_tensor * rows_mask
    cdef int i = 0, end, cells, rows
    while i < st.n_tokens:
        if st.split_rows and st.split_kv[i]:
            cells = st.split_kv[i]
            end = i + 1
        else:
            cells = st.n_kv
            end = i + 1
            while (end < st.n_tokens and end - i < FA_TILE_ROWS - 1
                   and not (st.split_rows and st.split_kv[end])):
                end += 1
        rows = end - i
        rows_q = ggml_view_3d(ctx, q, q.ne[0], rows, q.ne[2], q.nb[1], q.nb[2], <size_t> i * q.nb[1])
        rows_mask = ggml_view_2d(ctx, mask, mask.ne[0], rows, mask.nb[1], <size_t> i * mask.nb[1])
        if rows == 1 and not (st.split_rows and st.split_kv[i]):
            rows_q = ggml_concat(ctx, rows_q, rows_q, 1)
            rows_mask = ggml_concat(ctx, rows_mask, rows_mask, 1)
        part = ggml_flash_attn_ext(
            ctx, rows_q,
            ggml_view_3d(ctx, kc, head_dim_k, cells, n_head_kv, kc.nb[1], ggml_row_size(kc.type, head_dim_k), 0),
            ggml_view_3d(ctx, vc, head_dim_v, cells, n_head_kv, vc.nb[1], ggml_row_size(vc.type, head_dim_v), 0),
            rows_mask, kq_scale, 0.0, 0.0)
        ggml_flash_attn_ext_add_sinks(part, sinks)
        part = ggml_reshape_2d(ctx, part, head_dim_v * n_head, rows_q.ne[1])
        if rows_q.ne[1] != rows:
            part = ggml_view_2d(ctx, part, part.ne[0], rows, part.nb[1], 0)
        out = part if out == NULL else ggml_concat(ctx, out, part, 1)
        i = end
    return out


cdef ggml_tensor * _flash_attention_lone_row(Step * st, ggml_tensor * q, ggml_tensor * keys, ggml_tensor * values,
                                             ggml_tensor * mask, float kq_scale, ggml_tensor * sinks) noexcept:
    """attention()'s flash attention for a one-token step whose sequence
    alone would have fewer than FA_SPLIT_CELLS cells, in a cache that other
    sequences have filled past that (streams: the last one still running).
    With one row, ggml would split the cells between its threads and round
    otherwise than the sequence alone, which never saw that path; the row
    and a copy of it take the one-row kernel over every cell in order, as
    alone, and the copy is dropped.
    q: (head_dim_k, 1, n_head), permuted; values (head_dim_v, n_kv, n_head_kv)."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_head = q.ne[2], head_dim_v = values.ne[0]
    cdef ggml_tensor * out = ggml_flash_attn_ext(ctx, ggml_concat(ctx, q, q, 1), keys, values,
                                                 ggml_concat(ctx, mask, mask, 1), kq_scale, 0.0, 0.0)
    ggml_flash_attn_ext_add_sinks(out, sinks)
    out = ggml_reshape_2d(ctx, out, head_dim_v * n_head, 2)
    return ggml_view_2d(ctx, out, out.ne[0], 1, out.nb[1], 0)


cdef ggml_tensor * _attention_per_token(Step * st, ggml_tensor * q, ggml_tensor * keys, ggml_tensor * values,
                                        ggml_tensor * mask, float kq_scale, ggml_tensor * sinks) noexcept:
    """attention()'s products for a step of generated tokens (decode_kernels):
    one column per head and token, as a one-token step computes them, so
    that each token attends exactly as it would alone.  q: (head_dim_k,
    n_tokens, n_head), permuted; values (n_kv, head_dim_v, n_head_kv); the
    result as attention() returns it."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t head_dim_k = q.ne[0], n_head = q.ne[2], head_dim_v = values.ne[1]
    # (head_dim_k, 1, n_head, n_tokens): the KV heads broadcast over dim 2, as in
    # a one-token step, and dim 3 (one "matrix" per token) over the single one.
    q = ggml_reshape_4d(ctx, ggml_cont(ctx, ggml_permute(ctx, q, 0, 2, 1, 3)), head_dim_k, 1, n_head, st.n_tokens)
    cdef ggml_tensor * kq = ggml_mul_mat(ctx, keys, q)                   # (n_kv, 1, n_head, n_tokens)
    kq = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, kq, st.n_kv, n_head, st.n_tokens), 0, 2, 1, 3))
    kq = ggml_soft_max_ext(ctx, kq, mask, kq_scale, 0.0)                 # (n_kv, n_tokens, n_head): a mask row per token
    ggml_soft_max_add_sinks(kq, sinks)
    kq = ggml_reshape_4d(ctx, ggml_cont(ctx, ggml_permute(ctx, kq, 0, 2, 1, 3)), st.n_kv, 1, n_head, st.n_tokens)
    cdef ggml_tensor * out = ggml_mul_mat(ctx, values, kq)               # (head_dim_v, 1, n_head, n_tokens)
    return ggml_reshape_2d(ctx, out, head_dim_v * n_head, st.n_tokens)


cdef inline ggml_tensor * ffn_gated(Step * st, LayerWeights * lw, ggml_tensor * x, bint gelu) noexcept:
    """down(act(gate(x)) * up(x)), with SiLU (SwiGLU) or tanh-GELU (GeGLU)."""
    return gated(st, lw.ffn_gate, lw.ffn_up, lw.ffn_down, x, gelu)


cdef inline ggml_tensor * gated(Step * st, ggml_tensor * gate, ggml_tensor * up, ggml_tensor * down,
                                ggml_tensor * x, bint gelu) noexcept:
    cdef ggml_tensor * g = linear(st, gate, NULL, x)
    cdef ggml_tensor * u = linear(st, up, NULL, x)
    x = ggml_geglu_split(st.ctx, g, u) if gelu else ggml_swiglu_split(st.ctx, g, u)
    return linear(st, down, NULL, x)


cdef inline ggml_tensor * select_outputs(Step * st, ggml_tensor * x) noexcept:
    """(n, n_tokens) -> (n, n_outputs): before the last layer's FFN, keep only
    the rows whose logits are wanted (as llama.cpp's inp_out_ids), so the FFN
    and the output projection run for those alone."""
    if st.inp_out_ids == NULL:
        return x
    st.output_rows = True
    return ggml_get_rows(st.ctx, x, st.inp_out_ids)


cdef inline ggml_tensor * output_head(Step * st, Model m, ggml_tensor * x) noexcept:
    """The step's output from the final normed hidden state x (n_embd, n_outputs):
    the logits, or x itself when embeddings are wanted (llama.cpp's t_embd)."""
    return x if st.embeddings else linear(st, m.output, NULL, x)


cdef ggml_tensor * rank_head(Step * st, Model m, ggml_tensor * x) noexcept:
    """A reranker's score(s) from the final hidden states x (n_embd, n_outputs)
    of one sequence: llama.cpp's rank pooling (build_pooling, RANK).  The row
    read is the first token's for an encoder (its [CLS]), the last token's for
    a causal model (llm_graph_input_cls::set_input); then the dense layer and
    tanh where the model has ``cls``, the projection to the labels where it
    has ``cls.output``, and a softmax over those for Qwen3-Reranker.  Plain
    ggml_mul_mat, as llama.cpp's head: (n_cls_out, 1), or (n_embd, 1) for a
    head without ``cls.output`` (whose first value is the score)."""
    cdef ggml_context * ctx = st.ctx
    cdef int64_t row = x.ne[1] - 1 if st.hp.causal else 0
    cdef ggml_tensor * cur = ggml_view_2d(ctx, x, x.ne[0], 1, x.nb[1], row * x.nb[1])
    if m.cls != NULL:
        cur = ggml_mul_mat(ctx, m.cls, cur)
        if m.cls_b != NULL:
            cur = ggml_add(ctx, cur, m.cls_b)
        cur = ggml_tanh(ctx, cur)
    if m.cls_out != NULL:
        cur = ggml_mul_mat(ctx, m.cls_out, cur)
        if m.cls_out_b != NULL:
            cur = ggml_add(ctx, cur, m.cls_out_b)
    if st.hp.rank_softmax:
        cur = ggml_soft_max(ctx, cur)
    return cur


cdef inline ggml_tensor * embed_tokens(Step * st, Model m) noexcept:
    if st.inp_embd != NULL:
        # Given embeddings are taken as they are: llama.cpp's gemma3 scales token rows
        # alone (ubatch.token ? sqrtf(n_embd) : 1), and its other graphs do not scale.
        # Deepstack parts past the first n_embd are added later (add_deepstack).
        if st.hp.n_deepstack > 0:
            return ggml_view_2d(st.ctx, st.inp_embd, st.hp.n_embd, st.n_tokens, st.inp_embd.nb[1], 0)
        return st.inp_embd
    cdef ggml_tensor * x = ggml_get_rows(st.ctx, m.tok_embd, st.inp_tokens)  # (n_embd, n_tokens)
    if st.n_lora:
        x = add_lora_embedding(st, x)   # before the scale, as llama.cpp's build_inp_embd
    return ggml_scale(st.ctx, x, st.hp.embd_scale) if st.hp.embd_scale != 1.0 else x
