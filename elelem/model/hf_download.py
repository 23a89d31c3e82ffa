"""Downloading a model's files into the Hugging Face cache: resumable across processes and
checked against the digest the Hub lists.

The bytes travel through huggingface_hub's ``http_get`` (its headers, retries,
proxies and redirects) into a partial file with a stable name
(``blobs/<etag>.incomplete``), which a later pull resumes; each file is hashed
as it arrives and takes its final name only once its digest matches.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlparse

from ..errors import ModelDownloadError
from .hf_cache import _storage
from .hf_reference import HubRef

log = logging.getLogger("elelem")

#: progress(stage, done, total), as elelem.model.hub's: stage "download"; bytes of the whole set.
ProgressFn = Callable[[str, int, int], None]

_CHUNK = 8 << 20


@dataclass
class _Remote:
    path: str
    size: Optional[int]
    sha256: Optional[str]   # from LFS
    blob_id: Optional[str]  # the git blob id (sha1), for a file outside LFS


def _transport_errors() -> tuple:
    """The connection errors of huggingface_hub's HTTP client (httpx2 in 2.x)."""
    errors = []
    for module in ("httpx2", "httpx"):
        try:
            errors.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _status(error) -> Optional[int]:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class _Transfer:
    """The files of one model: those not cached at this commit are looked up (HEAD), those whose
    blob is missing are downloaded with resume and verified, and every one is linked into the
    snapshot by hf_hub_download."""

    def __init__(self, hub, ref: HubRef, commit: str, remotes: list[_Remote], root: Path, token,
                 progress: Optional[ProgressFn], force: bool):
        self.hub, self.ref, self.commit, self.remotes = hub, ref, commit, remotes
        self.root, self.token, self.progress, self.force = root, token, progress, force
        self.storage = _storage(root, ref.repo_id)
        self.done = 0
        self.total = 0

    def run(self) -> None:
        plan = []
        for remote in self.remotes:
            pointer = self.storage / "snapshots" / self.commit / remote.path
            if pointer.is_file() and not self.force:
                continue  # in the cache at this commit
            meta = self.hub.get_hf_file_metadata(
                self.hub.hf_hub_url(self.ref.repo_id, remote.path, revision=self.commit), token=self.token)
            if not meta.etag:
                raise ModelDownloadError(f"{self.ref}: {remote.path}: the Hub gave no ETag")
            blob = self.storage / "blobs" / meta.etag
            needs = self.force or not blob.is_file()
            size = meta.size if meta.size is not None else remote.size
            have = 0
            if needs:
                partial = _partial_path(blob)
                have = partial.stat().st_size if partial.is_file() and not self.force else 0
                if size is not None:
                    have = min(have, size)
                    self.total += size
                self.done += have
            plan.append((remote, meta, blob, needs, size, have))
        todo = [item for item in plan if item[3]]
        if todo:
            self._check_space()
            log.info("%s: downloading %d file(s), %s bytes", self.ref, len(todo), self.total or "unknown")
            self._report()
        for remote, meta, blob, needs, size, have in plan:
            if needs:
                self._download(remote, meta, blob, size, have)
            # The blob is in place: huggingface_hub links it into the snapshot (and downloads nothing).
            self.hub.hf_hub_download(self.ref.repo_id, remote.path, revision=self.commit, token=self.token,
                                     cache_dir=str(self.root))
        if todo and self.progress:
            self.progress("download", self.done, self.done)

    def _report(self) -> None:
        if self.progress:
            self.progress("download", self.done, self.total)

    def _check_space(self) -> None:
        needed = self.total - self.done
        folder = self.storage / "blobs"
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        if needed > free:
            raise ModelDownloadError(f"{self.ref}: needs {needed / 1e9:.1f} GB more in {folder}, "
                                     f"which has {free / 1e9:.1f} GB free")

    def _download(self, remote: _Remote, meta, blob: Path, size: Optional[int], counted: int) -> None:
        lock = self.root / ".locks" / self.storage.name / f"{blob.name}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with self.hub.utils.WeakFileLock(lock):  # huggingface_hub's lock for this blob
            self.done -= counted  # counted again below, from the partial file as it is now
            if blob.is_file() and not self.force:  # another process finished it meanwhile
                self.done += size or 0
                self._report()
                return
            self._download_locked(remote, meta, blob, size)

    def _download_locked(self, remote: _Remote, meta, blob: Path, size: Optional[int]) -> None:
        partial = _partial_path(blob)
        if self.force:
            partial.unlink(missing_ok=True)
        expected = _expected_digest(remote, meta, size)
        digest = expected[0]() if expected else None
        have = partial.stat().st_size if partial.is_file() else 0
        if size is not None and have > size:  # not this file's: start again
            partial.unlink()
            have = 0
        self.done += have
        if have and digest is not None:
            with open(partial, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
        headers = self.hub.utils.build_hf_headers(token=self.token)
        if not _same_host(self.hub.hf_hub_url(self.ref.repo_id, remote.path, revision=self.commit), meta.location):
            headers.pop("authorization", None)  # a signed CDN address: the token stays on the Hub
        log.debug("%s: %s from %s, resuming at %d", self.ref, remote.path, meta.location, have)
        with open(partial, "ab") as f:
            sink = _Sink(f, digest, self, have)
            self.hub.file_download.http_get(meta.location, sink, resume_size=have, headers=headers,
                                            expected_size=size, displayed_filename=remote.path,
                                            tqdm_class=self.hub.utils.silent_tqdm)
            f.flush()
            os.fsync(f.fileno())
        got = partial.stat().st_size
        if size is not None and got != size:
            raise ModelDownloadError(f"{self.ref}: {remote.path}: downloaded {got} bytes of {size}")
        if expected is not None:
            if sink.digest is None:  # the transfer started over part way: hash the file whole
                sink.digest = expected[0]()
                with open(partial, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        sink.digest.update(chunk)
            want, got_digest = expected[1], sink.digest.hexdigest()
            if got_digest != want:
                partial.unlink(missing_ok=True)
                raise ModelDownloadError(
                    f"{self.ref}: {remote.path}: the download's {expected[2]} is {got_digest}, but the Hub lists "
                    f"{want}; it was deleted, and nothing was cached")
        os.replace(partial, blob)
        log.info("%s: %s verified (%s) into %s", self.ref, remote.path, expected[2] if expected else "size", blob)


def _partial_path(blob: Path) -> Path:
    return blob.with_name(blob.name + ".incomplete")


def _expected_digest(remote: _Remote, meta, size: Optional[int]):
    """(new hasher, the digest the Hub lists, its name), or None when it lists none: the LFS
    sha256 of the listing; else an LFS file's ETag, which is its sha256; else, for a file
    outside LFS (whose ETag is its git blob id), that id."""
    if remote.sha256:
        return hashlib.sha256, remote.sha256.lower(), "sha256"
    if re.fullmatch(r"[0-9a-f]{64}", meta.etag or ""):
        return hashlib.sha256, meta.etag, "sha256"
    if remote.blob_id and meta.etag == remote.blob_id and size is not None:  # sha1("blob SIZE\\0" + bytes)
        def git_blob():
            h = hashlib.sha1()
            h.update(b"blob %d\0" % size)
            return h
        return git_blob, remote.blob_id.lower(), "git blob id"
    return None


def _same_host(a: str, b: str) -> bool:
    try:
        from huggingface_hub.utils._http import _is_same_or_hub_host
        return bool(_is_same_or_hub_host(a, b))
    except ImportError:  # pragma: no cover - a huggingface_hub without it
        return urlparse(a).netloc == urlparse(b).netloc


class _Sink:
    """The file huggingface_hub's http_get writes to: hashes and counts what it writes, and
    follows its rewind when a server ignores the Range (truncate to where the transfer began)."""

    def __init__(self, file, digest, transfer: _Transfer, start: int):
        self.file, self.digest, self.transfer, self.start = file, digest, transfer, start

    def write(self, data) -> int:
        self.file.write(data)
        if self.digest is not None:
            self.digest.update(data)
        self.transfer.done += len(data)
        self.transfer._report()
        return len(data)

    def tell(self) -> int:
        return self.file.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def truncate(self, size: Optional[int] = None) -> int:
        self.file.flush()
        position = self.file.tell() if size is None else size
        dropped = os.fstat(self.file.fileno()).st_size - position
        result = self.file.truncate(position)
        self.transfer.done -= dropped
        if dropped:
            self.digest = None  # the file is hashed whole at the end
        return result

    def flush(self) -> None:
        self.file.flush()
