# KVCache: the one place KV state lives.  Included into core.pyx.
#
# ``kv_size`` cells, each holding one position's K and V for every layer.  A
# cell records its position, the token it holds and the set of sequences that
# see it (a bitmask: a forked prefix is stored once and seen by several
# sequences, as in llama.cpp's llama_kv_cells).  The cache hands out cells for
# a batch, writes the batch's K and V into them (index inputs for set_rows),
# builds the attention masks from the cells, and trims and forks sequences.
# It computes nothing itself.
#
# Layers may differ in their K and V widths (Gemma 4's sliding-window and
# global layers), and a layer may attend over an earlier layer's K and V
# instead of storing its own (Gemma 4's shared K/V, llama.cpp's
# n_layer_kv_from_start): such a layer gets no tensors of its own, its k[il]
# and v[il] are its source's, and only the layers that own their K and V are
# allocated, saved and counted.  Transposed V (no flash attention) is as wide
# in every layer as in the widest (llama.cpp's TAG_V_CACHE_VARIABLE), so that
# one index input writes every layer's.
#
# Multi-head latent attention (kv_lora_rank > 0) caches a latent per token
# and V is that latent: each cell's K row holds the latent then the RoPE
# part, and V is a view of K's first kv_lora_rank values (llama.cpp's
# deepseek2: build_attn over llm_graph_input_attn_k, V viewed from K), so
# nothing is stored twice.  Such a cache has no V of its own (v_in_k): v[il]
# is the view, v_row is 0 and a state holds K alone.
#
# Positions of one sequence are always 0 .. length-1 with no gaps: a batch
# appends to its sequences, trimming drops a tail, and a fork copies a prefix.

from libc.stdint cimport uint64_t

DEF MAX_SEQ = 64           # sequences are bits of a uint64 mask
DEF KV_PAD = 256
# Cells are placed so that a sequence's cell index is its position modulo
# this (see KVCache.place): flash attention's KV tile (GGML_FA_TILE_KV), a
# multiple of every SIMD step of ggml's softmax and dot products.
DEF CELL_ALIGN = 64


DEF MAX_KV_BUFFERS = 8      # one per device that runs layers (Context's MAX_BACKENDS)


