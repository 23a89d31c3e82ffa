# One sequence's K and V as bytes, and back: saved states and the prompt
# cache.  Included into core.pyx after kv_cache.pxi.
#
# A state of n positions is laid out layer after layer: K as n rows, one per
# position in position order; then V, as n rows too when V is stored per cell
# (flash attention), else -- V stored transposed -- each channel's n values
# in turn; with V a view of K (multi-head latent attention), no V.  So a
# state is n * bytes_per_cell bytes, and its first m positions can be loaded
# alone.  The bytes are those of the cache's own types and layout: callers
# key a state by everything that shapes them (the model, the K/V types,
# flash attention); here only the sizes are checked.


cdef void _copy_runs(ggml_tensor * t, char * data, size_t base, const int32_t * cell_of, int n, size_t unit,
                     bint write) noexcept:
    """Copy ``unit`` bytes for each of n positions between ``data`` (packed in
    position order) and ``t`` at ``base + cell * unit``: one copy per run of
    consecutive cells, which a sequence evaluated alone fills."""
    cdef int p = 0, q
    while p < n:
        q = p + 1
        while q < n and cell_of[q] == cell_of[q - 1] + 1:
            q += 1
        if write:
            ggml_backend_tensor_set(t, data + <size_t> p * unit, base + <size_t> cell_of[p] * unit,
                                    <size_t> (q - p) * unit)
        else:
            ggml_backend_tensor_get(t, data + <size_t> p * unit, base + <size_t> cell_of[p] * unit,
                                    <size_t> (q - p) * unit)
        p = q


cdef void _state_io(KVCache c, const int32_t * cell_of, int m, int stored, char * data, bint write) noexcept:
    """Copy positions 0..m-1 between the cells ``cell_of`` and a state of
    ``stored`` positions (m <= stored) at ``data``."""
    cdef size_t at = 0, row, el
    cdef int il
    cdef int64_t ch
    cdef ggml_tensor * v
    for il in range(c.n_layer):
        if not c.owns_kv(il):   # reads an earlier layer's K and V, saved with that layer
            continue
        row = c.k[il].nb[1]
        _copy_runs(c.k[il], data + at, 0, cell_of, m, row, write)
        at += <size_t> stored * row
        v = c.v[il]
        if c.v_in_k:   # V is K's (multi-head latent attention): saved with it
            continue
        if not c.v_trans:
            row = v.nb[1]
            _copy_runs(v, data + at, 0, cell_of, m, row, write)
            at += <size_t> stored * row
        else:
            el = ggml_element_size(v)
            for ch in range(v.ne[0]):
                _copy_runs(v, data + at, <size_t> ch * c.kv_size * el, cell_of, m, el, write)
                at += <size_t> stored * el
    cdef int32_t * rope_next = <int32_t *> (data + at)
    cdef int p
    if c.mrope:   # each position's next rotary position, after the layers (graph/mrope.pxi)
        for p in range(m):
            if write:
                c.cell_rope_next[cell_of[p]] = rope_next[p]
            else:
                rope_next[p] = c.cell_rope_next[cell_of[p]]


cdef object _read_seq_state(KVCache c, int s, int n):
    """Sequence ``s``'s first n positions, as a uint8 array."""
    cdef size_t size = <size_t> n * c.bytes_per_cell
    out = np.empty(size, dtype=np.uint8)
    if n == 0:
        return out
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] cell_of = np.empty(n, dtype=np.int32)
    cdef uint64_t bit = (<uint64_t> 1) << s
    cdef int i
    for i in range(c.used_end):
        if (c.cell_seqs[i] & bit) and c.cell_pos[i] < n:
            cell_of[c.cell_pos[i]] = i
    _state_io(c, &cell_of[0], n, n, <char *> cnp.PyArray_DATA(out), False)
    return out


cdef int _load_seq_state(KVCache c, int s, cnp.ndarray ids, const unsigned char[::1] state, int stored) except -1:
    """Give empty sequence ``s`` the first ``len(ids)`` positions of a state of
    ``stored`` positions; ``ids`` are the tokens they hold.  A cache too full
    for them raises KVCacheFullError and is left as it was."""
    cdef int m = ids.shape[0]
    if c.seq_length[s] != 0:
        raise errors.InvalidArgumentError(f"can only load a state into an empty sequence (sequence {s} "
                                          f"holds {c.seq_length[s]} positions)")
    if not 0 <= m <= stored:
        raise errors.InvalidArgumentError(f"a state of {stored} positions cannot give {m} of them")
    cdef size_t expected = <size_t> stored * c.bytes_per_cell
    if <size_t> state.shape[0] != expected:
        raise errors.InvalidArgumentError(
            f"a state of {stored} positions is {expected:,} bytes for this cache, got {state.shape[0]:,}")
    if m == 0:
        return 0
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] tokens = ids
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] seqs = np.full(m, s, dtype=np.int32)
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] cells = np.empty(m, dtype=np.int32)
    cdef cnp.ndarray[cnp.int32_t, ndim=1, mode="c"] positions = np.empty(m, dtype=np.int32)
    c.place(m, &tokens[0], &seqs[0], &cells[0], &positions[0])
    _state_io(c, &cells[0], m, stored, <char *> &state[0], True)
    return 0
