"""llama.cpp's vocabulary test files and real chat templates, from the pinned llama-cpp-python sdist.

llama.cpp checks its tokenizers with ``models/ggml-vocab-<name>.gguf`` (a
vocabulary without weights) and, for most, ``.gguf.inp`` (texts separated by a
``__ggml_vocab_test__`` line) and ``.gguf.out`` (their ids, one line each; see
llama.cpp's tests/test-tokenizer-0.cpp), and keeps real models' chat templates in
``models/templates/*.jinja``.  They ship in the PyPI sdist of the
llama-cpp-python version elelem pins (scripts/vendor_ggml.py: PIN_VERSION,
PIN_SHA256), 1-16 MB per vocabulary, so they are not in this repository.

:func:`models_dir` fetches the sdist once with pip (``pip download --no-deps
--no-binary llama-cpp-python``), checks its sha256, and unpacks only those files
into ``$ELELEM_CACHE/reference/llama-cpp-python-<version>-models/`` (the cache of
scripts/reference_llamacpp.py); later calls reuse it.  With
``ELELEM_LLAMACPP_SDIST=<path to llama_cpp_python-<version>.tar.gz>`` a copy
already on disk is used instead of pip.  Tests that call it need the network
the first time, like the packaged models: they are marked ``real_model``.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEPARATOR = "\n__ggml_vocab_test__\n"  # between the texts of a .inp file (test-tokenizer-0.cpp)


@functools.cache
def _pin():
    """scripts/vendor_ggml.py (standard library only), for its pinned package, version and sha256."""
    spec = importlib.util.spec_from_file_location("vendor_ggml", ROOT / "scripts" / "vendor_ggml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cache_root() -> Path:
    return Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem")) / "reference"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wanted(member: tarfile.TarInfo) -> str | None:
    """The path under models/ to unpack ``member`` to, or None: only vocab test files and templates."""
    marker = "/vendor/llama.cpp/models/"
    at = member.name.find(marker)
    if at < 0 or not member.isfile():
        return None
    rest = member.name[at + len(marker):].split("/")
    if len(rest) == 1 and rest[0].startswith("ggml-vocab-"):
        return rest[0]
    if len(rest) == 2 and rest[0] == "templates" and rest[1] and not rest[1].startswith("."):
        return "templates/" + rest[1]
    return None


def _download(into: Path) -> Path:
    pin = _pin()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", pin.PIN_PACKAGE,
           f"{pin.PIN_PACKAGE}=={pin.PIN_VERSION}", "-d", str(into)]
    if importlib.util.find_spec("scikit_build_core") is not None:
        cmd.insert(4, "--no-build-isolation")  # pip prepares the sdist's metadata with its build backend
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"could not download the llama-cpp-python sdist ({done.returncode}): {' '.join(cmd)}\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    (sdist,) = into.glob("*.tar.gz")
    return sdist


def _unpack(sdist: Path, into: Path) -> int:
    count = 0
    with tarfile.open(sdist) as tar:
        for member in tar:
            relative = _wanted(member)
            if relative is None:
                continue
            target = into / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            count += 1
    return count


@functools.cache
def models_dir() -> Path:
    """The sdist's ``vendor/llama.cpp/models`` (vocab test files and templates/ only), fetched once."""
    pin = _pin()
    final = _cache_root() / f"llama-cpp-python-{pin.PIN_VERSION}-models"
    if (final / "sdist_sha256").is_file():
        return final
    import fcntl  # POSIX; only the tests that need the sdist get here

    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent test run waits here
        if (final / "sdist_sha256").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
        try:
            given = os.environ.get("ELELEM_LLAMACPP_SDIST")
            sdist = Path(given) if given else _download(tmp / "download")
            digest = _sha256(sdist)
            if digest != pin.PIN_SHA256:
                raise RuntimeError(f"{sdist}: sha256 {digest}, but scripts/vendor_ggml.py pins {pin.PIN_SHA256}")
            out = tmp / "models"
            if _unpack(sdist, out) == 0 or not any(out.glob("ggml-vocab-*.gguf")):
                raise RuntimeError(f"{sdist} has no vendor/llama.cpp/models/ggml-vocab-*.gguf")
            (out / "sdist_sha256").write_text(f"{digest}  {sdist.name}\n")
            os.chmod(out, 0o755)
            if final.exists():  # an unfinished directory (no sdist_sha256): replace it
                shutil.rmtree(final)
            os.rename(out, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def vocab_test_names() -> list[str]:
    """The <name> of every ggml-vocab-<name>.gguf that has .inp and .out files."""
    d = models_dir()
    return sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in d.glob("ggml-vocab-*.gguf")
                  if p.with_name(p.name + ".inp").is_file() and p.with_name(p.name + ".out").is_file())


def vocab_path(name: str) -> Path:
    return models_dir() / f"ggml-vocab-{name}.gguf"


def vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) of ggml-vocab-<name>.gguf.inp / .out, read as test-tokenizer-0.cpp reads them:
    the texts are split at SEPARATOR (a separator at the very end starts no text), the ids are
    the .out file's lines."""
    path = vocab_path(name)
    raw = path.with_name(path.name + ".inp").read_bytes().decode("utf-8")
    texts, pos = [], 0
    while pos < len(raw):
        end = raw.find(SEPARATOR, pos)
        if end < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:end])
        pos = end + len(SEPARATOR)
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").splitlines()
    if len(lines) != len(texts):
        raise ValueError(f"{path.name}: {len(texts)} texts in .inp but {len(lines)} lines in .out")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


def templates_dir() -> Path:
    return models_dir() / "templates"
