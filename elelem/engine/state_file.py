"""One saved KV state on disk: the file format of the prompt cache.

A file holds the tokens of one sequence and the K and V of their positions,
as the native cache reads them out (``Context.seq_state``).  Its header names
everything the bytes depend on (the *namespace*: the model file's hash, the
K/V types and layout, ...), so a file made under other settings -- or by
another program, or cut short, or damaged -- is recognised and refused,
never loaded.

Layout: ``MAGIC``, then ``<II`` (format version, header length), the header
as JSON, the tokens as little-endian int32, the state.  The header's
``crc32`` covers tokens and state.

Writes are atomic: the file is written under a temporary name in the same
folder, flushed to disk and renamed over the final name, so a reader sees a
whole file or none, and two processes writing the same entry leave one of
the two whole files.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import StateError

MAGIC = b"ELELEMKV"
VERSION = 1
_PREFIX = struct.Struct("<II")
#: A header larger than this is not one of ours (the real ones are ~300 bytes).
MAX_HEADER = 1 << 16
SUFFIX = ".kvc"


def write_state_file(path: Path, namespace: Mapping[str, Any], tokens: np.ndarray, state) -> None:
    """Write ``tokens`` and their ``state`` to ``path``, atomically."""
    tokens = np.ascontiguousarray(tokens, dtype="<i4")
    payload = memoryview(state).cast("B")
    crc = zlib.crc32(payload, zlib.crc32(tokens.tobytes()))
    header = json.dumps({"namespace": dict(namespace), "n_tokens": int(tokens.size),
                         "state_bytes": payload.nbytes, "crc32": crc}, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX + ".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + _PREFIX.pack(VERSION, len(header)) + header)
            f.write(tokens.tobytes())
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_tokens(path: Path, namespace: Mapping[str, Any]) -> np.ndarray:
    """The tokens a state file holds (its state is not read, nor checked)."""
    with open(path, "rb") as f:
        header = _read_header(f, path, namespace)
        return _read_exactly(f, 4 * header["n_tokens"], path).view("<i4").astype(np.int32)


def read_state_file(path: Path, namespace: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, state)`` of a state file, after checking all of it."""
    with open(path, "rb") as f:
        header = _read_header(f, path, namespace)
        tokens = _read_exactly(f, 4 * header["n_tokens"], path)
        state = _read_exactly(f, header["state_bytes"], path)
        if f.read(1):
            raise StateError(f"{path}: longer than its header says")
    if zlib.crc32(state.data, zlib.crc32(tokens.data)) != header["crc32"]:
        raise StateError(f"{path}: its contents do not match their checksum (damaged)")
    return tokens.view("<i4").astype(np.int32), state


def _read_header(f, path: Path, namespace: Mapping[str, Any]) -> dict[str, Any]:
    start = f.read(len(MAGIC) + _PREFIX.size)
    if len(start) < len(MAGIC) + _PREFIX.size or start[:len(MAGIC)] != MAGIC:
        raise StateError(f"{path}: not an elelem state file")
    version, size = _PREFIX.unpack(start[len(MAGIC):])
    if version != VERSION:
        raise StateError(f"{path}: state file format {version}, this elelem reads {VERSION}")
    if size > MAX_HEADER:
        raise StateError(f"{path}: a header of {size} bytes is not one of ours")
    try:
        header = json.loads(_read_exactly(f, size, path).tobytes())
        valid = isinstance(header, dict) and all(
            isinstance(header.get(k), int) and not isinstance(header.get(k), bool) and header[k] >= 0
            for k in ("n_tokens", "state_bytes", "crc32"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        valid = False
    if not valid:
        raise StateError(f"{path}: its header is damaged")
    if header.get("namespace") != dict(namespace):
        raise StateError(f"{path}: made for another model or other cache settings")
    return header


def _read_exactly(f, n: int, path: Path) -> np.ndarray:
    data = np.empty(n, dtype=np.uint8)
    if f.readinto(data.data) != n:
        raise StateError(f"{path}: cut short")
    return data
