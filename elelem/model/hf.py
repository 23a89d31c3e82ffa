"""Models from the Hugging Face Hub: ``hf://ORG/REPO[@REVISION][:QUANT]``, ``hf.co/ORG/REPO[:QUANT]``
and ``hf://ORG/REPO[@REVISION]/PATH/FILE.gguf``.

The quant is chosen as llama.cpp's ``-hf`` chooses it (common/download.cpp,
``find_best_model``): a tag matches a GGUF whose name holds it followed by ``.``
or ``-``, in any case; without a tag, Q4_K_M, then Q8_0, then the first model GGUF.
mmproj, imatrix and draft files are never chosen.  A split model
(``name-00001-of-00003.gguf``) is every one of its files.

``huggingface_hub`` (``pip install 'elelem[hub]'``) does every transfer, into
the standard Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME``), so the files
are shared with every other tool on the machine; it honours ``HF_ENDPOINT``,
``HF_TOKEN`` (or ``hf auth login``) and ``HF_HUB_OFFLINE=1``.  What elelem adds:

- **resume across processes.**  huggingface_hub 2.x writes each attempt to a
  new ``<etag>.<random>.incomplete`` file and deletes it on failure, so only a
  retry inside one ``http_get`` call resumes (its issue #4196, PR #4306).
  elelem keeps the partial file itself, at the stable name
  ``blobs/<etag>.incomplete`` (huggingface_hub 1.x's, under huggingface_hub's own
  lock for that blob), and hands it to huggingface_hub's ``http_get`` with
  ``resume_size``: the bytes still travel through huggingface_hub (its headers,
  retries, proxies and redirects), and an interrupted pull -- a dropped
  connection, Ctrl-C, a killed process -- continues where it stopped.
- **the LFS sha256.**  huggingface_hub checks only the size.  elelem hashes
  the bytes as they arrive and compares the digest with the sha256 the Hub
  lists for the file (the git blob id for a file outside LFS); a mismatch
  deletes the download, so nothing bad is ever cached under the final name.
- the blob then takes its final name in one rename, and huggingface_hub's
  ``hf_hub_download`` links it into the snapshot as it links any blob.

A model already in the cache at the current commit costs one API call; a
file whose ETag (its sha256) has not changed since the last pull is linked,
not downloaded again.  Without a connection (or with ``HF_HUB_OFFLINE=1``)
the cache alone answers.
"""
from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlparse

from ..errors import ElelemError, InvalidArgumentError, ModelDownloadError, ModelNotFoundError

log = logging.getLogger("elelem")

#: progress(stage, done, total), as elelem.model.hub's: stage "download"; bytes of the whole set.
ProgressFn = Callable[[str, int, int], None]

PREFIXES = ("hf://", "hf.co/", "huggingface.co/", "https://hf.co/", "https://huggingface.co/")
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's find_best_model, in order
# Never a model: projectors, importance matrices and the draft heads llama.cpp leaves out
# (gguf_filename_is_model), and files named as drafts.
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-", "draft")
INSTALL_HINT = "pip install 'elelem[hub]'"
_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)  # get_gguf_split_info
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_CHUNK = 8 << 20


# -- references ---------------------------------------------------------------------


