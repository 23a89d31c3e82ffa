# Multi-section RoPE positions (M-RoPE: Qwen2-VL's text model, llama.cpp's
# LLAMA_ROPE_TYPE_MROPE): four position streams per row -- temporal, height,
# width, and a fourth unused one.  A text token takes its position in the first
# three (llm_graph_input_pos::set_input).  An image's rows, a grid of nx x ny
# merged tokens placed at pos_0, take (pos_0, pos_0 + row, pos_0 + column, 0),
# and the token after the image takes pos_0 + max(nx, ny)
# (mtmd_image_tokens_get_decoder_pos, mtmd_image_tokens_get_n_pos).  So past an
# image the rotary position falls behind the cell's position; each cell keeps
# the rotary position of the token after it (KVCache.cell_rope_next), which
# follows the cell when a prefix is shared, and is dropped with it.
#
# The causal mask needs nothing more: llama.cpp masks an image's rows, which
# share the temporal position, by (row, column) in raster order -- the order of
# their cells, which elelem's mask already follows.


cdef int32_t * mrope_positions(KVCache cache, int n, const int32_t * seqs, const int32_t * positions,
                               const int32_t * cells, int grid_x, int grid_y, int offset) except NULL:
    """The four streams, (4, n) int32 malloc'd (the caller frees), for a step's
    rows; sets each row's cell_rope_next.  ``grid_x`` > 0: the rows are one
    sequence's, rows ``offset`` .. ``offset + n`` of an image of grid_x x grid_y."""
    cdef int32_t * pos = <int32_t *> calloc(4 * <size_t> n, sizeof(int32_t))
    cdef int32_t nxt[MAX_SEQ]
    cdef bint started[MAX_SEQ]
    cdef int i, s, k, span
    cdef int32_t t, pos_0
    if pos == NULL:
        raise MemoryError()
    if grid_x > 0:
        span = grid_x if grid_x > grid_y else grid_y
        pos_0 = cache.rope_next(seqs[0], positions[0])
        if offset > 0:   # the image's first rows came in an earlier step: they left pos_0 + span
            pos_0 -= span
        for i in range(n):
            k = offset + i
            pos[i] = pos_0
            pos[n + i] = pos_0 + k // grid_x
            pos[2 * n + i] = pos_0 + k % grid_x
            cache.cell_rope_next[cells[i]] = pos_0 + span
        return pos
    memset(started, 0, sizeof(started))
    for i in range(n):
        s = seqs[i]
        if not started[s]:
            nxt[s] = cache.rope_next(s, positions[i])
            started[s] = True
        t = nxt[s]
        pos[i] = pos[n + i] = pos[2 * n + i] = t
        cache.cell_rope_next[cells[i]] = t + 1
        nxt[s] = t + 1
    return pos
