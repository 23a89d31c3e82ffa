"""Smoke test of a built libggml-cuda.so through ctypes: the devices ggml
sees, and matrix products on each GPU and on ggml's CPU backend, each checked
against NumPy on the same weights (quantized ones dequantized by ggml).

It needs only NumPy and the ggml libraries elelem ships (elelem/_lib), not
elelem._core, so it runs under any Python 3 (the H200 machine's python3 is
3.12; elelem here is built for 3.11).  scripts/device_check_cuda.sh runs it
there; here, with no GPU, it shows that the CUDA module loads, registers no
device and leaves the CPU backend working.

    python scripts/ggml_cuda_smoke.py LIB_DIR [--require-gpu]

The CUDA runtime libraries the module needs (libcudart.so.13,
libcublas.so.13, libcublasLt.so.13) are opened first by absolute path, from
ELELEM_CUDA_LIB_DIR, the nvidia-* wheels of this Python, or
/usr/local/cuda/lib64; the module's own rpath covers only an elelem installed
in the same site-packages as those wheels.
"""
import argparse
import ctypes
import glob
import os
import sys
import time

import numpy as np

CUDA_SONAMES = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")  # dependency order
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}
# (weight type, rows M, columns K, batch N): N=1 runs ggml's mat-vec kernels
# (MMVQ / MMVF), N=512 its batched ones (MMQ for quants, cuBLAS for floats).
CASES = [("f32", 256, 512, 64), ("f16", 4096, 4096, 1), ("f16", 4096, 4096, 512),
         ("q4_0", 4096, 4096, 1), ("q4_0", 4096, 4096, 512), ("q8_0", 4096, 4096, 1), ("q8_0", 4096, 4096, 512)]


class GgmlInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class TypeTraits(ctypes.Structure):  # struct ggml_type_traits, ggml.h
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool),
                ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
                ("from_float_ref", ctypes.c_void_p)]


class Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def cuda_lib_dirs():
    dirs = [os.environ["ELELEM_CUDA_LIB_DIR"]] if os.environ.get("ELELEM_CUDA_LIB_DIR") else []
    try:
        import nvidia  # the namespace package of NVIDIA's wheels (nvidia-cuda-runtime, nvidia-cublas)
        dirs += [os.path.join(p, "cu13", "lib") for p in nvidia.__path__]
    except ImportError:
        pass
    return dirs + ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]


def preload_cuda_runtime():
    """Open cudart and cuBLAS globally, so that the module's DT_NEEDED sonames resolve to them."""
    found = {}
    for soname in CUDA_SONAMES:
        for d in cuda_lib_dirs():
            path = os.path.join(d, soname)
            if os.path.exists(path):
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                found[soname] = os.path.realpath(path)
                break
    return found


