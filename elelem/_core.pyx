# cython: language_level=3
"""elelem's native core: the objects that own ggml state.

- ``Model``    the GGUF context and the memory-mapped weights, used in place;
- ``KVCache``  per-layer K and V tensors in a backend buffer;
- ``Session``  a model + a cache + a CPU backend and graph allocator; it builds
               the graph for each step and runs it with the GIL released.

Every class has one construction path (a module-level factory; calling the
class directly raises) and a ``__dealloc__`` that is safe on a partly built
object.  Everything a caller passes in is validated here or in the Python layer
before it reaches ggml: no input may reach a GGML_ASSERT.

The graph builders live in the included ``.pxi`` files: shared blocks in
``_blocks.pxi`` and one short builder per architecture in ``_arch_*.pxi``.
"""
from libc.stdint cimport int32_t, int64_t, uint16_t, uint8_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset
from libc.math cimport INFINITY
from posix.fcntl cimport open as c_open, O_RDONLY
from posix.types cimport off_t
from posix.unistd cimport close as c_close, pread
from posix.stat cimport struct_stat, fstat
from posix.mman cimport mmap, mprotect, munmap, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FAILED

cimport numpy as cnp
import logging
import os
import warnings

import numpy as np

from elelem._ggml cimport *
from elelem import errors

cnp.import_array()

_log = logging.getLogger("elelem")
_ggml_log = logging.getLogger("elelem.ggml")


# --------------------------------------------------------------------------
# ggml's log messages go to the "elelem.ggml" logger, never to stderr.
# Lines can arrive in pieces (GGML_LOG_LEVEL_CONT), so they are joined here.

cdef list _pending_log = []
cdef int _pending_level = logging.INFO

cdef void _ggml_log_callback(ggml_log_level level, const char * text, void * user_data) noexcept with gil:
    global _pending_level
    try:
        if level != GGML_LOG_LEVEL_CONT:
            _pending_level = {GGML_LOG_LEVEL_DEBUG: logging.DEBUG, GGML_LOG_LEVEL_INFO: logging.INFO,
                              GGML_LOG_LEVEL_WARN: logging.WARNING,
                              GGML_LOG_LEVEL_ERROR: logging.ERROR}.get(level, logging.INFO)
        piece = text.decode("utf-8", "replace")
        _pending_log.append(piece)
        if piece.endswith("\n"):
            message = "".join(_pending_log).rstrip("\n")
            _pending_log.clear()
            if message:
                _ggml_log.log(_pending_level, "%s", message)
    except BaseException:
        pass  # a logging failure must never propagate into C

ggml_log_set(_ggml_log_callback, NULL)


# --------------------------------------------------------------------------
# Hyperparameters and weights, as the graph builders see them.

cdef enum ArchId:
    ARCH_QWEN2 = 0
    ARCH_LLAMA = 1
    ARCH_QWEN3 = 2
    ARCH_GEMMA3 = 3

ARCH_IDS = {"qwen2": ARCH_QWEN2, "llama": ARCH_LLAMA, "qwen3": ARCH_QWEN3, "gemma3": ARCH_GEMMA3}

cdef struct HParams:
    int arch
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

