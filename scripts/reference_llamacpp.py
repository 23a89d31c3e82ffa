"""Build llama.cpp (llama-cpp-python 0.3.36 from its PyPI sdist) as this machine's reference.  DEV-ONLY.

elelem claims the same tokens as llama.cpp *on the same machine*: ggml picks
its kernels (and so its summation order) from the CPU and the compiler, so a
reference made elsewhere cannot be compared bit for bit.  This script builds
llama-cpp-python once per machine into a cached virtual environment that the
tests (tests/support/llamacpp_reference.py) run in a subprocess.  It is never a
runtime or test dependency of elelem itself::

    python scripts/reference_llamacpp.py            # build if needed, print the reference python
    python scripts/reference_llamacpp.py --check    # exit 0 and print it if ready, else exit 1

The cache lives in ``$ELELEM_CACHE/reference/`` (default ``~/.cache/elelem``),
one directory per fingerprint: CPU model and the /proc/cpuinfo flags ggml's
native build looks at, the C/C++ compiler, the Python version, the
llama-cpp-python version and the CMake arguments.  Another machine, compiler or
option gets another directory.  The build happens in a temporary directory that
is renamed into place only once it imports, so an interrupted build leaves
nothing that looks ready.

Build options mirror elelem's own native build (setup.py): GGML_NATIVE=ON,
GGML_LLAMAFILE=ON (llama.cpp's own default, unlike ggml's), CPU only.  On a CPU
with AMX, GCC < 13 miscompiles ggml's AMX tile setup, so AMX is
compiled out with ``-mno-amx-*``.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERSION = "0.3.36"
PACKAGE = f"llama-cpp-python=={VERSION}"
# What the tests' generator scripts import inside the reference environment.
EXTRA_PACKAGES = ("numpy", "gguf")
# ggml's native build (GGML_NATIVE=ON -> -march=native) enables kernels by these.
CPU_FLAG_PATTERN = re.compile(r"^(pni|ssse3|sse4_1|sse4_2|avx|avx2|fma|f16c|bmi2|avx_vnni|avx512.*|amx.*)$")  # pni = SSE3
AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
BUILD_JOBS = "2"


def cache_root() -> Path:
    return Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem")) / "reference"


def cpu_info() -> tuple[str, list[str]]:
    """The CPU model name and its ggml-relevant flags, from /proc/cpuinfo (first processor)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == (platform.processor() or platform.machine()):
            model = value.strip()
        elif key == "flags" and not flags:
            flags = sorted(f for f in value.split() if CPU_FLAG_PATTERN.match(f))
    return model, flags


def has_amx(flags: list[str]) -> bool:
    return "amx_int8" in flags or "amx_tile" in flags


def compiler_version(name: str) -> str:
    cc = os.environ.get(name) or {"CC": "cc", "CXX": "c++"}[name]
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return f"{cc}: unavailable ({e})"
    return f"{cc}: {out.splitlines()[0].strip()}"


def cmake_args(flags: list[str]) -> list[str]:
    args = ["-DGGML_NATIVE=ON", "-DGGML_LLAMAFILE=ON", "-DGGML_CPU_REPACK=ON", "-DGGML_OPENMP=ON",
            "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DGGML_BLAS=OFF",
            "-DLLAVA_BUILD=ON", "-DCMAKE_BUILD_TYPE=Release"]
    if has_amx(flags):
        args += [f"-DCMAKE_C_FLAGS={AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={AMX_FLAGS}"]
    return args


def fingerprint() -> dict:
    """Everything that decides which kernels the reference runs and how they were compiled."""
    model, flags = cpu_info()
    return {
        "llama_cpp_python": VERSION,
        "cpu_model": model,
        "cpu_flags": flags,
        "machine": platform.machine(),
        "cc": compiler_version("CC"),
        "cxx": compiler_version("CXX"),
        "python": platform.python_version(),
        "cmake_args": cmake_args(flags),
    }


