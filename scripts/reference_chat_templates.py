"""Build llama.cpp's chat templating (its C++ Jinja engine and chat-format code) as a command.  DEV-ONLY.

elelem renders a model's chat template in its own Jinja sandbox
(elelem/text/template_sandbox.py) and must give the prompt llama.cpp gives.
llama.cpp renders with its own Jinja engine (common/jinja/) behind its
chat-format code (common/chat.cpp), which live in its ``common`` library;
llama-cpp-python builds only libllama.  This script compiles the part of
``common`` that chat templating needs, from the same pinned sdist, together
with scripts/chat_template_driver.cpp (JSON requests in, prompts and the
variables they were rendered from out; see there), and links it against the
libllama of the reference build (scripts/reference_llamacpp.py), which must
exist::

    python scripts/reference_llamacpp.py             # first: the reference build
    python scripts/reference_chat_templates.py       # build if needed, print the driver's path
    python scripts/reference_chat_templates.py --check   # exit 0 and print it if built, else exit 1

Only the sources chat templating needs are compiled (about 35 files of
common/, with -O1, 2 jobs: 1-2 minutes), not llama.cpp's CMake project, whose
``llama-common`` target would rebuild libllama and ggml.  The rest of
common.cpp (samplers, model loading) is dropped at link time
(-ffunction-sections, --gc-sections).

The sdist is fetched with pip (``pip download --no-binary llama-cpp-python``;
``ELELEM_LLAMACPP_SDIST=<path to llama_cpp_python-<version>.tar.gz>`` uses one
already on disk) and checked against scripts/vendor_ggml.py's PIN_SHA256.  The
driver is cached in ``$ELELEM_CACHE/reference/`` (default ``~/.cache/elelem``),
keyed by the sdist, the C++ compiler, the driver's source, the compile options
and the reference build it links; it is built in a temporary directory that is
renamed into place only once it has rendered a template, so an interrupted
build leaves nothing that looks ready.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "chat_template_driver.cpp"
SDIST_ROOT = "vendor/llama.cpp/"
# What of the sdist's llama.cpp tree the build reads (headers and sources).
UNPACKED = ("common/", "include/", "ggml/include/", "vendor/nlohmann/")
# common/ sources of chat templating: the Jinja engine, chat.cpp and its parsers (the
# llama-common target of common/CMakeLists.txt, less arg/download/sampling/speculative/...).
SOURCES = (
    "common/chat.cpp", "common/chat-auto-parser-generator.cpp", "common/chat-auto-parser-helpers.cpp",
    "common/chat-diff-analyzer.cpp", "common/chat-peg-parser.cpp", "common/peg-parser.cpp",
    "common/json-schema-to-grammar.cpp", "common/json-schema.cpp", "common/json.cpp", "common/log.cpp",
    "common/unicode.cpp", "common/trie.cpp", "common/common.cpp",
    "common/jinja/lexer.cpp", "common/jinja/parser.cpp", "common/jinja/runtime.cpp", "common/jinja/value.cpp",
    "common/jinja/string.cpp", "common/jinja/caps.cpp",
)
SOURCE_DIRS = ("common/parsers/",)  # every .cpp there (common/parsers/sources.cmake)
INCLUDES = ("common", "include", "ggml/include", "vendor")
CXXFLAGS = ("-std=c++17", "-O1", "-ffunction-sections", "-fdata-sections", "-fPIC")
# The engine's entry point for variables, wrapped so the driver can report what it rendered from.
WRAPPED = "_ZN5jinja16global_from_jsonI11common_jsonEEvRNS_7contextERKT_b"
LDFLAGS = ("-Wl,--gc-sections", f"-Wl,--wrap={WRAPPED}", "-lpthread")
BUILD_JOBS = 2
EXE = "chat_template_driver"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _load("reference_llamacpp")
PIN = _load("vendor_ggml")


def log(msg: str) -> None:
    print(f"[chat templates {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def reference_lib_dir(reference_fp: dict) -> Path | None:
    """The directory of the reference build's libllama.so, or None if there is no reference build."""
    py = REFERENCE.reference_python(reference_fp)
    if py is None:
        return None
    found = sorted((py.parent.parent / "lib").glob("python*/site-packages/llama_cpp/lib/libllama.so"))
    return found[0].parent if found else None


def fingerprint(reference_fp: dict | None = None) -> dict:
    reference_fp = REFERENCE.fingerprint() if reference_fp is None else reference_fp
    return {
        "llama_cpp_python": PIN.PIN_VERSION,
        "sdist_sha256": PIN.PIN_SHA256,
        "cxx": REFERENCE.compiler_version("CXX"),
        "driver_sha256": hashlib.sha256(DRIVER.read_bytes()).hexdigest(),
        "sources": list(SOURCES) + [d + "*.cpp" for d in SOURCE_DIRS],
        "cxxflags": list(CXXFLAGS),
        "ldflags": list(LDFLAGS),
        "reference": REFERENCE.fingerprint_key(reference_fp),
    }


