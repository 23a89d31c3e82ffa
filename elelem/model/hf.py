"""Models from the Hugging Face Hub: ``hf://ORG/REPO[@REVISION][:QUANT]``, ``hf.co/ORG/REPO[:QUANT]``
and ``hf://ORG/REPO[@REVISION]/PATH/FILE.gguf``.

The quant is chosen as llama.cpp's ``-hf`` chooses it (common/download.cpp,
``find_best_model``): a tag matches a GGUF whose name holds it followed by ``.``
or ``-``, in any case; without a tag, Q4_K_M, then Q8_0, then the first model GGUF.
mmproj, imatrix and draft files are never chosen.  A split model
(``name-00001-of-00003.gguf``) is every one of its files.  Its companions --
the vision projector and the drafters a repository ships beside its models
(``mmproj-*``, ``mtp-*``) -- come with :func:`pull_companion`, chosen as
llama.cpp's ``-hf`` chooses them (``find_best_sibling``).

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

References and the choice of files are in :mod:`.hf_reference`, the cache in
:mod:`.hf_cache` and the transfers in :mod:`.hf_download`; this module pulls
and resolves, and names them all.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from pathlib import Path
from typing import Optional

from ..errors import ElelemError, ModelDownloadError, ModelNotFoundError
from .hf_cache import (
    CachedModel,
    _cached_extra,
    _cached_or_raise,
    _offline,
    _snapshot_files,
    _storage,
    _write_ref,
    cache_root,
    cached,
    cached_files,
    list_cached,
    remove,
)
from .hf_download import ProgressFn, _first_line, _Remote, _status, _Transfer, _transport_errors
from .hf_reference import (
    DEFAULT_QUANTS,
    DRAFTERS,
    NOT_MODELS,
    PROJECTOR,
    PREFIXES,
    HubRef,
    available_quants,
    choose_companion,
    choose_files,
    is_model_file,
    is_reference,
    model_sets,
    parse_reference,
)

__all__ = [
    "DEFAULT_QUANTS", "DRAFTERS", "NOT_MODELS", "PROJECTOR", "PREFIXES", "CachedModel", "HubRef", "ProgressFn",
    "available_quants", "cache_root", "cached", "cached_files", "choose_companion", "choose_files", "copy_to", "is_model_file",
    "is_reference", "list_cached", "model_sets", "parse_reference", "pull_companion", "pull_files", "pull_model", "remove",
    "resolve",
]

log = logging.getLogger("elelem")

INSTALL_HINT = "pip install 'elelem[hub]'"


def _hub():
    """huggingface_hub, or a ModelDownloadError that says how to install it."""
    try:
        import huggingface_hub
        from huggingface_hub import constants, file_download, utils  # noqa: F401
    except ImportError as error:
        raise ModelDownloadError(f"models from Hugging Face need huggingface_hub ({error}): {INSTALL_HINT}") \
            from None
    return huggingface_hub


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
    endpoint = hub.constants.ENDPOINT
    if _offline():
        if force:
            raise ModelDownloadError(f"{ref}: cannot pull again: HF_HUB_OFFLINE is set")
        paths = _cached_or_raise(ref, cache_dir, "HF_HUB_OFFLINE is set")
        return paths + _cached_extra(ref, cache_dir, extra_files) if extra_files else paths
    try:
        info = _model_info(hub, ref, token, ref.revision)
    except _Unreachable as error:
        cached_paths = None if force else cached_files(ref, cache_dir)
        if cached_paths is None:
            raise ModelDownloadError(f"{ref}: cannot reach {endpoint} ({error}), and the model "
                                     f"is not in the Hugging Face cache ({cache_root(cache_dir)})") from None
        log.warning("%s: cannot reach %s (%s); using the cached copy", ref, endpoint, error)
        return cached_paths + _cached_extra(ref, cache_dir, extra_files) if extra_files else cached_paths
    commit = info.sha
    if not commit:
        raise ModelDownloadError(f"{ref}: {endpoint} did not say which commit it serves")
    remotes = _remotes(info)
    chosen = choose_files(list(remotes), ref)
    for pattern in extra_files:
        extra = [p for p in sorted(remotes) if fnmatch.fnmatchcase(p, pattern)]
        if not extra:
            raise ModelNotFoundError(f"{ref}: no file {pattern!r} in the repository")
        chosen += [p for p in extra if p not in chosen]
    log.info("%s: %s at commit %s", ref, ", ".join(chosen), commit[:12])
    root = cache_root(cache_dir)
    _run_transfer(hub, ref, commit, [remotes[p] for p in chosen], root, token, progress, force)
    _write_ref(_storage(root, ref.repo_id), ref.revision or "main", commit)
    return [_storage(root, ref.repo_id) / "snapshots" / commit / p for p in chosen]


class _Unreachable(Exception):
    """The Hub could not be reached (offline mode, no connection, a server error): the cache answers."""


def _model_info(hub, ref: HubRef, token, revision: Optional[str]):
    """The repository's listing at ``revision``, with each file's size and digest; its errors
    as elelem's (a gated, private or unknown repository, a refused token), or _Unreachable."""
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    endpoint = hub.constants.ENDPOINT
    has_token = bool(token) if token not in (None, True) else hub.utils.get_token() is not None
    try:
        return hub.HfApi().model_info(ref.repo_id, revision=revision, files_metadata=True, token=token)
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
        raise _Unreachable(_first_line(error)) from None