cdef class KVCache:
    # Each layer's K and V live in the buffer of the device that runs the
    # layer: one ggml context and buffer per device, in the order first met.
    cdef ggml_context * ctxs[2 * MAX_KV_BUFFERS]   # K and V per device, then the recurrent store's
    cdef ggml_backend_buffer_t bufs[2 * MAX_KV_BUFFERS]
    cdef int n_bufs
    cdef bint leak_buffers      # their server was lost: freeing them would wait on it forever,
                                # and a call given up on may still use their tensors
    cdef ggml_tensor ** k       # n_layer entries: (head_dim_k * n_head_kv, kv_size)
    cdef ggml_tensor ** v       # n_layer entries: (head_dim_v * n_head_kv, kv_size); transposed without flash attention
    cdef LayerShape * shapes    # n_layer entries: each layer's geometry (the model's, copied)
    cdef readonly int n_layer_kv  # layers that own their K and V
    cdef readonly int v_row     # transposed V's row: the widest layer's head_dim_v * n_head_kv
    cdef int32_t * cell_pos     # kv_size: the position a cell holds, -1 when free
    cdef int32_t * cell_token   # kv_size: the token id at that position
    cdef int32_t * cell_rope_next  # kv_size: M-RoPE models: the rotary position the token after the cell takes
    cdef readonly bint mrope    # the model's RoPE is multi-section (M-RoPE): a saved state keeps cell_rope_next
    cdef uint64_t * cell_seqs   # kv_size: bit s set when sequence s sees the cell
    cdef int32_t * seq_length   # MAX_SEQ: positions held by each sequence
    cdef readonly int kv_size
    cdef readonly int n_layer
    cdef readonly int n_seq_max
    cdef readonly int n_used    # cells seen by at least one sequence
    cdef int used_end           # one past the highest used cell
    cdef readonly str type_k    # ggml type names: f16, f32, q8_0, q4_0
    cdef readonly str type_v
    cdef readonly bint v_trans  # V stored transposed (no flash attention): see attention in graph/blocks.pxi
    cdef readonly bint v_in_k   # V is a view of K's rows (multi-head latent attention): no V stored
    # The recurrent state of a hybrid model's recurrent layers (NULL for
    # attention layers, and all NULL for other models): per layer, a
    # convolution's last inputs (Gated DeltaNet's d_conv - 1 of its Q/K/V
    # channels; LFM2's l_cache - 1 of B*x) and, for Gated DeltaNet, its state
    # matrix, of each sequence, in two slots a sequence: a step reads its
    # sequences' current slots and writes the other ones, which become current
    # only when the step succeeds -- so a failed or aborted step leaves every
    # state as it was, as it leaves the cells.
    cdef ggml_tensor ** r       # n_layer entries: F32 (n_embd_r, 2 * n_seq_max)
    cdef ggml_tensor ** s       # n_layer entries: F32 (n_embd_s, 2 * n_seq_max); NULL where a layer has
                                # a convolution state only (LFM2)
    cdef int32_t * rs_slot      # MAX_SEQ: each sequence's current slot, s or s + n_seq_max
    # The store's buffers are not cleared when made (only the K/V ones are):
    # a slot's pages are touched when its sequence first steps, so the memory
    # in use grows with the sequences used, not with n_seq_max (16 by default,
    # two slots each: 1.6 GB of Qwen3.5-4B states, if zeroed up front).  Bit q:
    # sequence q's current slot holds its state (zeros at the least).
    cdef uint64_t rs_ready
    cdef int n_kv_bufs          # bufs[:n_kv_bufs] hold K and V (cleared), the rest the recurrent store
    cdef readonly bint hybrid
    cdef readonly size_t state_bytes   # one sequence's recurrent state, over every layer

    def __cinit__(self):
        self.n_bufs = 0
        self.leak_buffers = False
        self.k = NULL
        self.v = NULL
        self.shapes = NULL
        self.cell_pos = NULL
        self.cell_token = NULL
        self.cell_rope_next = NULL
        self.cell_seqs = NULL
        self.seq_length = NULL
        self.r = NULL
        self.s = NULL
        self.rs_slot = NULL
        self.hybrid = False
        self.state_bytes = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("KVCache objects are made by a Context")

    def __dealloc__(self):
        cdef int i
        if not self.leak_buffers:
            with nogil:   # a long context's cells are gigabytes, freed beside other models' requests
                for i in range(self.n_bufs):
                    _free_buffer(self.bufs[i])
                    if self.ctxs[i] != NULL:
                        ggml_free(self.ctxs[i])
        free(self.k)
        free(self.v)
        free(self.shapes)
        free(self.cell_pos)
        free(self.cell_token)
        free(self.cell_rope_next)
        free(self.cell_seqs)
        free(self.seq_length)
        free(self.r)
        free(self.s)
        free(self.rs_slot)

    @property
    def bytes_per_cell(self):
        """K and V of one position, over every layer that stores its own (and, with
        M-RoPE, the rotary position of the token after it: graph/mrope.pxi)."""
        cdef size_t total = sizeof(int32_t) if self.mrope else 0
        cdef int il
        for il in range(self.n_layer):
            if self.shapes[il].kv_source == il:
                total += self.k[il].nb[1] + (0 if self.v_in_k else ggml_row_size(self.v[il].type, self.v[il].ne[0]))
        return total

    def layer_buffer_types(self):
        """The buffer type holding each layer's K ("CPU", "Vulkan0", ...; None for a
        layer without K/V of its own, or a recurrent one)."""
        cdef int il
        out = []
        for il in range(self.n_layer):
            if self.k == NULL or self.k[il] == NULL or self.k[il].buffer == NULL:
                out.append(None)
            else:
                out.append(ggml_backend_buft_name(ggml_backend_buffer_get_type(self.k[il].buffer)).decode())
        return out

    cdef inline bint owns_kv(self, int il) noexcept:
        return self.shapes[il].kv_source == il

    @property
    def nbytes(self):
        cdef size_t total = 0
        cdef int i
        for i in range(self.n_bufs):
            if self.bufs[i] != NULL:
                total += ggml_backend_buffer_get_size(self.bufs[i])
        return total

    # -- sequences -------------------------------------------------------------

    cdef int _check_seq(self, object seq) except -1:
        s = _as_integer("a sequence id", seq)
        if not 0 <= s < self.n_seq_max:
            raise errors.InvalidArgumentError(f"sequence id must be in [0, {self.n_seq_max}), got {s}")
        return s

    def seq_length_of(self, seq):
        """How many positions sequence ``seq`` holds (its next position)."""
        return self.seq_length[self._check_seq(seq)]

    def seq_tokens(self, seq):
        """The tokens sequence ``seq`` holds, in position order."""
        cdef int s = self._check_seq(seq)
        cdef uint64_t bit = (<uint64_t> 1) << s
        out = np.empty(self.seq_length[s], dtype=np.int32)
        cdef int32_t[::1] view = out
        cdef int i
        for i in range(self.used_end):
            if self.cell_seqs[i] & bit:
                view[self.cell_pos[i]] = self.cell_token[i]
        return out.tolist()

    def seq_rm(self, seq, p0=0):
        """Drop sequence ``seq``'s positions from ``p0`` on (trim, rewind or clear)."""
        cdef int s = self._check_seq(seq)
        start = _as_integer("the position to trim from", p0)
        if not 0 <= start <= self.seq_length[s]:
            raise errors.InvalidArgumentError(
                f"can only trim sequence {s} from a position in [0, {self.seq_length[s]}], got {start}")
        if self.hybrid and 0 < start < self.seq_length[s]:
            # Its recurrent state holds every position: only the Context can
            # rewind it (from a snapshot, evaluating the rest again).
            raise errors.InvalidArgumentError(
                f"sequence {s} of a hybrid model can only be trimmed through its Context (Context.seq_rm)")
        self._seq_rm(s, start)
        if self.hybrid and start == 0:
            self._clear_state(s)

    # -- the recurrent state -------------------------------------------------------

    cdef void _clear_state(self, int seq) noexcept:
        """Sequence ``seq``'s recurrent state back to zeros (a sequence with no positions)."""
        cdef int il
        cdef int slot = self.rs_slot[seq]
        self.rs_ready |= (<uint64_t> 1) << seq
        for il in range(self.n_layer):
            if self.r[il] != NULL:
                ggml_backend_tensor_memset(self.r[il], 0, <size_t> slot * self.r[il].nb[1], self.r[il].nb[1])
            if self.s[il] != NULL:
                ggml_backend_tensor_memset(self.s[il], 0, <size_t> slot * self.s[il].nb[1], self.s[il].nb[1])

    cdef void _state_copy(self, int seq, char * data, bint write) noexcept:
        """Sequence ``seq``'s recurrent state to (or, with ``write``, from) ``state_bytes`` at ``data``."""
        cdef int il
        cdef int slot = self.rs_slot[seq]
        cdef size_t at = 0
        cdef ggml_tensor * t
        cdef int j
        if write:
            self.rs_ready |= (<uint64_t> 1) << seq
        else:
            self.ready_state(seq)
        for il in range(self.n_layer):
            if self.r[il] == NULL:
                continue
            for j in range(2):
                t = self.r[il] if j == 0 else self.s[il]
                if t == NULL:
                    continue
                if write:
                    ggml_backend_tensor_set(t, data + at, <size_t> slot * t.nb[1], t.nb[1])
                else:
                    ggml_backend_tensor_get(t, data + at, <size_t> slot * t.nb[1], t.nb[1])
                at += t.nb[1]

    def recurrent_state(self, seq):
        """A copy of sequence ``seq``'s recurrent state (``state_bytes`` bytes): its snapshot."""
        cdef int q = self._check_seq(seq)
        out = np.empty(self.state_bytes, dtype=np.uint8)
        if self.state_bytes:
            self._state_copy(q, <char *> cnp.PyArray_DATA(out), False)
        return out

    def set_recurrent_state(self, seq, const unsigned char[::1] state):
        """Give sequence ``seq`` a recurrent state from :meth:`recurrent_state`."""
        cdef int q = self._check_seq(seq)
        if <size_t> state.shape[0] != self.state_bytes:
            raise errors.InvalidArgumentError(f"a recurrent state is {self.state_bytes:,} bytes for this model, "
                                              f"got {state.shape[0]:,}")
        if self.state_bytes:
            self._state_copy(q, <char *> &state[0], True)

    cdef void ready_state(self, int seq) noexcept:
        """Zero sequence ``seq``'s current slot if it was never written (see rs_ready)."""
        if not (self.rs_ready >> seq) & 1:
            self._clear_state(seq)

    cdef void flip_slots(self, int n, const int32_t * seqs) noexcept:
        """After a successful step: the slots it wrote become its sequences' current ones."""
        cdef int i, q
        cdef uint64_t done = 0
        for i in range(n):
            q = seqs[i]
            if not (done >> q) & 1:
                done |= (<uint64_t> 1) << q
                self.rs_slot[q] = q + self.n_seq_max if self.rs_slot[q] == q else q

    cdef void _seq_rm(self, int s, int start) noexcept:
        cdef uint64_t bit = (<uint64_t> 1) << s
        cdef int i
        for i in range(self.used_end):
            if (self.cell_seqs[i] & bit) and self.cell_pos[i] >= start:
                self._unsee(i, bit)
        self.seq_length[s] = start
        self._shrink_used_end()

    def seq_cp(self, src, dst, n=None):
        """Let empty sequence ``dst`` see ``src``'s first ``n`` positions (all by
        default): the cells are shared, not copied."""
        cdef int a = self._check_seq(src), b = self._check_seq(dst)
        count = self.seq_length[a] if n is None else _as_integer("the prefix length", n)
        if a == b or self.seq_length[b] != 0:
            raise errors.InvalidArgumentError(f"can only fork into another, empty sequence (sequence {b} "
                                              f"holds {self.seq_length[b]} positions)")
        if not 0 <= count <= self.seq_length[a]:
            raise errors.InvalidArgumentError(
                f"sequence {a} holds {self.seq_length[a]} positions; cannot fork {count} of them")
        if self.hybrid and count != self.seq_length[a]:
            raise errors.InvalidArgumentError(
                f"a hybrid model forks a sequence whole (its recurrent state holds every position); "
                f"sequence {a} holds {self.seq_length[a]}, not {count}: fork through the Context")
        self._fork_cells(a, b, count)
        if self.hybrid:
            self.set_recurrent_state(b, self.recurrent_state(a))

    cdef void _fork_cells(self, int a, int b, int count) noexcept:
        cdef uint64_t bit_a = (<uint64_t> 1) << a, bit_b = (<uint64_t> 1) << b
        cdef int i
        for i in range(self.used_end):
            if (self.cell_seqs[i] & bit_a) and self.cell_pos[i] < count:
                self.cell_seqs[i] |= bit_b
        self.seq_length[b] = count

    def cell_table(self):
        """Copies of the cell arrays ``(pos, token, seqs)``: for tests and inspection."""
        pos = np.empty(self.kv_size, dtype=np.int32)
        token = np.empty(self.kv_size, dtype=np.int32)
        seqs = np.empty(self.kv_size, dtype=np.uint64)
        cdef int32_t[::1] p = pos
        cdef int32_t[::1] t = token
        cdef uint64_t[::1] m = seqs
        cdef int i
        for i in range(self.kv_size):
            p[i] = self.cell_pos[i]
            t[i] = self.cell_token[i]
            m[i] = self.cell_seqs[i]
        return pos, token, seqs

    @property
    def n_free(self):
        return self.kv_size - self.n_used

    # -- cells for a batch -----------------------------------------------------

    cdef void _unsee(self, int i, uint64_t bit) noexcept:
        self.cell_seqs[i] &= ~bit
        if self.cell_seqs[i] == 0:
            self.cell_pos[i] = -1
            self.n_used -= 1

    cdef void _shrink_used_end(self) noexcept:
        while self.used_end > 0 and self.cell_seqs[self.used_end - 1] == 0:
            self.used_end -= 1

    cdef int _last_cell(self, int s) noexcept:
        """The highest cell sequence s sees, -1 if none."""
        cdef uint64_t bit = (<uint64_t> 1) << s
        cdef int c = self.used_end - 1
        while c >= 0 and not (self.cell_seqs[c] & bit):
            c -= 1
        return c

    cdef int32_t rope_next(self, int s, int32_t p) noexcept nogil:
        """The rotary position (M-RoPE) of sequence s's token at position p: the one its
        cell at p - 1 left (graph/mrope.pxi); 0 at the start."""
        cdef uint64_t bit = (<uint64_t> 1) << s
        cdef int i
        if p <= 0:
            return 0
        for i in range(self.used_end):
            if self.cell_pos[i] == p - 1 and (self.cell_seqs[i] & bit):
                return self.cell_rope_next[i]
        return p

    cdef int place(self, int n, const int32_t * tokens, const int32_t * seqs, int32_t * cells,
                   int32_t * positions) except -1:
        """Take ``n`` free cells for a batch; each token goes to the next
        position of its sequence, in the lowest free cell past the cells that
        sequence already sees whose index is its position modulo CELL_ALIGN
        (so one sequence alone fills 0, 1, 2, ... as llama.cpp does), else
        the lowest free one past them, else the lowest free one.

        Past them, because attention goes over the cells in order (flash
        attention's one-row kernel: an online softmax, one cell after
        another).  On the grid, because the other kernels go over them in
        blocks: flash attention's tiled kernel (64 query rows or more) in
        tiles of 64 cells, ggml's softmax and products without flash
        attention in SIMD lanes.  A cell's place in its block is where its
        term goes into a sum, so a sequence whose cells sit where they would
        alone makes the sums it makes alone, whatever its neighbours and
        whichever cells a shared prefix came in (a 100-token prompt placed
        right after another's got logits 0.26 away, with flash attention).
        A cell off the grid (the cache too full to keep it) only costs that.
        Raises when too few cells are free."""
        if n > self.kv_size - self.n_used:
            raise errors.KVCacheFullError(
                f"the KV cache has {self.kv_size - self.n_used} free cells of {self.kv_size}; "
                f"this step needs {n}")
        cdef int i, c, s
        cdef int after[MAX_SEQ]     # per sequence of the batch: the cell to search from
        for i in range(n):
            after[seqs[i]] = -2
        for i in range(n):
            s = seqs[i]
            if after[s] == -2:
                after[s] = self._last_cell(s) + 1
            c = after[s] + ((self.seq_length[s] - after[s]) % CELL_ALIGN + CELL_ALIGN) % CELL_ALIGN
            while c < self.kv_size and self.cell_seqs[c] != 0:
                c += CELL_ALIGN
            if c >= self.kv_size:   # no free cell on the grid past them: the lowest free one past them
                c = after[s]
                while c < self.kv_size and self.cell_seqs[c] != 0:
                    c += 1
            if c == self.kv_size:   # nothing free past them: the lowest free cell
                c = 0
                while self.cell_seqs[c] != 0:
                    c += 1
            after[s] = c + 1
            cells[i] = c
            positions[i] = self.seq_length[s]
            self.seq_length[s] += 1
            self.cell_pos[c] = positions[i]
            self.cell_token[c] = tokens[i]
            self.cell_seqs[c] = (<uint64_t> 1) << s
            self.n_used += 1
            if c + 1 > self.used_end:
                self.used_end = c + 1
        return 0

    cdef void unplace(self, int n, const int32_t * seqs, const int32_t * cells) noexcept:
        """Undo ``place`` (a step that failed or was aborted)."""
        cdef int i
        for i in range(n - 1, -1, -1):
            self.seq_length[seqs[i]] -= 1
            self._unsee(cells[i], self.cell_seqs[cells[i]])
        self._shrink_used_end()

    cdef int n_kv(self) noexcept:
        """Cells attended to: up to the highest used one, padded to a multiple
        of 256 (masked), as llama.cpp: the same n_kv gives the same summation
        order, and it keeps the graph's shapes fixed across many steps."""
        return min(self.kv_size, ((self.used_end + KV_PAD - 1) // KV_PAD) * KV_PAD)

    cdef void fill_mask(self, void * out, int n_tokens, int n_kv, const int32_t * seqs, const int32_t * positions,
                        int n_swa, bint f16, bint causal) noexcept nogil:
        _fill_mask(out, n_tokens, n_kv, self.cell_pos, self.cell_seqs, seqs, positions, n_swa, f16, causal)


cdef uint16_t F16_ZERO = 0x0000
cdef uint16_t F16_NEG_INF = 0xFC00


cdef KVCache _new_kv_cache(Model m, int kv_size, int n_seq_max, ggml_type type_k, ggml_type type_v,
                           bint v_trans, ggml_backend_buffer_type_t * layer_buft, double rpc_timeout=0):
    """Per-layer K and V, each layer's in the buffer type of the backend that
    runs the layer (``layer_buft[il]``)."""
    cdef KVCache c = KVCache.__new__(KVCache)
    cdef int i
    c.kv_size = kv_size
    c.n_layer = m.hp.n_layer
    c.n_seq_max = n_seq_max
    c.type_k = ggml_type_name(type_k).decode()
    c.type_v = ggml_type_name(type_v).decode()
    c.v_in_k = m.hp.kv_lora_rank > 0
    c.v_trans = v_trans and not c.v_in_k
    if c.v_in_k:
        c.type_v = c.type_k   # V is K's own values
    c.cell_pos = <int32_t *> malloc(kv_size * sizeof(int32_t))
    c.cell_token = <int32_t *> calloc(kv_size, sizeof(int32_t))
    c.cell_rope_next = <int32_t *> calloc(kv_size, sizeof(int32_t))
    c.mrope = m.hp.rope_type == GGML_ROPE_TYPE_MROPE or m.hp.rope_type == GGML_ROPE_TYPE_IMROPE
    c.cell_seqs = <uint64_t *> calloc(kv_size, sizeof(uint64_t))
    c.seq_length = <int32_t *> calloc(MAX_SEQ, sizeof(int32_t))
    c.k = <ggml_tensor **> calloc(m.hp.n_layer, sizeof(ggml_tensor *))
    c.v = <ggml_tensor **> calloc(m.hp.n_layer, sizeof(ggml_tensor *))
    c.r = <ggml_tensor **> calloc(m.hp.n_layer, sizeof(ggml_tensor *))
    c.s = <ggml_tensor **> calloc(m.hp.n_layer, sizeof(ggml_tensor *))
    c.rs_slot = <int32_t *> calloc(MAX_SEQ, sizeof(int32_t))
    c.shapes = <LayerShape *> malloc(m.hp.n_layer * sizeof(LayerShape))
    if c.k == NULL or c.v == NULL or c.shapes == NULL or c.cell_pos == NULL or c.cell_token == NULL or c.cell_rope_next == NULL \
            or c.cell_seqs == NULL or c.seq_length == NULL or c.r == NULL or c.s == NULL or c.rs_slot == NULL:
        raise MemoryError()
    memcpy(c.shapes, m.shapes, m.hp.n_layer * sizeof(LayerShape))
    for i in range(MAX_SEQ):
        c.rs_slot[i] = i
    c.hybrid = m.hybrid
    for i in range(kv_size):
        c.cell_pos[i] = -1
    cdef ggml_init_params p
    p.mem_size = ggml_tensor_overhead() * (4 * m.hp.n_layer + 1)
    p.mem_buffer = NULL
    p.no_alloc = True
    cdef ggml_backend_buffer_type_t buf_types[2 * MAX_KV_BUFFERS]
    cdef int il, ib
    c.v_row = 0
    c.n_layer_kv = 0
    for il in range(m.hp.n_layer):
        if not c.v_in_k:
            c.v_row = max(c.v_row, m.shapes[il].head_dim_v * m.shapes[il].n_head_kv)
    for il in range(m.hp.n_layer):
        if m.shapes[il].kv_source != il:   # reads an earlier layer's (checked: it owns them)
            c.k[il] = c.k[m.shapes[il].kv_source]
            c.v[il] = c.v[m.shapes[il].kv_source]
            continue
        c.n_layer_kv += 1
        ib = 0
        while ib < c.n_bufs and buf_types[ib] != layer_buft[il]:
            ib += 1
        if ib == c.n_bufs:
            if ib == MAX_KV_BUFFERS:
                raise errors.InvalidArgumentError(f"layers on more than {MAX_KV_BUFFERS} devices")
            c.ctxs[ib] = ggml_init(p)
            c.bufs[ib] = NULL
            if c.ctxs[ib] == NULL:
                raise MemoryError()
            buf_types[ib] = layer_buft[il]
            c.n_bufs += 1
        if m.recurrent_layers[il] or m.shapes[il].n_head_kv == 0:
            # No cells to speak of (a recurrent layer, or one that is an FFN
            # alone: Nemotron-H's): K and V of one element, kept so that every
            # layer has them (a cell's bytes stay a sum over layers).
            c.k[il] = ggml_new_tensor_2d(c.ctxs[ib], type_k, ggml_blck_size(type_k), kv_size)
            c.v[il] = ggml_new_tensor_2d(c.ctxs[ib], type_v, ggml_blck_size(type_v), kv_size)
            continue
        c.k[il] = ggml_new_tensor_2d(c.ctxs[ib], type_k, m.shapes[il].head_dim_k * m.shapes[il].n_head_kv, kv_size)
        if c.v_in_k:   # (kv_lora_rank, kv_size) over K's rows; allocated with K
            c.v[il] = ggml_view_2d(c.ctxs[ib], c.k[il], m.shapes[il].head_dim_v, kv_size, c.k[il].nb[1], 0)
            continue
        c.v[il] = ggml_new_tensor_2d(c.ctxs[ib], type_v, c.v_row if v_trans else
                                     m.shapes[il].head_dim_v * m.shapes[il].n_head_kv, kv_size)
    c.n_kv_bufs = c.n_bufs
    for il in range(m.hp.n_layer):   # the recurrent store: buffers of its own, per device
        if not m.recurrent_layers[il]:
            continue
        ib = c.n_kv_bufs
        while ib < c.n_bufs and buf_types[ib] != layer_buft[il]:
            ib += 1
        if ib == c.n_bufs:
            if ib == 2 * MAX_KV_BUFFERS:
                raise errors.InvalidArgumentError(f"layers on more than {MAX_KV_BUFFERS} devices")
            c.ctxs[ib] = ggml_init(p)
            c.bufs[ib] = NULL
            if c.ctxs[ib] == NULL:
                raise MemoryError()
            buf_types[ib] = layer_buft[il]
            c.n_bufs += 1
        c.r[il] = ggml_new_tensor_2d(c.ctxs[ib], GGML_TYPE_F32, _n_embd_r(&m.hp), 2 * n_seq_max)
        c.state_bytes += c.r[il].nb[1]
        if _n_embd_s(&m.hp) > 0:
            c.s[il] = ggml_new_tensor_2d(c.ctxs[ib], GGML_TYPE_F32, _n_embd_s(&m.hp), 2 * n_seq_max)
            c.state_bytes += c.s[il].nb[1]
    for ib in range(c.n_bufs):
        # K and V zeroed: flash attention reads whole views, and masked garbage
        # could be NaN.  The recurrent store not: a slot is zeroed when its
        # sequence first needs it (KVCache.ready_state).
        c.bufs[ib] = _alloc_tensors(c.ctxs[ib], buf_types[ib], GGML_BACKEND_BUFFER_USAGE_ANY, ib < c.n_kv_bufs,
                                    rpc_timeout)
        if c.bufs[ib] == NULL:
            raise MemoryError(f"cannot allocate a KV cache of {kv_size} cells in "
                              f"{ggml_backend_buft_name(buf_types[ib]).decode()}")
    return c


cdef inline int64_t _n_embd_r(const HParams * hp) noexcept:
    """A recurrent layer's convolution state (llama.cpp's n_embd_r): LFM2's
    short convolution keeps the last l_cache - 1 values of B*x, n_embd
    channels; a Gated DeltaNet layer the last d_conv - 1 inputs of its Q, K,
    V channels."""
    if hp.shortconv_l_cache > 0:
        return <int64_t> (hp.shortconv_l_cache - 1) * hp.n_embd
    return <int64_t> (hp.ssm_d_conv - 1) * (hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state)


cdef inline int64_t _n_embd_s(const HParams * hp) noexcept:
    """A recurrent layer's other state (llama.cpp's n_embd_s): a Gated
    DeltaNet layer's (d_state, d_state) matrix per value head; none for LFM2."""
    if hp.shortconv_l_cache > 0:
        return 0
    return <int64_t> hp.ssm_d_state * hp.ssm_d_inner


cdef void _fill_mask(void * out, int n_tokens, int n_kv, const int32_t * cell_pos, const uint64_t * cell_seqs,
                     const int32_t * seqs, const int32_t * positions, int n_swa, bint f16,
                     bint causal) noexcept nogil:
    """Row i (a token of sequence s at position p) may see cell j iff s sees j
    and j's position is <= p, and, with a sliding window, p - pos < n_swa.
    Without ``causal`` (an encoder: BERT) the position test is dropped: every
    token sees every cell of its sequence.  Written as float16 (flash
    attention wants it) or float32 (softmax)."""
    cdef int i, j, p
    cdef uint64_t bit
    cdef bint visible
    cdef uint16_t * h = <uint16_t *> out
    cdef float * f = <float *> out
    cdef size_t at
    for i in range(n_tokens):
        p = positions[i]
        bit = (<uint64_t> 1) << seqs[i]
        for j in range(n_kv):
            visible = (cell_seqs[j] & bit) != 0 and (cell_pos[j] <= p or not causal) \
                and (n_swa == 0 or p - cell_pos[j] < n_swa)
            at = <size_t> i * n_kv + j
            if f16:
                h[at] = F16_ZERO if visible else F16_NEG_INF
            else:
                f[at] = 0.0 if visible else -INFINITY


def attention_mask(cell_pos, cell_seqs, seqs, positions, int n_swa=0, bint causal=True):
    """The mask the cache builds for a batch, as float32 ``(n_tokens, n_cells)``
    (0 or -inf): ``cell_pos``/``cell_seqs`` describe the cells (position, -1
    when free; bitmask of sequences), ``seqs``/``positions`` the batch's tokens."""
    cdef int32_t[::1] cp = np.ascontiguousarray(cell_pos, dtype=np.int32)
    cdef uint64_t[::1] cs = np.ascontiguousarray(cell_seqs, dtype=np.uint64)
    cdef int32_t[::1] ts = np.ascontiguousarray(seqs, dtype=np.int32)
    cdef int32_t[::1] tp = np.ascontiguousarray(positions, dtype=np.int32)
    if cp.shape[0] != cs.shape[0] or ts.shape[0] != tp.shape[0] or cp.shape[0] == 0 or ts.shape[0] == 0:
        raise ValueError("need as many cell positions as cell masks, as many token seqs as positions, none empty")
    if n_swa < 0 or min(ts) < 0 or max(ts) >= MAX_SEQ:
        raise ValueError(f"need n_swa >= 0 and sequence ids in [0, {MAX_SEQ})")
    out = np.empty((ts.shape[0], cp.shape[0]), dtype=np.float32)
    cdef float[:, ::1] view = out
    _fill_mask(&view[0, 0], ts.shape[0], cp.shape[0], &cp[0], &cs[0], &ts[0], &tp[0], n_swa, False, causal)
    return out


def causal_mask(int n_past, int n_tokens, int n_kv, int n_swa=0):
    """The mask of one sequence alone, in cells 0 .. n_past + n_tokens - 1 in
    order, evaluating ``n_tokens`` after ``n_past``: float32 ``(n_tokens, n_kv)``."""
    if n_past < 0 or n_tokens <= 0 or n_kv < n_past + n_tokens or n_swa < 0:
        raise ValueError("need n_past >= 0, n_tokens > 0, n_kv >= n_past + n_tokens, n_swa >= 0")
    used = n_past + n_tokens
    cell_pos = np.where(np.arange(n_kv) < used, np.arange(n_kv), -1).astype(np.int32)
    cell_seqs = (np.arange(n_kv) < used).astype(np.uint64)
    return attention_mask(cell_pos, cell_seqs, np.zeros(n_tokens, np.int32),
                          np.arange(n_past, used, dtype=np.int32), n_swa)