def driver_dir(fp: dict | None = None) -> Path:
    fp = fingerprint() if fp is None else fp
    key = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return REFERENCE.cache_root() / f"chat-templates-{PIN.PIN_VERSION}-{key}"


def driver_path(fp: dict | None = None) -> Path | None:
    """The built driver for this machine, or None."""
    d = driver_dir(fp)
    exe = d / EXE
    return exe if (d / "build.json").is_file() and exe.exists() else None


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _sdist(into: Path) -> Path:
    given = os.environ.get("ELELEM_LLAMACPP_SDIST")
    if given:
        return Path(given)
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--no-deps", "--no-binary",
           PIN.PIN_PACKAGE, f"{PIN.PIN_PACKAGE}=={PIN.PIN_VERSION}", "-d", str(into)]
    if importlib.util.find_spec("scikit_build_core") is not None:
        cmd.insert(5, "--no-build-isolation")  # pip prepares the sdist's metadata with its build backend
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"could not download the {PIN.PIN_PACKAGE} sdist ({done.returncode}): {' '.join(cmd)}\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return next(into.glob("*.tar.gz"))


def _unpack(sdist: Path, into: Path) -> Path:
    """The sdist's vendor/llama.cpp/, with only the parts the build reads."""
    root = into / "llama.cpp"
    with tarfile.open(sdist) as tar:
        for member in tar:
            at = member.name.find(SDIST_ROOT)
            if at < 0 or not member.isfile():
                continue
            relative = member.name[at + len(SDIST_ROOT):]
            if not relative.startswith(UNPACKED):
                continue
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return root


def _compile(cxx: str, source: Path, obj: Path, root: Path, logfile: Path) -> None:
    cmd = [cxx, *CXXFLAGS, *(f"-I{root / d}" for d in INCLUDES), "-c", str(source), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    with open(logfile, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")


def build(fp: dict, reference_fp: dict) -> Path:
    final = driver_dir(fp)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    lib = reference_lib_dir(reference_fp)
    if lib is None:
        raise SystemExit(f"no llama.cpp reference build for this machine ({REFERENCE.reference_dir(reference_fp)}); "
                         "run python scripts/reference_llamacpp.py first")
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build of the same fingerprint waits here
        if driver_path(fp):
            return final / EXE
        start = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=root))
        logfile = tmp / "build.log"
        try:
            sdist = _sdist(tmp / "download")
            digest = _sha256(sdist)
            if digest != PIN.PIN_SHA256:
                raise SystemExit(f"{sdist}: sha256 {digest}, but scripts/vendor_ggml.py pins {PIN.PIN_SHA256}")
            src = _unpack(sdist, tmp / "src")
            sources = [src / s for s in SOURCES]
            for d in SOURCE_DIRS:
                sources += sorted((src / d).glob("*.cpp"))
            sources.append(DRIVER)
            cxx = os.environ.get("CXX") or "c++"
            log(f"compiling {len(sources)} files of llama.cpp's common/ and the driver with {cxx}, "
                f"{BUILD_JOBS} jobs (log: {final / 'build.log'})")
            objs = tmp / "obj"
            objs.mkdir()
            targets = [objs / f"{i:02d}-{s.stem}.o" for i, s in enumerate(sources)]
            with concurrent.futures.ThreadPoolExecutor(BUILD_JOBS) as pool:  # the first failure stops the build
                list(pool.map(lambda pair: _compile(cxx, *pair, src, logfile), zip(sources, targets)))
            exe = tmp / EXE
            cmd = [cxx, *map(str, targets), "-o", str(exe), f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                   f"-Wl,-rpath,{lib}", *LDFLAGS]
            with open(logfile, "a", encoding="utf-8") as f:
                f.write(f"$ {' '.join(cmd)}\n")
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"link failed ({done.returncode}): {done.stderr[-3000:]}")
            # It must render before it counts as built.
            probe = {"now": 0, "requests": [{"mode": "render", "template": "{{ x | tojson }}", "context": {"x": [1]}}]}
            out = subprocess.run([str(exe)], input=json.dumps(probe), capture_output=True, text=True, timeout=60)
            if out.returncode != 0 or json.loads(out.stdout)["results"][0].get("prompt") != "[1]":
                raise SystemExit(f"the built driver does not work: {out.stdout[-2000:]} {out.stderr[-2000:]}")
            shutil.rmtree(tmp / "src")
            shutil.rmtree(tmp / "download", ignore_errors=True)
            shutil.rmtree(objs)
            record = dict(fp, sdist=sdist.name, libllama=str(lib), build_seconds=round(time.monotonic() - start, 1))
            (tmp / "build.json").write_text(json.dumps(record, indent=1) + "\n")
            if final.exists():  # a stale, unfinished directory (no build.json): replace it
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
        return final / EXE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="only say whether the driver is built (exit 1 if not)")
    args = ap.parse_args()
    reference_fp = REFERENCE.fingerprint()
    fp = fingerprint(reference_fp)
    if args.check:
        exe = driver_path(fp)
        if exe is None:
            print(f"not built: {driver_dir(fp)}", file=sys.stderr)
            return 1
        print(exe)
        return 0
    print(build(fp, reference_fp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
