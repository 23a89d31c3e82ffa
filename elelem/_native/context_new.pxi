# Making a Context (new_context): the cache's types, the backends of the
# model's devices, and the graph's node budget.  Included into core.pyx after context.pxi.


KV_TYPES = {"f16": GGML_TYPE_F16, "f32": GGML_TYPE_F32, "q8_0": GGML_TYPE_Q8_0, "q4_0": GGML_TYPE_Q4_0}


cdef ggml_type _kv_type(str option, object name, Model model, bint values) except *:
    if not isinstance(name, str) or name not in KV_TYPES:
        raise errors.InvalidArgumentError(f"{option} must be one of {', '.join(KV_TYPES)}, got {name!r}")
    cdef ggml_type t = KV_TYPES[name]
    cdef int il, head_dim
    for il in range(model.hp.n_layer):   # every layer's heads (Gemma 4's differ between layers)
        head_dim = model.shapes[il].head_dim_v if values else model.shapes[il].head_dim_k
        if head_dim % ggml_blck_size(t) != 0:
            raise errors.InvalidArgumentError(f"{option}={name} stores blocks of {ggml_blck_size(t)} values; "
                                              f"this model's heads are {head_dim} wide")
    return t


def new_context(Model model, object kv_size, object n_batch=512, object n_threads=1, object kv_type="f16",
                bint flash_attn=False, object n_seq_max=1, object type_v=None, list devices=None,
                list layer_device=None, list adapters=None, Context beside=None):
    """Backends, scheduler and a KV cache of ``kv_size`` cells shared by up to
    ``n_seq_max`` sequences, over ``model``.  ``kv_type`` is the type of K (and
    of V, unless ``type_v`` says otherwise): f16, f32, q8_0 or q4_0.  A
    quantized V needs flash attention (ggml's softmax path multiplies a
    transposed V, which cannot be stored in blocks), so it turns it on.
    ``devices`` and ``layer_device`` are those the model's layers were placed
    with (place_layers): each device gets a backend, ahead of the CPU, and
    each layer's K and V live on its device.  ``adapters`` are LoRA adapters
    for the model (open_adapter) that steps may apply, each sequence at its
    own scales (Context.set_lora_scales; none at first).

    ``beside``: the context of the target a drafter (a Gemma 4 drafter)
    drafts for; the new context has no cache of its own but ``beside``'s,
    which its layers read (Context.draft_step), and the same flash attention."""
    model._check_open()
    if beside is not None:
        _check_beside(model, beside)
        kv_type, type_v, flash_attn = beside.cache.type_k, beside.cache.type_v, beside.flash_attn
    adapters = adapters or []
    if len(adapters) > MAX_ADAPTERS:
        raise errors.InvalidArgumentError(f"{len(adapters)} LoRA adapters: a context takes at most {MAX_ADAPTERS}")
    for ad in adapters:
        if (<Adapter?> ad).model is not model:
            raise errors.InvalidArgumentError(f"the LoRA adapter {ad.path} was loaded for another model")
    cdef int cells = _checked_count("kv_size", kv_size, MAX_CELLS)
    cdef int batch = _checked_count("n_batch", n_batch, MAX_CELLS)
    cdef int threads = _checked_count("n_threads", n_threads, MAX_N_THREADS)
    cdef int seqs = _checked_count("n_seq_max", n_seq_max, MAX_SEQ_IDS)
    cdef ggml_type kv = _kv_type("kv_type (type_k)", kv_type, model, False)
    cdef ggml_type kv_v = _kv_type("kv_type" if type_v is None else "type_v",
                                   kv_type if type_v is None else type_v, model, True)
    if model.hp.kv_lora_rank > 0:
        # Multi-head latent attention: V is a view of K (KVCache.v_in_k), so K's type is V's,
        # and without flash attention that view is transposed, which blocks cannot be.
        kv_v = kv
    if kv_v != GGML_TYPE_F16 and kv_v != GGML_TYPE_F32 and not flash_attn:
        _log.info("a %s V cache needs flash attention: turning it on", ggml_type_name(kv_v).decode())
        flash_attn = True

    cdef Context c = Context.__new__(Context)
    c.model = model
    c.adapters = tuple(adapters)
    cdef int ia
    cdef size_t lora_nodes = 0
    for ia in range(len(adapters)):
        c.adapter_weights[ia] = &(<Adapter> adapters[ia]).weights
        # each pair's A and B products (split by runs or groups of rows at most), its scale and sum
        lora_nodes += <size_t> c.adapter_weights[ia].n_pairs * LORA_PAIR_NODES
    c.n_adapters = len(adapters)
    c.n_batch = min(batch, cells)
    c.n_threads = threads
    c.flash_attn = flash_attn
    devices = devices or []
    layer_device = layer_device if layer_device is not None else [-1] * model.hp.n_layer
    if len(layer_device) != model.hp.n_layer or len(devices) >= MAX_BACKENDS:
        raise errors.InvalidArgumentError("devices and layer_device do not fit this model")
    c.rpc_endpoints = model.rpc_endpoints
    c.rpc_timeout = model.rpc_timeout
    c.closed = False  # from here on, _release frees what was made
    _init_device_backends(c, devices)
    c.cpu = _new_cpu_backend(threads, &c.abort_flag)
    c.threadpool = _new_cpu_threadpool(c.cpu, threads)
    c.backends[c.n_backends] = c.cpu
    c.bufts[c.n_backends] = ggml_backend_get_default_buffer_type(c.cpu)
    c.n_backends += 1
    # Each layer's K and V live in the buffers of the device that runs it.
    cdef ggml_backend_buffer_type_t * layer_buft = <ggml_backend_buffer_type_t *> malloc(
        model.hp.n_layer * sizeof(ggml_backend_buffer_type_t))
    if layer_buft == NULL:
        raise MemoryError()
    cdef int il
    try:
        for il in range(model.hp.n_layer):
            layer_buft[il] = c.bufts[layer_device[il] if layer_device[il] >= 0 else c.n_backends - 1]
        if beside is None:
            c.cache = _new_kv_cache(model, cells, seqs, kv, kv_v, not flash_attn, layer_buft, c.rpc_timeout)
        else:
            c.cache = beside.cache
            c.target = beside
    finally:
        free(layer_buft)
    # Graph metadata: a generous node budget per layer, and for a prompt step
    # split by sequence (graph/blocks.pxi) 5 more nodes a run for attention and
    # 3 a run for each repacked matmul, 5 for one split as alone (7 a layer at most); the arena is reused
    # by every step.
    # An expert layer adds about 30 nodes and 2 per expert a token uses (graph/experts.pxi).
    cdef size_t moe_nodes = 0
    if model.hp.n_expert > 0:   # ... and about 12 for each group of rows through the experts (graph/experts.pxi)
        # (a step of generated tokens: groups of 7 rows; a prompt step: up to MAX_RUNS runs)
        moe_nodes = 32 + 2 * model.hp.n_expert_used + 12 * max(MAX_RUNS, min(MAX_EXPERT_GROUPS, c.n_batch // 7 + 1))
    # A step of generated tokens under flash attention: up to FA_ROW_NODES a row
    # whose one-token step would split its cells (_flash_attention_as_one_token_steps),
    # which only a cache of FA_SPLIT_CELLS cells or more has.  (The scheduler's
    # context grows with the node budget: about 40 kB a node, in address space.)
    cdef size_t split_nodes = FA_ROW_NODES * min(c.n_batch, MAX_SPLIT_ROWS) \
        if flash_attn and c.cache.kv_size >= FA_SPLIT_CELLS else 0
    c.graph_size = max(<size_t> GGML_DEFAULT_GRAPH_SIZE,
                       <size_t> model.hp.n_layer * (64 + (5 + 7 * 5) * MAX_RUNS + moe_nodes + split_nodes)
                       + 256 + lora_nodes)
    c.graph_meta_size = ggml_tensor_overhead() * c.graph_size + ggml_graph_overhead_custom(c.graph_size, False)
    c.graph_meta = malloc(c.graph_meta_size)
    if c.graph_meta == NULL:
        raise MemoryError()
    # Without the GIL: ggml zeroes the scheduler's tables (tens of megabytes for a
    # big node budget), 20 ms that the other models' steps would wait for in a server.
    with nogil:
        c.sched = ggml_backend_sched_new(c.backends, c.bufts, c.n_backends, 2 * c.graph_size, False, True)
    if c.sched == NULL:
        raise MemoryError("ggml could not create the backend scheduler")
    c._reserve()
    return c


cdef void _init_device_backends(Context c, list devices) except *:
    """A backend for each device, in the order given, ahead of the CPU."""
    cdef _DeviceInitJob job
    for dev in devices:
        job.dev = (<Device?> dev).dev
        job.backend = NULL
        job.buft = NULL
        _run_guarded(_device_init_job, &job, sizeof(job), c.rpc_timeout, f"starting a backend on {dev.description}",
                     c.rpc_endpoints)
        if job.backend == NULL:
            raise errors.ComputeError(f"ggml could not start a backend on {dev.name} ({dev.description})")
        c.backends[c.n_backends] = job.backend
        c.bufts[c.n_backends] = job.buft
        c.n_backends += 1
