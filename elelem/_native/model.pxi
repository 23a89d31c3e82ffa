# Model: hyperparameters, the per-layer weight table, and the weights --
# memory-mapped (or read) and used in place, with ggml's repacked copies.
# Included into core.pyx.

# --------------------------------------------------------------------------
# Hyperparameters and weights, as the graph builders see them.

cdef struct HParams:
    int n_vocab
    int n_embd
    int n_layer
    int n_head
    int n_head_kv
    int head_dim_k        # per-head width of Q and K
    int head_dim_v        # per-head width of V
    int n_ff
    int n_ctx_train
    int n_rot             # rotated dims of each head
    int rope_type         # GGML_ROPE_TYPE_NORMAL or _NEOX
    float rms_eps
    float rope_base       # global layers
    float rope_base_swa   # sliding-window layers
    float rope_scale      # freq_scale = 1 / linear scaling factor
    float rope_scale_swa  # the same for sliding-window layers (gemma3: never scaled, as llama.cpp)
    float attn_scale      # multiplies Q.K
    float embd_scale      # multiplies the token embeddings (1 for most)
    int n_swa             # sliding window width, 0 if none
    float norm_eps        # LayerNorm's epsilon (BERT)
    bint causal           # a token sees only earlier positions; else its whole sequence (BERT's default)
    bint encoder          # no output head: the output is the last hidden state (BERT family)
    # RoPE scaling beyond linear (YaRN), as ggml_rope_ext takes it
    int n_ctx_orig        # the context YaRN extends (rope.scaling.original_context_length; n_ctx_train)
    float rope_ext_factor # 0 without YaRN
    float rope_attn_factor
    float yarn_beta_fast
    float yarn_beta_slow
    # Attention temperature (mistral3): Q *= 1 + attn_temp_scale * log(floor(pos / attn_temp_floor) + 1)
    float attn_temp_scale # 0: none
    int attn_temp_floor
    # Mixture of experts (llama.cpp's build_moe_ffn arguments); n_expert 0 for a dense model
    int n_expert
    int n_expert_used     # experts each token is routed to
    int n_ff_exp          # each expert's FFN width
    int n_layer_dense_lead  # the first layers have the dense FFN instead (GLM)
    int expert_gating     # router: 0 softmax, 1 sigmoid, 2 softmax over the chosen logits (gpt-oss)
    bint expert_norm      # the chosen weights renormalised to sum 1
    float expert_scale    # and multiplied by this (0 or 1: not)
    bint expert_swiglu_oai  # gpt-oss's clamped SwiGLU (alpha 1.702, limit 7), else SwiGLU
    bint late_output_rows # the unwanted rows dropped after the last layer, not before its FFN (gpt-oss)
    # Gated DeltaNet (recurrent) layers: Model.recurrent_layers says which
    int ssm_d_conv        # the convolution's width (its state keeps d_conv - 1 columns)
    int ssm_d_inner       # value channels: ssm_dt_rank value heads of ssm_d_state
    int ssm_d_state       # the head width (of keys and of values)
    int ssm_n_group       # key heads
    int ssm_dt_rank       # value heads
    int rope_sections[4]  # multi-section RoPE (imrope): rotated dims per position stream
    bint q_gate           # the full-attention Q projection also writes a sigmoid output gate (qwen35)
    bint ssm_v_grouped    # value heads grouped by key head (qwen3next): Q and K repeated per group, not tiled
    # Gemma 4
    bint expert_gelu      # the experts' activation is GeGLU (tanh GELU), not SwiGLU
    int n_embd_per_layer  # per-layer token embeddings' width, 0 for none
    float final_logit_softcap  # logits = softcap * tanh(logits / softcap); 0: none

cdef struct LayerShape:
    # A layer's attention geometry, where it differs between layers (Gemma 4:
    # sliding-window and global layers have their own head widths, KV heads and
    # rotated dims); every layer has HParams' values otherwise.
    int n_head_kv
    int head_dim_k
    int head_dim_v
    int n_rot
    int kv_source         # the layer whose cached K and V it attends over: itself, or an
                          # earlier layer's when it shares theirs (Gemma 4) and stores none

