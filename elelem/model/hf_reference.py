"""References to models on the Hugging Face Hub, and which files of a repository a reference means.

``hf://ORG/REPO[@REVISION][:QUANT]``, ``hf.co/ORG/REPO[:QUANT]`` and
``hf://ORG/REPO[@REVISION]/PATH/FILE.gguf``.  The files are chosen as
llama.cpp's ``-hf`` chooses them (common/download.cpp, ``find_best_model``),
and so are the companions a repository ships beside its models -- the vision
projector (``mmproj-*``) and the drafters (``mtp-*``, ...) --
(``find_best_sibling``); nothing here touches the network or the cache.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Optional, TypeGuard

from ..errors import InvalidArgumentError, ModelNotFoundError

PREFIXES = ("hf://", "hf.co/", "huggingface.co/", "https://hf.co/", "https://huggingface.co/")
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's find_best_model, in order
# Never a model: projectors, importance matrices and the draft heads llama.cpp leaves out
# (gguf_filename_is_model), and files named as drafts.
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-", "draft")
#: What names a repository's vision projector, and its drafters in the order llama.cpp
#: infers the speculative type from them (common/arg.cpp, common_models_handler_apply):
#: the MTP head first, then DSpark, DFlash and EAGLE-3 heads.  Substrings of the path,
#: case-sensitive, as llama.cpp matches them.
PROJECTOR = "mmproj"
DRAFTERS = ("mtp-", "dspark-", "dflash-", "eagle3-")
_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)  # get_gguf_split_info
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


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


def is_reference(name: Any) -> TypeGuard[str]:
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


# -- companions: the projector and the drafters beside a model ---------------------------


def quant_bits(path: str) -> int:
    """The bits of a file's quant tag: Q4_K_M 4, BF16 16, MXFP4 4, none 0 (llama.cpp's extract_quant_bits)."""
    return _tag_bits(_split_info(path).tag)


def _tag_bits(tag: str) -> int:
    digits = re.search(r"[0-9]+", tag)
    return int(digits[0]) if digits else 0


def choose_companion(files: list[str], model: str, keyword: str, tag: Optional[str] = None) -> Optional[str]:
    """The GGUF among ``files`` whose path holds ``keyword`` that goes with the model file
    ``model``, or None: llama.cpp's find_best_sibling.  Only a file in the model's folder or
    in a folder above it counts, the deepest first; then, given a quant ``tag`` (the
    reference's ``:QUANT``, which llama.cpp passes for drafters), a file named ``-TAG.``;
    then the quant whose bits are closest to the tag's, or to the model file's without
    one; the first in path order at a tie."""
    model_dir = model.split("/")[:-1]
    tag = (tag or "").upper()
    wanted = _tag_bits(tag) if tag else quant_bits(model)
    best: Optional[tuple] = None
    for path in sorted(files):
        if not path.endswith(".gguf") or keyword not in path:
            continue
        folder = path.split("/")[:-1]
        if folder != model_dir[:len(folder)]:
            continue
        exact = bool(tag) and f"-{tag}." in path.upper()
        rank = (-len(folder), not exact, abs(quant_bits(path) - wanted))
        if best is None or rank < best[0]:
            best = (rank, path)
    return None if best is None else best[1]
