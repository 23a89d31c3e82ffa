"""The Hugging Face hub cache as elelem reads and tidies it: where it is, which models it
holds, and removing one.

The layout is huggingface_hub's (``models--ORG--REPO/{blobs,refs,snapshots}``),
so the files are shared with every other tool on the machine; these functions
need no network, and work without huggingface_hub installed.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ModelNotFoundError
from .hf_reference import HubRef, _complete, _matching, _split_info, choose_files, model_sets, parse_reference

_COMMIT = re.compile(r"[0-9a-f]{40}")


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


def _cached_extra(ref: HubRef, cache_dir, patterns: tuple[str, ...]) -> list[Path]:
    folder = _snapshot(_storage(cache_root(cache_dir), ref.repo_id), ref.revision)
    files = _snapshot_files(folder) if folder is not None else []
    out: list[Path] = []
    for pattern in patterns:
        found = [folder / p for p in files if fnmatch.fnmatchcase(p, pattern)] if folder is not None else []
        if not found:
            raise ModelNotFoundError(f"{ref}: no file {pattern!r} in the cached repository")
        out += found
    return out


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


@dataclass(frozen=True)
class CachedModel:
    ref: str           # a reference that names it (hf://ORG/REPO[@REV][:QUANT] or .../FILE.gguf)
    path: Path         # its first file
    files: int
    size: int          # bytes of its files


def list_cached(cache_dir: str | os.PathLike | None = None) -> list[CachedModel]:
    """Every complete GGUF model in the Hugging Face cache, by repository and commit."""
    root = cache_root(cache_dir)
    out: list[CachedModel] = []
    if not root.is_dir():
        return out
    for storage in sorted(root.glob("models--*")):
        repo_id = storage.name[len("models--"):].replace("--", "/", 1)
        if "/" not in repo_id:  # a repository without an organisation: no hf:// reference names it
            continue
        refs: dict[str, list[str]] = {}
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