cdef struct LayerWeights:
    ggml_tensor * attn_norm       # (n_embd)
    ggml_tensor * wq              # (n_embd, n_head * head_dim_k)
    ggml_tensor * wk              # (n_embd, n_head_kv * head_dim_k)
    ggml_tensor * wv              # (n_embd, n_head_kv * head_dim_v)
    ggml_tensor * wo              # (n_head * head_dim_v, n_embd)
    ggml_tensor * bq              # optional biases, NULL when absent
    ggml_tensor * bk
    ggml_tensor * bv
    ggml_tensor * bo
    ggml_tensor * q_norm          # optional per-head norms (head_dim_k)
    ggml_tensor * k_norm
    ggml_tensor * attn_post_norm  # optional norm after attention (n_embd)
    ggml_tensor * ffn_norm        # (n_embd)
    ggml_tensor * ffn_gate        # (n_embd, n_ff)
    ggml_tensor * ffn_up          # (n_embd, n_ff)
    ggml_tensor * ffn_down        # (n_ff, n_embd)
    ggml_tensor * ffn_post_norm   # optional norm after the FFN (n_embd)
    # BERT-family encoders: post-norm LayerNorms with biases, biased FFN, fused QKV.
    ggml_tensor * wqkv            # (n_embd, Q + K + V widths); wq/wk/wv are NULL with it
    ggml_tensor * bqkv
    ggml_tensor * attn_out_norm   # LayerNorm after attention + residual (n_embd)
    ggml_tensor * attn_out_norm_b
    ggml_tensor * ffn_up_b        # (n_ff)
    ggml_tensor * ffn_down_b      # (n_embd)
    ggml_tensor * layer_out_norm  # LayerNorm after the FFN + residual (n_embd)
    ggml_tensor * layer_out_norm_b
    ggml_tensor * attn_sinks      # optional (n_head): each head's sink logit (gpt-oss)
    # Mixture of experts: NULL in a dense layer
    ggml_tensor * ffn_gate_inp    # the router (n_embd, n_expert)
    ggml_tensor * ffn_gate_inp_b  # optional (n_expert)
    ggml_tensor * ffn_gate_exps   # (n_embd, n_ff_exp, n_expert)
    ggml_tensor * ffn_up_exps     # (n_embd, n_ff_exp, n_expert)
    ggml_tensor * ffn_down_exps   # (n_ff_exp, n_embd, n_expert)
    ggml_tensor * ffn_gate_exps_b # optional (n_ff_exp, n_expert)
    ggml_tensor * ffn_up_exps_b   # optional (n_ff_exp, n_expert)
    ggml_tensor * ffn_down_exps_b # optional (n_embd, n_expert)
    ggml_tensor * ffn_exp_probs_b # optional (n_expert): added to the probabilities for choosing only (GLM)
    ggml_tensor * ffn_gate_shexp  # optional shared experts (n_embd, n_ff_shexp) ...
    ggml_tensor * ffn_up_shexp
    ggml_tensor * ffn_down_shexp  # ... (n_ff_shexp, n_embd)
    ggml_tensor * ffn_gate_inp_shexp  # optional (n_embd): a sigmoid gate on the shared experts' output (Qwen)
    # Gated DeltaNet: NULL in other layers; wqkv (above) projects its Q, K and V
    ggml_tensor * attn_gate       # (n_embd, ssm_d_inner): the output gate z
    ggml_tensor * ssm_conv1d      # (ssm_d_conv, conv channels), F32
    ggml_tensor * ssm_dt          # (ssm_dt_rank): the time-step bias
    ggml_tensor * ssm_a           # (ssm_dt_rank): -exp(A_log)
    ggml_tensor * ssm_beta        # (n_embd, ssm_dt_rank)
    ggml_tensor * ssm_alpha       # (n_embd, ssm_dt_rank)
    ggml_tensor * ssm_norm        # (ssm_d_state)
    ggml_tensor * ssm_out         # (ssm_d_inner, n_embd)
    # Gemma 4
    ggml_tensor * ffn_gate_up_exps  # optional: the experts' gate and up stacked (n_embd, 2 * n_ff_exp, n_expert)
    ggml_tensor * ffn_gate_inp_s  # the router's input scale (n_embd)
    ggml_tensor * ffn_down_exps_s # optional: each expert's output scale (n_expert)
    ggml_tensor * ffn_pre_norm_2  # norm before the experts (n_embd) ...
    ggml_tensor * ffn_post_norm_1 # ... after the dense FFN of an expert layer
    ggml_tensor * ffn_post_norm_2 # ... after the experts
    ggml_tensor * per_layer_inp_gate   # per-layer embeddings: (n_embd, n_embd_per_layer) ...
    ggml_tensor * per_layer_proj       # ... (n_embd_per_layer, n_embd)
    ggml_tensor * per_layer_post_norm  # ... (n_embd)
    ggml_tensor * layer_out_scale      # optional (1): the layer's output times this
    # Qwen3-Next's Gated DeltaNet: Q, K, V and z projected together, head group by
    # head group (older files; newer ones have wqkv and attn_gate), and beta and alpha the same way
    ggml_tensor * ssm_in          # optional (n_embd, 2 * key heads * ssm_d_state + 2 * ssm_d_inner)
    ggml_tensor * ssm_ba          # (n_embd, 2 * ssm_dt_rank)

cdef struct WidenedWeights:
    # Q5_0 weights and their Q8_0 copies, pairwise (widen.pxi); n is 0 when none.
    int n
    ggml_tensor ** narrow
    ggml_tensor ** wide

# Python-side role names, in the order of LayerWeights' fields.
LAYER_ROLES = ("attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "q_norm", "k_norm",
               "attn_post_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "ffn_post_norm",
               "wqkv", "bqkv", "attn_out_norm", "attn_out_norm_b", "ffn_up_b", "ffn_down_b",
               "layer_out_norm", "layer_out_norm_b", "attn_sinks",
               "ffn_gate_inp", "ffn_gate_inp_b", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
               "ffn_gate_exps_b", "ffn_up_exps_b", "ffn_down_exps_b", "ffn_exp_probs_b",
               "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
               "ffn_gate_inp_shexp",
               "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_beta", "ssm_alpha", "ssm_norm", "ssm_out",
               "ffn_gate_up_exps", "ffn_gate_inp_s", "ffn_down_exps_s", "ffn_pre_norm_2", "ffn_post_norm_1",
               "ffn_post_norm_2", "per_layer_inp_gate", "per_layer_proj", "per_layer_post_norm", "layer_out_scale",
               "ssm_in", "ssm_ba")

