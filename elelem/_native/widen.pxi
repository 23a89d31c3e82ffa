# Widening Q5_0 matmul weights to Q8_0 at load, a lossless change of layout.
# Included into core.pyx after model.pxi.
#
# Why: on x86, a mul_mat of two or more columns (a prompt chunk, a verify
# step of drafted tokens, several streams batched) goes through llamafile's
# tinyBLAS, which tiles 4 weight rows by 2 columns on AVX2 and so decodes each
# Q5_0 block again for every 2 columns.  Decoding the 5-bit values is most of
# its time.  A Q5_0 value is an integer in [-16, 15] times the block's f16
# scale, so the same block as Q8_0 (the scale, then the 32 integers as int8)
# holds exactly the same numbers, and tinyBLAS reads Q8_0 with a plain load.
#
# The arithmetic stays bit for bit what llama.cpp computes on the Q5_0 file:
# for both types, tinyBLAS_Q0_AVX runs the same tiles with the same int8 dot
# products and scale products, and on AVX2 ggml_vec_dot_q5_0_q8_0 and
# ggml_vec_dot_q8_0_q8_0 (one column) are the same loop once the values are
# unpacked.  That identity holds only for those kernels, so the core widens
# only where the CPU backend in use was built with AVX2 (the caller checks),
# and tests/test_widen.py compares the logits bit for bit.
#
# Cost: the copies, 34 bytes a block, on top of the Q5_0 weights (22 bytes a
# block), which one-token steps keep using: there ggml's vec_dot runs, and the
# smaller weight reads faster.  The copies are chosen at load and made when
# they pay (_make_widened): once the prompt steps have evaluated
# Model.widen_after tokens (elelem.cpu.WIDEN_AFTER_PROMPT_TOKENS by default,
# where the faster steps have saved about what making the copies costs; 0,
# at the first prompt, with widen=True).  So opening a model costs what
# llama.cpp's does, and a chat of short prompts never holds the copies.

DEF Q5_0_BLOCK_BYTES = 22    # f16 scale, 32 high bits, 16 bytes of low nibbles
DEF Q8_0_BLOCK_BYTES = 34    # f16 scale, 32 int8 values
DEF BLOCK_VALUES = 32


cdef void _q5_0_to_q8_0(const uint8_t * src, uint8_t * dst, int64_t n_blocks) noexcept nogil:
    """The unpacking of ggml's dequantize_row_q5_0, stopped before the scale."""
    cdef int64_t b
    cdef int j
    cdef uint32_t qh
    cdef const uint8_t * qs
    cdef int8_t * out
    for b in range(n_blocks):
        dst[0] = src[0]  # the f16 scale, unchanged
        dst[1] = src[1]
        qh = (<uint32_t> src[2]) | ((<uint32_t> src[3]) << 8) | ((<uint32_t> src[4]) << 16) | ((<uint32_t> src[5]) << 24)
        qs = src + 6
        out = <int8_t *> (dst + 2)
        for j in range(BLOCK_VALUES // 2):
            out[j] = <int8_t> (((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16)
            out[j + BLOCK_VALUES // 2] = <int8_t> (((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16)
        src += Q5_0_BLOCK_BYTES
        dst += Q8_0_BLOCK_BYTES


cdef void _widen_weights(Model m, list names, tied_from) except *:
    """Give every Q5_0 weight in ``names`` that no buffer type repacked a Q8_0
    copy in a CPU buffer, recorded beside it in m.widened.  The graph keeps
    the Q5_0 weight for one-column matmuls (ggml's vec_dot, where the smaller
    weight reads faster) and takes the copy for wider ones (widened_weight)."""
    cdef ggml_tensor * w
    cdef ggml_tensor * r
    chosen = []
    for name in dict.fromkeys(names):
        # A tied output's repacked copy is named output.weight (_repack_weights).
        repacked_name = TIED_OUTPUT_NAME if name == tied_from else name.encode()
        if _repacked_tensor(m, repacked_name) != NULL:
            continue
        w = _file_tensor(m, name.encode())
        if w != NULL and w.type == GGML_TYPE_Q5_0 and ggml_is_contiguous(w):
            chosen.append(name.encode())
    if not chosen:
        return
    cdef int n = len(chosen)
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * (n + 1)
    p.mem_buffer = NULL
    p.no_alloc = True
    m.widened_ctx = ggml_init(p)
    m.widened.narrow = <ggml_tensor **> calloc(n, sizeof(ggml_tensor *))
    m.widened.wide = <ggml_tensor **> calloc(n, sizeof(ggml_tensor *))
    if m.widened_ctx == NULL or m.widened.narrow == NULL or m.widened.wide == NULL:
        raise MemoryError()
    cdef int i
    for i, name in enumerate(chosen):
        w = _file_tensor(m, name)
        r = ggml_new_tensor(m.widened_ctx, GGML_TYPE_Q8_0, GGML_MAX_DIMS, w.ne)
        ggml_set_name(r, name)
        m.widened.narrow[i] = w
        m.widened.wide[i] = r
    m.widen_pending = n   # made by the first step that uses them (_make_widened)


cdef void _make_widened(Model m) except *:
    """Make the Q8_0 copies chosen at load (once): the graph then uses them."""
    if m.widen_pending == 0:
        return
    cdef int n = m.widen_pending
    cdef int i
    cdef double t0 = _time.perf_counter()
    m.widened_buf = ggml_backend_alloc_ctx_tensors_from_buft(m.widened_ctx, ggml_backend_cpu_buffer_type())
    if m.widened_buf == NULL:
        raise MemoryError("ggml could not allocate the widened (Q8_0) weights")
    ggml_backend_buffer_set_usage(m.widened_buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    for i in range(n):
        with nogil:
            _q5_0_to_q8_0(<const uint8_t *> m.widened.narrow[i].data, <uint8_t *> m.widened.wide[i].data,
                          ggml_nelements(m.widened.narrow[i]) // BLOCK_VALUES)
    m.widen_pending = 0
    m.widened.n = n  # only now: the graph may use the copies
    _log.debug("widened %d Q5_0 weights to Q8_0 for the first step of several tokens (%.1f MiB, %.2f s)",
               n, ggml_backend_buffer_get_size(m.widened_buf) / 1048576.0, _time.perf_counter() - t0)


cdef inline ggml_tensor * widened_weight(const WidenedWeights * widened, ggml_tensor * w,
                                         const ggml_tensor * x) noexcept:
    """The weight to multiply x (n_in, n_columns) by: w's Q8_0 copy when x has
    two or more columns (tinyBLAS tiles them) and w has one, else w."""
    if widened == NULL or widened.n == 0 or w.type != GGML_TYPE_Q5_0 or x.ne[1] < 2:
        return w
    cdef int i
    for i in range(widened.n):
        if widened.narrow[i] == w:
            return widened.wide[i]
    return w


cdef ggml_tensor * _repacked_tensor(Model m, bytes name) noexcept:
    cdef ggml_tensor * t = NULL
    cdef int i
    for i in range(MAX_EXTRA_BUFTS):
        if t == NULL and m.repack_ctx[i] != NULL:
            t = ggml_get_tensor(m.repack_ctx[i], name)
    return t
