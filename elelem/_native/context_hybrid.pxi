# A hybrid model's steps, trims and forks (Qwen3.5, Qwen3-Next, LFM2, the
# Mamba-2 hybrids).  Its recurrent layers take a step as sequences of one token
# count, one after the other, and its recurrent state holds every position it
# has seen: a step of several tokens is framed by snapshots
# (Context._snapshot_before, snapshots.pxi) that a trim or a fork goes back to,
# evaluating the tokens after the snapshot again.  Included into core.pyx after
# context.pxi.


cdef object _one_sequence_step(Context c, tokens, cnp.ndarray seqs, outputs, bint embeddings, bint generated,
                               bint keep_hidden=False, embd=None, bint causal=True, int grid_x=0, int grid_y=0,
                               int grid_offset=0):
    """One sequence's rows (a decoding stream, a prompt chunk, an image's
    embeddings): already in order, so one step without the sorting of
    _hybrid_decode.  Snapshots before it, and after it unless the rows are
    generated ones: the end of a prompt is where a new turn or a retry rewinds
    to."""
    present, counts = seqs[:1], np.array([seqs.shape[0]])
    c._snapshot_before(present, counts, generated)
    out = c._decode(tokens, seqs, outputs, embeddings, generated, 1, keep_hidden=keep_hidden, embd=embd,
                    causal=causal, grid_x=grid_x, grid_y=grid_y, grid_offset=grid_offset)
    if not generated:
        c._snapshot_before(present, counts, False)
    return out


cdef object _hybrid_decode(Context c, cnp.ndarray ids, cnp.ndarray seqs, outputs, bint embeddings,
                           bint decode_kernels, bint keep_hidden):
    """Several sequences' rows (Context.decode): sorted sequence after
    sequence, one step when every sequence has the same count of rows and one
    step per count otherwise; the rows come back in the batch's order
    (``last_hidden`` too)."""
    rows = _output_rows(outputs, seqs)
    flags = np.zeros(ids.shape[0], dtype=bool)
    flags[rows] = True
    order = np.argsort(seqs, kind="stable")        # sequence after sequence, each in its order
    present, counts = np.unique(seqs, return_counts=True)
    groups = [present[counts == k] for k in np.unique(counts)]
    c._snapshot_before(present, counts, decode_kernels)
    if len(groups) == 1:
        out = c._decode(ids[order], seqs[order], flags[order], embeddings, decode_kernels, len(present),
                        keep_hidden=keep_hidden)
        if not decode_kernels:   # and at the end of a prompt, where a new turn or a retry rewinds to
            c._snapshot_before(present, counts, False)
        if keep_hidden:
            c.last_hidden = c.last_hidden[np.argsort(order)]
        kept = order[flags[order]]                 # the original row of each output, in output order
        return out[np.argsort(kept)]
    # Sequences of several counts: one step for each; a failure undoes the ones before it.
    saved = {int(q): (c.cache.seq_length_of(int(q)), c.cache.recurrent_state(int(q))) for q in present}
    outs, done, hidden = [], [], []
    try:
        for group in groups:
            mine = order[np.isin(seqs[order], group)]
            wanted = flags[mine]
            if not wanted.any():   # a step returns some row: one to drop (a prompt chunk short of its end)
                wanted = wanted.copy()
                wanted[-1] = True
                c._decode(ids[mine], seqs[mine], wanted, embeddings, decode_kernels, len(group),
                          keep_hidden=keep_hidden)
                done.append(group)
                hidden.append((mine, c.last_hidden))
                continue
            out = c._decode(ids[mine], seqs[mine], wanted, embeddings, decode_kernels, len(group),
                            keep_hidden=keep_hidden)
            done.append(group)
            outs.append((mine[wanted], out))
            hidden.append((mine, c.last_hidden))
    except BaseException:
        for group in done:
            for q in group:
                length, state = saved[int(q)]
                c.cache._seq_rm(int(q), length)
                c.cache.set_recurrent_state(int(q), state)
        raise
    if keep_hidden:
        rows = np.concatenate([r for r, _ in hidden])
        c.last_hidden = np.concatenate([h for _, h in hidden])[np.argsort(rows)]
    kept = np.concatenate([k for k, _ in outs])
    out = np.concatenate([o for _, o in outs])
    return out[np.argsort(kept)]


cdef object _rewind_recurrent(Context c, seq, p0):
    """Context._rewind on a hybrid model: the sequence goes back to the latest
    snapshot at or before ``p0``; returns the tokens from there to ``p0`` and
    whether they were generated ones."""
    cdef KVCache cache = c.cache
    c._check_idle()
    cdef int s = cache._check_seq(seq)
    cdef int length = cache.seq_length[s]
    p = _as_integer("the position to trim from", p0)
    if not 0 <= p <= length:
        cache.seq_rm(seq, p0)   # its error
    if p == length:
        return [], False
    if p == 0:
        c.snapshots.clear(s)
        cache.seq_rm(s, 0)
        return [], False
    tokens = cache.seq_tokens(s)
    pos, state, generated = c.snapshots.latest(s, p)
    c.snapshots.keep_to(s, pos)
    cache._seq_rm(s, pos)
    if state is None:
        cache._clear_state(s)
    else:
        cache.set_recurrent_state(s, state)
    return list(tokens[pos:p]), generated


cdef object _fork_recurrent(Context c, src, dst, n):
    """Context.seq_cp on a hybrid model: the recurrent state copied whole, or
    from the latest snapshot at or before the prefix's end, the tokens after
    it evaluated again."""
    cdef KVCache cache = c.cache
    c._check_idle()
    cdef int a = cache._check_seq(src)
    count = cache.seq_length[a] if n is None else _as_integer("the prefix length", n)
    if count == cache.seq_length[a]:
        cache.seq_cp(src, dst, count)
        c.snapshots.copy(a, cache._check_seq(dst), None)
        return
    cdef int b = cache._check_seq(dst)
    if a == b or cache.seq_length[b] != 0 or not 0 <= count <= cache.seq_length[a]:
        return cache.seq_cp(src, dst, count)   # its error
    tokens = cache.seq_tokens(a)
    pos, state, generated = c.snapshots.latest(a, count)
    cache._fork_cells(a, b, pos)
    if state is None:
        cache._clear_state(b)
    else:
        cache.set_recurrent_state(b, state)
    c.snapshots.copy(a, b, pos)
    if pos < count:
        _log.info("sequence %d forks %d positions of sequence %d; evaluating positions %d..%d again from "
                  "the nearest snapshot of its recurrent state", b, count, a, pos, count - 1)
        c._replay(b, tokens[pos:count], generated)