def bind(lib, name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


class Ggml:
    def __init__(self, lib_dir):
        vp, sz, i64, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_char_p
        base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so.0"), mode=ctypes.RTLD_GLOBAL)
        core = ctypes.CDLL(os.path.join(lib_dir, "libggml.so.0"), mode=ctypes.RTLD_GLOBAL)
        self.load = bind(core, "ggml_backend_load", vp, cp)
        self.reg_name = bind(base, "ggml_backend_reg_name", cp, vp)
        self.reg_dev_count = bind(base, "ggml_backend_reg_dev_count", sz, vp)
        self.reg_proc = bind(base, "ggml_backend_reg_get_proc_address", vp, vp, cp)
        self.dev_count = bind(core, "ggml_backend_dev_count", sz)
        self.dev_get = bind(core, "ggml_backend_dev_get", vp, sz)
        self.dev_name = bind(base, "ggml_backend_dev_name", cp, vp)
        self.dev_description = bind(base, "ggml_backend_dev_description", cp, vp)
        self.dev_type = bind(base, "ggml_backend_dev_type", ctypes.c_int, vp)
        self.dev_memory = bind(base, "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
        self.dev_init = bind(base, "ggml_backend_dev_init", vp, vp, cp)
        self.backend_free = bind(base, "ggml_backend_free", None, vp)
        self.synchronize = bind(base, "ggml_backend_synchronize", None, vp)
        self.init = bind(base, "ggml_init", vp, GgmlInitParams)
        self.free = bind(base, "ggml_free", None, vp)
        self.tensor_overhead = bind(base, "ggml_tensor_overhead", sz)
        self.graph_overhead = bind(base, "ggml_graph_overhead", sz)
        self.new_tensor_2d = bind(base, "ggml_new_tensor_2d", vp, vp, ctypes.c_int, i64, i64)
        self.mul_mat = bind(base, "ggml_mul_mat", vp, vp, vp, vp)
        self.new_graph = bind(base, "ggml_new_graph", vp, vp)
        self.build_forward = bind(base, "ggml_build_forward_expand", None, vp, vp)
        self.nbytes = bind(base, "ggml_nbytes", sz, vp)
        self.alloc_ctx_tensors = bind(base, "ggml_backend_alloc_ctx_tensors", vp, vp, vp)
        self.buffer_free = bind(base, "ggml_backend_buffer_free", None, vp)
        self.tensor_set = bind(base, "ggml_backend_tensor_set", None, vp, vp, sz, sz)
        self.tensor_get = bind(base, "ggml_backend_tensor_get", None, vp, vp, sz, sz)
        self.graph_compute = bind(base, "ggml_backend_graph_compute", ctypes.c_int, vp, vp)
        self.quantize_chunk = bind(base, "ggml_quantize_chunk", sz, ctypes.c_int, vp, vp, i64, i64, i64, vp)
        self.type_traits = bind(base, "ggml_get_type_traits", ctypes.POINTER(TypeTraits), ctypes.c_int)

    def features(self, reg):
        fn = self.reg_proc(reg, b"ggml_backend_get_features")
        if not fn:
            return []
        f = ctypes.CFUNCTYPE(ctypes.POINTER(Feature), ctypes.c_void_p)(fn)(reg)
        out, i = [], 0
        while f and f[i].name:
            out.append((f[i].name.decode(), f[i].value.decode()))
            i += 1
        return out

    def devices(self):
        out = []
        for i in range(self.dev_count()):
            dev = self.dev_get(i)
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            self.dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            out.append(dict(dev=dev, name=self.dev_name(dev).decode(), description=self.dev_description(dev).decode(),
                            type=DEVICE_TYPES.get(self.dev_type(dev), "?"), free=free.value, total=total.value))
        return out


def weight_bytes(g, wtype, weights):
    """The weights in ggml's layout for wtype (quantized by ggml itself)."""
    if wtype == "f32":
        return np.ascontiguousarray(weights, dtype=np.float32).tobytes()
    if wtype == "f16":
        return np.ascontiguousarray(weights, dtype=np.float16).tobytes()
    m, k = weights.shape
    src = np.ascontiguousarray(weights, dtype=np.float32)
    dst = ctypes.create_string_buffer(src.nbytes)  # any quant is smaller than f32
    n = g.quantize_chunk(GGML_TYPES[wtype], src.ctypes.data, dst, 0, m, k, None)
    return dst.raw[:n]


def reference(g, wtype, weights, x):
    """x @ W.T in float64, W being what the backend holds: f16-rounded, or ggml's own dequantization."""
    if wtype == "f32":
        w = weights
    elif wtype == "f16":
        w = weights.astype(np.float16).astype(np.float32)
    else:
        q = weight_bytes(g, wtype, weights)
        w = np.empty(weights.size, dtype=np.float32)
        g.type_traits(GGML_TYPES[wtype]).contents.to_float(q, w.ctypes.data, w.size)
        w = w.reshape(weights.shape)
    return x.astype(np.float64) @ w.astype(np.float64).T


def mul_mat(g, backend, wtype, weights, x, repeat=1):
    """ggml_mul_mat(W, x) on one backend: returns (x @ W.T, seconds per product)."""
    m, k = weights.shape
    n = x.shape[0]
    ctx = g.init(GgmlInitParams(3 * g.tensor_overhead() + g.graph_overhead(), None, True))
    w_t = g.new_tensor_2d(ctx, GGML_TYPES[wtype], k, m)
    x_t = g.new_tensor_2d(ctx, GGML_TYPES["f32"], k, n)
    y_t = g.mul_mat(ctx, w_t, x_t)
    graph = g.new_graph(ctx)
    g.build_forward(graph, y_t)
    buf = g.alloc_ctx_tensors(ctx, backend)
    try:
        wb = weight_bytes(g, wtype, weights)
        assert len(wb) == g.nbytes(w_t), (wtype, len(wb), g.nbytes(w_t))
        g.tensor_set(w_t, wb, 0, len(wb))
        xb = np.ascontiguousarray(x, dtype=np.float32)
        g.tensor_set(x_t, xb.ctypes.data, 0, xb.nbytes)
        status = g.graph_compute(backend, graph)  # warm-up; also the checked result
        if status != 0:
            raise RuntimeError(f"ggml_backend_graph_compute returned {status}")
        t0 = time.perf_counter()
        for _ in range(repeat - 1):
            g.graph_compute(backend, graph)
        g.synchronize(backend)
        seconds = (time.perf_counter() - t0) / max(repeat - 1, 1)
        y = np.empty((n, m), dtype=np.float32)
        g.tensor_get(y_t, y.ctypes.data, 0, y.nbytes)
        return y, seconds
    finally:
        g.buffer_free(buf)
        g.free(ctx)


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lib_dir", help="the folder with libggml-base.so.0, libggml.so.0, libggml-cpu*.so, libggml-cuda.so")
    ap.add_argument("--require-gpu", action="store_true", help="fail unless ggml sees a GPU")
    args = ap.parse_args()
    lib_dir = os.path.abspath(args.lib_dir)

    found = preload_cuda_runtime()
    for soname in CUDA_SONAMES:
        print(f"runtime  {soname:20s} {found.get(soname, 'NOT FOUND')}")
    g = Ggml(lib_dir)
    cpu_modules = sorted(glob.glob(os.path.join(lib_dir, "libggml-cpu*.so")))
    cpu_reg = None
    for path in cpu_modules:  # the first that opens; the native build ships one
        cpu_reg = g.load(path.encode())
        if cpu_reg:
            break
    cuda_reg = g.load(os.path.join(lib_dir, "libggml-cuda.so").encode())
    print(f"modules  cpu: {'loaded' if cpu_reg else 'FAILED'}  cuda: {'loaded' if cuda_reg else 'FAILED to load'}")
    if cuda_reg:
        print(f"cuda reg {g.reg_name(cuda_reg).decode()}: {g.reg_dev_count(cuda_reg)} device(s); features "
              + ", ".join(f"{k}={v}" for k, v in g.features(cuda_reg)))
    devices = g.devices()
    for d in devices:
        print(f"device   {d['name']:8s} {d['type']:5s} {d['description']}  "
              f"{d['free'] / 2**30:.1f} GiB free of {d['total'] / 2**30:.1f} GiB")
    gpus = [d for d in devices if d["type"] == "GPU"]
    failures = 0
    cpu = next((d for d in devices if d["type"] == "CPU"), None)
    if cpu is None:  # the CPU module refused this CPU: the GPU is still checked
        print("FAIL: no CPU device: the CPU module did not load")
        failures += 1

    rng = np.random.default_rng(0)
    backends = [(d["name"], g.dev_init(d["dev"], None)) for d in ([cpu] if cpu else []) + gpus]
    try:
        for wtype, m, k, n in CASES:
            weights = rng.standard_normal((m, k)).astype(np.float32)
            x = rng.standard_normal((n, k)).astype(np.float32)
            ref = reference(g, wtype, weights, x)
            for name, backend in backends:
                is_gpu = name != cpu["name"] if cpu else True
                y, seconds = mul_mat(g, backend, wtype, weights, x, repeat=20 if is_gpu else 1)
                err = rel_err(y, ref)
                # The backends round the activations (to f16 for f16 weights, to q8_0/q8_1
                # blocks for quantized ones): ~1e-3 here; a wrong kernel is off by O(1).
                ok = err < 2e-2
                failures += not ok
                line = f"matmul   {name:5s} {wtype:5s} M={m} K={k} N={n}: max rel err vs NumPy {err:.1e} {'ok' if ok else 'FAIL'}"
                if is_gpu:
                    gbps = len(weight_bytes(g, wtype, weights)) / seconds / 1e9
                    line += (f"  {seconds * 1e6:8.1f} us ({2 * m * k * n / seconds / 1e12:.2f} TFLOP/s, "
                             f"weights {gbps:.0f} GB/s)")
                print(line)
    finally:
        for _, backend in backends:
            g.backend_free(backend)

    if args.require_gpu and not gpus:
        print("FAIL: ggml sees no GPU")
        failures += 1
    print("RESULT", "ok" if failures == 0 else f"{failures} failure(s)",
          f"({len(gpus)} GPU(s); {'' if cuda_reg else 'no '}CUDA module)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
