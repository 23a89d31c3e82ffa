# The mixture-of-experts FFN, included into core.pyx after blocks.pxi.
# Written to follow llama.cpp's build_moe_ffn (llama-graph.cpp) op for op,
# so that on the same kernels the logits are its own: the router and top-k
# choice, the chosen experts through ggml_mul_mat_id (biases through
# ggml_add_id), each expert's output weighted, then summed in expert order.
#
# Batching.  ggml's CPU mul_mat_id, plain (vec_dot) or on repacked experts
# (CPU_REPACK's forward_mul_mat_id: its gemv), computes each token's row of
# each chosen expert with the one-column kernel, whatever else is in the
# step, so a token gets the numbers it gets alone in any batch: the expert
# products need no splitting by sequence (tests/test_moe.py checks it).

DEF MAX_USED_EXPERTS = 64       # experts a token is routed to, at most (elelem.model.architectures checks)


cdef inline ggml_tensor * matmul_id(Step * st, ggml_tensor * w, ggml_tensor * x, ggml_tensor * ids) noexcept:
    """The chosen experts of w (n_in, n_out, n_expert) times x (n_in, 1 or
    n_used, n_tokens): (n_out, n_used, n_tokens)."""
    return ggml_mul_mat_id(st.ctx, w, x, ids)


cdef ggml_tensor * ffn_moe(Step * st, LayerWeights * lw, ggml_tensor * x, ggml_tensor * logits=NULL) noexcept:
    """The routed experts of one layer for x (n_embd, n_tokens): (n_embd, n_tokens).

    ``logits`` (n_expert, n_tokens), when given, are the router's (Gemma 4
    routes from its own input, build_moe_ffn's probs_in); else the router
    runs on x.  The experts' gate and up are two stacks or one
    (ffn_gate_up_exps, gate first: Gemma 4), their activation SwiGLU, gpt-oss's
    clamped SwiGLU or GeGLU (HParams), and each expert's output may be scaled
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
    cdef ggml_tensor * up
    cdef ggml_tensor * gate
    cdef int64_t n_ff
    if lw.ffn_gate_up_exps != NULL:
        up = matmul_id(st, lw.ffn_gate_up_exps, x, chosen)                          # (2 n_ff_exp, n_used, n_tokens)
        n_ff = up.ne[0] // 2
        gate = ggml_view_3d(ctx, up, n_ff, up.ne[1], up.ne[2], up.nb[1], up.nb[2], 0)
        up = ggml_view_3d(ctx, up, n_ff, up.ne[1], up.ne[2], up.nb[1], up.nb[2], n_ff * up.nb[0])
    else:
        up = matmul_id(st, lw.ffn_up_exps, x, chosen)                               # (n_ff_exp, n_used, n_tokens)
        if lw.ffn_up_exps_b != NULL:
            up = ggml_add_id(ctx, up, lw.ffn_up_exps_b, chosen)
        gate = matmul_id(st, lw.ffn_gate_exps, x, chosen)
        if lw.ffn_gate_exps_b != NULL:
            gate = ggml_add_id(ctx, gate, lw.ffn_gate_exps_b, chosen)
    cdef ggml_tensor * h
    if hp.expert_swiglu_oai:
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
    if lw.ffn_down_exps_b != NULL:
        experts = ggml_add_id(ctx, experts, lw.ffn_down_exps_b, chosen)
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