# Python-side role names, in the order of LayerWeights' fields.
LAYER_ROLES = ("attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "q_norm", "k_norm",
               "attn_post_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "ffn_post_norm")

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


DEF MAX_EXTRA_BUFTS = 4

# --------------------------------------------------------------------------
# Model: the GGUF context and the weights, memory-mapped and used in place.

cdef class Model:
    cdef gguf_context * gguf            # tensor table and metadata, owned
    cdef ggml_context * weights_ctx     # tensor headers (no data), owned
    cdef void * map_addr                # the whole file, mapped read-only (or read into anonymous memory)
    cdef size_t map_size
    cdef ggml_backend_buffer_t weights_buf   # a CPU buffer over the mapping, no copy
    # Matmul weights that ggml's CPU "extra" buffer types (CPU_REPACK) can lay
    # out for faster kernels are copied into them at load, as llama.cpp does;
    # this also makes elelem's arithmetic, and so its tokens, equal llama.cpp's.
    cdef ggml_context * repack_ctx[MAX_EXTRA_BUFTS]
    cdef ggml_backend_buffer_t repack_buf[MAX_EXTRA_BUFTS]
    cdef readonly int n_repacked
    cdef readonly dict repacked        # buffer type name -> number of weights repacked into it
    cdef HParams hp
    cdef LayerWeights * layers          # n_layer entries, calloc'd
    cdef unsigned char * swa_layers     # n_layer flags: 1 where the layer attends over the window
    cdef ggml_tensor * tok_embd         # (n_embd, n_vocab)
    cdef ggml_tensor * output_norm      # (n_embd)
    cdef ggml_tensor * output           # (n_embd, n_vocab); tok_embd when tied
    cdef ggml_tensor * rope_freqs       # optional (n_rot / 2) frequency factors
    cdef readonly object path
    cdef readonly dict hparams
    cdef readonly str description
    cdef bint closed

    def __cinit__(self):
        self.gguf = NULL
        self.weights_ctx = NULL
        self.map_addr = NULL
        self.map_size = 0
        self.weights_buf = NULL
        self.layers = NULL
        self.swa_layers = NULL
        for i in range(MAX_EXTRA_BUFTS):
            self.repack_ctx[i] = NULL
            self.repack_buf[i] = NULL
        self.n_repacked = 0
        self.repacked = {}
        self.tok_embd = self.output_norm = self.output = self.rope_freqs = NULL
        self.closed = True

    def __init__(self, *args, **kwargs):
        raise TypeError("Model objects are made by elelem._core.open_model()")

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        cdef int i
        for i in range(MAX_EXTRA_BUFTS):
            if self.repack_buf[i] != NULL:
                ggml_backend_buffer_free(self.repack_buf[i])
                self.repack_buf[i] = NULL
            if self.repack_ctx[i] != NULL:
                ggml_free(self.repack_ctx[i])
                self.repack_ctx[i] = NULL
        if self.weights_buf != NULL:
            ggml_backend_buffer_free(self.weights_buf)
            self.weights_buf = NULL
        if self.map_addr != NULL:
            munmap(self.map_addr, self.map_size)
            self.map_addr = NULL
        if self.weights_ctx != NULL:
            ggml_free(self.weights_ctx)
            self.weights_ctx = NULL
        if self.gguf != NULL:
            gguf_free(self.gguf)
            self.gguf = NULL
        if self.layers != NULL:
            free(self.layers)
            self.layers = NULL
        if self.swa_layers != NULL:
            free(self.swa_layers)
            self.swa_layers = NULL
        self.closed = True

    def close(self):
        """Unmap the weights.  Sessions keep their model alive, so close those first."""
        self._release()

    @property
    def is_closed(self):
        return self.closed

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

    cdef ggml_tensor * _tensor(self, name, bint required) except? NULL:
        cdef bytes b = name.encode()
        cdef ggml_tensor * t = NULL
        cdef int i
        for i in range(MAX_EXTRA_BUFTS):
            if t == NULL and self.repack_ctx[i] != NULL:
                t = ggml_get_tensor(self.repack_ctx[i], b)
        if t == NULL:
            t = ggml_get_tensor(self.weights_ctx, b)
        if t == NULL and required:
            raise errors.ModelShapeError(f"required tensor {name!r} is missing from {self.path}")
        return t


def open_model(path, str arch, dict hparams, dict global_tensors, list layer_tensors, str description="",
               list matmul_weights=None, bint repack=True, bint use_mmap=True, amx_types=None):
    """Open ``path`` (already validated by elelem.gguf_reader) for ``arch``.

    ``hparams`` holds the HParams fields by name; ``global_tensors`` maps
    tok_embd/output_norm/output/rope_freqs to a tensor name or None;
    ``layer_tensors`` has one dict per layer mapping a role in LAYER_ROLES to
    a tensor name or None (absent optional tensor).  ``matmul_weights`` names
    the tensors used as the left operand of a mul_mat: with ``repack``, those
    the CPU backend can repack are copied into its repack buffer.  Without
    ``use_mmap`` the file is read into memory instead of mapped.
    ``amx_types`` names the ggml types (``"q4_K"``, ...) allowed into the AMX
    buffer type, where the CPU has one; None allows every type it takes.
    """
    if arch not in ARCH_IDS:
        raise errors.UnsupportedArchitectureError(
            f"no graph builder for {arch!r}; supported: {', '.join(sorted(ARCH_IDS))}")
    cdef Model m = Model.__new__(Model)
    m.path = os.fspath(path)
    m.hparams = dict(hparams)
    m.description = description
    _fill_hparams(&m.hp, hparams)
    m.hp.arch = ARCH_IDS[arch]
    if len(layer_tensors) != m.hp.n_layer:
        raise errors.ModelShapeError(f"{len(layer_tensors)} layer tensor tables for {m.hp.n_layer} layers")

    cdef bytes bpath = os.fsencode(m.path)
    cdef const char * cpath = bpath
    cdef gguf_init_params gparams
    gparams.no_alloc = True
    gparams.ctx = &m.weights_ctx
    with nogil:
        m.gguf = gguf_init_from_file(cpath, gparams)
    if m.gguf == NULL:
        raise errors.GGUFError(f"ggml could not read the GGUF file {m.path}")

    _map_weights(m, bpath, use_mmap)
    if repack and matmul_weights:
        _repack_weights(m, matmul_weights, None if global_tensors.get("output") else global_tensors["tok_embd"],
                        None if amx_types is None else frozenset(amx_types))

    m.tok_embd = m._tensor(global_tensors["tok_embd"], True)
    m.output_norm = m._tensor(global_tensors["output_norm"], True)
    m.output = m._tensor(global_tensors.get("output") or TIED_OUTPUT_NAME.decode(), False)
    if m.output == NULL:
        m.output = m.tok_embd  # tied output, not repacked
    rf = global_tensors.get("rope_freqs")
    m.rope_freqs = m._tensor(rf, False) if rf else NULL

    m.layers = <LayerWeights *> calloc(m.hp.n_layer, sizeof(LayerWeights))
    m.swa_layers = <unsigned char *> calloc(m.hp.n_layer, 1)
    if m.layers == NULL or m.swa_layers == NULL:
        raise MemoryError()
    swa = hparams.get("swa_layers") or [False] * m.hp.n_layer
    if len(swa) != m.hp.n_layer:
        raise errors.ModelShapeError(f"{len(swa)} sliding-window flags for {m.hp.n_layer} layers")
    cdef int il, ir
    for il in range(m.hp.n_layer):
        m.swa_layers[il] = 1 if swa[il] else 0
        table = layer_tensors[il]
        for ir, role in enumerate(LAYER_ROLES):
            name = table.get(role)
            if name is not None:
                _role_slot(&m.layers[il], ir)[0] = m._tensor(name, True)
    m.closed = False
    return m


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
    hp.rope_type = GGML_ROPE_TYPE_NEOX if h["rope_type"] == "neox" else GGML_ROPE_TYPE_NORMAL
    hp.rms_eps = h["rms_eps"]
    hp.rope_base = h["rope_base"]
    hp.rope_base_swa = h.get("rope_base_swa", h["rope_base"])
    hp.rope_scale = h.get("rope_scale", 1.0)
    hp.rope_scale_swa = h.get("rope_scale_swa", hp.rope_scale)
    hp.attn_scale = h["attn_scale"]
    hp.embd_scale = h.get("embd_scale", 1.0)
    hp.n_swa = h.get("n_swa", 0)


cdef void _map_weights(Model m, bytes bpath, bint use_mmap) except *:
    """Map the file (or, without ``use_mmap``, read it into anonymous memory)
    and place every tensor of weights_ctx at its offset in it."""
    cdef int fd = c_open(bpath, O_RDONLY)
    if fd < 0:
        raise errors.ModelNotFoundError(f"cannot open {m.path}")
    cdef struct_stat st
    if fstat(fd, &st) != 0:
        c_close(fd)
        raise OSError(f"cannot stat {m.path}")
    m.map_size = <size_t> st.st_size
    cdef ssize_t got = 0
    if use_mmap:
        m.map_addr = mmap(NULL, m.map_size, PROT_READ, MAP_SHARED, fd, 0)
    else:
        m.map_addr = mmap(NULL, m.map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if m.map_addr != MAP_FAILED:
            with nogil:
                got = _read_fully(fd, <char *> m.map_addr, m.map_size)
    c_close(fd)  # a file mapping keeps the file alive
    if m.map_addr == MAP_FAILED:
        m.map_addr = NULL
        if use_mmap:
            raise OSError(f"cannot memory-map {m.path}")
        raise MemoryError(f"cannot allocate {m.map_size:,} bytes to read {m.path} into")
    if not use_mmap:
        if got < 0:
            raise OSError(f"cannot read {m.path}")
        if got != <ssize_t> m.map_size:
            raise errors.GGUFTruncatedError(
                f"{m.path}: read {got:,} of {m.map_size:,} bytes; the file changed while it was being read",
                field="tensor data", offset=got)
        mprotect(m.map_addr, m.map_size, PROT_READ)  # weights are never written

    m.weights_buf = ggml_backend_cpu_buffer_from_ptr(m.map_addr, m.map_size)
    if m.weights_buf == NULL:
        raise MemoryError("ggml could not wrap the mapped weights in a buffer")
    ggml_backend_buffer_set_usage(m.weights_buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)

    cdef size_t data_offset = gguf_get_data_offset(m.gguf)
    cdef ggml_tensor * t = ggml_get_first_tensor(m.weights_ctx)
    cdef int64_t tid
    cdef size_t start, nbytes
    while t != NULL:
        tid = gguf_find_tensor(m.gguf, t.name)
        start = data_offset + gguf_get_tensor_offset(m.gguf, tid)
        nbytes = ggml_nbytes(t)
        if tid < 0 or start > m.map_size or nbytes > m.map_size - start:
            raise errors.GGUFError(
                f"tensor {t.name.decode(errors='replace')!r}: data at offset {start} + {nbytes} bytes "
                f"runs past the end of the file ({m.map_size} bytes)")
        _check_status(ggml_backend_tensor_alloc(m.weights_buf, t, <char *> m.map_addr + start),
                      "placing a tensor in the mapped weights")
        t = ggml_get_next_tensor(m.weights_ctx, t)


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


cdef bint _repack_supported(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, ggml_tensor * w) except -1:
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
            w = ggml_get_tensor(m.weights_ctx, name.encode())
            if w != NULL and (allowed is None or ggml_type_name(w.type).decode() in allowed) \
                    and _repack_supported(dev, bufts[ib], w):
                chosen.append(name)
        if chosen:
            p.mem_size = ggml_tensor_overhead() * (len(chosen) + 1)
            p.mem_buffer = NULL
            p.no_alloc = True
            m.repack_ctx[ib] = ggml_init(p)
            if m.repack_ctx[ib] == NULL:
                raise MemoryError()
            for name in chosen:
                w = ggml_get_tensor(m.weights_ctx, name.encode())
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
                w = ggml_get_tensor(m.weights_ctx, name.encode())
                new_name = TIED_OUTPUT_NAME if name == tied_from else name.encode()
                r = ggml_get_tensor(m.repack_ctx[ib], new_name)
                with nogil:
                    ggml_backend_tensor_set(r, w.data, 0, ggml_nbytes(w))  # the buffer repacks on write
            m.n_repacked += len(chosen)
            m.repacked[buft_name.decode()] = len(chosen)
            _log.debug("repacked %d weights into %s", len(chosen), buft_name.decode())
            chosen_set = set(chosen)
            pending = [n for n in pending if n not in chosen_set]
        ib += 1


# --------------------------------------------------------------------------
# KVCache: per-layer K and V, [head_dim * n_head_kv, n_ctx] each, in one
# backend buffer.  It owns memory and hands out views; it computes nothing.

cdef class KVCache:
    cdef ggml_context * ctx
    cdef ggml_backend_buffer_t buf
    cdef ggml_tensor ** k       # n_layer entries: (head_dim_k * n_head_kv, n_ctx)
    cdef ggml_tensor ** v       # n_layer entries: (head_dim_v * n_head_kv, n_ctx)
    cdef readonly int n_ctx
    cdef readonly int n_layer
    cdef readonly str type_name

    def __cinit__(self):
        self.ctx = NULL
        self.buf = NULL
        self.k = NULL
        self.v = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("KVCache objects are made by a Session")

    def __dealloc__(self):
        if self.buf != NULL:
            ggml_backend_buffer_free(self.buf)
        if self.ctx != NULL:
            ggml_free(self.ctx)
        free(self.k)
        free(self.v)

    @property
    def nbytes(self):
        return ggml_backend_buffer_get_size(self.buf) if self.buf != NULL else 0


cdef KVCache _new_kv_cache(Model m, int n_ctx, ggml_type type, ggml_backend_t backend):
    cdef KVCache c = KVCache.__new__(KVCache)
    c.n_ctx = n_ctx
    c.n_layer = m.hp.n_layer
    c.type_name = ggml_type_name(type).decode()
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * (2 * m.hp.n_layer + 1)
    p.mem_buffer = NULL
    p.no_alloc = True
    c.ctx = ggml_init(p)
    c.k = <ggml_tensor **> calloc(m.hp.n_layer, sizeof(ggml_tensor *))
    c.v = <ggml_tensor **> calloc(m.hp.n_layer, sizeof(ggml_tensor *))
    if c.ctx == NULL or c.k == NULL or c.v == NULL:
        raise MemoryError()
    cdef int il
    for il in range(m.hp.n_layer):
        c.k[il] = ggml_new_tensor_2d(c.ctx, type, m.hp.head_dim_k * m.hp.n_head_kv, n_ctx)
        c.v[il] = ggml_new_tensor_2d(c.ctx, type, m.hp.head_dim_v * m.hp.n_head_kv, n_ctx)
    c.buf = ggml_backend_alloc_ctx_tensors(c.ctx, backend)
    if c.buf == NULL:
        raise MemoryError(f"cannot allocate a KV cache of {n_ctx} positions")
    # Zero it: flash attention reads whole views, and masked garbage could be NaN.
    ggml_backend_buffer_clear(c.buf, 0)
    return c


# --------------------------------------------------------------------------
# The causal mask, shared by the graph inputs and the property tests.

cdef uint16_t F16_ZERO = 0x0000
cdef uint16_t F16_NEG_INF = 0xFC00

cdef void _fill_mask(void * out, int n_past, int n_tokens, int n_kv, int n_swa, bint f16) noexcept nogil:
    """Row i (query at position n_past + i) may see key j iff j <= n_past + i
    and, with a sliding window, n_past + i - j < n_swa.  Written as float16
    (flash attention wants it) or float32 (softmax, as llama.cpp)."""
    cdef int i, j, pos
    cdef bint hidden
    cdef uint16_t * h = <uint16_t *> out
    cdef float * f = <float *> out
    cdef size_t at
    for i in range(n_tokens):
        pos = n_past + i
        for j in range(n_kv):
            hidden = j > pos or (n_swa > 0 and pos - j >= n_swa)
            at = <size_t> i * n_kv + j
            if f16:
                h[at] = F16_NEG_INF if hidden else F16_ZERO
            else:
                f[at] = -INFINITY if hidden else 0.0


def causal_mask(int n_past, int n_tokens, int n_kv, int n_swa=0):
    """The attention mask for a step, as float32 ``(n_tokens, n_kv)``: 0 or -inf."""
    if n_past < 0 or n_tokens <= 0 or n_kv < n_past + n_tokens or n_swa < 0:
        raise ValueError("need n_past >= 0, n_tokens > 0, n_kv >= n_past + n_tokens, n_swa >= 0")
    out = np.empty((n_tokens, n_kv), dtype=np.float32)
    cdef float[:, ::1] view = out
    _fill_mask(&view[0, 0], n_past, n_tokens, n_kv, n_swa, False)
    return out


# --------------------------------------------------------------------------
# A fast path for elelem.gguf_reader: walking the length-prefixed strings of a
# GGUF string array (300k of them in a Qwen2 vocabulary and merges) in C.

def scan_string_array(const unsigned char[::1] buf, Py_ssize_t pos, Py_ssize_t count, Py_ssize_t max_length):
    """Walk ``count`` strings (u64 little-endian length, then bytes) from ``pos``.

    Returns ``(ends, bad)``: ``ends[i]`` is the offset just past string i, and
    ``bad`` is the index of the first string whose length is over
    ``max_length`` or runs past the buffer (-1 if none; ``ends`` then stops there).
    """
    ends = np.empty(count, dtype=np.int64)
    cdef cnp.int64_t[::1] out = ends
    cdef Py_ssize_t size = buf.shape[0], i, bad = -1
    cdef unsigned long long length
    cdef int k
    with nogil:
        for i in range(count):
            if size - pos < 8:
                bad = i
                break
            length = 0
            for k in range(8):
                length |= (<unsigned long long> buf[pos + k]) << (8 * k)
            if length > <unsigned long long> max_length or length > <unsigned long long> (size - pos - 8):
                bad = i
                break
            pos += 8 + <Py_ssize_t> length
            out[i] = pos
    return (ends, -1) if bad < 0 else (ends[:bad], bad)


include "_blocks.pxi"
include "_arch_qwen2.pxi"
include "_arch_gemma3.pxi"


# --------------------------------------------------------------------------
# Session: one sequence over a model; owns the cache, the backend and the
# graph allocator, and keeps its model alive.

import operator as _operator

# Positions are int32 in ggml; a cache this long fails to allocate long before.
DEF MAX_N_CTX = 2147483647
# ggml's CPU threadpool holds GGML_MAX_N_THREADS (512) workers; more crashes it.
DEF MAX_N_THREADS = 512


cdef object _as_integer(str name, object value):
    """``value`` as a Python int (numpy integers too, bools not), or
    InvalidArgumentError: never Cython's own OverflowError or TypeError from
    an ``int`` argument."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise errors.InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    return _operator.index(value)


cdef int _checked_count(str name, object value, long long upper) except -1:
    """``value`` as an int in [1, upper], or InvalidArgumentError."""
    number = _as_integer(name, value)
    if not 1 <= number <= upper:
        raise errors.InvalidArgumentError(f"{name} must be between 1 and {upper:,}, got {number:,}")
    return number


DEF KV_PAD = 256

cdef inline int _padded_n_kv(int n_used, int n_ctx) noexcept:
    """Attend over a multiple of 256 positions (masking the tail), as llama.cpp
    does: the same n_kv gives the same summation order, so the same tokens,
    and it keeps the graph's shapes fixed across many steps."""
    return min(n_ctx, ((n_used + KV_PAD - 1) // KV_PAD) * KV_PAD)


# Ctrl-C during a step.  Python's SIGINT handler only sets a flag that the
# interpreter checks between bytecodes, so a long prefill would ignore Ctrl-C
# until it finished.  While the main thread computes, a C handler chained in
# front of Python's also sets a flag that ggml's abort callback reads: the step
# stops at the next graph node, and Python still sees its KeyboardInterrupt.
cdef extern from *:
    """
    #include <signal.h>
    #include <string.h>
    static volatile sig_atomic_t elelem_sigint_seen = 0;
    static struct sigaction elelem_prev_sigint;

    static void elelem_on_sigint(int sig) {
        elelem_sigint_seen = 1;
        elelem_prev_sigint.sa_handler(sig);  /* Python's own handler */
    }

    /* Chain in front of the current SIGINT handler if it is a plain function
       (Python's); returns 1 if installed. */
    static int elelem_sigint_watch(void) {
        struct sigaction act;
        elelem_sigint_seen = 0;
        if (sigaction(SIGINT, NULL, &elelem_prev_sigint) != 0) return 0;
        if ((elelem_prev_sigint.sa_flags & SA_SIGINFO) ||
            elelem_prev_sigint.sa_handler == SIG_DFL || elelem_prev_sigint.sa_handler == SIG_IGN) return 0;
        memset(&act, 0, sizeof act);
        act.sa_handler = elelem_on_sigint;
        act.sa_flags = elelem_prev_sigint.sa_flags;
        sigemptyset(&act.sa_mask);
        return sigaction(SIGINT, &act, NULL) == 0;
    }

    static void elelem_sigint_unwatch(void) { sigaction(SIGINT, &elelem_prev_sigint, NULL); }
    """
    int elelem_sigint_seen
    int elelem_sigint_watch() nogil
    void elelem_sigint_unwatch() nogil

from cpython.exc cimport PyErr_CheckSignals
import threading as _threading


cdef cbool _abort_requested(void * data) noexcept nogil:
    return (<volatile int *> data)[0] != 0 or elelem_sigint_seen != 0


include "_cpu_backend.pxi"
_load_cpu_backend()


cdef class Session:
    cdef readonly Model model           # kept alive for as long as the session lives
    cdef readonly KVCache cache
    cdef ggml_backend_t backend
    cdef ggml_gallocr_t galloc
    cdef void * graph_meta              # arena for the graph's metadata
    cdef size_t graph_meta_size
    # The last graph built and allocated, reused while the step's shape
    # (n_tokens, n_kv, all_logits) stays the same: n_kv moves in steps of 256,
    # so decoding rebuilds the graph once every 256 tokens.
    cdef Step graph_step
    cdef bint graph_ready
    cdef size_t graph_size              # max nodes in one step's graph
    cdef readonly int n_ctx
    cdef readonly int n_batch
    cdef readonly int n_threads
    cdef readonly int n_past
    cdef readonly bint flash_attn
    cdef readonly long n_evaluated      # tokens evaluated over the session's life
    cdef volatile int abort_flag
    cdef bint closed

    def __cinit__(self):
        self.backend = NULL
        self.galloc = NULL
        self.graph_meta = NULL
        self.graph_step.ctx = NULL
        self.graph_ready = False
        self.closed = True
        self.abort_flag = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("Session objects are made by elelem._core.new_session()")

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        if self.galloc != NULL:
            ggml_gallocr_free(self.galloc)
            self.galloc = NULL
        if self.backend != NULL:
            ggml_backend_free(self.backend)
            self.backend = NULL
        self._drop_graph()
        if self.graph_meta != NULL:
            free(self.graph_meta)
            self.graph_meta = NULL
        self.cache = None
        self.closed = True

    def close(self):
        self._release()

    @property
    def is_closed(self):
        return self.closed

    @property
    def n_vocab(self):
        return self.model.hp.n_vocab

    cdef inline void _check_open(self) except *:
        if self.closed:
            raise errors.ClosedError("this session is closed")
        self.model._check_open()

    def set_n_threads(self, object n_threads):
        cdef int threads = _checked_count("n_threads", n_threads, MAX_N_THREADS)
        self._check_open()
        self.n_threads = threads
        _cpu_set_n_threads(self.backend, threads)

    def request_abort(self):
        """Ask a running step to stop (from another thread); it raises KeyboardInterrupt."""
        self.abort_flag = 1

    def rewind(self, object n_past):
        """Forget every cached position from ``n_past`` on."""
        self._check_open()
        n_past = _as_integer("the length to rewind to", n_past)
        if n_past < 0 or n_past > self.n_past:
            raise errors.InvalidArgumentError(
                f"can only rewind to a length in [0, {self.n_past}], got {n_past}")
        self.n_past = n_past

    cdef void _drop_graph(self) noexcept:
        if self.graph_step.ctx != NULL:
            ggml_free(self.graph_step.ctx)
            self.graph_step.ctx = NULL
        self.graph_ready = False

    cdef ggml_cgraph * _build(self, Step * st) except NULL:
        cdef ggml_init_params p
        p.mem_size = self.graph_meta_size
        p.mem_buffer = self.graph_meta
        p.no_alloc = True
        st.ctx = ggml_init(p)
        if st.ctx == NULL:
            raise MemoryError()
        st.gf = ggml_new_graph_custom(st.ctx, self.graph_size, False)
        st.hp = &self.model.hp
        _make_inputs(st)
        cdef ggml_tensor * logits
        if self.model.hp.arch in (ARCH_QWEN2, ARCH_LLAMA, ARCH_QWEN3):
            logits = build_qwen2_family(self.model, self.cache, st)
        elif self.model.hp.arch == ARCH_GEMMA3:
            logits = build_gemma3(self.model, self.cache, st)
        else:
            raise errors.UnsupportedArchitectureError("no graph builder for this architecture")
        st.logits = logits
        ggml_set_output(logits)
        ggml_build_forward_expand(st.gf, logits)
        return st.gf

    cdef void _reserve(self) except *:
        """Size the compute buffer from the largest graph this session can run."""
        self._drop_graph()  # the reserve graph reuses the arena
        cdef Step st
        memset(&st, 0, sizeof(Step))
        st.n_tokens = min(self.n_batch, self.n_ctx)
        st.n_past = self.n_ctx - st.n_tokens
        st.n_kv = self.n_ctx
        st.n_ctx = self.n_ctx
        st.all_logits = False
        st.flash_attn = self.flash_attn
        cdef ggml_cgraph * gf = self._build(&st)
        try:
            if not ggml_gallocr_reserve(self.galloc, gf):
                raise MemoryError("ggml could not reserve the compute buffer")
        finally:
            ggml_free(st.ctx)

    def eval(self, tokens, *, bint all_logits=False):
        """Evaluate ``tokens`` at the current position and advance it.

        Returns float32 logits: ``(n_vocab,)`` for the last token, or
        ``(len(tokens), n_vocab)`` with ``all_logits=True``.  A long input is
        evaluated in chunks of ``n_batch``.
        """
        self._check_open()
        cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] ids = self._validated_ids(tokens)
        cdef int n = ids.shape[0]
        cdef int n_vocab = self.model.hp.n_vocab
        if all_logits:
            out = np.empty((n, n_vocab), dtype=np.float32)
        else:
            out = np.empty(n_vocab, dtype=np.float32)
        cdef int start = 0, chunk
        self.abort_flag = 0
        while start < n:
            chunk = min(self.n_batch, n - start)
            self._eval_chunk(ids, start, chunk, all_logits, out)
            start += chunk
        return out

    cdef cnp.ndarray _validated_ids(self, tokens):
        # No dtype forced on the conversion: that would truncate 1.5 to 1.
        ids = np.asarray(tokens)
        if ids.size == 0:
            raise errors.InvalidArgumentError("cannot evaluate an empty list of tokens")
        if ids.ndim != 1:
            raise errors.InvalidTokenError(f"token ids must be a flat sequence, got shape {ids.shape}")
        if ids.dtype.kind not in "iu":
            raise errors.InvalidTokenError(
                f"token ids must be integers in [0, {self.model.hp.n_vocab}), got dtype {ids.dtype}")
        ids = np.ascontiguousarray(ids)
        cdef int n = ids.shape[0]
        if self.n_past + n > self.n_ctx:
            raise errors.ContextLimitError(
                f"{self.n_past} cached + {n} new tokens = {self.n_past + n} exceeds n_ctx={self.n_ctx}")
        lo, hi = ids.min(), ids.max()
        if lo < 0 or hi >= self.model.hp.n_vocab:
            bad = lo if lo < 0 else hi
            raise errors.InvalidTokenError(f"token id {int(bad)} is outside [0, {self.model.hp.n_vocab})")
        return ids.astype(np.int32, copy=False)

    cdef void _eval_chunk(self, cnp.ndarray ids_arr, int start, int n_tokens, bint all_logits,
                          cnp.ndarray out) except *:
        cdef Step * st = &self.graph_step
        cdef int n_kv = _padded_n_kv(self.n_past + n_tokens, self.n_ctx)
        if not (self.graph_ready and st.n_tokens == n_tokens and st.n_kv == n_kv and st.all_logits == all_logits):
            self._drop_graph()
            memset(st, 0, sizeof(Step))
            st.n_tokens = n_tokens
            st.n_kv = n_kv
            st.n_ctx = self.n_ctx
            st.all_logits = all_logits
            st.flash_attn = self.flash_attn
            self._build(st)
            if not ggml_gallocr_alloc_graph(self.galloc, st.gf):
                self._drop_graph()
                raise MemoryError("ggml could not allocate the compute graph")
            self.graph_ready = True
        st.n_past = self.n_past
        cdef ggml_status status
        cdef int watching
        cdef cnp.int32_t[::1] ids = ids_arr
        _set_inputs(st, &ids[start])
        watching = _threading.current_thread() is _threading.main_thread()  # signals reach the main thread
        with nogil:
            if watching:
                watching = elelem_sigint_watch()
            status = ggml_backend_graph_compute(self.backend, st.gf)
            if watching:
                elelem_sigint_unwatch()
        if status == GGML_STATUS_ABORTED:
            PyErr_CheckSignals()  # raises the pending KeyboardInterrupt, if Ctrl-C was the cause
        _check_status(status, "computing a step")
        if all_logits:
            ggml_backend_tensor_get(st.logits, cnp.PyArray_DATA(out) + <size_t> start * self.model.hp.n_vocab * 4,
                                    0, ggml_nbytes(st.logits))
        else:
            ggml_backend_tensor_get(st.logits, cnp.PyArray_DATA(out), 0, ggml_nbytes(st.logits))
        self.n_past += n_tokens
        self.n_evaluated += n_tokens

    @property
    def compute_buffer_size(self):
        return ggml_gallocr_get_buffer_size(self.galloc, 0) if self.galloc != NULL else 0


def new_session(Model model, object n_ctx, object n_batch=512, object n_threads=1, str kv_type="f16",
                bint flash_attn=False):
    """A new sequence over ``model`` with its own KV cache of ``n_ctx`` positions."""
    model._check_open()
    cdef int ctx = _checked_count("n_ctx", n_ctx, MAX_N_CTX)
    cdef int batch = _checked_count("n_batch", n_batch, MAX_N_CTX)
    cdef int threads = _checked_count("n_threads", n_threads, MAX_N_THREADS)
    cdef ggml_type kv
    if kv_type == "f16":
        kv = GGML_TYPE_F16
    elif kv_type == "f32":
        kv = GGML_TYPE_F32
    else:
        raise errors.InvalidArgumentError(f"kv_type must be 'f16' or 'f32', got {kv_type!r}")

    cdef Session s = Session.__new__(Session)
    s.model = model
    s.n_ctx = ctx
    s.n_batch = min(batch, ctx)
    s.n_threads = threads
    s.n_past = 0
    s.flash_attn = flash_attn
    s.backend = _new_cpu_backend(threads, &s.abort_flag)
    s.cache = _new_kv_cache(model, ctx, kv, s.backend)
    # Graph metadata: a generous node budget per layer; the arena is reused by every step.
    s.graph_size = max(<size_t> GGML_DEFAULT_GRAPH_SIZE, <size_t> model.hp.n_layer * 64 + 256)
    s.graph_meta_size = ggml_tensor_overhead() * s.graph_size + ggml_graph_overhead_custom(s.graph_size, False)
    s.graph_meta = malloc(s.graph_meta_size)
    if s.graph_meta == NULL:
        raise MemoryError()
    s.galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(s.backend))
    if s.galloc == NULL:
        raise MemoryError()
    s.closed = False
    s._reserve()
    return s
