"""The persistent prompt cache: KV states of evaluated sequences, on disk.

A coding agent sends the same long system prompt from process after
process.  When a request ends, the engine offers the sequence it leaves (its
prompt and answer) to this cache, which writes its K and V to a file in the
background.  When a new prompt arrives -- in this process or a later one --
the engine asks for the stored sequence sharing the longest prefix with it
and loads that prefix instead of evaluating it.  Any stored sequence serves
any prompt it shares a prefix with: a prefix of a state loads alone.

Keys: a folder per *namespace* (the model file's sha256, the K/V types, the
V layout and the CPU kernels that computed the values: see
``LLM._prompt_cache_namespace``), a file per token sequence.  The index
(file -> tokens) is kept in memory and refreshed when the folder changes,
so other processes' entries are seen.

Bounded: after each write the least recently used files (by modification
time, which a hit refreshes) are removed until the folder is within
``max_bytes``; a stored sequence that a newer one extends is removed at
once, since the newer one serves every prompt the older one could -- except
for a hybrid model (``whole_states``), whose recurrent state is that of an
entry's last position: its entries load whole or not at all, so a prompt
finds only the ones it extends, and a conversation's prompt end is kept
beside the whole answer that extends it.

Everything read is checked (see :mod:`.state_file`): a damaged, cut-short
or foreign file is skipped with a warning, and removed if it is one of ours.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..errors import InvalidArgumentError, StateError
from .state_file import SUFFIX, read_state_file, read_tokens, write_state_file

log = logging.getLogger("elelem")

DEFAULT_MAX_BYTES = 2 << 30
#: Shorter sequences are not stored, and a hit must save at least this many
#: evaluated tokens: below it, evaluating is about as fast as reading.
DEFAULT_MIN_TOKENS = 128
#: States waiting to be written; more are dropped (a full disk queue must not hold memory).
MAX_PENDING_WRITES = 4
#: Temporary files older than this were left by a process that died mid-write.
STALE_TEMP_SECONDS = 3600


@dataclass(frozen=True)
class CacheHit:
    path: Path
    n: int              # positions of the prompt the entry holds
    stored: int         # positions the entry holds in all


class PromptCache:
    """KV states of token sequences under ``directory``, for one namespace."""

    def __init__(self, directory, namespace: Mapping[str, Any], *, max_bytes: int = DEFAULT_MAX_BYTES,
                 min_tokens: int = DEFAULT_MIN_TOKENS, whole_states: bool = False):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise InvalidArgumentError(f"the prompt cache's max_bytes must be a positive integer, got {max_bytes!r}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
            raise InvalidArgumentError(f"the prompt cache's min_tokens must be a positive integer, got {min_tokens!r}")
        self.namespace = dict(namespace)
        digest = hashlib.sha256(json.dumps(self.namespace, sort_keys=True).encode()).hexdigest()
        self.folder = Path(directory).expanduser() / digest[:16]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot use {directory} as a prompt cache: {exc}") from exc
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.whole_states = whole_states
        self._index: dict[Path, np.ndarray] = {}
        self._index_stamp: Optional[int] = None
        self._lock = threading.Lock()           # the index, shared by the engine and the writer
        self._pending: "queue.Queue[tuple[np.ndarray, np.ndarray]]" = queue.Queue()
        self._writer: Optional[threading.Thread] = None
        self.hits = 0                            # statistics
        self.loaded_tokens = 0
        self.writes = 0

    # -- lookup ------------------------------------------------------------------

    def lookup(self, prompt: Sequence[int], limit: int) -> Optional[CacheHit]:
        """The stored sequence sharing the longest prefix (at most ``limit``
        positions, at least ``min_tokens``) with ``prompt``, or None."""
        head = np.asarray(prompt[:limit], dtype=np.int32)
        best: Optional[CacheHit] = None
        with self._lock:
            self._refresh_index()
            for path, tokens in self._index.items():
                n = _common_prefix(tokens, head)
                if self.whole_states and n < len(tokens):
                    continue
                if n >= self.min_tokens and (best is None or n > best.n):
                    best = CacheHit(path, n, len(tokens))
        return best

    def read(self, hit: CacheHit) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """``(tokens, state)`` of a hit's whole entry, checked; None (with a
        warning) when the file turns out bad or gone."""
        try:
            tokens, state = read_state_file(hit.path, self.namespace)
        except FileNotFoundError:
            return None                          # evicted by another process meanwhile
        except (OSError, StateError) as exc:
            with self._lock:
                self._discard(hit.path, exc)
            return None
        try:
            os.utime(hit.path)                   # recently used: evicted last
        except OSError:
            pass
        return tokens, state

    def record_hit(self, n: int) -> None:
        self.hits += 1
        self.loaded_tokens += n

    # -- storing -----------------------------------------------------------------

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether exactly this sequence is stored (then it is marked used)."""
        path = self._path_for(np.asarray(tokens, dtype=np.int32))
        try:
            os.utime(path)
            return True
        except OSError:
            return False

    def store(self, tokens: Sequence[int], state: np.ndarray) -> None:
        """Write a sequence's state in the background (dropped if too many wait)."""
        if len(tokens) < self.min_tokens:
            return
        if self._pending.qsize() >= MAX_PENDING_WRITES:
            log.debug("prompt cache: %d writes pending; not storing %d more tokens", MAX_PENDING_WRITES, len(tokens))
            return
        self._pending.put((np.asarray(tokens, dtype=np.int32), state))
        with self._lock:
            if self._writer is None or not self._writer.is_alive():
                # Not a daemon: the interpreter waits for it at exit, so a state
                # offered just before a short process ends is still written.
                self._writer = threading.Thread(target=self._write_pending, name="elelem-prompt-cache")
                self._writer.start()

    def flush(self) -> None:
        """Wait for the writes in progress."""
        writer = self._writer
        if writer is not None:
            writer.join()

    def _write_pending(self) -> None:
        while True:
            try:
                tokens, state = self._pending.get_nowait()
            except queue.Empty:
                return
            try:
                self._write(tokens, state)
            except Exception as exc:  # noqa: BLE001 -- a failed write loses a cache entry, nothing else
                log.warning("prompt cache: could not store %d tokens in %s: %s", len(tokens), self.folder, exc,
                            exc_info=not isinstance(exc, OSError))

    def _write(self, tokens: np.ndarray, state: np.ndarray) -> None:
        path = self._path_for(tokens)
        write_state_file(path, self.namespace, tokens, state)
        self.writes += 1
        log.debug("prompt cache: stored %d tokens (%.1f MiB) in %s", len(tokens), state.nbytes / 2**20, path.name)
        with self._lock:
            self._refresh_index()
            # An entry this one extends can serve no prompt better than this one.
            for other, other_tokens in list(self._index.items()):
                if self.whole_states:
                    break
                if other != path and len(other_tokens) < len(tokens) and \
                        _common_prefix(other_tokens, tokens) == len(other_tokens):
                    _unlink(other)
                    del self._index[other]
        self._evict()

    def _evict(self) -> None:
        entries, now = [], time.time()
        for item in os.scandir(self.folder):
            try:
                info = item.stat()
            except OSError:
                continue
            if item.name.endswith(SUFFIX):
                entries.append((info.st_mtime, info.st_size, Path(item.path)))
            elif item.name.startswith(".tmp-") and now - info.st_mtime > STALE_TEMP_SECONDS:
                _unlink(Path(item.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            log.debug("prompt cache: evicting %s (%.1f MiB)", path.name, size / 2**20)
            _unlink(path)
            total -= size

    # -- the index ---------------------------------------------------------------

    def _path_for(self, tokens: np.ndarray) -> Path:
        return self.folder / (hashlib.blake2b(tokens.astype("<i4").tobytes(), digest_size=16).hexdigest() + SUFFIX)

    def _refresh_index(self) -> None:
        """Re-read the folder if it changed (an entry added or removed here or
        by another process); entries already known are not read again."""
        try:
            stamp = os.stat(self.folder).st_mtime_ns
        except OSError:
            return
        if stamp == self._index_stamp:
            return
        self._index_stamp = stamp
        present = {Path(e.path) for e in os.scandir(self.folder) if e.name.endswith(SUFFIX)}
        for path in list(self._index):
            if path not in present:
                del self._index[path]
        for path in present - self._index.keys():
            try:
                self._index[path] = read_tokens(path, self.namespace)
            except FileNotFoundError:
                continue
            except (OSError, StateError) as exc:
                self._discard(path, exc)

    def _discard(self, path: Path, why: Exception) -> None:
        """Skip a bad file (called with the lock held)."""
        log.warning("prompt cache: ignoring %s: %s", path, why)
        if path.name.endswith(SUFFIX) and path.parent == self.folder:
            _unlink(path)
        self._index.pop(path, None)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
