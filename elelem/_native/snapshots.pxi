# Snapshots of a hybrid model's recurrent states, included into core.pyx
# after kv_cache.pxi: the memory side of trimming and forking a sequence.
#
# A recurrent state holds every position its sequence has seen, so it
# cannot drop a tail as the cells can: a sequence trimmed or forked below
# its length is set back to its latest snapshot at or before that point, and
# the tokens from there are evaluated again (Context.seq_rm and seq_cp do
# that).  Two kinds of snapshot:
# - transient ones, taken before a step gives a sequence several tokens (a
#   prompt, or generated guesses to verify), which a rewind into that step
#   restores; at most max_transient a sequence, the oldest dropped;
# - kept ones (the engine's: the end of each prompt and of each
#   generation), which stay until dropped, within the engine's budget
#   (engine/state_cache.py), so that an agent's next turn resumes there.
# Each is [position, state bytes, generated, kept, last used]; "generated"
# says the tokens after it were generated ones (replayed as such).


cdef class RecurrentSnapshots:
    cdef dict by_seq            # seq -> [snapshot, ...] sorted by position
    cdef public int max_transient
    cdef long clock

    def __cinit__(self):
        self.by_seq = {}
        self.max_transient = 4
        self.clock = 0

    cdef list _tick(self, list snap):
        self.clock += 1
        snap[4] = self.clock
        return snap

    cdef list take(self, KVCache cache, int s, bint generated, bint keep):
        """Snapshot sequence s's state where it ends now (or mark the one
        there kept and used)."""
        at = cache.seq_length[s]
        snaps = self.by_seq.setdefault(s, [])
        for snap in snaps:
            if snap[0] == at:
                snap[3] = snap[3] or keep
                return self._tick(snap)
        snap = self._tick([at, cache.recurrent_state(s), generated, keep, 0])
        snaps.append(snap)
        snaps.sort(key=lambda snap: snap[0])
        transient = [snap for snap in snaps if not snap[3]]
        for old in transient[:max(0, len(transient) - self.max_transient)]:
            snaps.remove(old)
        return snap

    cdef tuple latest(self, int s, p):
        """(position, state, generated) of s's latest snapshot at or before p
        (marked used), or (0, None, False): the empty state."""
        usable = [snap for snap in self.by_seq.get(s, []) if snap[0] <= p]
        if not usable:
            return 0, None, False
        snap = self._tick(max(usable, key=lambda snap: snap[0]))
        return snap[0], snap[1], snap[2]

    cdef int resume_point(self, int s, p):
        """s's latest snapshot position at or before p, 0 without one."""
        return max((snap[0] for snap in self.by_seq.get(s, []) if snap[0] <= p), default=0)

    cdef void keep_to(self, int s, pos) except *:
        """Forget s's snapshots past pos (its state went back there)."""
        self.by_seq[s] = [snap for snap in self.by_seq.get(s, []) if snap[0] <= pos]

    cdef void copy(self, int src, int dst, upto) except *:
        """dst takes src's snapshots at or before upto (all where None)."""
        self.by_seq[dst] = [list(snap) for snap in self.by_seq.get(src, []) if upto is None or snap[0] <= upto]

    cdef void clear(self, int s) except *:
        self.by_seq.pop(s, None)

    cdef void drop(self, int s, p) except *:
        self.by_seq[s] = [snap for snap in self.by_seq.get(s, []) if snap[0] != p]

    cdef object state_at(self, int s, p):
        """The state bytes of s's snapshot at exactly p, or None."""
        snap = next((snap for snap in self.by_seq.get(s, []) if snap[0] == p), None)
        return None if snap is None else snap[1]

    cdef list kept(self):
        """[(last used, seq, position, bytes), ...] of every kept snapshot;
        states shared by forked sequences count once, under the first."""
        seen, out = set(), []
        for s, snaps in self.by_seq.items():
            for snap in snaps:
                if snap[3]:
                    fresh = id(snap[1]) not in seen
                    seen.add(id(snap[1]))
                    out.append((snap[4], s, snap[0], len(snap[1]) if fresh else 0))
        return out

    cdef size_t nbytes(self):
        return sum(len(snap[1]) for snaps in self.by_seq.values() for snap in snaps)
