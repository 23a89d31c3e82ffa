# Devices: where a model's layers run and their weights and KV cache live.
# Included into core.pyx after cpu_backend.pxi.
#
# A Device wraps a ggml_backend_dev_t: the local CPU, one device of an RPC
# server (rpc.pxi), and later a GPU.  The layer split (elelem/api/devices.py)
# hands Context and Model a list of devices and, per layer, which one runs it:
# the same per-layer placement serves RPC servers today and CUDA devices
# (n_gpu_layers, main_gpu, tensor_split) later.

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