@dataclass(frozen=True)
class HubRef:
    """A parsed reference to a model on the Hub."""

    repo_id: str
    revision: Optional[str] = None  # None: "main"
    quant: Optional[str] = None     # a tag such as Q4_K_M
    filename: Optional[str] = None  # a path in the repository, or (from_pretrained) a glob

    def __str__(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        if self.filename:
            return f"hf://{self.repo_id}{at}/{self.filename}"
        return f"hf://{self.repo_id}{at}" + (f":{self.quant}" if self.quant else "")


def is_reference(name: Any) -> bool:
    """Whether ``name`` names a model on the Hub (``hf://...``, ``hf.co/...``)."""
    return isinstance(name, str) and name.startswith(PREFIXES)


def parse_reference(text: str) -> HubRef:
    """``hf://ORG/REPO[@REVISION][:QUANT]``, ``hf.co/ORG/REPO[:QUANT]`` (ollama's spelling;
    ``:latest`` means no tag) or ``hf://ORG/REPO[@REVISION]/PATH/FILE.gguf``."""
    rest = next((text[len(p):] for p in PREFIXES if text.startswith(p)), None)
    if rest is None:
        raise InvalidArgumentError(f"{text!r} is not a Hugging Face reference (hf://ORG/REPO[:QUANT])")
    parts = rest.split("/", 2)
    if len(parts) < 2:
        raise InvalidArgumentError(f"{text!r}: expected hf://ORG/REPO[@REVISION][:QUANT] or hf://ORG/REPO/FILE.gguf")
    org, repo = parts[0], parts[1]
    filename = parts[2] if len(parts) == 3 else None
    quant = revision = None
    if filename is None and ":" in repo:
        repo, quant = repo.rsplit(":", 1)
        if not quant or not re.fullmatch(r"[A-Za-z0-9_.-]+", quant):
            raise InvalidArgumentError(f"{text!r}: {quant!r} is not a quant tag (such as Q4_K_M)")
        if quant.lower() == "latest":  # ollama's default tag
            quant = None
    if "@" in repo:
        repo, revision = repo.split("@", 1)
        if not revision or "/" in revision or ":" in revision:
            raise InvalidArgumentError(f"{text!r}: {revision!r} is not a revision")
    for part in (org, repo):
        if not _NAME_PART.fullmatch(part) or ".." in part or "--" in part or part.endswith((".", "-")):
            raise InvalidArgumentError(f"{text!r}: {part!r} is not a valid organisation or repository name")
    if filename is not None:
        if not filename.lower().endswith(".gguf") or filename.startswith("/") or ".." in filename.split("/"):
            raise InvalidArgumentError(f"{text!r}: the file must be a .gguf path in the repository")
    return HubRef(f"{org}/{repo}", revision, quant, filename)


# -- choosing the files, as llama.cpp does ---------------------------------------------


@dataclass(frozen=True)
class _SplitInfo:
    prefix: str  # the name without .gguf and without the -NNNNN-of-NNNNN part; the tag included
    tag: str     # the quant, upper case ("" when the name has none)
    index: int   # from 1
    count: int


def _split_info(path: str) -> _SplitInfo:
    prefix = path[:-5] if path.lower().endswith(".gguf") else path
    index = count = 1
    match = _SPLIT.match(prefix)
    if match:
        prefix, index, count = match[1], int(match[2]), int(match[3])
    tag = _TAG.search(prefix)
    return _SplitInfo(prefix, tag[1].upper() if tag else "", index, count)


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and not any(word in name for word in NOT_MODELS)


def model_sets(files: list[str]) -> list[list[str]]:
    """The models among ``files``: each a list of paths, one file or every file of a split
    model in order (incomplete splits included, as found); sorted by path."""
    sets: dict[tuple, list[str]] = {}
    for path in sorted(files):
        if not is_model_file(path):
            continue
        info = _split_info(path)
        key = (info.prefix, info.count) if info.count > 1 else (path, 1)
        sets.setdefault(key, []).append(path)
    for paths in sets.values():
        paths.sort(key=lambda p: _split_info(p).index)
    return sorted(sets.values(), key=lambda paths: paths[0])


def available_quants(files: list[str]) -> list[str]:
    """The quant tags of the models among ``files`` (a file's name where it has no tag)."""
    return sorted({_split_info(s[0]).tag or s[0] for s in model_sets(files)})


def choose_files(files: list[str], ref: HubRef) -> list[str]:
    """The files of the model ``ref`` names among the repository's ``files`` (first file first).

    Raises ModelNotFoundError, listing what the repository has, when no model matches, when a
    tag or glob matches more than one, or when a split model lacks some of its files."""
    sets = model_sets(files)
    where = f"{ref}"
    if ref.filename is not None:
        if ref.filename in files:
            info = _split_info(ref.filename)
            chosen = next((s for s in sets if ref.filename in s), [ref.filename])
            return _complete(chosen, where) if info.count > 1 else [ref.filename]
        matches = [s for s in sets if any(fnmatch.fnmatchcase(p, ref.filename) for p in s)]
        if not matches:  # a glob may name any GGUF (from_pretrained), not only a model
            matches = [[p] for p in sorted(files) if fnmatch.fnmatchcase(p, ref.filename)]
        if len(matches) == 1:
            return _complete(matches[0], where)
        listing = ", ".join(p for p in sorted(files) if p.lower().endswith(".gguf")) or "no GGUF files"
        if not matches:
            raise ModelNotFoundError(f"{where}: no file {ref.filename!r} in the repository; it has: {listing}")
        raise ModelNotFoundError(f"{where}: {ref.filename!r} matches {len(matches)} models "
                                 f"({', '.join(s[0] for s in matches)}); name one of them")
    if not sets:
        listing = ", ".join(sorted(files)) or "no files"
        raise ModelNotFoundError(f"{where}: the repository has no GGUF model (it has: {listing})")
    quants = ", ".join(available_quants(files))
    if ref.quant is not None:
        matches = _matching(sets, ref.quant)
        if not matches:
            raise ModelNotFoundError(f"{where}: no GGUF matches the quant {ref.quant!r}; "
                                     f"the repository has: {quants}")
        if len(matches) > 1:
            raise ModelNotFoundError(f"{where}: the quant {ref.quant!r} matches {len(matches)} models "
                                     f"({', '.join(s[0] for s in matches)}); the repository has: {quants}")
        return _complete(matches[0], where)
    for tag in DEFAULT_QUANTS:
        matches = _matching(sets, tag)
        if matches:
            return _complete(matches[0], where)
    return _complete(sets[0], where)


def _matching(sets: list[list[str]], tag: str) -> list[list[str]]:
    """The models whose file names hold ``tag`` then ``.`` or ``-`` (llama.cpp's regex, any case);
    where several do, those whose own tag is exactly ``tag`` (Q8_0 is not IQ8_0)."""
    pattern = re.compile(re.escape(tag) + "[.-]", re.IGNORECASE)
    found = [s for s in sets if any(pattern.search(p) for p in s)]
    exact = [s for s in found if _split_info(s[0]).tag == tag.upper()]
    return exact if len(found) > 1 and exact else found


def _complete(paths: list[str], where: str) -> list[str]:
    info = _split_info(paths[0])
    if info.count > 1 and [_split_info(p).index for p in paths] != list(range(1, info.count + 1)):
        raise ModelNotFoundError(f"{where}: the split model {info.prefix} needs {info.count} files; "
                                 f"found {len(paths)}: {', '.join(paths)}")
    return paths


# -- huggingface_hub and its cache ----------------------------------------------------


def _hub():
    """huggingface_hub, or a ModelDownloadError that says how to install it."""
    try:
        import huggingface_hub
        from huggingface_hub import constants, file_download, utils  # noqa: F401
    except ImportError as error:
        raise ModelDownloadError(f"models from Hugging Face need huggingface_hub ({error}): {INSTALL_HINT}") \
            from None
    return huggingface_hub


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The Hugging Face hub cache: ``cache_dir``, else huggingface_hub's (``HF_HUB_CACHE``,
    else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), worked out the same way
    without it."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    try:
        from huggingface_hub import constants
        return Path(constants.HF_HUB_CACHE).expanduser()
    except ImportError:
        pass
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                or os.path.join(home, "hub")).expanduser()


