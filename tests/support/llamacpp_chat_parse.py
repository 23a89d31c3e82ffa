"""llama.cpp's parsing of chat replies (tool calls, reasoning), as a command, for the tool-call tests.  DEV-ONLY.

tests/support/chat_parse_driver.cpp, compiled with the same common/ sources of the pinned sdist and
linked to the same reference libllama as scripts/reference_chat_templates.py's driver (whose
download, unpacking and compile steps it reuses), reads model replies with the parser llama.cpp
builds for a template and a request.  Cached in ``$ELELEM_CACHE/reference/chat-parse-<key>/``.
Build it with ``python tests/support/llamacpp_chat_parse.py`` (1-3 minutes, 2 jobs); the tests
that use it skip when it is not built (:func:`run` gives None).
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DRIVER = HERE / "chat_parse_driver.cpp"
EXE = "chat_parse_driver"


def _script():
    spec = importlib.util.spec_from_file_location("reference_chat_templates",
                                                  ROOT / "scripts" / "reference_chat_templates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _key(chat) -> tuple[dict, Path]:
    fp = chat.fingerprint()
    fp = dict(fp, driver_sha256=hashlib.sha256(DRIVER.read_bytes()).hexdigest(), ldflags=["-lpthread"])
    key = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return fp, chat.REFERENCE.cache_root() / f"chat-parse-{chat.PIN.PIN_VERSION}-{key}"


def driver() -> Path | None:
    """The built driver, or None."""
    try:
        _, final = _key(_script())
    except Exception:  # no reference build on this machine
        return None
    exe = final / EXE
    return exe if (final / "build.json").is_file() and exe.exists() else None


def run(requests: list[dict]) -> list[dict] | None:
    """llama.cpp's results for ``requests`` (see chat_parse_driver.cpp), or None when it is not built."""
    exe = driver()
    if exe is None:
        return None
    out = subprocess.run([str(exe)], input=json.dumps({"requests": requests}), capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{exe} failed ({out.returncode}): {out.stdout[-2000:]}")
    return json.loads(out.stdout)["results"]


def build() -> Path:
    chat = _script()
    fp, final = _key(chat)
    lib = chat.reference_lib_dir(chat.REFERENCE.fingerprint())
    if lib is None:
        raise SystemExit("no llama.cpp reference build here; run python scripts/reference_llamacpp.py first")
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if driver() is not None:
            return final / EXE
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
        try:
            sdist = chat._sdist(tmp / "download")
            if chat._sha256(sdist) != chat.PIN.PIN_SHA256:
                raise SystemExit(f"{sdist}: not the pinned sdist")
            src = chat._unpack(sdist, tmp / "src")
            sources = [src / s for s in chat.SOURCES]
            for d in chat.SOURCE_DIRS:
                sources += sorted((src / d).glob("*.cpp"))
            sources.append(DRIVER)
            cxx = os.environ.get("CXX") or "c++"
            objs = tmp / "obj"
            objs.mkdir()
            targets = [objs / f"{i:02d}-{s.stem}.o" for i, s in enumerate(sources)]
            logfile = tmp / "build.log"
            with concurrent.futures.ThreadPoolExecutor(chat.BUILD_JOBS) as pool:
                list(pool.map(lambda pair: chat._compile(cxx, *pair, src, logfile), zip(sources, targets)))
            exe = tmp / EXE
            cmd = [cxx, *map(str, targets), "-o", str(exe), f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                   f"-Wl,-rpath,{lib}", "-Wl,--gc-sections", "-lpthread"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"link failed: {done.stderr[-3000:]}")
            shutil.rmtree(tmp / "src")
            shutil.rmtree(tmp / "download", ignore_errors=True)
            shutil.rmtree(objs)
            (tmp / "build.json").write_text(json.dumps(fp, indent=1) + "\n")
            os.chmod(tmp, 0o755)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final / EXE


if __name__ == "__main__":
    print(build())
    sys.exit(0)