cdef inline ggml_tensor ** _role_slot(LayerWeights * lw, int i) noexcept:
    return (<ggml_tensor **> lw) + i


cdef inline void _check_status(ggml_status status, str what) except *:
    # The one place a ggml status becomes a Python exception.
    if status == GGML_STATUS_SUCCESS:
        return
    if status == GGML_STATUS_ABORTED:
        raise KeyboardInterrupt(f"{what}: aborted")
    if status == GGML_STATUS_ALLOC_FAILED:
        raise MemoryError(f"{what}: ggml could not allocate memory")
    raise errors.ComputeError(f"{what}: ggml returned status {<int> status}")


cdef struct WeightFile:
    # One GGUF file of the model: the file itself, or one shard of a split model.
    gguf_context * gguf            # its tensor table (and, in the first, the metadata), owned
    ggml_context * ctx             # its tensor headers (no data), owned
    void * addr                    # the whole file, mapped read-only (or read into anonymous memory)
    size_t size
    ggml_backend_buffer_t buf      # a CPU buffer over the mapping, no copy


DEF MAX_EXTRA_BUFTS = 4
DEF MAX_DEVICES = 8        # devices besides the CPU that one model's layers may be placed on

# --------------------------------------------------------------------------
# Model: the GGUF context and the weights, memory-mapped and used in place.