def fingerprint_key(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def reference_dir(fp: dict | None = None) -> Path:
    fp = fingerprint() if fp is None else fp
    return cache_root() / f"llama-cpp-python-{VERSION}-{fingerprint_key(fp)}"


def reference_python(fp: dict | None = None) -> Path | None:
    """The ready reference interpreter for this machine, or None if it has not been built."""
    d = reference_dir(fp)
    py = d / "venv" / "bin" / "python"
    return py if (d / "fingerprint.json").is_file() and py.exists() else None


def log(msg: str) -> None:
    print(f"[reference {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_logged(cmd: list[str], logfile: Path, env: dict | None = None) -> None:
    """Run cmd, all output into logfile; show ninja/make progress lines ([12/300]) on stderr."""
    progress = re.compile(r"^\s*(\[\s*\d+/\d+\]|\[\s*\d+%\])")
    last = 0.0
    with open(logfile, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                errors="replace")
        for line in proc.stdout:
            f.write(line)
            if progress.match(line) and time.monotonic() - last > 15:
                last = time.monotonic()
                log(line.strip()[:120])
        if proc.wait() != 0:
            raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd[:6])} ...; see {logfile}")


def build(fp: dict) -> Path:
    final = reference_dir(fp)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build of the same fingerprint waits here
        if reference_python(fp):
            return final / "venv" / "bin" / "python"
        start = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=root))
        try:
            logfile = tmp / "build.log"
            log(f"building {PACKAGE} into {final} (log: {final / 'build.log'})")
            run_logged([sys.executable, "-m", "venv", str(tmp / "venv")], logfile)
            py = str(tmp / "venv" / "bin" / "python")
            pip = [py, "-m", "pip", "--disable-pip-version-check"]
            sdist_dir = tmp / "sdist"
            # Only llama-cpp-python as source: its build requirements may be wheels.
            run_logged(pip + ["download", "--no-deps", "--no-binary", "llama-cpp-python", PACKAGE,
                              "-d", str(sdist_dir)], logfile)
            sdist = next(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
            run_logged(pip + ["install", *EXTRA_PACKAGES], logfile)
            # scikit-build-core shlex-splits CMAKE_ARGS: a flags value with spaces must be quoted.
            env = dict(os.environ, CMAKE_ARGS=shlex.join(fp["cmake_args"]), CMAKE_BUILD_PARALLEL_LEVEL=BUILD_JOBS,
                       FORCE_CMAKE="1")
            env.pop("SOURCE_DATE_EPOCH", None)  # it would turn GGML_NATIVE's default off
            log(f"compiling llama.cpp with CMAKE_ARGS={env['CMAKE_ARGS']!r}, {BUILD_JOBS} jobs")
            run_logged(pip + ["install", "-v", "--no-cache-dir", str(sdist)], logfile, env=env)
            info = subprocess.run([py, "-c", "import llama_cpp; print(llama_cpp.__version__); "
                                   "print(llama_cpp.llama_print_system_info().decode())"],
                                  capture_output=True, text=True, check=True).stdout.split("\n", 1)
            if info[0].strip() != VERSION:
                raise SystemExit(f"built llama_cpp {info[0]!r}, expected {VERSION}")
            record = dict(fp, sdist=sdist.name, sdist_sha256=_sha256(sdist),
                          system_info=info[1].strip(), build_seconds=round(time.monotonic() - start, 1))
            shutil.rmtree(sdist_dir)
            (tmp / "fingerprint.json").write_text(json.dumps(record, indent=1) + "\n")
            if final.exists():  # a stale, unfinished directory (no fingerprint.json): replace it
                shutil.rmtree(final)
            os.chmod(tmp, 0o755)  # mkdtemp made it private
            os.rename(tmp, final)  # atomic on one file system: it is either absent or complete
        except BaseException:
            failed_log = root / f"{final.name}.failed.log"  # the partial directory goes; its log stays
            if logfile.exists():
                shutil.copyfile(logfile, failed_log)
                log(f"build log kept at {failed_log}")
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log(f"built in {time.monotonic() - start:.0f} s")
        return final / "venv" / "bin" / "python"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="only say whether the reference is built (exit 1 if not)")
    ap.add_argument("--fingerprint", action="store_true", help="print this machine's fingerprint as JSON")
    args = ap.parse_args()
    fp = fingerprint()
    if args.fingerprint:
        print(json.dumps(dict(fp, key=fingerprint_key(fp)), indent=1))
        return 0
    if args.check:
        py = reference_python(fp)
        if py is None:
            print(f"not built: {reference_dir(fp)}", file=sys.stderr)
            return 1
        print(py)
        return 0
    py = build(fp)
    print(py)
    return 0


if __name__ == "__main__":
    sys.exit(main())