def _offline() -> bool:
    try:
        from huggingface_hub import constants
        return bool(constants.is_offline_mode())
    except ImportError:
        return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _storage(root: Path, repo_id: str) -> Path:
    return root / ("models--" + repo_id.replace("/", "--"))  # huggingface_hub's repo_folder_name


def _snapshot(storage: Path, revision: Optional[str]) -> Optional[Path]:
    """The snapshot folder of ``revision`` (a branch, tag or commit) in the cache, if any."""
    revision = revision or "main"
    commit = revision if _COMMIT.fullmatch(revision) else None
    if commit is None:
        try:
            commit = (storage / "refs" / revision).read_text().strip()
        except OSError:
            return None
    folder = storage / "snapshots" / commit
    return folder if folder.is_dir() else None


def _snapshot_files(folder: Path) -> list[str]:
    """The files of a snapshot whose blob is present, as repository paths."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def cached(ref: HubRef | str, cache_dir: str | os.PathLike | None = None) -> Optional[Path]:
    """The path of ``ref``'s model (its first file) in the cache, or None; no network."""
    files = cached_files(ref, cache_dir)
    return files[0] if files else None


def cached_files(ref: HubRef | str, cache_dir: str | os.PathLike | None = None) -> Optional[list[Path]]:
    """Every file of ``ref``'s model in the cache (first first), or None; no network."""
    ref = parse_reference(ref) if isinstance(ref, str) else ref
    folder = _snapshot(_storage(cache_root(cache_dir), ref.repo_id), ref.revision)
    if folder is None:
        return None
    try:
        files = choose_files(_snapshot_files(folder), ref)
    except ModelNotFoundError:
        return None
    return [folder / f for f in files]