cdef class Model:
    # The GGUF file, or each file of a split model in order (n_files), each mapped and its
    # tensors placed in its own mapping; _file_tensor() finds a tensor in whichever holds it.
    cdef WeightFile * files             # n_files entries, calloc'd
    cdef readonly int n_files
    # Matmul weights that ggml's CPU "extra" buffer types (CPU_REPACK) can lay
    # out for faster kernels are copied into them at load, as llama.cpp does;
    # this also makes elelem's arithmetic, and so its tokens, equal llama.cpp's.
    cdef ggml_context * repack_ctx[MAX_EXTRA_BUFTS]
    cdef ggml_backend_buffer_t repack_buf[MAX_EXTRA_BUFTS]
    cdef readonly int n_repacked
    cdef readonly dict repacked        # buffer type name -> number of weights repacked into it
    cdef readonly dict repacked_bytes  # buffer type name -> bytes of its copies
    # Q8_0 copies of Q5_0 matmul weights, for steps of two or more tokens (widen.pxi).
    cdef ggml_context * widened_ctx
    cdef ggml_backend_buffer_t widened_buf
    cdef WidenedWeights widened
    cdef int widen_pending             # copies chosen at load, made when they pay (_make_widened)
    cdef public long widen_after       # ... once this many prompt tokens were evaluated (0: at the first prompt)
    cdef long prompt_tokens_seen
    # Layers placed on other devices (placement.pxi): their weights' copies there.
    cdef ggml_context * device_ctx[MAX_DEVICES]
    cdef ggml_backend_buffer_t device_buf[MAX_DEVICES]
    cdef int n_device_bufs
    cdef readonly list rpc_endpoints   # the servers holding some of its weights
    cdef double rpc_timeout
    cdef HParams hp
    cdef int builder_id                 # index of its graph builder in the registry (graph/registry.pxi)
    cdef LayerWeights * layers          # n_layer entries, calloc'd
    cdef unsigned char * swa_layers     # n_layer flags: 1 where the layer attends over the window
    cdef unsigned char * recurrent_layers  # n_layer flags: 1 for a recurrent (Gated DeltaNet) layer
    cdef LayerShape * shapes            # n_layer entries: each layer's attention geometry
    cdef ggml_tensor * tok_embd         # (n_embd, n_vocab)
    cdef ggml_tensor * output_norm      # (n_embd)
    cdef ggml_tensor * output           # (n_embd, n_vocab); tok_embd when tied
    cdef ggml_tensor * rope_freqs       # optional (n_rot / 2) frequency factors
    # Encoder inputs (BERT): absolute positions, token type 0, the LayerNorm of the sum.
    cdef ggml_tensor * pos_embd         # optional (n_embd, n_ctx_train)
    cdef ggml_tensor * type_embd        # optional (n_embd, n_token_types)
    cdef ggml_tensor * tok_norm         # optional (n_embd), with tok_norm_b
    cdef ggml_tensor * tok_norm_b
    # Per-layer token embeddings (Gemma 4): a table of n_layer rows of
    # n_embd_per_layer per token, a projection of the embeddings to as many, its norm.
    cdef ggml_tensor * per_layer_tok_embd    # (n_embd_per_layer * n_layer, n_vocab)
    cdef ggml_tensor * per_layer_model_proj  # (n_embd, n_embd_per_layer * n_layer)
    cdef ggml_tensor * per_layer_proj_norm   # (n_embd_per_layer)
    cdef readonly object path
    cdef readonly dict hparams
    cdef readonly str description
    cdef bint closed

    def __cinit__(self):
        self.files = NULL
        self.n_files = 0
        self.layers = NULL
        self.swa_layers = NULL
        self.recurrent_layers = NULL
        self.shapes = NULL
        for i in range(MAX_EXTRA_BUFTS):
            self.repack_ctx[i] = NULL
            self.repack_buf[i] = NULL
        self.n_repacked = 0
        self.repacked = {}
        self.repacked_bytes = {}
        self.widened_ctx = NULL
        self.widened_buf = NULL
        memset(&self.widened, 0, sizeof(WidenedWeights))
        self.n_device_bufs = 0
        self.rpc_endpoints = []
        self.rpc_timeout = 0
        self.tok_embd = self.output_norm = self.output = self.rope_freqs = NULL
        self.pos_embd = self.type_embd = self.tok_norm = self.tok_norm_b = NULL
        self.per_layer_tok_embd = self.per_layer_model_proj = self.per_layer_proj_norm = NULL
        self.closed = True

    def __init__(self, *args, **kwargs):
        raise TypeError("Model objects are made by elelem._core.open_model()")

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        cdef int i
        _release_device_weights(self)
        for i in range(MAX_EXTRA_BUFTS):
            if self.repack_buf[i] != NULL:
                ggml_backend_buffer_free(self.repack_buf[i])
                self.repack_buf[i] = NULL
            if self.repack_ctx[i] != NULL:
                ggml_free(self.repack_ctx[i])
                self.repack_ctx[i] = NULL
        if self.widened_buf != NULL:
            ggml_backend_buffer_free(self.widened_buf)
            self.widened_buf = NULL
        if self.widened_ctx != NULL:
            ggml_free(self.widened_ctx)
            self.widened_ctx = NULL
        free(self.widened.narrow)
        free(self.widened.wide)
        memset(&self.widened, 0, sizeof(WidenedWeights))
        self.widen_pending = 0
        if self.files != NULL:
            for i in range(self.n_files):
                _release_file(&self.files[i])
            free(self.files)
            self.files = NULL
        self.n_files = 0
        if self.layers != NULL:
            free(self.layers)
            self.layers = NULL
        if self.swa_layers != NULL:
            free(self.swa_layers)
            self.swa_layers = NULL
        if self.recurrent_layers != NULL:
            free(self.recurrent_layers)
            self.recurrent_layers = NULL
        if self.shapes != NULL:
            free(self.shapes)
            self.shapes = NULL
        self.closed = True

    def close(self):
        """Unmap the weights.  Sessions keep their model alive, so close those first."""
        self._release()

    @property
    def is_closed(self):
        return self.closed

    @property
    def n_widened(self):
        """Q5_0 weights with a Q8_0 copy for batched steps (widen.pxi), made
        or to be made by the first step that uses them."""
        return self.widened.n or self.widen_pending

    @property
    def widened_bytes(self):
        return ggml_backend_buffer_get_size(self.widened_buf) if self.widened_buf != NULL else 0

    cdef inline void _check_open(self) except *:
        if self.closed:
            raise errors.ClosedError("this model is closed")

    @property
    def n_vocab(self):
        return self.hp.n_vocab

    @property
    def n_ctx_train(self):
        return self.hp.n_ctx_train

    @property
    def n_layer(self):
        return self.hp.n_layer

    @property
    def causal(self):
        """False where tokens attend to their whole sequence (BERT)."""
        return bool(self.hp.causal)

    @property
    def hybrid(self):
        """True where some layers keep a recurrent state (Gated DeltaNet) beside the K/V cells."""
        cdef int il
        if self.recurrent_layers == NULL:
            return False
        for il in range(self.hp.n_layer):
            if self.recurrent_layers[il]:
                return True
        return False

    @property
    def encoder(self):
        """True for an encoder (BERT family): embeddings, but no logits."""
        return bool(self.hp.encoder)

    cdef ggml_tensor * _tensor(self, name, bint required) except? NULL:
        cdef bytes b = name.encode()
        cdef ggml_tensor * t = _repacked_tensor(self, b)
        if t == NULL:
            t = _file_tensor(self, b)
        if t == NULL and required:
            raise errors.ModelShapeError(f"required tensor {name!r} is missing from {self.path}")
        return t


