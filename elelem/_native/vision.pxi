# VisionModel: a projector file's weights (memory-mapped, used in place) and
# the CPU backend that encodes images with them.  Included into core.pyx after
# the builders (graph/vit.pxi, graph/vision_*.pxi).

DEF VIT_GRAPH_NODES_PER_LAYER = 96
DEF VIT_GRAPH_NODES_EXTRA = 256


cdef class VisionModel:
    cdef WeightFile file                # the projector GGUF, mapped
    cdef bint file_open
    cdef VisionHParams hp
    cdef VisionWeights w
    cdef VitLayerWeights * layers       # n_layer entries, calloc'd
    cdef int builder_id                 # index of its builder in _vision_builders
    cdef ggml_backend_t cpu             # made at the first encoding
    cdef ggml_threadpool * threadpool
    cdef int n_threads_now
    cdef ggml_gallocr_t galloc          # the compute buffer, kept between encodings
    cdef volatile int abort_flag
    cdef bint busy
    cdef bint closed
    cdef readonly object path
    cdef readonly str projector_type
    cdef readonly dict hparams
    cdef readonly long n_encoded        # images encoded over the model's life

    def __cinit__(self):
        memset(&self.file, 0, sizeof(WeightFile))
        memset(&self.w, 0, sizeof(VisionWeights))
        self.file_open = False
        self.layers = NULL
        self.cpu = NULL
        self.threadpool = NULL
        self.n_threads_now = 0
        self.galloc = NULL
        self.abort_flag = 0
        self.busy = False
        self.closed = True
        self.n_encoded = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("VisionModel objects are made by elelem._core.open_vision_model()")

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        if self.galloc != NULL:
            ggml_gallocr_free(self.galloc)
            self.galloc = NULL
        if self.cpu != NULL:
            ggml_backend_free(self.cpu)
            self.cpu = NULL
        if self.threadpool != NULL:
            _cpu_threadpool_free(self.threadpool)
            self.threadpool = NULL
        if self.file_open:
            _release_file(&self.file)
            self.file_open = False
        if self.layers != NULL:
            free(self.layers)
            self.layers = NULL
        memset(&self.w, 0, sizeof(VisionWeights))
        self.closed = True

    def close(self):
        """Unmap the weights and free the compute buffer (not during an encoding)."""
        if self.busy:
            raise errors.InvalidArgumentError("an image is being encoded with this projector")
        self._release()

    @property
    def is_closed(self):
        return self.closed

    def n_output_tokens(self, int nx, int ny):
        """How many embeddings an image of nx x ny (preprocessed) pixels gives."""
        cdef int side_x = nx // self.hp.patch_size, side_y = ny // self.hp.patch_size
        cdef int cols = side_x // self.hp.n_merge, rows = side_y // self.hp.n_merge
        if self.w.img_break != NULL:   # pixtral: an [IMG_BREAK] after each row but the last
            return cols * rows + rows - 1
        return cols * rows

    def request_abort(self):
        """Stop the encoding under way (from another thread): it raises KeyboardInterrupt."""
        self.abort_flag = 1

    cdef ggml_tensor * _tensor(self, name) except? NULL:
        cdef bytes b = name.encode()
        cdef ggml_tensor * t = ggml_get_tensor(self.file.ctx, b)
        if t == NULL:
            raise errors.ModelShapeError(f"required tensor {name!r} is missing from {self.path}")
        return t

    cdef void _ready_backend(self, int n_threads) except *:
        cdef ggml_threadpool * old
        if self.cpu == NULL:
            self.cpu = _new_cpu_backend(n_threads, &self.abort_flag)
        if self.n_threads_now != n_threads:
            old = self.threadpool
            self.threadpool = _new_cpu_threadpool(self.cpu, n_threads)
            if old != NULL:
                _cpu_threadpool_free(old)
            self.n_threads_now = n_threads
        if self.galloc == NULL:
            self.galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(self.cpu))
            if self.galloc == NULL:
                raise MemoryError("ggml could not make a graph allocator")

    def encode(self, pixels, n_threads=2, bint flash_attn=True, inputs=None):
        """The embeddings of one preprocessed image: float32 ``(n_tokens, n_embd_out)``.

        ``pixels``: float32 ``(3, height, width)``, normalised, one plane per
        channel (elelem.vision.preprocess makes them).  The encoder runs with
        the GIL released, on ``n_threads`` threads.  ``flash_attn`` picks
        clip.cpp's flash-attention path (K and V in F16) or its plain
        softmax(KQ)V; libmtmd takes the first on the CPU by default.
        ``inputs``: the graph's other inputs by name (int32 or float32
        arrays, as the projector type's builder names them: qwen2vl's
        positions and windows, elelem.vision.qwen)."""
        if self.closed:
            raise errors.ClosedError("this projector is closed")
        if self.busy:
            raise errors.InvalidArgumentError("an image is already being encoded with this projector")
        cdef int threads = _checked_count("n_threads", n_threads, MAX_N_THREADS)
        cdef cnp.ndarray[cnp.float32_t, ndim=3, mode="c"] px = np.ascontiguousarray(pixels, dtype=np.float32)
        cdef int ny = px.shape[1], nx = px.shape[2]
        cdef int side = self.hp.image_size
        cdef int align = self.hp.patch_size * self.hp.n_merge
        if self.hp.dynamic_size:
            if px.shape[0] != 3 or nx <= 0 or ny <= 0 or nx % align or ny % align:
                raise errors.InvalidArgumentError(
                    f"this {self.projector_type} projector takes (3, height, width) pixels, each side a multiple "
                    f"of {align}, got {tuple(pixels.shape)}")
            if self.hp.pos_size and max(nx, ny) // self.hp.patch_size > self.hp.pos_size:
                raise errors.InvalidArgumentError(
                    f"a {nx}x{ny} image has more than the projector's {self.hp.pos_size} patches a side")
        elif px.shape[0] != 3 or nx != side or ny != side:
            raise errors.InvalidArgumentError(
                f"this {self.projector_type} projector takes (3, {side}, {side}) pixels, got {tuple(pixels.shape)}")
        extra = [(name.encode(), np.ascontiguousarray(value)) for name, value in (inputs or {}).items()]
        self._ready_backend(threads)
        cdef size_t graph_size = VIT_GRAPH_NODES_PER_LAYER * self.hp.n_layer + VIT_GRAPH_NODES_EXTRA
        cdef ggml_init_params p
        p.mem_size = ggml_tensor_overhead() * graph_size + ggml_graph_overhead_custom(graph_size, False)
        p.mem_buffer = NULL
        p.no_alloc = True
        cdef VitStep st
        memset(&st, 0, sizeof(VitStep))
        st.ctx = ggml_init(p)
        if st.ctx == NULL:
            raise MemoryError()
        cdef ggml_tensor * out
        cdef ggml_status status
        try:
            st.gf = ggml_new_graph_custom(st.ctx, graph_size, False)
            st.hp = &self.hp
            st.w = &self.w
            st.layers = self.layers
            st.nx = nx
            st.ny = ny
            st.flash_attn = flash_attn
            out = _vision_builders[self.builder_id](&st)
            ggml_set_output(out)
            ggml_build_forward_expand(st.gf, out)
            if not ggml_gallocr_alloc_graph(self.galloc, st.gf):
                raise MemoryError("ggml could not allocate the image encoder's graph")
            ggml_backend_tensor_set(st.inp_raw, cnp.PyArray_DATA(px), 0, ggml_nbytes(st.inp_raw))
            for name, value in extra:
                _set_vision_input(st.gf, name, value)
            if st.pos_x != NULL:
                _set_patch_positions(&st)
            self.busy = True
            self.abort_flag = 0
            try:
                with nogil:
                    status = ggml_backend_graph_compute(self.cpu, st.gf)
            finally:
                self.busy = False
            _check_status(status, "encoding an image")
            result = np.empty((out.ne[1], out.ne[0]), dtype=np.float32)
            ggml_backend_tensor_get(out, cnp.PyArray_DATA(result), 0, ggml_nbytes(out))
        finally:
            ggml_free(st.ctx)
        self.n_encoded += 1
        return result


