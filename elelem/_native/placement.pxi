# Placing a model's layers on devices other than the CPU: their weights are
# copied into the device's buffer type and the layer table points at the
# copies, so ggml's scheduler runs those layers' matmuls where the weights
# are.  Included into core.pyx after model.pxi.
#
# The token embeddings stay on the CPU (llama.cpp's input layer: a get_rows
# of a few rows).  The output norm and head go where llama.cpp puts them: on
# the device of the last layer when every layer and the output were offloaded
# (n_gpu_layers -1, or more than n_layer), else on the CPU.  A tied head is
# copied there, and the CPU keeps the embedding table for get_rows.


def place_layers(Model m, list devices, list layer_device, double rpc_timeout=DEFAULT_RPC_TIMEOUT,
                 int output_device=-1):
    """Copy the weights of layer ``il`` to ``devices[layer_device[il]]``
    (-1: it stays on the CPU, used in place from the file), and the output
    norm and head to ``devices[output_device]`` (-1: the CPU).  Weights of
    placed layers must not have been repacked (open_model's matmul_weights
    leaves them out): the copy is made from the file's bytes."""
    m._check_open()
    if m.n_device_bufs:
        raise errors.InvalidArgumentError("this model's layers were placed already")
    if len(layer_device) != m.hp.n_layer:
        raise errors.InvalidArgumentError(f"need one device index per layer ({m.hp.n_layer}), got {len(layer_device)}")
    if len(devices) > MAX_DEVICES:
        raise errors.InvalidArgumentError(f"at most {MAX_DEVICES} devices besides the CPU, got {len(devices)}")
    for d in list(layer_device) + [output_device]:
        if not -1 <= d < len(devices):
            raise errors.InvalidArgumentError(f"layer device index {d} is not in [-1, {len(devices)})")
    if output_device >= 0 and m.hp.encoder:
        raise errors.InvalidArgumentError("an encoder has no output head to place")
    m.rpc_endpoints = sorted({(<Device?> dev).endpoint for dev in devices if dev.endpoint is not None})
    m.rpc_timeout = rpc_timeout if m.rpc_endpoints else 0
    cdef int d_i, il, ir, n
    for d_i, dev in enumerate(devices):
        layers = [il for il in range(m.hp.n_layer) if layer_device[il] == d_i]
        if layers or output_device == d_i:
            _place_on_device(m, <Device> dev, layers, output_device == d_i)


def unsupported_weights(Model m, Device dev, list layers, bint with_output=False):
    """The weights of these layers (and of the output norm and head) that ``dev``
    cannot hold or multiply, as ``[(layer or -1 for the output, tensor name,
    bytes)]``.  ggml's scheduler aborts on a weight placed where its op cannot
    run (a Vulkan device's largest buffer is often smaller than a big
    vocabulary's embedding table), so llama.cpp keeps such weights on the CPU
    (weight_buft_supported); elelem keeps their layer, or the head, there."""
    m._check_open()
    out = []
    cdef int il, ir
    cdef ggml_tensor ** role
    for il in layers:
        if not 0 <= il < m.hp.n_layer:
            raise errors.InvalidArgumentError(f"layer {il} is not in [0, {m.hp.n_layer})")
        for ir in range(len(LAYER_ROLES)):
            role = _role_slot(&m.layers[il], ir)
            if role[0] != NULL and not _device_runs(dev.dev, _file_tensor(m, role[0].name)):
                out.append((il, role[0].name.decode(), int(ggml_nbytes(role[0]))))
    cdef ggml_tensor * heads[2]
    heads[0] = m.output_norm
    heads[1] = m.output
    if with_output:
        for ir in range(2):
            if heads[ir] != NULL and not _device_runs(dev.dev, _file_tensor(m, heads[ir].name)):
                out.append((-1, heads[ir].name.decode(), int(ggml_nbytes(heads[ir]))))
    return out


cdef bint _device_runs(ggml_backend_dev_t dev, ggml_tensor * w) except -1:
    """Whether ``dev`` holds ``w`` (its size within the device's buffer limits) and, for a
    matrix, multiplies a batch of 512 columns by it: the ops a weight takes part in."""
    if w == NULL:
        return True
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * 4
    p.mem_buffer = NULL
    p.no_alloc = True
    cdef ggml_context * ctx = ggml_init(p)
    if ctx == NULL:
        raise MemoryError()
    cdef ggml_tensor * x
    try:
        if not ggml_backend_dev_supports_op(dev, w):
            return False
        if ggml_n_dims(w) == 2 and w.ne[1] > 1:
            x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w.ne[0], 512)
            return ggml_backend_dev_supports_op(dev, ggml_mul_mat(ctx, w, x))
        return True
    finally:
        ggml_free(ctx)


