# Qwen3.5 / Qwen3.6 and Qwen3-Next: a hybrid of Gated DeltaNet layers
# (recurrent: a short causal convolution over Q, K and V, then the gated delta
# rule over a state matrix per value head) and, every
# full_attention_interval-th layer, full attention with per-head Q/K norms, a
# sigmoid output gate and RoPE (Qwen3.5: interleaved multi-section; Qwen3-Next:
# NEOX).  Written after llama.cpp's qwen35 and qwen3next graphs
# (src/models/qwen35.cpp, qwen3next.cpp, delta-net-base.cpp) op for op, with
# its fused ggml_gated_delta_net (what llama.cpp runs on the CPU, prompt and
# decode).  The two differ in the recurrent layers' projections: Qwen3.5
# projects Q/K/V, z, beta and alpha separately, Qwen3-Next projects beta and
# alpha together (ssm_ba), in older files also Q/K/V and z (ssm_in), each
# head group by head group; and Qwen3-Next's value heads are grouped by key
# head (Qwen3.5's converter tiles them), so its Q and K heads are repeated
# per group before the delta rule rather than broadcast by it.
#
# A step's tokens are n_seqs sequences of the same count, sequence after
# sequence (Context.decode arranges that): the recurrent layers see them as
# (channels, tokens per sequence, sequences).


cdef struct DeltaInputs:
    # A Gated DeltaNet layer's projections of its input, before the convolution.
    ggml_tensor * qkv     # (channels, tokens per sequence, n_seqs): Q, K, V of each token
    ggml_tensor * z       # the output gate, ssm_d_inner per token, contiguous
    ggml_tensor * beta    # (1, value heads, tokens per sequence, n_seqs), after the sigmoid
    ggml_tensor * alpha   # (value heads, tokens per sequence, n_seqs), before the time-step bias


cdef inline ggml_tensor * _l2_norm(Step * st, ggml_tensor * x) noexcept:
    """llama.cpp's build_gdn_l2_norm: x / ||x|| over dim 0, as a scaled RMS norm."""
    cdef float n = x.ne[0]
    cdef float eps = st.hp.rms_eps / n          # in float, as llama.cpp: its bits matter
    cdef float scale = (<float> 1.0) / sqrtf(n)
    return ggml_scale(st.ctx, ggml_rms_norm(st.ctx, x, eps), scale)


cdef void _project_separately(Step * st, LayerWeights * lw, ggml_tensor * x, DeltaInputs * p) noexcept:
    """Qwen3.5: Q/K/V, z, beta and alpha each through a matrix of its own."""
    cdef const HParams * hp = st.hp
    cdef int64_t n_seqs = st.n_seqs, per = st.n_tokens // st.n_seqs
    cdef int64_t channels = hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state
    p.qkv = ggml_reshape_3d(st.ctx, linear(st, lw.wqkv, NULL, x), channels, per, n_seqs)
    p.z = linear(st, lw.attn_gate, NULL, x)
    p.beta = ggml_sigmoid(st.ctx, ggml_reshape_4d(st.ctx, linear(st, lw.ssm_beta, NULL, x),
                                                  1, hp.ssm_dt_rank, per, n_seqs))
    p.alpha = ggml_reshape_3d(st.ctx, linear(st, lw.ssm_alpha, NULL, x), hp.ssm_dt_rank, per, n_seqs)


