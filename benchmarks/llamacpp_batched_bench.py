#!/usr/bin/env python3
"""llama.cpp's own batched decoding (``llama-batched-bench``) as a yardstick.  DEV-ONLY.

    python benchmarks/llamacpp_batched_bench.py --build          # build if needed, print the binary
    python benchmarks/llamacpp_batched_bench.py --check          # print it if built, else exit 1
    python benchmarks/llamacpp_batched_bench.py MODEL.gguf [--npl 1 4 8] [--ntg 64] [--npp 32] [-t 2]

The binary is built from the llama.cpp that llama-cpp-python 0.3.36's PyPI
sdist vendors (``vendor/llama.cpp``) -- the same sdist, sha256-checked, that
scripts/reference_llamacpp.py builds the reference from -- with the same CMake
options (GGML_NATIVE=ON, GGML_LLAMAFILE=ON, CPU only, Release), plus static
libraries and no OpenSSL.  Only the ``llama-batched-bench`` target is built,
at ``nice -n 19`` with one job (``BATCHED_BENCH_JOBS`` changes it), because
this project's machine has two cores that others compile on; that takes
15-25 minutes there.  It is cached in
``$ELELEM_CACHE/reference/llama-batched-bench-0.3.36-<fingerprint>/``, built
in a temporary directory and renamed into place only once it runs, so an
interrupted build leaves nothing that looks ready.

``run()`` returns llama-batched-bench's rows (its ``--output-format jsonl``),
one dict each: ``pl`` (B, the number of parallel sequences), ``pp``, ``tg``,
``speed_pp``, ``speed_tg`` (S_TG: the aggregate generation tokens/s over all B
sequences), ``t_pp``, ``t_tg``, ``flash_attn``, ...
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import reference_llamacpp as ref  # noqa: E402  (the reference build's fingerprint and sdist pin)

SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # llama_cpp_python-0.3.36.tar.gz
TARGET = "llama-batched-bench"
EXTRA_CMAKE_ARGS = ["-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
                    "-DLLAMA_BUILD_TOOLS=ON"]


def fingerprint() -> dict:
    fp = ref.fingerprint()
    fp.pop("python", None)  # a C++ binary: the Python version does not matter
    fp["cmake_args"] = fp["cmake_args"] + EXTRA_CMAKE_ARGS
    fp["target"] = TARGET
    return fp


def build_dir(fp: dict | None = None) -> Path:
    fp = fingerprint() if fp is None else fp
    key = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return ref.cache_root() / f"llama-batched-bench-{ref.VERSION}-{key}"


def binary(fp: dict | None = None) -> Path | None:
    """The built llama-batched-bench for this machine, or None."""
    d = build_dir(fp)
    exe = d / "bin" / TARGET
    return exe if (d / "fingerprint.json").is_file() and exe.exists() else None


def build(sdist: Path | None = None) -> Path:
    """Build llama-batched-bench once per fingerprint (cached); returns the binary."""
    fp = fingerprint()
    final = build_dir(fp)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary(fp):
            return binary(fp)
        start = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
        try:
            logfile = tmp / "build.log"
            ref.log(f"building {TARGET} into {final} (log: {final / 'build.log'})")
            if sdist is None:
                run = ["pip", "--disable-pip-version-check", "download", "--no-deps",
                       "--no-binary", "llama-cpp-python", ref.PACKAGE, "-d", str(tmp / "sdist")]
                ref.run_logged([sys.executable, "-m", *run], logfile)
                sdist = next((tmp / "sdist").glob("llama_cpp_python-*.tar.gz"))
            if ref._sha256(sdist) != SDIST_SHA256:
                raise SystemExit(f"{sdist}: sha256 is not that of llama_cpp_python-{ref.VERSION}.tar.gz")
            with tarfile.open(sdist) as tar:
                tar.extractall(tmp / "src", filter="data")
            source = next((tmp / "src").glob("llama_cpp_python-*/vendor/llama.cpp"))
            cmake_build = tmp / "cmake-build"
            env = dict(os.environ)
            env.pop("SOURCE_DATE_EPOCH", None)  # it would turn GGML_NATIVE's default off
            ref.run_logged(["cmake", "-S", str(source), "-B", str(cmake_build), *fp["cmake_args"]], logfile, env=env)
            jobs = os.environ.get("BATCHED_BENCH_JOBS", "1")
            ref.run_logged(["nice", "-n", "19", "cmake", "--build", str(cmake_build), "--target", TARGET,
                            "-j", jobs], logfile, env=env)
            (tmp / "bin").mkdir()
            exe = tmp / "bin" / TARGET
            shutil.copy2(cmake_build / "bin" / TARGET, exe)
            subprocess.run([str(exe), "--help"], capture_output=True, check=True)
            shutil.rmtree(cmake_build)
            shutil.rmtree(tmp / "src")
            shutil.rmtree(tmp / "sdist", ignore_errors=True)
            record = dict(fp, sdist_sha256=SDIST_SHA256, build_seconds=round(time.monotonic() - start, 1))
            (tmp / "fingerprint.json").write_text(json.dumps(record, indent=1) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        ref.log(f"built in {time.monotonic() - start:.0f} s")
        return final / "bin" / TARGET


def run(exe: Path, model: str, *, npl=(1, 4, 8), npp: int = 32, ntg: int = 64, threads: int = 2,
        n_ctx: int = 4096, flash_attn: bool = False) -> list[dict]:
    """Run llama-batched-bench on one model; one dict per row of its table (its JSONL output)."""
    cmd = [str(exe), "-m", model, "-c", str(n_ctx), "-b", "512", "-ub", "512", "-npp", str(npp),
           "-ntg", str(ntg), "-npl", ",".join(map(str, npl)), "-t", str(threads), "-tb", str(threads),
           # off by default in elelem's LLM and llama-cpp-python; llama.cpp defaults to auto
           "-fa", "on" if flash_attn else "off",
           "--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out.stdout + "\n" + out.stderr).splitlines()
            if line.startswith("{") and '"speed_tg"' in line]
    if not rows:
        raise RuntimeError(f"no llama-batched-bench rows in its output:\n{out.stdout[-1000:]}{out.stderr[-1000:]}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--build", action="store_true", help="build if needed and print the binary")
    ap.add_argument("--check", action="store_true", help="print the binary if built, else exit 1")
    ap.add_argument("--sdist", type=Path, help="a local llama_cpp_python-0.3.36.tar.gz instead of pip download")
    ap.add_argument("--npl", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--npp", type=int, default=32)
    ap.add_argument("--ntg", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    if args.check:
        exe = binary()
        print(exe or f"not built: {build_dir()}", file=sys.stdout if exe else sys.stderr)
        return 0 if exe else 1
    exe = build(args.sdist) if args.build or not binary() else binary()
    if not args.model:
        print(exe)
        return 0
    for row in run(exe, args.model, npl=args.npl, npp=args.npp, ntg=args.ntg, threads=args.threads):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