def _remotes(info) -> dict[str, _Remote]:
    """The repository's files by path, with what the listing says of each."""
    return {s.rfilename: _Remote(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
            for s in info.siblings or []}


def _run_transfer(hub, ref: HubRef, commit: str, remotes: list[_Remote], root: Path, token,
                  progress: Optional[ProgressFn], force: bool) -> None:
    try:
        _Transfer(hub, ref, commit, remotes, root, token, progress, force).run()
    except (OSError, *_transport_errors()) as error:
        if isinstance(error, ElelemError):
            raise
        raise ModelDownloadError(f"{ref}: the download failed: {_first_line(error)} (pull again to resume "
                                 f"it)") from error


def pull_companion(ref: HubRef | str, model: Path, keywords: tuple[str, ...], *, pull: bool = True, progress: Optional[ProgressFn] = None, force: bool = False,
                   token: str | bool | None = None) -> Optional[Path]:
    """The companion of ``model`` (a file of ``ref``'s snapshot in the cache, as
    :func:`pull_model` returns it) that the repository ships at the same commit: the file
    :func:`choose_companion` picks for the first of ``keywords`` that names one (a drafter near
    the reference's quant, as llama.cpp passes it for drafters but not for the projector),
    downloaded and verified as the model's files are; None where the
    repository has none.  Without the Hub (offline, ``pull=False``, out of reach) the snapshot
    in the cache answers."""
    ref = parse_reference(ref) if isinstance(ref, str) else ref
    snapshot = next((p for p in model.parents if p.parent.name == "snapshots"), None)
    if snapshot is None:
        raise ModelNotFoundError(f"{model} is not a file of a Hugging Face cache snapshot")
    model_file, commit = model.relative_to(snapshot).as_posix(), snapshot.name

    def pick(files: list[str]) -> Optional[str]:
        for keyword in keywords:
            found = choose_companion(files, model_file, keyword, None if keyword == PROJECTOR else ref.quant)
            if found is not None:
                return found
        return None

    def from_cache() -> Optional[Path]:
        found = pick(_snapshot_files(snapshot))
        return None if found is None else snapshot / found

    if not pull or _offline():
        return from_cache()
    hub = _hub()
    try:
        info = _model_info(hub, ref, token, commit)
    except _Unreachable as error:
        log.warning("%s: cannot reach %s (%s); looking for its %s in the cache", ref, hub.constants.ENDPOINT,
                    error, "/".join(keywords))
        return from_cache()
    remotes = _remotes(info)
    chosen = pick(list(remotes))
    if chosen is None:
        return None
    log.info("%s: %s beside %s at commit %s", ref, chosen, model_file, commit[:12])
    _run_transfer(hub, ref, commit, [remotes[chosen]], snapshot.parent.parent.parent, token, progress, force)
    return snapshot / chosen


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
