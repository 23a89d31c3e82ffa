# The mixture-of-experts FFN, included into core.pyx after blocks.pxi.
# Written to follow llama.cpp's build_moe_ffn (llama-graph.cpp) op for op,
# so that on the same kernels the logits are its own: the router and top-k
# choice, the chosen experts through ggml_mul_mat_id (biases through
# ggml_add_id), each expert's output weighted, then summed in expert order.
#
# Batching.  ggml's CPU mul_mat_id on repacked experts (CPU_REPACK's
# forward_mul_mat_id: its gemv) computes each token's row of each chosen
# expert with the one-column kernel, whatever else is in the step; on plain
# experts too (vec_dot) -- except K-quant and IQ experts (Q6_K, Q5_K, Q4_K
# not repacked, Q3_K, Q2_K, IQ*: _tiled_experts), which ggml's tiled kernel
# (ggml-cpu/tiled) takes over, expert by expert, once _cpu_kernels.tiled_min_columns
# (8) of the step's rows chose that expert, and which rounds otherwise than
# vec_dot (its int sums scaled once per block, vec_dot's lanes summed at the
# end).  A token decoded alone is one row for each of its experts: vec_dot;
# 8 streams in one step that all chose one expert: tiled for all 8 (Qwen3-
# 30B-A3B Q4_K_M's Q6_K ffn_down_exps: streams parted from their solo tokens
# after 9-56).  So for such experts the step's rows go through the experts
# in groups (_expert_groups) in which an expert gets the rows it gets in the
# rows' own steps: at most _cpu_kernels.tiled_min_columns - 1 rows a group where
# each row stands for a one-token step (decode_kernels), and in a prompt
# step of several sequences their runs (or runs of output rows), packed
# together below that count, a longer run alone.  Within the tiled kernel a
# row's numbers do not depend on the expert's other rows, nor within
# vec_dot.  (tests/test_moe.py checks it.)
#
# Where elelem's experts kernel takes an expert stack (_experts_kernel_takes:
# repacked Q4_K in every step, Q6_K in steps of generated tokens), no split
# is needed: it gives every row the one-column kernel's numbers in a step of
# any composition, and reads each chosen expert once for all the rows that
# chose it where ggml's mul_mat_id reads it once a row (kernels/experts.c).

DEF MAX_USED_EXPERTS = 64       # experts a token is routed to, at most (elelem.model.architectures checks)
DEF MAX_EXPERT_GROUPS = 80      # groups of a step's rows through the experts, at most (else not split):
                                # 512 generated tokens (n_batch's default) in groups of 7


cdef inline bint _tiled_experts(Step * st, const ggml_tensor * w) noexcept:
    """Experts whose mul_mat_id rows take vec_dot below the tiled kernel's
    width and ggml's tiled kernel from there (a plain CPU buffer: repacked
    experts take their gemv for every row)."""
    if w == NULL:
        return False
    cdef MatmulCase c = matmul_case(st, w, NULL, 1)
    return _tiled_weight(&c, &_cpu_kernels)


cdef int _pack_runs(int n_runs, const int * run_length, int64_t cap, int * start, int * length) noexcept:
    """Runs of rows packed in order into groups of at most cap rows; a run
    longer than cap is a group of its own.  Returns the number of groups."""
    cdef int r, g = 0, at = 0
    for r in range(n_runs):
        if g > 0 and length[g - 1] <= cap and length[g - 1] + run_length[r] <= cap:
            length[g - 1] += run_length[r]
        else:
            start[g] = at
            length[g] = run_length[r]
            g += 1
        at += run_length[r]
    return g


cdef inline bint _experts_kernel_takes(Step * st, const ggml_tensor * w, int64_t n_tokens) noexcept:
    """Whether elelem's experts kernel computes w's chosen experts for a step
    of n_tokens rows (matmul.pxi: experts_kernel_takes)."""
    if w == NULL:
        return False
    cdef MatmulCase c = matmul_case(st, w, NULL, n_tokens)
    return experts_kernel_takes(&c, &_cpu_kernels)


cdef inline bint _splits_rows(Step * st, const ggml_tensor * w, int64_t n_tokens) noexcept:
    return _tiled_experts(st, w) and not _experts_kernel_takes(st, w, n_tokens)