cdef void _place_on_device(Model m, Device dev, list layers, bint with_output) except *:
    cdef int count = 0, il, ir, k, n_output = 0
    for il in layers:
        for ir in range(len(LAYER_ROLES)):
            if _role_slot(&m.layers[il], ir)[0] != NULL:
                count += 1
    # The output norm and head: after the layers' tensors, in this order.
    cdef ggml_tensor ** output_roles[2]
    if with_output:
        output_roles[0] = &m.output_norm
        output_roles[1] = &m.output
        for k in range(2):
            if output_roles[k][0] != NULL:
                n_output += 1
        count += n_output
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * (count + 1)
    p.mem_buffer = NULL
    p.no_alloc = True
    cdef int slot = m.n_device_bufs
    m.device_ctx[slot] = ggml_init(p)
    m.device_buf[slot] = NULL
    m.n_device_bufs += 1
    if m.device_ctx[slot] == NULL:
        raise MemoryError()
    cdef ggml_tensor ** src = <ggml_tensor **> malloc(count * sizeof(ggml_tensor *))
    cdef ggml_tensor ** dst = <ggml_tensor **> malloc(count * sizeof(ggml_tensor *))
    cdef ggml_tensor * orig
    cdef ggml_tensor ** role
    cdef _UploadJob job
    if src == NULL or dst == NULL:
        free(src)
        free(dst)
        raise MemoryError()
    try:
        k = 0
        for il in layers:
            for ir in range(len(LAYER_ROLES)):
                role = _role_slot(&m.layers[il], ir)
                if role[0] == NULL:
                    continue
                orig = _file_tensor(m, role[0].name)  # the file's bytes, never a repacked copy
                if orig == NULL or orig != role[0]:
                    raise errors.InvalidArgumentError(
                        f"{role[0].name.decode()} was repacked for the CPU; leave it out of matmul_weights")
                src[k] = orig
                dst[k] = ggml_dup_tensor(m.device_ctx[slot], orig)
                ggml_set_name(dst[k], orig.name)
                k += 1
        if with_output:
            for ir in range(2):
                role = output_roles[ir]
                if role[0] == NULL:
                    continue
                orig = _file_tensor(m, role[0].name)
                if orig == NULL or orig != role[0]:
                    raise errors.InvalidArgumentError(
                        f"{role[0].name.decode()} was repacked for the CPU; leave it out of matmul_weights")
                src[k] = orig
                dst[k] = ggml_dup_tensor(m.device_ctx[slot], orig)
                ggml_set_name(dst[k], orig.name)
                k += 1
        endpoints = [dev.endpoint] if dev.endpoint is not None else None
        m.device_buf[slot] = _alloc_tensors(m.device_ctx[slot], ggml_backend_dev_buffer_type(dev.dev),
                                            GGML_BACKEND_BUFFER_USAGE_WEIGHTS, False, m.rpc_timeout, endpoints)
        if m.device_buf[slot] == NULL:
            raise MemoryError(f"{dev.name} ({dev.description}) could not allocate the weights of "
                              f"{len(layers)} layers{' and the output head' if with_output else ''}")
        job.n = count
        job.src = src
        job.dst = dst
        try:
            _run_guarded(_upload_job, &job, sizeof(job), m.rpc_timeout, f"uploading weights to {dev.description}",
                         endpoints)
        except errors.RPCError:
            src = dst = NULL  # an upload given up on may still read them: left allocated
            raise
        k = 0
        for il in layers:  # the same walk: point each role at its copy
            for ir in range(len(LAYER_ROLES)):
                role = _role_slot(&m.layers[il], ir)
                if role[0] != NULL:
                    role[0] = dst[k]
                    k += 1
        if with_output:
            for ir in range(2):
                if output_roles[ir][0] != NULL:
                    output_roles[ir][0] = dst[k]  # a tied head: m.tok_embd still points at the CPU's table
                    k += 1
        _log.debug("placed %s%s on %s (%s): %d tensors, %d bytes",
                   f"layers {min(layers)}..{max(layers)}" if layers else "no layers",
                   " and the output head" if with_output else "", dev.name,
                   dev.description, count, ggml_backend_buffer_get_size(m.device_buf[slot]))
    finally:
        free(src)
        free(dst)


cdef void _release_device_weights(Model m) noexcept:
    cdef _FreeJob job
    cdef int i
    if m.n_device_bufs:
        memset(&job, 0, sizeof(job))
        job.n_buffers = m.n_device_bufs
        job.buffers = m.device_buf
        _free_guarded(&job, m.rpc_timeout, m.rpc_endpoints)
        for i in range(m.n_device_bufs):
            m.device_buf[i] = NULL
            if m.device_ctx[i] != NULL and not _rpc_unsafe(m.rpc_endpoints):
                ggml_free(m.device_ctx[i])  # else a call given up on may still use its tensors
            m.device_ctx[i] = NULL
        m.n_device_bufs = 0