cdef void _project_by_head_group(Step * st, LayerWeights * lw, ggml_tensor * x, DeltaInputs * p) noexcept:
    """Qwen3-Next: beta and alpha through one matrix, per key head [beta of its
    value heads, alpha of them]; Q/K/V and z through wqkv and attn_gate, or
    in older files through one matrix too (ssm_in), per key head [q, k, its
    value heads' v, their z] -- taken apart and put together as llama.cpp's
    build_qkvz does."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_seqs = st.n_seqs, per = st.n_tokens // st.n_seqs
    cdef int64_t head_k = hp.ssm_d_state, heads_k = hp.ssm_n_group
    cdef int64_t heads_v = hp.ssm_dt_rank, head_v = hp.ssm_d_inner // hp.ssm_dt_rank
    cdef int64_t group = heads_v // heads_k              # value heads per key head
    cdef ggml_tensor * mixed
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef size_t el
    if lw.wqkv != NULL:
        p.qkv = ggml_reshape_3d(ctx, linear(st, lw.wqkv, NULL, x), hp.ssm_d_inner + 2 * heads_k * head_k, per, n_seqs)
        p.z = linear(st, lw.attn_gate, NULL, x)
    else:
        mixed = ggml_reshape_4d(ctx, linear(st, lw.ssm_in, NULL, x), 2 * head_k + 2 * head_v * group, heads_k,
                                per, n_seqs)
        el = ggml_element_size(mixed)
        q = ggml_view_4d(ctx, mixed, head_k, heads_k, per, n_seqs, mixed.nb[1], mixed.nb[2], mixed.nb[3], 0)
        k = ggml_view_4d(ctx, mixed, head_k, heads_k, per, n_seqs, mixed.nb[1], mixed.nb[2], mixed.nb[3],
                         head_k * el)
        v = ggml_view_4d(ctx, mixed, head_v * group, heads_k, per, n_seqs, mixed.nb[1], mixed.nb[2], mixed.nb[3],
                         2 * head_k * el)
        p.z = ggml_cont(ctx, ggml_view_4d(ctx, mixed, head_v * group, heads_k, per, n_seqs, mixed.nb[1],
                                          mixed.nb[2], mixed.nb[3], (2 * head_k + head_v * group) * el))
        p.qkv = ggml_concat(ctx, ggml_cont_3d(ctx, q, head_k * heads_k, per, n_seqs),
                            ggml_cont_3d(ctx, k, head_k * heads_k, per, n_seqs), 0)
        p.qkv = ggml_concat(ctx, p.qkv, ggml_cont_3d(ctx, v, head_v * heads_v, per, n_seqs), 0)
    mixed = ggml_reshape_4d(ctx, linear(st, lw.ssm_ba, NULL, x), 2 * group, heads_k, per, n_seqs)
    el = ggml_element_size(mixed)
    cdef ggml_tensor * b = ggml_view_4d(ctx, mixed, group, heads_k, per, n_seqs, mixed.nb[1], mixed.nb[2],
                                        mixed.nb[3], 0)
    cdef ggml_tensor * a = ggml_view_4d(ctx, mixed, group, heads_k, per, n_seqs, mixed.nb[1], mixed.nb[2],
                                        mixed.nb[3], group * el)
    p.beta = ggml_reshape_4d(ctx, ggml_sigmoid(ctx, ggml_cont(ctx, b)), 1, heads_v, per, n_seqs)
    p.alpha = ggml_cont_3d(ctx, a, heads_v, per, n_seqs)


cdef inline ggml_tensor * _repeat_per_group(Step * st, ggml_tensor * x, int64_t heads_v) noexcept:
    """(d, key heads, per, n_seqs) -> (d, heads_v, per, n_seqs), each key head
    repeated for the value heads of its group, next to each other."""
    cdef int64_t d = x.ne[0], heads_k = x.ne[1], per = x.ne[2], n_seqs = x.ne[3]
    x = ggml_reshape_4d(st.ctx, x, d, 1, heads_k, per * n_seqs)
    x = ggml_repeat_4d(st.ctx, x, d, heads_v // heads_k, heads_k, per * n_seqs)
    return ggml_reshape_4d(st.ctx, x, d, heads_v, per, n_seqs)


cdef ggml_tensor * _delta_net(Step * st, KVCache cache, int il, LayerWeights * lw, ggml_tensor * x) noexcept:
    """One Gated DeltaNet layer on x (n_embd, n_tokens): (n_embd, n_tokens),
    its sequences' convolution and delta states read and written in the cache."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t n_seqs = st.n_seqs
    cdef int64_t per = st.n_tokens // n_seqs                 # tokens of each sequence
    cdef int64_t head_k = hp.ssm_d_state, heads_k = hp.ssm_n_group
    cdef int64_t heads_v = hp.ssm_dt_rank, head_v = hp.ssm_d_inner // hp.ssm_dt_rank
    cdef int64_t channels = hp.ssm_d_inner + 2 * heads_k * head_k
    cdef int64_t conv_keep = hp.ssm_d_conv - 1
    cdef DeltaInputs p
    if lw.ssm_ba != NULL:
        _project_by_head_group(st, lw, x, &p)
    else:
        _project_separately(st, lw, x, &p)
    cdef ggml_tensor * qkv = p.qkv
    cdef ggml_tensor * z = p.z
    cdef ggml_tensor * beta = p.beta
    cdef ggml_tensor * gate = ggml_mul(ctx, ggml_softplus(ctx, ggml_add(ctx, p.alpha, lw.ssm_dt)), lw.ssm_a)
    gate = ggml_reshape_4d(ctx, gate, 1, heads_v, per, n_seqs)

    # The convolution: each sequence's last conv_keep inputs, then this step's.
    cdef ggml_tensor * conv = ggml_reshape_3d(ctx, ggml_get_rows(ctx, cache.r[il], st.inp_rs_read),
                                              conv_keep, channels, n_seqs)
    conv = ggml_concat(ctx, conv, ggml_transpose(ctx, qkv), 0)  # (conv_keep + per, channels, n_seqs)
    cdef ggml_tensor * kept = ggml_view_3d(ctx, conv, conv_keep, channels, n_seqs, conv.nb[1], conv.nb[2],
                                           ggml_row_size(conv.type, per))
    ggml_build_forward_expand(st.gf, ggml_set_rows(ctx, cache.r[il], ggml_cont_2d(ctx, kept, conv_keep * channels,
                                                                                   n_seqs), st.inp_rs_write))
    cdef ggml_tensor * state = ggml_reshape_4d(ctx, ggml_get_rows(ctx, cache.s[il], st.inp_rs_read),
                                               head_v, head_v, heads_v, n_seqs)
    cdef ggml_tensor * mixed = ggml_silu(ctx, ggml_ssm_conv(ctx, conv, lw.ssm_conv1d))  # (channels, per, n_seqs)
    cdef size_t row = ggml_row_size(mixed.type, channels)
    cdef ggml_tensor * q = ggml_view_4d(ctx, mixed, head_k, heads_k, per, n_seqs, ggml_row_size(mixed.type, head_k),
                                        row, row * per, 0)
    cdef ggml_tensor * k = ggml_view_4d(ctx, mixed, head_k, heads_k, per, n_seqs, ggml_row_size(mixed.type, head_k),
                                        row, row * per, ggml_row_size(mixed.type, head_k * heads_k))
    cdef ggml_tensor * v = ggml_view_4d(ctx, mixed, head_v, heads_v, per, n_seqs, ggml_row_size(mixed.type, head_v),
                                        row, row * per, ggml_row_size(mixed.type, 2 * head_k * heads_k))
    q = _l2_norm(st, q)
    k = _l2_norm(st, k)
    if hp.ssm_v_grouped and heads_k != heads_v:
        q = _repeat_per_group(st, q, heads_v)
        k = _repeat_per_group(st, k, heads_v)

    # The delta rule, fused: the outputs, then the final state, in one tensor.
    cdef ggml_tensor * result = ggml_gated_delta_net(ctx, q, k, v, gate, beta, state, 1)
    cdef ggml_tensor * out = ggml_view_4d(ctx, result, head_v, heads_v, per, n_seqs,
                                          ggml_row_size(result.type, head_v),
                                          ggml_row_size(result.type, head_v * heads_v),
                                          ggml_row_size(result.type, head_v * heads_v * per), 0)
    cdef ggml_tensor * new_state = ggml_view_2d(ctx, result, head_v * head_v * heads_v, n_seqs,
                                                ggml_row_size(result.type, head_v * head_v * heads_v),
                                                ggml_row_size(result.type, head_v * heads_v * per * n_seqs))
    ggml_build_forward_expand(st.gf, ggml_set_rows(ctx, cache.s[il], new_state, st.inp_rs_write))

    # Gated RMS norm: norm(out) * silu(z), then the output projection -- over
    # the step's tokens as one 2-D batch, where llama.cpp multiplies a 3-D one
    # (per sequence): the same numbers per column through elelem's matmul, and
    # ggml's AMX kernel, which takes any mul_mat of a weight in its buffer,
    # writes a batched product's sequences past its output (byte offsets added
    # to a float pointer in ggml_backend_amx_mul_mat) and reads past the weight.
    out = ggml_mul(ctx, norm_rms(st, out, lw.ssm_norm),
                   ggml_silu(ctx, ggml_reshape_4d(ctx, z, head_v, heads_v, per, n_seqs)))
    return linear(st, lw.ssm_out, NULL, ggml_reshape_2d(ctx, out, head_v * heads_v, st.n_tokens))


