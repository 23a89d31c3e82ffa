#!/usr/bin/env python3
"""Rebuild third_party/ggml from the pinned llama-cpp-python sdist.

    python scripts/vendor_ggml.py            # download the pinned sdist with pip
    python scripts/vendor_ggml.py --sdist F  # use an sdist already on disk

The sdist's sha256 is checked before anything is copied, so an upgrade means:
change PIN_VERSION and PIN_SHA256 below, run this script, rebuild, run the tests.
The tree is copied unmodified; only whole backends are left out.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PIN_PACKAGE = "llama-cpp-python"
PIN_VERSION = "0.3.36"
PIN_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
GGML_IN_SDIST = "vendor/llama.cpp/ggml"
LICENSE_IN_SDIST = "vendor/llama.cpp/LICENSE"

# Backends under ggml/src that are kept besides the core: the CPU backend runs
# everything else; CUDA, Vulkan and Metal run layers on GPUs, RPC on other machines.
KEPT_BACKENDS = {"ggml-cpu", "ggml-cuda", "ggml-metal", "ggml-rpc", "ggml-vulkan"}

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "third_party" / "ggml"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_sdist(into: Path) -> Path:
    # --no-build-isolation: pip only needs the sdist's metadata, and building
    # scikit-build-core from source (what --no-binary :all: would do) is slow.
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps",
         "--no-binary", PIN_PACKAGE, "--no-build-isolation",
         f"{PIN_PACKAGE}=={PIN_VERSION}", "-d", str(into)],
        check=True,
    )
    (sdist,) = into.glob("*.tar.gz")
    return sdist


def left_out(src_dir: Path) -> list[str]:
    return sorted(
        p.name for p in src_dir.iterdir()
        if p.is_dir() and p.name.startswith("ggml-") and p.name not in KEPT_BACKENDS
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, help="a local copy of the pinned sdist")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sdist = args.sdist or download_sdist(tmp)
        digest = sha256_of(sdist)
        if digest != PIN_SHA256:
            print(f"sha256 mismatch for {sdist}: {digest} != {PIN_SHA256}", file=sys.stderr)
            return 1
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp / "x", filter="data")
        (top,) = (tmp / "x").iterdir()
        ggml = top / GGML_IN_SDIST

        dropped = left_out(ggml / "src")
        if DEST.exists():
            shutil.rmtree(DEST)
        DEST.mkdir(parents=True)
        shutil.copy2(ggml / "CMakeLists.txt", DEST / "CMakeLists.txt")
        shutil.copytree(ggml / "include", DEST / "include")
        shutil.copytree(ggml / "cmake", DEST / "cmake")
        shutil.copytree(ggml / "src", DEST / "src",
                        ignore=lambda d, names: [n for n in names if Path(d) == ggml / "src" and n in dropped])
        shutil.copy2(top / LICENSE_IN_SDIST, DEST / "LICENSE")
        (DEST / "VENDORED.md").write_text(vendored_md(digest, dropped))
    print(f"vendored ggml from {PIN_PACKAGE} {PIN_VERSION} into {DEST.relative_to(ROOT)}")
    return 0


def vendored_md(digest: str, dropped: list[str]) -> str:
    version = "unknown"
    for line in (DEST / "CMakeLists.txt").read_text().splitlines():
        for part in ("MAJOR", "MINOR", "PATCH"):
            if line.startswith(f"set(GGML_VERSION_{part} "):
                version = version if version != "unknown" else ""
                version += ("." if version else "") + line.split()[1].rstrip(")")
    dropped_list = "\n".join(f"- `src/{d}/`" for d in dropped)
    return f"""# Vendored ggml

This tree is ggml {version}, copied unmodified from the PyPI sdist of
`{PIN_PACKAGE}=={PIN_VERSION}`, path `{GGML_IN_SDIST}`.

- sdist sha256: `{digest}`
- licence: `LICENSE` (MIT), copied from `{LICENSE_IN_SDIST}` in the same sdist

## Kept

`CMakeLists.txt`, `include/`, `cmake/` and `src/` with the ggml core, gguf,
the CPU backend, and the CUDA, Vulkan, Metal and RPC backends' sources.

## Left out

Backends elelem does not build:

{dropped_list}

## Rebuild or upgrade

    python scripts/vendor_ggml.py

downloads the pinned sdist with pip, checks its sha256 and rewrites this tree
(this file included). To upgrade, change `PIN_VERSION` and `PIN_SHA256` in
`scripts/vendor_ggml.py`, run it, then `pip install .` and the test suite.
"""


if __name__ == "__main__":
    sys.exit(main())
