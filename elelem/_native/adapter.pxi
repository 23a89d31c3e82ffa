# LoRA adapters: the low-rank factors of a GGUF adapter file (llama.cpp's
# convert_lora_to_gguf.py writes them: general.type "adapter", a pair of
# tensors "<weight>.lora_a" and "<weight>.lora_b" for each weight it adapts),
# owned here as the model's weights are, in a CPU buffer of their own.
# Included into core.pyx after model.pxi.  The graph adds each adapter's
# product to its weight's (graph/lora.pxi), as llama.cpp's build_lora_mm.

DEF MAX_ADAPTERS = 8          # adapters one context can use (a bit each in Step.lora_mask)
DEF MAX_ADAPTER_RANKS = 4     # distinct ranks within one adapter (each its own scale input)
# Graph nodes one adapted weight may add: its A and B products, each split by
# runs of columns (MAX_RUNS, 5 nodes a run) or by groups of rows through the
# experts, its scales and its sum (graph/lora.pxi).
DEF LORA_PAIR_NODES = 128


cdef struct LoraPair:
    # One adapted weight.  x @ w becomes x @ w + scale * B(A x), as llama.cpp's build_lora_mm.
    const ggml_tensor * base    # the model's weight, as the graph builders see it
    ggml_tensor * a             # (n_in, rank[, n_expert]); token_embd: (rank, n_vocab), rows by token
    ggml_tensor * b             # (rank, n_out[, n_expert]); token_embd: (rank, n_embd)
    int rank_slot               # index of its rank in AdapterWeights.ranks
    bint embedding              # the token embedding table (llama.cpp's build_inp_embd)


cdef struct AdapterWeights:
    # What the graph needs of one adapter.
    int n_pairs
    LoraPair * pairs            # n_pairs entries, calloc'd
    float alpha                 # adapter.lora.alpha; 0: the scale is the user's scale
    int n_ranks
    int ranks[MAX_ADAPTER_RANKS]   # the distinct ranks (lora_b's ne[0]) of its pairs


cdef inline float lora_scale(const AdapterWeights * w, int rank_slot, float user_scale) noexcept:
    """llama.cpp's llama_adapter_lora_weight::get_scale, in its float steps:
    alpha ? scale * alpha / rank : scale."""
    cdef float rank = <float> w.ranks[rank_slot]
    return user_scale * w.alpha / rank if w.alpha != 0.0 else user_scale


cdef inline const LoraPair * lora_pair(const AdapterWeights * w, const ggml_tensor * base) noexcept:
    """The adapter's pair for a weight of the model (NULL: it leaves that weight alone)."""
    cdef int i
    for i in range(w.n_pairs):
        if w.pairs[i].base == base and not w.pairs[i].embedding:
            return &w.pairs[i]
    return NULL


cdef set LORA_FACTOR_TYPES = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0}


cdef class Adapter:
    """A LoRA adapter loaded for one model (``open_adapter``)."""
    cdef gguf_context * gguf            # its tensor table, owned
    cdef ggml_context * ctx             # the tensors (headers), owned
    cdef ggml_backend_buffer_t buf      # their data, in a CPU buffer, owned
    cdef AdapterWeights weights
    cdef readonly Model model           # the model it adapts, kept alive
    cdef readonly object path
    cdef readonly tuple targets         # the names of the weights it adapts, in file order

    def __cinit__(self):
        self.gguf = NULL
        self.ctx = NULL
        self.buf = NULL
        memset(&self.weights, 0, sizeof(AdapterWeights))

    def __init__(self, *args, **kwargs):
        raise TypeError("Adapter objects are made by elelem._core.open_adapter()")

    def __dealloc__(self):
        if self.buf != NULL:
            ggml_backend_buffer_free(self.buf)
            self.buf = NULL
        if self.ctx != NULL:
            ggml_free(self.ctx)
            self.ctx = NULL
        if self.gguf != NULL:
            gguf_free(self.gguf)
            self.gguf = NULL
        free(self.weights.pairs)
        self.weights.pairs = NULL

    @property
    def alpha(self):
        return self.weights.alpha

    @property
    def ranks(self):
        return tuple(self.weights.ranks[i] for i in range(self.weights.n_ranks))

    @property
    def nbytes(self):
        return ggml_backend_buffer_get_size(self.buf) if self.buf != NULL else 0