cdef ggml_tensor * _gated_attention(Step * st, KVCache cache, int il, LayerWeights * lw, ggml_tensor * x) noexcept:
    """Full attention whose Q projection also writes a sigmoid output gate, head by head."""
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef int64_t hd = hp.head_dim_k
    cdef ggml_tensor * q_full = ggml_reshape_3d(ctx, linear(st, lw.wq, lw.bq, x), 2 * hd, hp.n_head, st.n_tokens)
    cdef size_t el = ggml_element_size(q_full)
    cdef ggml_tensor * q = ggml_view_3d(ctx, q_full, hd, hp.n_head, st.n_tokens, el * 2 * hd, el * 2 * hd * hp.n_head, 0)
    cdef ggml_tensor * gate = ggml_view_3d(ctx, q_full, hd, hp.n_head, st.n_tokens, el * 2 * hd,
                                           el * 2 * hd * hp.n_head, el * hd)
    gate = ggml_cont_2d(ctx, gate, hd * hp.n_head, st.n_tokens)
    q = norm_rms(st, q, lw.q_norm)
    cdef ggml_tensor * k = norm_rms(st, ggml_reshape_3d(ctx, linear(st, lw.wk, lw.bk, x), hd, hp.n_head_kv,
                                                        st.n_tokens), lw.k_norm)
    cdef ggml_tensor * v = linear(st, lw.wv, lw.bv, x)
    if hp.rope_type == GGML_ROPE_TYPE_IMROPE:   # Qwen3.5
        q = _rope_sections(st, q)
        k = _rope_sections(st, k)
    else:                                       # Qwen3-Next: NEOX
        q = rope(st, q, hp.rope_base, hp.rope_scale, NULL)
        k = rope(st, k, hp.rope_base, hp.rope_scale, NULL)
    cdef ggml_tensor * out = attention(st, cache, il, q, k, v, st.inp_mask, hp.attn_scale)
    return linear(st, lw.wo, lw.bo, ggml_mul(ctx, out, ggml_sigmoid(ctx, gate)))