def open_model(path, str builder, dict hparams, dict global_tensors, list layer_tensors, str description="",
               list matmul_weights=None, bint repack=True, bint use_mmap=True, amx_types=None,
               bint widen_q5_0=False, shards=None):
    """Open ``path`` (already validated by elelem.gguf_reader), to be run by
    the graph builder named ``builder`` (see ``graph_builders()``).

    ``hparams`` holds the HParams fields by name; ``global_tensors`` maps
    tok_embd/output_norm/output/rope_freqs to a tensor name or None;
    ``layer_tensors`` has one dict per layer mapping a role in LAYER_ROLES to
    a tensor name or None (absent optional tensor).  ``matmul_weights`` names
    the tensors used as the left operand of a mul_mat: with ``repack``, those
    the CPU backend can repack are copied into its repack buffer.  Without
    ``use_mmap`` the file is read into memory instead of mapped.
    ``amx_types`` names the ggml types (``"q4_K"``, ...) allowed into the AMX
    buffer type, where the CPU has one; None allows every type it takes.
    With ``widen_q5_0``, Q5_0 matmul weights that no buffer type repacked get
    a Q8_0 copy holding the same values (widen.pxi; only where that keeps
    the arithmetic: the caller decides).
    ``shards`` lists every file of a split model in order, ``path`` first
    (``GGUFFile.shard_paths``, validated by the reader); each is mapped, and
    its tensors placed in its own mapping.
    """
    cdef int builder_id = _builder_id(builder)
    cdef Model m = Model.__new__(Model)
    m.path = os.fspath(path)
    m.hparams = dict(hparams)
    m.description = description
    _fill_hparams(&m.hp, hparams)
    m.builder_id = builder_id
    if len(layer_tensors) != m.hp.n_layer:
        raise errors.ModelShapeError(f"{len(layer_tensors)} layer tensor tables for {m.hp.n_layer} layers")

    paths = [m.path] if not shards else [os.fspath(p) for p in shards]
    if os.path.abspath(paths[0]) != os.path.abspath(m.path):
        raise errors.InvalidArgumentError(f"shards[0] is {paths[0]}, not the model's path {m.path}")
    if len(paths) > 65535:  # split.no is a uint16
        raise errors.InvalidArgumentError(f"{len(paths)} shards: a split model has at most 65535")
    m.files = <WeightFile *> calloc(len(paths), sizeof(WeightFile))
    if m.files == NULL:
        raise MemoryError()
    cdef int ifile
    for ifile, shard_path in enumerate(paths):
        m.n_files = ifile + 1  # so that _release frees what this file has got, should it fail
        _open_weight_file(m, ifile, shard_path, use_mmap, len(paths) > 1)
    if repack and matmul_weights:
        _repack_weights(m, matmul_weights, None if global_tensors.get("output") else global_tensors["tok_embd"],
                        None if amx_types is None else frozenset(amx_types))
    if widen_q5_0 and matmul_weights:
        _widen_weights(m, matmul_weights, None if global_tensors.get("output") else global_tensors["tok_embd"])

    m.tok_embd = m._tensor(global_tensors["tok_embd"], True)
    on = global_tensors.get("output_norm")   # an encoder has none
    m.output_norm = m._tensor(on, True) if on else NULL
    m.output = m._tensor(global_tensors.get("output") or TIED_OUTPUT_NAME.decode(), False)
    if m.output == NULL:
        m.output = m.tok_embd  # tied output, not repacked
    rf = global_tensors.get("rope_freqs")
    m.rope_freqs = m._tensor(rf, False) if rf else NULL
    m.pos_embd = _optional_tensor(m, global_tensors, "pos_embd")
    m.type_embd = _optional_tensor(m, global_tensors, "type_embd")
    m.tok_norm = _optional_tensor(m, global_tensors, "tok_norm")
    m.tok_norm_b = _optional_tensor(m, global_tensors, "tok_norm_b")
    m.per_layer_tok_embd = _optional_tensor(m, global_tensors, "per_layer_tok_embd")
    m.per_layer_model_proj = _optional_tensor(m, global_tensors, "per_layer_model_proj")
    m.per_layer_proj_norm = _optional_tensor(m, global_tensors, "per_layer_proj_norm")

    m.layers = <LayerWeights *> calloc(m.hp.n_layer, sizeof(LayerWeights))
    m.swa_layers = <unsigned char *> calloc(m.hp.n_layer, 1)
    m.recurrent_layers = <unsigned char *> calloc(m.hp.n_layer, 1)
    m.shapes = <LayerShape *> calloc(m.hp.n_layer, sizeof(LayerShape))
    if m.layers == NULL or m.swa_layers == NULL or m.recurrent_layers == NULL or m.shapes == NULL:
        raise MemoryError()
    recurrent = hparams.get("recurrent_layers") or [False] * m.hp.n_layer
    if len(recurrent) != m.hp.n_layer:
        raise errors.ModelShapeError(f"{len(recurrent)} recurrent-layer flags for {m.hp.n_layer} layers")
    swa = hparams.get("swa_layers") or [False] * m.hp.n_layer
    if len(swa) != m.hp.n_layer:
        raise errors.ModelShapeError(f"{len(swa)} sliding-window flags for {m.hp.n_layer} layers")
    _fill_layer_shapes(m, hparams)
    cdef int il, ir
    for il in range(m.hp.n_layer):
        m.swa_layers[il] = 1 if swa[il] else 0
        m.recurrent_layers[il] = 1 if recurrent[il] else 0
        table = layer_tensors[il]
        for ir, role in enumerate(LAYER_ROLES):
            name = table.get(role)
            if name is not None:
                _role_slot(&m.layers[il], ir)[0] = m._tensor(name, True)
    m.closed = False
    return m