def _cached_or_raise(ref: HubRef, cache_dir, reason: str) -> list[Path]:
    paths = cached_files(ref, cache_dir)
    if paths is not None:
        return paths
    folder = _snapshot(_storage(cache_root(cache_dir), ref.repo_id), ref.revision)
    if folder is not None:
        choose_files(_snapshot_files(folder), ref)  # raises, listing the cached quants
    raise ModelNotFoundError(f"{ref} is not in the Hugging Face cache ({cache_root(cache_dir)}), and {reason}")


# -- pulling -------------------------------------------------------------------------


@dataclass
class _Remote:
    path: str
    size: Optional[int]
    sha256: Optional[str]   # from LFS
    blob_id: Optional[str]  # the git blob id (sha1), for a file outside LFS


def resolve(ref: HubRef | str, *, pull: bool = True, progress: Optional[ProgressFn] = None,
            force: bool = False, token: str | bool | None = None,
            cache_dir: str | os.PathLike | None = None) -> Path:
    """The local path of ``ref``'s model (its first file), pulling it unless ``pull`` is false."""
    ref = parse_reference(ref) if isinstance(ref, str) else ref
    if not pull:
        return _cached_or_raise(ref, cache_dir, "pull=False")[0]
    return pull_model(ref, progress=progress, force=force, token=token, cache_dir=cache_dir)