cdef int _expert_groups(Step * st, LayerWeights * lw, int64_t n_rows, int * start, int * length) noexcept:
    """The groups of the n_rows rows that go through the experts together
    (the header above); 1 (every row at once) where no split is needed."""
    start[0] = 0
    length[0] = <int> n_rows
    if not (_splits_rows(st, lw.ffn_down_exps, n_rows) or _splits_rows(st, lw.ffn_up_exps, n_rows)
            or _splits_rows(st, lw.ffn_gate_exps, n_rows) or _splits_rows(st, lw.ffn_gate_up_exps, n_rows)):
        return 1
    cdef int64_t cap = _cpu_kernels.tiled_min_columns - 1
    if n_rows <= cap:
        return 1
    cdef int g, n_groups
    if st.decode_kernels:           # every row a one-token step's
        n_groups = <int> ((n_rows + cap - 1) // cap)
        if n_groups > MAX_EXPERT_GROUPS:
            return 1
        for g in range(n_groups):
            start[g] = <int> (g * cap)
            length[g] = <int> min(cap, n_rows - g * cap)
        return n_groups
    if st.output_rows:                                   # the last layer's FFN on the output rows
        if st.n_out_runs > 1 and n_rows == st.n_outputs:
            return _pack_runs(st.n_out_runs, st.out_run_length, cap, start, length)
    elif st.n_runs > 1 and n_rows == st.n_tokens:        # a prompt step of several sequences
        return _pack_runs(st.n_runs, st.run_length, cap, start, length)
    return 1


cdef inline ggml_tensor * matmul_id(Step * st, ggml_tensor * w, ggml_tensor * x, ggml_tensor * ids) noexcept:
    """The chosen experts of w (n_in, n_out, n_expert) times x (n_in, 1 or
    n_used, n_tokens): (n_out, n_used, n_tokens)."""
    cdef ggml_tensor * args[2]
    if (x.type == GGML_TYPE_F32 and ggml_is_contiguous(x) and x.ne[3] == 1
            and _experts_kernel_takes(st, w, x.ne[2])):
        # The columns quantized by the CPU backend to Q8_K, as its mul_mat_id
        # quantizes them; the weight travels as userdata (kernels/experts.h).
        args[0] = ggml_cpy(st.ctx, ggml_reshape_2d(st.ctx, x, x.ne[0], x.ne[1] * x.ne[2]),
                           ggml_new_tensor_2d(st.ctx, GGML_TYPE_Q8_K, x.ne[0], x.ne[1] * x.ne[2]))
        args[1] = ids
        return ggml_custom_4d(st.ctx, GGML_TYPE_F32, w.ne[1], ids.ne[0], ids.ne[1], 1, args, 2,
                              elelem_experts_matmul_avx512 if _cpu_kernels.small_batch_isa == ELELEM_SMALL_BATCH_AVX512
                              else elelem_experts_matmul, GGML_N_TASKS_MAX, <void *> w)
    return ggml_mul_mat_id(st.ctx, w, x, ids)


cdef ggml_tensor * _expert_products(Step * st, LayerWeights * lw, ggml_tensor * x, ggml_tensor * chosen) noexcept:
    """The chosen experts' outputs for x (n_embd, 1, n) and chosen (n_used, n):
    (n_embd, n_used, n), before their routing weights."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_tokens = x.ne[2]
    cdef ggml_tensor * up
    cdef ggml_tensor * gate
    cdef int64_t n_ff
    # Each product as llama.cpp's build_lora_mm_id: the experts, their scale,
    # the LoRA adapters' products (add_lora_id, a no-op without), then the bias.
    if lw.ffn_gate_up_exps != NULL:
        up = matmul_id(st, lw.ffn_gate_up_exps, x, chosen)                          # (2 n_ff_exp, n_used, n_tokens)
        up = add_lora_id(st, lw.ffn_gate_up_exps, x, chosen, up)
        n_ff = up.ne[0] // 2
        gate = ggml_view_3d(ctx, up, n_ff, up.ne[1], up.ne[2], up.nb[1], up.nb[2], 0)
        up = ggml_view_3d(ctx, up, n_ff, up.ne[1], up.ne[2], up.nb[1], up.nb[2], n_ff * up.nb[0])
    else:
        up = add_lora_id(st, lw.ffn_up_exps, x, chosen,
                         matmul_id(st, lw.ffn_up_exps, x, chosen))                 # (n_ff_exp, n_used, n_tokens)
        if lw.ffn_up_exps_b != NULL:
            up = ggml_add_id(ctx, up, lw.ffn_up_exps_b, chosen)
        gate = NULL
        if lw.ffn_gate_exps != NULL:
            gate = add_lora_id(st, lw.ffn_gate_exps, x, chosen, matmul_id(st, lw.ffn_gate_exps, x, chosen))
            if lw.ffn_gate_exps_b != NULL:
                gate = ggml_add_id(ctx, gate, lw.ffn_gate_exps_b, chosen)
    cdef ggml_tensor * h
    if hp.expert_relu_sqr:   # no gate (llama.cpp's LLM_FFN_RELU_SQR without gate_exps: Nemotron-3-Nano)
        h = ggml_sqr(ctx, ggml_relu(ctx, up))
    elif gate == NULL:   # experts without a gate (nomic-bert-moe): build_moe_ffn's GELU of up alone
        h = ggml_gelu(ctx, up)
    elif hp.expert_swiglu_oai:
        h = ggml_swiglu_oai(ctx, gate, up, 1.702, 7.0)   # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants
    elif hp.expert_gelu:
        h = ggml_geglu_split(ctx, gate, up)
    else:
        h = ggml_swiglu_split(ctx, gate, up)
    cdef ggml_tensor * experts = matmul_id(st, lw.ffn_down_exps, h, chosen)          # (n_embd, n_used, n_tokens)
    cdef ggml_tensor * scale
    if lw.ffn_down_exps_s != NULL:   # llama.cpp's build_lora_mm_id: each chosen expert's scale
        scale = ggml_repeat_4d(ctx, ggml_reshape_3d(ctx, lw.ffn_down_exps_s, 1, hp.n_expert, 1),
                               1, hp.n_expert, n_tokens, 1)
        experts = ggml_mul(ctx, experts, ggml_get_rows(ctx, scale, chosen))
    experts = add_lora_id(st, lw.ffn_down_exps, h, chosen, experts)
    if lw.ffn_down_exps_b != NULL:
        experts = ggml_add_id(ctx, experts, lw.ffn_down_exps_b, chosen)
    return experts


cdef ggml_tensor * ffn_moe(Step * st, LayerWeights * lw, ggml_tensor * x, ggml_tensor * logits=NULL) noexcept:
    """The routed experts of one layer for x (n_embd, n_tokens): (n_embd, n_tokens).

    ``logits`` (n_expert, n_tokens), when given, are the router's (Gemma 4
    routes from its own input, build_moe_ffn's probs_in); else the router
    runs on x.  The experts' gate and up are two stacks or one
    (ffn_gate_up_exps, gate first: Gemma 4) or up alone, their activation
    SwiGLU, gpt-oss's clamped SwiGLU or GeGLU (HParams), or without a gate a
    squared ReLU (Nemotron-3-Nano) or GELU (nomic-bert-moe), and each expert's
    output may be scaled
    (ffn_down_exps_s, llama.cpp's down_exps_s)."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_embd = x.ne[0]
    cdef int64_t n_tokens = x.ne[1]
    cdef int n_used = hp.n_expert_used
    if logits == NULL:
        logits = linear(st, lw.ffn_gate_inp, lw.ffn_gate_inp_b, x)   # (n_expert, n_tokens)
    cdef ggml_tensor * probs
    if hp.expert_gating == 0:
        probs = ggml_soft_max(ctx, logits)
    elif hp.expert_gating == 1:
        probs = ggml_sigmoid(ctx, logits)
    else:                       # softmax over the chosen experts' logits, below
        probs = logits
    # A selection bias (GLM, DeepSeek V3) moves the choice, not the weights.
    cdef ggml_tensor * choice = ggml_add(ctx, probs, lw.ffn_exp_probs_b) if lw.ffn_exp_probs_b != NULL else probs
    cdef ggml_tensor * chosen = ggml_argsort_top_k(ctx, choice, n_used)              # I32 (n_used, n_tokens)
    cdef ggml_tensor * weights = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, hp.n_expert, n_tokens),
                                               chosen)                             # (1, n_used, n_tokens)
    cdef ggml_tensor * total
    if hp.expert_gating == 2:
        weights = ggml_reshape_3d(ctx, ggml_soft_max(ctx, ggml_reshape_2d(ctx, weights, n_used, n_tokens)),
                                  1, n_used, n_tokens)
    if hp.expert_norm:
        weights = ggml_reshape_2d(ctx, weights, n_used, n_tokens)
        total = ggml_clamp(ctx, ggml_sum_rows(ctx, weights), 6.103515625e-5, INFINITY)  # F16's smallest normal
        weights = ggml_reshape_3d(ctx, ggml_div(ctx, weights, total), 1, n_used, n_tokens)
    if hp.expert_scale != 0.0 and hp.expert_scale != 1.0:
        weights = ggml_scale(ctx, weights, hp.expert_scale)
    ggml_build_forward_expand(st.gf, weights)   # as llama.cpp: computed before the experts

    x = ggml_reshape_3d(ctx, x, n_embd, 1, n_tokens)
    cdef int group_start[MAX_EXPERT_GROUPS]
    cdef int group_length[MAX_EXPERT_GROUPS]
    cdef int n_groups = _expert_groups(st, lw, n_tokens, group_start, group_length)
    cdef ggml_tensor * experts = NULL
    cdef ggml_tensor * part
    cdef int g
    if n_groups == 1:
        experts = _expert_products(st, lw, x, chosen)
    else:
        for g in range(n_groups):
            st.lora_row0 = group_start[g]   # the rows whose LoRA scales apply (graph/lora.pxi)
            part = _expert_products(
                st, lw,
                ggml_view_3d(ctx, x, n_embd, 1, group_length[g], x.nb[1], x.nb[2], <size_t> group_start[g] * x.nb[2]),
                ggml_view_2d(ctx, chosen, n_used, group_length[g], chosen.nb[1],
                             <size_t> group_start[g] * chosen.nb[1]))
            experts = part if experts == NULL else ggml_concat(ctx, experts, part, 2)
        st.lora_row0 = 0
    experts = ggml_mul(ctx, experts, weights)
    ggml_build_forward_expand(st.gf, experts)

    # The sum over the chosen experts, in their order: views first, then adds.
    cdef ggml_tensor * views[MAX_USED_EXPERTS]
    cdef int i
    for i in range(n_used):
        views[i] = ggml_view_2d(ctx, experts, n_embd, n_tokens, experts.nb[2], <size_t> i * experts.nb[1])
        ggml_build_forward_expand(st.gf, views[i])
    cdef ggml_tensor * out = views[0]
    for i in range(1, n_used):
        out = ggml_add(ctx, out, views[i])
        ggml_build_forward_expand(st.gf, out)
    return ggml_cont(ctx, out) if n_used == 1 else out


cdef inline ggml_tensor * ffn_layer(Step * st, LayerWeights * lw, ggml_tensor * x) noexcept:
    """A decoder layer's FFN: the routed experts plus, where the model has
    them, the shared ones (GLM); or the dense SwiGLU FFN (leading dense
    layers, dense models)."""
    if lw.ffn_gate_inp == NULL:
        return ffn_gated(st, lw, x, False)
    cdef ggml_tensor * routed = ffn_moe(st, lw, x)
    if lw.ffn_up_shexp == NULL:
        return routed
    cdef ggml_tensor * shared = gated(st, lw.ffn_gate_shexp, lw.ffn_up_shexp, lw.ffn_down_shexp, x, False)
    if lw.ffn_gate_inp_shexp != NULL:   # Qwen: the shared expert's output times a sigmoid gate per token
        shared = ggml_mul(st.ctx, shared, ggml_sigmoid(st.ctx, linear(st, lw.ffn_gate_inp_shexp, NULL, x)))
    return ggml_add(st.ctx, routed, shared)