cdef void _fill_layer_shapes(Model m, dict h) except *:
    """Each layer's attention geometry: HParams' values, or the per-layer lists
    ``layer_n_head_kv``, ``layer_head_dim_k``, ``layer_head_dim_v``,
    ``layer_n_rot`` and ``layer_kv_source`` where hparams has them (checked
    by elelem.model.architectures)."""
    cdef int il, n = m.hp.n_layer
    defaults = {"layer_n_head_kv": m.hp.n_head_kv, "layer_head_dim_k": m.hp.head_dim_k,
                "layer_head_dim_v": m.hp.head_dim_v, "layer_n_rot": m.hp.n_rot}
    lists = {}
    for name, value in defaults.items():
        lists[name] = h.get(name) or [value] * n
    lists["layer_kv_source"] = h.get("layer_kv_source") or list(range(n))
    for name, values in lists.items():
        if len(values) != n:
            raise errors.ModelShapeError(f"{len(values)} entries of {name} for {n} layers")
    for il in range(n):
        m.shapes[il].n_head_kv = lists["layer_n_head_kv"][il]
        m.shapes[il].head_dim_k = lists["layer_head_dim_k"][il]
        m.shapes[il].head_dim_v = lists["layer_head_dim_v"][il]
        m.shapes[il].n_rot = lists["layer_n_rot"][il]
        m.shapes[il].kv_source = lists["layer_kv_source"][il]
        if not 0 <= m.shapes[il].kv_source <= il or m.shapes[m.shapes[il].kv_source].kv_source != m.shapes[il].kv_source:
            raise errors.ModelShapeError(f"layer {il} shares the K/V of layer {m.shapes[il].kv_source}, "
                                         f"which is not an earlier layer with K/V of its own")


cdef ggml_tensor * _optional_tensor(Model m, dict global_tensors, str role) except? NULL:
    name = global_tensors.get(role)
    return m._tensor(name, True) if name else NULL


cdef void _fill_hparams(HParams * hp, dict h) except *:
    hp.n_vocab = h["n_vocab"]
    hp.n_embd = h["n_embd"]
    hp.n_layer = h["n_layer"]
    hp.n_head = h["n_head"]
    hp.n_head_kv = h["n_head_kv"]
    hp.head_dim_k = h["head_dim_k"]
    hp.head_dim_v = h["head_dim_v"]
    hp.n_ff = h["n_ff"]
    hp.n_ctx_train = h["n_ctx_train"]
    hp.n_rot = h["n_rot"]
    hp.rope_type = {"neox": GGML_ROPE_TYPE_NEOX, "imrope": GGML_ROPE_TYPE_IMROPE}.get(h["rope_type"],
                                                                                   GGML_ROPE_TYPE_NORMAL)
    hp.rms_eps = h["rms_eps"]
    hp.rope_base = h["rope_base"]
    hp.rope_base_swa = h.get("rope_base_swa", h["rope_base"])
    hp.rope_scale = h.get("rope_scale", 1.0)
    hp.rope_scale_swa = h.get("rope_scale_swa", hp.rope_scale)
    hp.attn_scale = h["attn_scale"]
    hp.embd_scale = h.get("embd_scale", 1.0)
    hp.n_swa = h.get("n_swa", 0)
    hp.norm_eps = h.get("norm_eps", 1e-12)
    hp.causal = h.get("causal", True)
    hp.encoder = h.get("encoder", False)
    hp.n_ctx_orig = h.get("n_ctx_orig", h["n_ctx_train"])
    hp.rope_ext_factor = h.get("rope_ext_factor", 0.0)
    hp.rope_attn_factor = h.get("rope_attn_factor", 1.0)
    hp.yarn_beta_fast = h.get("yarn_beta_fast", 32.0)
    hp.yarn_beta_slow = h.get("yarn_beta_slow", 1.0)
    hp.attn_temp_scale = h.get("attn_temp_scale", 0.0)
    hp.attn_temp_floor = h.get("attn_temp_floor", 1)
    hp.n_expert = h.get("n_expert", 0)
    hp.n_expert_used = h.get("n_expert_used", 0)
    hp.n_ff_exp = h.get("n_ff_exp", 0)
    hp.n_layer_dense_lead = h.get("n_layer_dense_lead", 0)
    hp.expert_gating = h.get("expert_gating", 0)
    hp.expert_norm = h.get("expert_norm", False)
    hp.expert_scale = h.get("expert_scale", 0.0)
    hp.expert_swiglu_oai = h.get("expert_swiglu_oai", False)
    hp.late_output_rows = h.get("late_output_rows", False)
    hp.ssm_d_conv = h.get("ssm_d_conv", 0)
    hp.ssm_d_inner = h.get("ssm_d_inner", 0)
    hp.ssm_d_state = h.get("ssm_d_state", 0)
    hp.ssm_n_group = h.get("ssm_n_group", 0)
    hp.ssm_dt_rank = h.get("ssm_dt_rank", 0)
    for i, width in enumerate(h.get("rope_sections") or (0, 0, 0, 0)):
        hp.rope_sections[i] = width
    hp.q_gate = h.get("q_gate", False)
    hp.ssm_v_grouped = h.get("ssm_v_grouped", False)
    hp.expert_gelu = h.get("expert_gelu", False)
    hp.n_embd_per_layer = h.get("n_embd_per_layer", 0)
    hp.final_logit_softcap = h.get("final_logit_softcap", 0.0)