def pull_model(ref: HubRef | str, *, progress: Optional[ProgressFn] = None, force: bool = False,
               token: str | bool | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """Download ``ref``'s model (every file of a split model) into the Hugging Face cache, verify
    each file's sha256, and return the path of its first file.  ``progress`` sees the bytes of
    the whole set.  Offline (HF_HUB_OFFLINE=1, or the Hub out of reach) the cache answers."""
    return pull_files(ref, progress=progress, force=force, token=token, cache_dir=cache_dir)[0]


def pull_files(ref: HubRef | str, *, progress: Optional[ProgressFn] = None, force: bool = False,
               token: str | bool | None = None, cache_dir: str | os.PathLike | None = None,
               extra_files: tuple[str, ...] = ()) -> list[Path]:
    """:func:`pull_model`, returning the path of every file: the model's, first first, then
    those of ``extra_files`` (globs of more files of the repository to fetch beside it)."""
    ref = parse_reference(ref) if isinstance(ref, str) else ref
    hub = _hub()
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    endpoint = hub.constants.ENDPOINT
    if _offline():
        if force:
            raise ModelDownloadError(f"{ref}: cannot pull again: HF_HUB_OFFLINE is set")
        paths = _cached_or_raise(ref, cache_dir, "HF_HUB_OFFLINE is set")
        return paths + _cached_extra(ref, cache_dir, extra_files) if extra_files else paths
    has_token = bool(token) if token not in (None, True) else hub.utils.get_token() is not None
    try:
        info = hub.HfApi().model_info(ref.repo_id, revision=ref.revision, files_metadata=True, token=token)
    except GatedRepoError:
        page = f"{endpoint}/{ref.repo_id}"
        raise ModelDownloadError(
            f"{ref}: the repository is gated: " + (f"your token has no access yet; accept its conditions at {page}"
                                                     if has_token else
                                                     f"accept its conditions at {page}, then log in "
                                                     f"('hf auth login') or set HF_TOKEN")) from None
    except RepositoryNotFoundError as error:
        if _status(error) == 401 and "Invalid credentials" in str(error):
            raise ModelDownloadError(f"{ref}: {endpoint} refused the token (HF_TOKEN or the saved login) "
                                     f"as invalid") from None
        raise ModelNotFoundError(
            f"{ref}: no repository {ref.repo_id} on {endpoint}" +
            (" that this token can read" if has_token else
             "; if it is private or gated, log in ('hf auth login') or set HF_TOKEN")) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{ref}: the repository {ref.repo_id} has no revision {ref.revision!r}") from None
    except (OfflineModeIsEnabled, OSError, *_transport_errors()) as error:
        if isinstance(error, HfHubHTTPError) and _status(error) not in (None, 500, 502, 503, 504):
            raise ModelDownloadError(f"{ref}: {endpoint} answered {_first_line(error)}") from None
        paths = None if force else cached_files(ref, cache_dir)
        if paths is None:
            raise ModelDownloadError(f"{ref}: cannot reach {endpoint} ({_first_line(error)}), and the model "
                                     f"is not in the Hugging Face cache ({cache_root(cache_dir)})") from None
        log.warning("%s: cannot reach %s (%s); using the cached copy", ref, endpoint, _first_line(error))
        return paths + _cached_extra(ref, cache_dir, extra_files) if extra_files else paths
    commit = info.sha
    if not commit:
        raise ModelDownloadError(f"{ref}: {endpoint} did not say which commit it serves")
    remotes = {s.rfilename: _Remote(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
               for s in info.siblings or []}
    chosen = choose_files(list(remotes), ref)
    for pattern in extra_files:
        extra = [p for p in sorted(remotes) if fnmatch.fnmatchcase(p, pattern)]
        if not extra:
            raise ModelNotFoundError(f"{ref}: no file {pattern!r} in the repository")
        chosen += [p for p in extra if p not in chosen]
    log.info("%s: %s at commit %s", ref, ", ".join(chosen), commit[:12])
    root = cache_root(cache_dir)
    try:
        _Transfer(hub, ref, commit, [remotes[p] for p in chosen], root, token, progress, force).run()
    except (OSError, *_transport_errors()) as error:
        if isinstance(error, ElelemError):
            raise
        raise ModelDownloadError(f"{ref}: the download failed: {_first_line(error)} (pull again to resume "
                                 f"it)") from error
    _write_ref(_storage(root, ref.repo_id), ref.revision or "main", commit)
    return [_storage(root, ref.repo_id) / "snapshots" / commit / p for p in chosen]


def _cached_extra(ref: HubRef, cache_dir, patterns: tuple[str, ...]) -> list[Path]:
    folder = _snapshot(_storage(cache_root(cache_dir), ref.repo_id), ref.revision)
    files = _snapshot_files(folder) if folder is not None else []
    out = []
    for pattern in patterns:
        found = [folder / p for p in files if fnmatch.fnmatchcase(p, pattern)]
        if not found:
            raise ModelNotFoundError(f"{ref}: no file {pattern!r} in the cached repository")
        out += found
    return out


def copy_to(files: list[Path], local_dir: str | os.PathLike, *, symlinks: bool = False) -> list[Path]:
    """Place ``files`` (in a snapshot of the cache) in ``local_dir`` under their repository paths:
    copies (hard links where the file system allows), or symbolic links to the cache."""
    out = []
    for path in files:
        snapshot = next(p for p in path.parents if p.parent.name == "snapshots")
        target = Path(local_dir) / path.relative_to(snapshot)
        target.parent.mkdir(parents=True, exist_ok=True)
        blob = path.resolve()
        if target.exists() and target.resolve() == blob:
            out.append(target)
            continue
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        if symlinks:
            tmp.symlink_to(blob)
        else:
            try:
                os.link(blob, tmp)
            except OSError:
                shutil.copyfile(blob, tmp)
        os.replace(tmp, target)
        out.append(target)
    return out


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


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/<branch or tag> -> commit, as huggingface_hub records it (so offline use finds it)."""
    if _COMMIT.fullmatch(revision):
        return
    path = storage / "refs" / revision
    try:
        if path.read_text() == commit:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, path)


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


# -- the cache: listing and removing ---------------------------------------------------


@dataclass(frozen=True)
class CachedModel:
    ref: str           # a reference that names it (hf://ORG/REPO[@REV][:QUANT] or .../FILE.gguf)
    path: Path         # its first file
    files: int
    size: int          # bytes of its files


def list_cached(cache_dir: str | os.PathLike | None = None) -> list[CachedModel]:
    """Every complete GGUF model in the Hugging Face cache, by repository and commit."""
    root = cache_root(cache_dir)
    out = []
    if not root.is_dir():
        return out
    for storage in sorted(root.glob("models--*")):
        repo_id = storage.name[len("models--"):].replace("--", "/", 1)
        if "/" not in repo_id:  # a repository without an organisation: no hf:// reference names it
            continue
        refs = {}
        for ref_file in sorted((storage / "refs").rglob("*")) if (storage / "refs").is_dir() else []:
            if ref_file.is_file():
                try:
                    refs.setdefault(ref_file.read_text().strip(), []).append(
                        ref_file.relative_to(storage / "refs").as_posix())
                except OSError:
                    continue
        for folder in sorted((storage / "snapshots").glob("*")):
            files = _snapshot_files(folder)
            sets = [s for s in model_sets(files) if _is_complete(s)]
            names = refs.get(folder.name, [])
            at = "" if "main" in names else f"@{names[0]}" if names else f"@{folder.name}"
            for paths in sets:
                tag = _split_info(paths[0]).tag
                ref = HubRef(repo_id, at[1:] or None, tag or None)
                if not tag or _matching(sets, tag) != [paths]:
                    ref = HubRef(repo_id, at[1:] or None, None, paths[0])
                out.append(CachedModel(str(ref), folder / paths[0], len(paths),
                                       sum(os.path.getsize(folder / p) for p in paths)))
    return out


def _is_complete(paths: list[str]) -> bool:
    try:
        _complete(paths, "")
        return True
    except ModelNotFoundError:
        return False


def remove(ref: HubRef | str, cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Delete ``ref``'s model from the cache: its snapshot links, and each blob no other snapshot
    links to; a repository left with no snapshot goes entirely.  Returns the links removed."""
    ref = parse_reference(ref) if isinstance(ref, str) else ref
    root = cache_root(cache_dir)
    storage = _storage(root, ref.repo_id)
    folder = _snapshot(storage, ref.revision)
    if folder is None:
        raise ModelNotFoundError(f"{ref} is not in the Hugging Face cache ({root})")
    files = choose_files(_snapshot_files(folder), ref)
    removed = []
    for path in files:
        link = folder / path
        blob = link.resolve()
        link.unlink()
        removed.append(link)
        if blob.parent == (storage / "blobs").resolve() and not _linked(storage, blob):
            blob.unlink(missing_ok=True)
    snapshots = storage / "snapshots"
    _prune(snapshots)
    if not snapshots.is_dir() or not any(snapshots.iterdir()):  # nothing of the repository is left
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(root / ".locks" / storage.name, ignore_errors=True)
    return removed


def _linked(storage: Path, blob: Path) -> bool:
    for link in (storage / "snapshots").rglob("*"):
        if link.is_symlink() and link.resolve() == blob:
            return True
    return False


def _prune(folder: Path) -> None:
    """Remove the empty folders under ``folder`` (not ``folder`` itself)."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            path.rmdir()

