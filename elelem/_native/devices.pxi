# Devices: where a model's layers run and their weights and KV cache live.
# Included into core.pyx after cpu_backend.pxi.
#
# A Device wraps a ggml_backend_dev_t: the local CPU, one device of an RPC
# server (rpc.pxi), or a GPU of a backend module (CUDA, Vulkan, Metal) loaded
# at run time by load_gpu_module.  The layer split (elelem/api/devices.py,
# elelem/api/offload.py) hands Context and Model a list of devices and, per
# layer, which one runs it: the same per-layer placement serves RPC servers
# and GPUs (n_gpu_layers, main_gpu, tensor_split).

DEVICE_KINDS = {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
                GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel"}


cdef class Device:
    cdef ggml_backend_dev_t dev
    cdef readonly str name           # ggml's name: "CPU", "RPC0", ...
    cdef readonly str description    # an RPC device's is its server's endpoint
    cdef readonly object endpoint    # "host:port" for an RPC server's device, else None

    def __init__(self, *args, **kwargs):
        raise TypeError("Device objects come from elelem._core.cpu_device() and rpc_connect()")

    @property
    def kind(self):
        """"cpu", "rpc", or the kind of a local accelerator ("gpu", ...)."""
        if self.endpoint is not None:
            return "rpc"  # ggml-rpc calls every remote device a GPU, whatever the server runs it on
        return DEVICE_KINDS.get(ggml_backend_dev_kind(self.dev), "other")

    def memory(self):
        """(free, total) bytes, as the device reports them (for an RPC server:
        a round trip; for a CPU device, the host's RAM)."""
        cdef size_t free_bytes = 0, total_bytes = 0
        with nogil:
            ggml_backend_dev_memory(self.dev, &free_bytes, &total_bytes)
        return int(free_bytes), int(total_bytes)

    @property
    def backend(self):
        """The name ggml's backend (module) gives itself: "CPU", "CUDA", "Vulkan", "MTL" (Metal), "RPC"."""
        return ggml_backend_reg_name(ggml_backend_dev_backend_reg(self.dev)).decode()

    @property
    def device_id(self):
        """The PCI bus id ("0000:c1:00.0") when the backend knows it, else None: the same
        card seen through two backends (CUDA and Vulkan) has the same id."""
        cdef ggml_backend_dev_props props
        memset(&props, 0, sizeof(props))
        ggml_backend_dev_get_props(self.dev, &props)
        return props.device_id.decode() if props.device_id != NULL else None

    @property
    def buffer_type(self):
        return ggml_backend_buft_name(ggml_backend_dev_buffer_type(self.dev)).decode()

    def __eq__(self, other):
        return isinstance(other, Device) and (<Device> other).dev == self.dev

    def __hash__(self):
        return hash(<uintptr_t> self.dev)

    def __repr__(self):
        return f"Device({self.name!r}, {self.description!r})"


cdef Device _wrap_device(ggml_backend_dev_t dev, endpoint=None):
    cdef Device d = Device.__new__(Device)
    d.dev = dev
    d.name = ggml_backend_dev_name(dev).decode("utf-8", "replace")
    d.description = ggml_backend_dev_description(dev).decode("utf-8", "replace")
    d.endpoint = endpoint
    return d


def cpu_device():
    """The local CPU, which runs every layer no other device takes."""
    return _wrap_device(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU))


def local_devices():
    """Every device of the backends loaded in this process (not RPC servers')."""
    cdef size_t i
    out = []
    for i in range(ggml_backend_dev_count()):
        out.append(_wrap_device(ggml_backend_dev_get(i)))
    return out


import ctypes as _ctypes

# GPU backend modules, each loaded at most once per process (ggml registers a
# module's backend for good): path -> the registry, or None when it failed.
cdef dict _gpu_modules = {}


def load_gpu_module(str path):
    """Load one GPU backend module (libggml-cuda.so, libggml-vulkan.so, libggml-metal.so) with
    ggml_backend_load; returns the number of devices it brings, or raises
    OSError when it cannot be opened (the loader's message: a missing
    libvulkan.so.1 or libcudart) and DeviceError when it opens but its
    backend does not start (no driver, a driver too old, a device list that
    names a device which is not there).  A second call for the same path
    answers from the first one's outcome."""
    cdef bytes bpath = os.fsencode(path)
    cdef const char * cpath = bpath
    cdef ggml_backend_reg_t reg
    if path in _gpu_modules:
        outcome = _gpu_modules[path]
        if isinstance(outcome, BaseException):
            raise outcome
        return ggml_backend_reg_dev_count(<ggml_backend_reg_t> <uintptr_t> outcome)
    try:
        # dlopen first, through ctypes, for the loader's own message on failure
        # (ggml_backend_load only logs it); the module stays mapped either way.
        _ctypes.CDLL(path, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as error:
        _gpu_modules[path] = error
        raise
    with nogil:
        reg = ggml_backend_load(cpath)
    if reg == NULL:
        error = errors.DeviceError(f"{os.path.basename(path)} loaded, but its backend did not start")
        _gpu_modules[path] = error
        raise error
    _gpu_modules[path] = <uintptr_t> reg
    return ggml_backend_reg_dev_count(reg)


def flash_attn_supported(Device dev, int head_dim_k, int head_dim_v, int n_head, int n_head_kv, str type_k,
                         str type_v, int n_tokens=1, int n_kv=256):
    """Whether ``dev`` runs ggml_flash_attn_ext for these heads and these K and V
    types (llama.cpp's flash_attn auto asks the same of the device that holds
    each layer's cache).  Asked of a graph node built in a metadata-only context."""
    for name in (type_k, type_v):
        if name not in KV_TYPES:
            raise errors.InvalidArgumentError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {name!r}")
    cdef ggml_type tk = KV_TYPES[type_k], tv = KV_TYPES[type_v]
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * 8
    p.mem_buffer = NULL
    p.no_alloc = True
    cdef ggml_context * ctx = ggml_init(p)
    if ctx == NULL:
        raise MemoryError()
    cdef ggml_tensor * q
    cdef ggml_tensor * k
    cdef ggml_tensor * v
    cdef ggml_tensor * mask
    cdef ggml_tensor * out
    try:
        q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, head_dim_k, n_tokens, n_head, 1)
        k = ggml_new_tensor_4d(ctx, tk, head_dim_k, n_kv, n_head_kv, 1)
        v = ggml_new_tensor_4d(ctx, tv, head_dim_v, n_kv, n_head_kv, 1)
        mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n_tokens, 1, 1)  # as graph/blocks.pxi makes it
        out = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0, 0.0, 0.0)
        return bool(ggml_backend_dev_supports_op(dev.dev, out))
    finally:
        ggml_free(ctx)