cdef ggml_tensor * _graph_weight(Model m, const char * name) noexcept:
    """The model's weight called ``name`` as the graph builders use it (a
    repacked or device copy keeps the name), or NULL."""
    cdef int il, ir
    cdef ggml_tensor * t
    for il in range(m.hp.n_layer):
        for ir in range(len(LAYER_ROLES)):
            t = _role_slot(&m.layers[il], ir)[0]
            if t != NULL and strcmp(t.name, name) == 0:
                return t
    if m.output != NULL and strcmp(m.output.name, name) == 0:
        return m.output
    if m.per_layer_model_proj != NULL and strcmp(m.per_layer_model_proj.name, name) == 0:
        return m.per_layer_model_proj
    return NULL


def open_adapter(Model model, path, float alpha):
    """Load the LoRA adapter at ``path`` (its metadata already checked by
    elelem.model.adapters) for ``model``.  Every lora_a has its lora_b, each
    pair adapts a weight the model has, with llama.cpp's shape checks (A is
    (n_in, rank), B (rank, n_out); stacked experts' pairs as many experts);
    anything else is AdapterError."""
    model._check_open()
    cdef Adapter ad = Adapter.__new__(Adapter)
    ad.model = model
    ad.path = os.fspath(path)
    ad.weights.alpha = alpha
    cdef bytes bpath = os.fsencode(path)
    cdef const char * cpath = bpath
    cdef gguf_init_params gparams
    gparams.no_alloc = True
    gparams.ctx = &ad.ctx
    with nogil:
        ad.gguf = gguf_init_from_file(cpath, gparams)
    if ad.gguf == NULL:
        raise errors.AdapterError(f"ggml could not read the LoRA adapter {ad.path}")

    # Pair the factors by the weight they adapt; norm tensors are skipped, as llama.cpp does.
    pairs = {}
    order = []
    cdef ggml_tensor * t = ggml_get_first_tensor(ad.ctx)
    while t != NULL:
        name = t.name.decode("utf-8", "replace")
        for suffix, side in ((".lora_a", 0), (".lora_b", 1)):
            if name.endswith(suffix):
                target = name[:-len(suffix)]
                if target not in pairs:
                    pairs[target] = [0, 0]
                    order.append(target)
                pairs[target][side] = <uintptr_t> t
                break
        else:
            if not name.endswith("_norm.weight"):
                raise errors.AdapterError(f"{ad.path}: tensor {name!r} is neither a .lora_a nor a .lora_b")
        t = ggml_get_next_tensor(ad.ctx, t)
    if not pairs:
        raise errors.AdapterError(f"{ad.path}: no LoRA tensors")
    ad.weights.pairs = <LoraPair *> calloc(len(pairs), sizeof(LoraPair))
    if ad.weights.pairs == NULL:
        raise MemoryError()
    cdef LoraPair * p
    cdef ggml_tensor * a
    cdef ggml_tensor * b
    cdef const ggml_tensor * base
    cdef int i, r
    for target in order:
        a = <ggml_tensor *> <uintptr_t> pairs[target][0]
        b = <ggml_tensor *> <uintptr_t> pairs[target][1]
        if a == NULL or b == NULL:
            raise errors.AdapterError(f"{ad.path}: the LoRA pair for {target!r} lacks its "
                                      f"{'lora_a' if a == NULL else 'lora_b'}")
        btarget = target.encode()
        embedding = btarget == model.tok_embd.name
        base = model.tok_embd if embedding else _graph_weight(model, btarget)
        if base == NULL:
            raise errors.AdapterError(f"{ad.path}: the adapter changes {target!r}, which this model does not have "
                                      f"or does not multiply (is it an adapter for another model?)")
        for side, f in (("lora_a", <uintptr_t> a), ("lora_b", <uintptr_t> b)):
            if (<ggml_tensor *> f).type not in LORA_FACTOR_TYPES:
                raise errors.AdapterError(f"{ad.path}: {target}.{side} is "
                                          f"{ggml_type_name((<ggml_tensor *> f).type).decode()}; LoRA factors are "
                                          f"F32, F16, BF16 or Q8_0")
        if embedding:
            # llama.cpp's build_inp_embd: A's rows taken by token, B not transposed.
            ok = base.ne[0] == b.ne[1] and base.ne[1] == a.ne[1] and a.ne[0] == b.ne[0] and a.ne[2] == 1 and b.ne[2] == 1
        else:
            ok = (base.ne[0] == a.ne[0] and base.ne[1] == b.ne[1] and a.ne[1] == b.ne[0]
                  and a.ne[2] == base.ne[2] and b.ne[2] == base.ne[2])
        if not ok or a.ne[3] != 1 or b.ne[3] != 1:
            raise errors.AdapterError(
                f"{ad.path}: {target}.lora_a {_shape(a)} and .lora_b {_shape(b)} do not fit the model's "
                f"{target} {_shape(base)} (is it an adapter for another model?)")
        if embedding and a.type == GGML_TYPE_Q8_0:
            raise errors.AdapterError(f"{ad.path}: {target}.lora_a is Q8_0; a token embedding's is a float type")
        i = ad.weights.n_pairs
        p = &ad.weights.pairs[i]
        p.base = base
        p.a = a
        p.b = b
        p.embedding = embedding
        for r in range(ad.weights.n_ranks):
            if ad.weights.ranks[r] == b.ne[0]:
                break
        else:
            if ad.weights.n_ranks == MAX_ADAPTER_RANKS:
                raise errors.AdapterError(f"{ad.path}: more than {MAX_ADAPTER_RANKS} distinct LoRA ranks")
            r = ad.weights.n_ranks
            ad.weights.ranks[r] = <int> b.ne[0]
            ad.weights.n_ranks += 1
        p.rank_slot = r
        ad.weights.n_pairs += 1
    ad.targets = tuple(order)

    ad.buf = ggml_backend_alloc_ctx_tensors_from_buft(ad.ctx, ggml_backend_cpu_buffer_type())
    if ad.buf == NULL:
        raise MemoryError("ggml could not allocate the LoRA adapter's weights")
    ggml_backend_buffer_set_usage(ad.buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    _read_adapter_data(ad)
    _log.info("LoRA adapter %s: %d weights, rank %s, alpha %g, %.2f MiB", ad.path, ad.weights.n_pairs,
              "/".join(str(r) for r in ad.ranks), alpha, ad.nbytes / 2**20)
    return ad


cdef str _shape(const ggml_tensor * t):
    return "(" + ", ".join(str(t.ne[i]) for i in range(max(2, ggml_n_dims(t)))) + ")"


cdef void _read_adapter_data(Adapter ad) except *:
    """Read each factor's data from the file into its place in the buffer."""
    cdef int fd = c_open(os.fsencode(ad.path), O_RDONLY)
    if fd < 0:
        raise errors.ModelNotFoundError(f"cannot open {ad.path}")
    cdef struct_stat st
    cdef size_t data_offset = gguf_get_data_offset(ad.gguf)
    cdef size_t start, nbytes
    cdef int64_t tid
    cdef ggml_tensor * t
    cdef ssize_t got
    try:
        if fstat(fd, &st) != 0:
            raise OSError(f"cannot stat {ad.path}")
        t = ggml_get_first_tensor(ad.ctx)
        while t != NULL:
            tid = gguf_find_tensor(ad.gguf, t.name)
            start = data_offset + gguf_get_tensor_offset(ad.gguf, tid)
            nbytes = ggml_nbytes(t)
            if tid < 0 or start > <size_t> st.st_size or nbytes > <size_t> st.st_size - start:
                raise errors.AdapterError(f"{ad.path}: the data of {t.name.decode(errors='replace')!r} runs past "
                                          f"the end of the file")
            with nogil:
                got = _read_at(fd, <char *> t.data, nbytes, <off_t> start)
            if got != <ssize_t> nbytes:
                raise OSError(f"cannot read {ad.path}")
            t = ggml_get_next_tensor(ad.ctx, t)
    finally:
        c_close(fd)


cdef ssize_t _read_at(int fd, char * dest, size_t size, off_t offset) noexcept nogil:
    cdef size_t done = 0
    cdef ssize_t n
    while done < size:
        n = pread(fd, dest + done, min(size - done, <size_t> (1 << 30)), offset + <off_t> done)
        if n <= 0:
            return -1 if n < 0 else <ssize_t> done
        done += <size_t> n
    return <ssize_t> done