cdef void _set_vision_input(ggml_cgraph * gf, bytes name, cnp.ndarray value) except *:
    """Set the graph's input ``name`` (a builder's named input) from ``value``, which must fill it."""
    cdef ggml_tensor * t = ggml_graph_get_tensor(gf, name)
    if t == NULL:
        raise errors.InvalidArgumentError(f"the image encoder's graph has no input {name.decode()!r}")
    want = np.int32 if t.type == GGML_TYPE_I32 else np.float32
    if value.dtype != want or <size_t> value.nbytes != ggml_nbytes(t):
        raise errors.InvalidArgumentError(f"the image encoder's input {name.decode()!r} takes {ggml_nbytes(t)} bytes "
                                          f"of {np.dtype(want).name}, got {value.nbytes} of {value.dtype}")
    if t.buffer != NULL:
        ggml_backend_tensor_set(t, cnp.PyArray_DATA(value), 0, ggml_nbytes(t))


cdef void _set_patch_positions(VitStep * st) except *:
    """Each patch's (column, row) in row-major order (clip.cpp's set_input for gemma4v)."""
    cdef int n_cols = st.nx // st.hp.patch_size
    cdef cnp.ndarray[cnp.int32_t, ndim=1] idx = np.arange(st.pos_x.ne[0], dtype=np.int32)
    cdef cnp.ndarray[cnp.int32_t, ndim=1] col = np.ascontiguousarray(idx % n_cols, dtype=np.int32)
    cdef cnp.ndarray[cnp.int32_t, ndim=1] row = np.ascontiguousarray(idx // n_cols, dtype=np.int32)
    ggml_backend_tensor_set(st.pos_x, cnp.PyArray_DATA(col), 0, ggml_nbytes(st.pos_x))
    ggml_backend_tensor_set(st.pos_y, cnp.PyArray_DATA(row), 0, ggml_nbytes(st.pos_y))


cdef int _set_clamps(float * out, clamps) except -1:
    """clamps: None, or (input min, input max, output min, output max); returns 1 where set."""
    if clamps is None:
        return 0
    for i in range(4):
        out[i] = clamps[i]
    return 1


def open_vision_model(path, str projector_type, dict hparams, dict global_tensors, list layer_tensors,
                      bint use_mmap=True, dict clamps=None):
    """Open the projector file ``path`` (already validated by elelem.model.projector).

    ``projector_type`` names its builder (``vision_builders()``); ``hparams``
    holds the VisionHParams fields by name; ``global_tensors`` maps roles of
    VISION_GLOBAL_ROLES to tensor names (None or absent: the file has none);
    ``layer_tensors`` has one dict per layer mapping roles of VIT_LAYER_ROLES
    to names.  ``clamps`` maps a product's weight name to its four clamps (Gemma 4's
    clippable linears; elelem.model.projector reads them)."""
    if projector_type not in _vision_builder_names:
        raise errors.UnsupportedArchitectureError(
            f"no vision encoder for projector type {projector_type!r}; built in: "
            f"{', '.join(sorted(_vision_builder_names))}")
    unknown = sorted(set(global_tensors) - set(VISION_GLOBAL_ROLES)) + \
        sorted({r for t in layer_tensors for r in t} - set(VIT_LAYER_ROLES))
    if unknown:
        raise RuntimeError(f"elelem._core knows no vision tensor role {', '.join(unknown)}; rebuild it")
    cdef VisionModel vm = VisionModel.__new__(VisionModel)
    vm.path = os.fspath(path)
    vm.projector_type = projector_type
    vm.hparams = dict(hparams)
    vm.builder_id = _vision_builder_names.index(projector_type)
    vm.hp.n_embd = hparams["n_embd"]
    vm.hp.n_head = hparams["n_head"]
    vm.hp.d_head = hparams["d_head"]
    vm.hp.n_ff = hparams["n_ff"]
    vm.hp.n_layer = hparams["n_layer"]
    vm.hp.n_embd_out = hparams["n_embd_out"]
    vm.hp.image_size = hparams["image_size"]
    vm.hp.patch_size = hparams["patch_size"]
    vm.hp.n_merge = hparams["n_merge"]
    vm.hp.ffn_op = {"gelu": VIT_FFN_GELU, "gelu_quick": VIT_FFN_GELU_QUICK, "silu": VIT_FFN_SILU}[hparams["ffn_op"]]
    vm.hp.eps = hparams["eps"]
    vm.hp.rms_norm = hparams.get("norm", "layer") == "rms"
    vm.hp.n_wa_pattern = hparams.get("n_wa_pattern", 0)
    vm.hp.v_norm = hparams.get("v_norm", False)
    vm.hp.kq_scale = hparams.get("kq_scale", 0.0)
    vm.hp.rope_theta = hparams.get("rope_theta", 0.0)
    vm.hp.dynamic_size = hparams.get("dynamic_size", False)
    vm.hp.pos_size = hparams.get("pos_size", 0)
    vm.hp.rope_2d_interleaved = hparams.get("rope_2d_interleaved", False)
    clamps = clamps or {}
    if len(layer_tensors) != vm.hp.n_layer:
        raise errors.ModelShapeError(f"{len(layer_tensors)} layer tensor tables for {vm.hp.n_layer} layers")
    vm.file_open = True   # what the opening gets is released, should it fail
    _open_weight_file(&vm.file, 0, vm.path, use_mmap, False)
    cdef int i, il
    for i, role in enumerate(VISION_GLOBAL_ROLES):
        name = global_tensors.get(role)
        if name:
            (<ggml_tensor **> &vm.w)[i] = vm._tensor(name)
    vm.w.mm_clamped = _set_clamps(vm.w.mm_clamp, clamps.get(global_tensors.get("mm_input_proj")))
    vm.layers = <VitLayerWeights *> calloc(vm.hp.n_layer, sizeof(VitLayerWeights))
    if vm.layers == NULL:
        raise MemoryError()
    for il in range(vm.hp.n_layer):
        for i, role in enumerate(VIT_LAYER_ROLES):
            name = layer_tensors[il].get(role)
            if name:
                (<ggml_tensor **> &vm.layers[il])[i] = vm._tensor(name)
        for i, role in enumerate(VIT_MM_ROLES):
            if _set_clamps(&vm.layers[il].clamp[4 * i], clamps.get(layer_tensors[il].get(role))):
                vm.layers[il].clamped |= 1 << i
    vm.closed = False
    return vm