cdef inline ggml_tensor * _file_tensor(Model m, const char * name) noexcept:
    """The tensor ``name`` as stored, in whichever of the model's files holds it (NULL if none)."""
    cdef int i
    cdef ggml_tensor * t
    for i in range(m.n_files):
        if m.files[i].ctx == NULL:  # a file whose loading failed
            continue
        t = ggml_get_tensor(m.files[i].ctx, name)
        if t != NULL:
            return t
    return NULL


cdef void _release_file(WeightFile * f) noexcept:
    if f.buf != NULL:
        ggml_backend_buffer_free(f.buf)
        f.buf = NULL
    if f.addr != NULL:
        munmap(f.addr, f.size)
        f.addr = NULL
    if f.ctx != NULL:
        ggml_free(f.ctx)
        f.ctx = NULL
    if f.gguf != NULL:
        gguf_free(f.gguf)
        f.gguf = NULL


cdef bytes SPLIT_NO_KEY = b"split.no"


cdef void _open_weight_file(Model m, int index, str path, bint use_mmap, bint split) except *:
    """Read file ``index`` of the model's tensor table (ggml's parser, after the reader's),
    map the file (or, without ``use_mmap``, read it into anonymous memory) and place each
    of its tensors at its offset in that mapping.  In a split model the file's
    ``split.no`` must be its index (llama.cpp's check) and no tensor may be in two files."""
    cdef WeightFile * f = &m.files[index]
    cdef bytes bpath = os.fsencode(path)
    cdef const char * cpath = bpath
    cdef gguf_init_params gparams
    gparams.no_alloc = True
    gparams.ctx = &f.ctx
    with nogil:
        f.gguf = gguf_init_from_file(cpath, gparams)
    if f.gguf == NULL:
        raise errors.GGUFError(f"ggml could not read the GGUF file {path}")
    cdef int64_t kid
    cdef int i
    cdef ggml_tensor * t
    if split:
        kid = gguf_find_key(f.gguf, SPLIT_NO_KEY)
        if kid < 0 or gguf_get_kv_type(f.gguf, kid) != GGUF_TYPE_UINT16 or gguf_get_val_u16(f.gguf, kid) != index:
            raise errors.GGUFError(f"{path}: split.no is not {index}, as file {index + 1} of a split model needs")
        t = ggml_get_first_tensor(f.ctx)
        while t != NULL:
            for i in range(index):
                if ggml_get_tensor(m.files[i].ctx, t.name) != NULL:
                    raise errors.GGUFError(f"{path}: tensor {t.name.decode(errors='replace')!r} is also in "
                                           f"file {i + 1} of the split model")
            t = ggml_get_next_tensor(f.ctx, t)

    cdef int fd = c_open(bpath, O_RDONLY)
    if fd < 0:
        raise errors.ModelNotFoundError(f"cannot open {path}")
    cdef struct_stat st
    if fstat(fd, &st) != 0:
        c_close(fd)
        raise OSError(f"cannot stat {path}")
    f.size = <size_t> st.st_size
    cdef ssize_t got = 0
    if use_mmap:
        f.addr = mmap(NULL, f.size, PROT_READ, MAP_SHARED, fd, 0)
    else:
        f.addr = mmap(NULL, f.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if f.addr != MAP_FAILED:
            with nogil:
                got = _read_fully(fd, <char *> f.addr, f.size)
    c_close(fd)  # a file mapping keeps the file alive
    if f.addr == MAP_FAILED:
        f.addr = NULL
        if use_mmap:
            raise OSError(f"cannot memory-map {path}")
        raise MemoryError(f"cannot allocate {f.size:,} bytes to read {path} into")
    if not use_mmap:
        if got < 0:
            raise OSError(f"cannot read {path}")
        if got != <ssize_t> f.size:
            raise errors.GGUFTruncatedError(
                f"{path}: read {got:,} of {f.size:,} bytes; the file changed while it was being read",
                field="tensor data", offset=got)
        mprotect(f.addr, f.size, PROT_READ)  # weights are never written

    f.buf = ggml_backend_cpu_buffer_from_ptr(f.addr, f.size)
    if f.buf == NULL:
        raise MemoryError("ggml could not wrap the mapped weights in a buffer")
    ggml_backend_buffer_set_usage(f.buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)

    cdef size_t data_offset = gguf_get_data_offset(f.gguf)
    cdef int64_t tid
    cdef size_t start, nbytes
    t = ggml_get_first_tensor(f.ctx)
    while t != NULL:
        tid = gguf_find_tensor(f.gguf, t.name)
        start = data_offset + gguf_get_tensor_offset(f.gguf, tid)
        nbytes = ggml_nbytes(t)
        if tid < 0 or start > f.size or nbytes > f.size - start:
            raise errors.GGUFError(
                f"tensor {t.name.decode(errors='replace')!r}: data at offset {start} + {nbytes} bytes "
                f"runs past the end of the file {path} ({f.size} bytes)")
        _check_status(ggml_backend_tensor_alloc(f.buf, t, <char *> f.addr + start),
                      "placing a tensor in the mapped weights")
        t = ggml_get_next_tensor(f.ctx, t)


cdef ssize_t _read_fully(int fd, char * dest, size_t size) noexcept nogil:
    """Read ``size`` bytes from offset 0; the count read (less at EOF), or -1."""
    cdef size_t done = 0
    cdef ssize_t n
    while done < size:
        n = pread(fd, dest + done, min(size - done, <size_t> (1 << 30)), <off_t> done)
        if n < 0:
            return -1
        if n == 0:
            break
        done += <size_t> n
    return <ssize_t> done


cdef bint _repack_supported(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, ggml_tensor * w,
                            int n_used) except -1:
    """Would the CPU backend run mul_mat(w, x) with w in ``buft``?  (The test
    llama.cpp makes: a dummy op over a 512-column batch, w in a 0-byte buffer.)"""
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * 4
    p.mem_buffer = NULL
    p.no_alloc = True
    cdef ggml_context * tmp = ggml_init(p)
    if tmp == NULL:
        raise MemoryError()
    cdef ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0)
    cdef ggml_backend_buffer * saved = w.buffer
    cdef bint ok = False
    cdef ggml_tensor * op
    if dummy != NULL:
        if w.ne[2] > 1 and n_used > 0:  # stacked experts: the op is mul_mat_id, as llama.cpp asks it
            op = ggml_mul_mat_id(tmp, w, ggml_new_tensor_3d(tmp, GGML_TYPE_F32, w.ne[0], n_used, 512),
                                 ggml_new_tensor_2d(tmp, GGML_TYPE_I32, n_used, 512))
        else:
            op = ggml_mul_mat(tmp, w, ggml_new_tensor_4d(tmp, GGML_TYPE_F32, w.ne[0], 512, w.ne[2], w.ne[3]))
        w.buffer = dummy
        ok = ggml_backend_dev_supports_op(dev, op)
        w.buffer = saved
        ggml_backend_buffer_free(dummy)
    ggml_free(tmp)
    return ok


