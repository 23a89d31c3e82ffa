# Context's checks of a step's inputs (token ids, sequence ids, output rows,
# an MTP head's hidden states), before anything is placed in the cache.
# Included into core.pyx after context.pxi.


cdef void _check_whole_sequences(KVCache cache, cnp.ndarray seqs) except *:
    # Without a causal mask a token sees its whole sequence, later tokens too,
    # so a sequence is evaluated in one step from an empty start.
    for s in np.unique(seqs).tolist():
        if cache.seq_length[s] != 0:
            raise errors.InvalidArgumentError(
                f"an encoder evaluates a sequence in one step; sequence {s} already holds "
                f"{cache.seq_length[s]} positions")


cdef cnp.ndarray _checked_ids(tokens, int n_vocab):
    # No dtype forced on the conversion: that would truncate 1.5 to 1.
    ids = np.asarray(tokens)
    if ids.size == 0:
        raise errors.InvalidArgumentError("cannot evaluate an empty list of tokens")
    if ids.ndim != 1:
        raise errors.InvalidTokenError(f"token ids must be a flat sequence, got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise errors.InvalidTokenError(f"token ids must be integers in [0, {n_vocab}), got dtype {ids.dtype}")
    lo, hi = ids.min(), ids.max()
    if lo < 0 or hi >= n_vocab:
        bad = lo if lo < 0 else hi
        raise errors.InvalidTokenError(f"token id {int(bad)} is outside [0, {n_vocab})")
    return np.ascontiguousarray(ids, dtype=np.int32)


cdef cnp.ndarray _checked_hidden(hidden_in, int n, const HParams * hp):
    """An MTP head's hidden states, one row per token; None for any other model."""
    if not hp.mtp_head:
        if hidden_in is not None:
            raise errors.InvalidArgumentError("only an MTP head takes hidden states with its tokens")
        return None
    if hidden_in is None:
        raise errors.InvalidArgumentError("an MTP head needs the hidden state before each token (hidden_in)")
    h = np.ascontiguousarray(hidden_in, dtype=np.float32)
    if h.shape != (n, hidden_width(hp)):
        raise errors.InvalidArgumentError(f"hidden_in must be ({n}, {hidden_width(hp)}) for {n} tokens, got {h.shape}")
    return h


cdef cnp.ndarray _checked_seq_ids(seq_ids, int n, int n_seq_max):
    seqs = np.asarray(seq_ids)
    if seqs.ndim == 0 and seqs.dtype.kind in "iu":
        seqs = np.full(n, int(seqs))
    if seqs.ndim != 1 or seqs.shape[0] != n or seqs.dtype.kind not in "iu":
        raise errors.InvalidArgumentError(f"need one integer sequence id per token ({n}), got {seq_ids!r}")
    if seqs.min() < 0 or seqs.max() >= n_seq_max:
        raise errors.InvalidArgumentError(f"sequence ids must be in [0, {n_seq_max})")
    return np.ascontiguousarray(seqs, dtype=np.int32)


cdef cnp.ndarray _output_rows(outputs, cnp.ndarray seqs):
    cdef int n = seqs.shape[0]
    if outputs is None:  # the last token of each sequence, in row order
        last = {}
        for i, s in enumerate(seqs.tolist()):
            last[s] = i
        return np.array(sorted(last.values()), dtype=np.int32)
    if outputs is True:
        return np.arange(n, dtype=np.int32)
    flags = np.asarray(outputs)
    if flags.dtype != np.bool_ or flags.shape != (n,) or not flags.any():
        raise errors.InvalidArgumentError(f"outputs must be None, True or {n} booleans with at least one set")
    return np.flatnonzero(flags).astype(np.int32)
