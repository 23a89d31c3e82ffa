#!/usr/bin/env python3
"""Build ggml's Vulkan backend module once, cache it, and put it into an installed elelem.

    python scripts/vulkan_module.py                 # build if needed, install into `import elelem`'s _lib
    python scripts/vulkan_module.py --check         # exit 0 if the cache has it, else 1

CI (.ci/run) installs elelem with pip (no Vulkan: the ordinary CPU build) and
then this: the same module ``ELELEM_VULKAN=1 pip install .`` would build --
the same CMake project (cmake/), the same vendored sources and headers --
built as the one target ``ggml-vulkan`` (with ggml-base beside it, which it
links), so the CPU modules are not compiled twice.  Its shaders take most of
the time (7 minutes on 2 quiet cores, 45 on 2 busy ones), so the module is cached in
``$ELELEM_CACHE/vulkan/<key>/`` (default ``~/.cache/elelem``), keyed by the
sha256 of what goes into it: the vendored ggml and Vulkan headers, the CMake
files, and the versions of glslc and the C++ compiler.

Needs Debian 12's glslc, libvulkan-dev and spirv-headers (mesa-vulkan-drivers
for lavapipe, to run the tests).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE = "libggml-vulkan.so"
INPUTS = ("third_party/ggml", "third_party/vulkan-headers", "cmake")
JOBS = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")


def cache_root() -> Path:
    return Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem")) / "vulkan"


def tool_version(*command: str) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as error:
        sys.exit(f"{command[0]} is needed ({error}); on Debian: apt-get install glslc libvulkan-dev spirv-headers")


def key() -> str:
    h = hashlib.sha256()
    for top in INPUTS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file():
                h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    for command in (("glslc", "--version"), (os.environ.get("CXX", "c++"), "--version")):
        h.update(tool_version(*command).encode())
    return h.hexdigest()[:24]


def cmake() -> str:
    try:
        import cmake as cmake_wheel
        return os.path.join(cmake_wheel.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        return "cmake"


def build(into: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="elelem-vulkan-") as tmp:
        out = Path(tmp) / "lib"
        args = [cmake(), "-S", str(ROOT / "cmake"), "-B", tmp, "-DCMAKE_BUILD_TYPE=Release",
                "-DELELEM_CPU_VARIANTS=native", "-DELELEM_VULKAN=ON", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
                "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out}",
                f"-DCMAKE_RUNTIME_OUTPUT_DIRECTORY={out}", "-DGGML_LLAMAFILE=ON", "-DGGML_OPENMP=OFF",
                "-DGGML_CCACHE=OFF"]   # setup.py's switches, for the same ggml-base
        try:
            import ninja
            args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={os.path.join(ninja.BIN_DIR, 'ninja')}"]
        except ImportError:
            pass
        subprocess.run(args, check=True)
        subprocess.run([cmake(), "--build", tmp, "--target", "ggml-vulkan", "-j", JOBS], check=True)
        staging = into.with_name(into.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        shutil.copyfile(out / MODULE, staging / MODULE)
        staging.rename(into)     # only a finished build looks ready


def installed_lib_dir() -> Path:
    found = subprocess.run([sys.executable, "-c", "import elelem._core as c; print(c.LIB_DIR)"],
                           capture_output=True, text=True, cwd=tempfile.gettempdir())
    if found.returncode != 0:
        sys.exit(f"no installed elelem to put the module into:\n{found.stderr}")
    return Path(found.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 0 if the module for these sources is cached")
    ap.add_argument("--lib-dir", type=Path, help="the elelem/_lib to put it into (default: the installed one's)")
    args = ap.parse_args()
    cached = cache_root() / key()
    if args.check:
        print(cached / MODULE)
        return 0 if (cached / MODULE).is_file() else 1
    if not (cached / MODULE).is_file():
        print(f"building {MODULE} into {cached} (several minutes: its shaders)", file=sys.stderr)
        build(cached)
    lib_dir = args.lib_dir or installed_lib_dir()
    shutil.copyfile(cached / MODULE, lib_dir / MODULE)
    print(lib_dir / MODULE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