cdef bytes TIED_OUTPUT_NAME = b"output.weight"

cdef bytes AMX_BUFT_NAME = b"AMX"

cdef void _repack_weights(Model m, list names, tied_from, amx_types) except *:
    cdef ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if dev == NULL:
        return
    cdef ggml_backend_dev_get_extra_bufts_t get_extra = <ggml_backend_dev_get_extra_bufts_t> \
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts")
    if get_extra == NULL:
        return
    cdef ggml_backend_buffer_type_t * bufts = get_extra(dev)
    cdef int ib = 0
    cdef ggml_tensor * w
    cdef ggml_tensor * r
    cdef ggml_init_params p
    pending = list(dict.fromkeys(names))
    while bufts != NULL and bufts[ib] != NULL and ib < MAX_EXTRA_BUFTS and pending:
        buft_name = ggml_backend_buft_name(bufts[ib])
        # ggml offers its extra buffer types best first (AMX before CPU_REPACK);
        # a type kept out of AMX falls through to the next one that takes it.
        allowed = amx_types if buft_name == AMX_BUFT_NAME else None
        chosen = []
        for name in pending:
            w = _file_tensor(m, name.encode())
            if w != NULL and (allowed is None or ggml_type_name(w.type).decode() in allowed) \
                    and _repack_supported(dev, bufts[ib], w, m.hp.n_expert_used):
                chosen.append(name)
        if chosen:
            p.mem_size = ggml_tensor_overhead() * (len(chosen) + 1)
            p.mem_buffer = NULL
            p.no_alloc = True
            m.repack_ctx[ib] = ggml_init(p)
            if m.repack_ctx[ib] == NULL:
                raise MemoryError()
            for name in chosen:
                w = _file_tensor(m, name.encode())
                r = ggml_dup_tensor(m.repack_ctx[ib], w)
                # A tied output keeps the embedding table unpacked for get_rows
                # and gets a repacked copy of its own, as in llama.cpp.
                new_name = TIED_OUTPUT_NAME if name == tied_from else name.encode()
                ggml_set_name(r, new_name)
            m.repack_buf[ib] = ggml_backend_alloc_ctx_tensors_from_buft(m.repack_ctx[ib], bufts[ib])
            if m.repack_buf[ib] == NULL:
                raise MemoryError("ggml could not allocate the repacked weights")
            ggml_backend_buffer_set_usage(m.repack_buf[ib], GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
            for name in chosen:
                w = _file_tensor(m, name.encode())
                new_name = TIED_OUTPUT_NAME if name == tied_from else name.encode()
                r = ggml_get_tensor(m.repack_ctx[ib], new_name)
                with nogil:
                    ggml_backend_tensor_set(r, w.data, 0, ggml_nbytes(w))  # the buffer repacks on write
            m.n_repacked += len(chosen)
            m.repacked[buft_name.decode()] = len(chosen)
            m.repacked_bytes[buft_name.decode()] = ggml_backend_buffer_get_size(m.repack_buf[ib])
            _log.debug("repacked %d weights into %s", len(chosen), buft_name.decode())
            chosen_set = set(chosen)
            pending = [n for n in pending if n not in chosen_set]
        ib += 1