cdef inline ggml_tensor * _rope_sections(Step * st, ggml_tensor * x) noexcept:
    cdef const HParams * hp = st.hp
    cdef int sections[4]
    sections[0] = hp.rope_sections[0]
    sections[1] = hp.rope_sections[1]
    sections[2] = hp.rope_sections[2]
    sections[3] = hp.rope_sections[3]
    return ggml_rope_multi(st.ctx, x, st.inp_pos4, NULL, hp.n_rot, sections, hp.rope_type, hp.n_ctx_orig,
                           hp.rope_base, hp.rope_scale, hp.rope_ext_factor, hp.rope_attn_factor,
                           hp.yarn_beta_fast, hp.yarn_beta_slow)


cdef ggml_tensor * build_qwen35(Model m, KVCache cache, Step * st) except NULL:
    cdef const HParams * hp = st.hp
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw
    cdef ggml_tensor * x = embed_tokens(st, m)   # the residual stream, (n_embd, n_tokens)
    cdef ggml_tensor * h
    cdef int il
    for il in range(hp.n_layer):
        lw = &m.layers[il]
        keep_layer_input(st, il, x)
        h = norm_rms(st, x, lw.attn_norm)
        if m.recurrent_layers[il]:
            h = _delta_net(st, cache, il, lw, h)
        else:
            h = _gated_attention(st, cache, il, lw, h)
        x = ggml_add(ctx, h, x)
        h = ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm))
        x = ggml_add(ctx, h, x)
    # llama.cpp's qwen35 keeps every row through its last layer.
    if st.want_hidden and st.n_feature_layers == 0:
        # Every row's normed state, for the MTP head (llama.cpp's h_nextn); the
        # norm is row by row, so the output rows' numbers are the same.
        st.hidden = norm_rms(st, x, m.output_norm)
        x = select_outputs(st, st.hidden)
    else:
        x = norm_rms(st, select_outputs(st, x), m.output_norm)
    return output_head(st, m, x)   # (n_vocab, n_outputs), or (n_embd, n_outputs)


cdef ggml_tensor * build_qwen35_mtp(Model m, KVCache cache, Step * st) except NULL:
    """The multi-token-prediction head of Qwen3.5 / 3.6 (elelem.model.mtp), as
    llama.cpp's qwen35 graph_mtp: the token's embedding and the hidden state
    of the row before it, each normed, concatenated and projected; one
    full-attention block of the model's kind (its own K and V: layer 0 of
    this context's cache); the head's output norm, then its logits."""
    cdef ggml_context * ctx = st.ctx
    cdef LayerWeights * lw = &m.layers[0]
    cdef ggml_tensor * table = lw.nextn_embed_tokens if lw.nextn_embed_tokens != NULL else m.tok_embd
    cdef ggml_tensor * e = norm_rms(st, ggml_get_rows(ctx, table, st.inp_tokens), lw.nextn_enorm)
    cdef ggml_tensor * x = linear(st, lw.nextn_eh_proj, NULL,
                                  ggml_concat(ctx, e, norm_rms(st, st.inp_h, lw.nextn_hnorm), 0))
    cdef ggml_tensor * h = _gated_attention(st, cache, 0, lw, norm_rms(st, x, lw.attn_norm))
    x = ggml_add(ctx, h, x)
    h = ffn_layer(st, lw, norm_rms(st, x, lw.ffn_norm))
    x = ggml_add(ctx, h, x)
    # Every row's normed state: the next draft's h (llama.cpp's h_nextn of the head).
    x = norm_rms(st, x, lw.nextn_shared_head_norm if lw.nextn_shared_head_norm != NULL else m.output_norm)
    if st.want_hidden:
        st.hidden = x
    x = select_outputs(st, x)
    if st.embeddings:
        return x
    return linear(st, lw.nextn_shared_head_head if lw.nextn_shared_head_head != NULL else m.output, NULL, x)


# Qwen3-Next (qwen3next) runs through it too: what differs is in its weights
# (ssm_ba, ssm_in) and hyperparameters (NEOX RoPE, ssm_v_grouped).
_register_builder("qwen35", build_qwen35)
_register_builder("qwen35_mtp", build_qwen35_mtp)
