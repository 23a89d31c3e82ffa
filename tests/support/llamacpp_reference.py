"""llama.cpp's outputs for the tests, made live on this machine, or read from a stored fixture that matches it.

elelem must give llama.cpp's tokens, and on the same kernels llama.cpp's
float32 logits, *on the same machine*.  So the tests do not trust outputs made
elsewhere: they run the fixture scripts (tests/support/fixtures/make_*_fixtures.py)
under the llama.cpp reference python that scripts/reference_llamacpp.py built
for this machine's fingerprint, in a subprocess, on the very model files
elelem reads.  Outputs are cached in ``$ELELEM_CACHE/reference/outputs/``,
keyed by that fingerprint, the scripts' sources, the model files' sha256 and
the arguments, so only the first run pays for llama.cpp.

Without a reference build, a stored fixture is used only where its header's
kernel fingerprint (CPU flags, compilers, build options, llama.cpp version,
threads, repacking) is this machine's.  Otherwise the test skips, and fails
when CI=true: CI must never pass by skipping the comparison.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPT_DEPENDENCIES = (FIXTURES / "reference_run.py",)
# What a stored fixture's machine fingerprint must share with this machine (the
# CPU's name and the Python version do not change ggml's kernels).
KERNEL_KEYS = ("llama_cpp_python", "cpu_flags", "machine", "cc", "cxx", "cmake_args")
THREADS = 2  # the fixture scripts' n_threads (reference_run.N_THREADS); elelem must use the same


@functools.cache
def builder():
    """scripts/reference_llamacpp.py, imported (it uses only the standard library)."""
    spec = importlib.util.spec_from_file_location("reference_llamacpp", ROOT / "scripts" / "reference_llamacpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def machine() -> dict:
    return builder().fingerprint()


def cpu_has_amx() -> bool:
    return builder().has_amx(machine()["cpu_flags"])


def elelem_kernel_options() -> dict:
    """LLM(...) options under which elelem runs the kernels the reference runs.

    The reference is built without AMX (-mno-amx-*), while elelem
    puts the weights AMX takes into AMX buffers.  On an AMX CPU elelem
    therefore runs with amx=False: the same CPU_REPACK (AVX-512) kernels as
    the reference.  AMX itself is checked against NumPy in
    tests/test_cpu_backend.py.  Untested here: this machine has no AMX.

    The reference runs llama-cpp-python's default flash_attn=False, while
    LLM's default is llama.cpp's "auto" (on, on the CPU): flash_attn=False."""
    return {"flash_attn": False, **({"amx": False} if cpu_has_amx() else {})}


def skip_or_fail(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: this comparison must run in CI)")
    pytest.skip(reason)


@functools.cache
def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _kernel_view(fp: dict) -> dict:
    """A fingerprint less what does not change ggml's kernels: whether libmtmd was built
    (LLAVA_BUILD), so that fixtures stored before the reference built it still hold."""
    args = fp.get("cmake_args")
    if isinstance(args, list):
        fp = dict(fp, cmake_args=[a for a in args if not a.startswith("-DLLAVA_BUILD=")])
    return fp


def kernel_mismatch(kernels: dict) -> list[str]:
    """What differs between a stored fixture's kernels and this machine's; empty if it holds here."""
    if not kernels.get("machine"):
        return ["its header has no kernel fingerprint"]
    here = _kernel_view(machine())
    theirs = _kernel_view(kernels["machine"])
    diffs = [f"{k}: fixture {theirs.get(k)!r}, here {here[k]!r}" for k in KERNEL_KEYS if theirs.get(k) != here[k]]
    if kernels.get("threads") != THREADS:
        diffs.append(f"threads: fixture {kernels.get('threads')!r}, tests {THREADS}")
    if not kernels.get("extra_bufts", True):
        diffs.append("the fixture was made without extra buffer types; the tests run with them")
    return diffs


def output_dir(script: str, options: list[str], inputs: list[Path], outputs: list[str]) -> Path:
    """Where run_script caches the outputs of one run (see there for the key)."""
    key = hashlib.sha256()
    for part in [builder().fingerprint_key(machine()), script, json.dumps(options), json.dumps(outputs)]:
        key.update(part.encode() + b"\0")
    for path in [FIXTURES / script, *SCRIPT_DEPENDENCIES]:
        key.update(path.read_bytes())
    for path in inputs:
        key.update(file_sha256(Path(path)).encode())
    return builder().cache_root() / "outputs" / f"{Path(script).stem}-{key.hexdigest()[:20]}"


def run_script(script: str, args: list[str], options: list[str], inputs: list[Path],
               outputs: list[str]) -> dict[str, dict] | None:
    """Run tests/support/fixtures/<script> under the reference python; {output name: JSON}, cached.

    None when this machine has no reference build.  The cache key covers the
    fingerprint, the scripts' sources, ``options`` (the arguments that change
    the results) and the content of ``inputs`` (the files the script reads),
    not their paths, which change from one session to the next.  The script
    writes ``outputs`` into the directory that ``args`` names as "{out}"."""
    py = builder().reference_python(machine())
    if py is None:
        return None
    cache = output_dir(script, options, inputs, outputs)
    if not cache.is_dir():
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
        start = time.monotonic()
        cmd = [str(py), str(FIXTURES / script), *[a.replace("{out}", str(tmp)) for a in args]]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"llama.cpp reference failed ({done.returncode}): {' '.join(cmd)}\n"
                               f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        (tmp / "run.log").write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}\n"
                                     f"seconds: {time.monotonic() - start:.1f}\n")
        try:
            os.rename(tmp, cache)  # whole or absent; a concurrent run that got there first wins
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return {name: json.loads((cache / name).read_text(encoding="utf-8")) for name in outputs}


class Reference:
    """llama.cpp's outputs for the tests' inputs: live, cached, or a matching stored fixture."""

    def __init__(self):
        self._memo: dict = {}

    def _stored(self, path: Path, matches) -> dict:
        """The stored fixture at path, if it was made with this machine's kernels on these inputs."""
        stored = json.loads(path.read_text(encoding="utf-8"))
        diffs = kernel_mismatch(stored["header"].get("kernels", {})) + matches(stored)
        if diffs:
            skip_or_fail(f"{self.not_built()}, and {path.name} was made with other kernels or inputs: "
                         + "; ".join(diffs))
        return stored

    def _once(self, key: str, make):
        """make()'s result, computed once; a failed reference run fails every test that needs it, without rerunning."""
        if key not in self._memo:
            try:
                self._memo[key] = make()
            except RuntimeError as e:
                self._memo[key] = e
        if isinstance(self._memo[key], RuntimeError):
            raise self._memo[key]
        return self._memo[key]

    def arch_logits(self, models_dir: Path, names: list[str], smollm: Path) -> dict:
        """make_arch_fixtures.py's output for the <name>.gguf files in models_dir."""
        return self._synthetic("make_arch_fixtures.py", "arch_logits.json", models_dir, names,
                               ["--smollm", str(smollm)])

    def bert_embeddings(self, models_dir: Path, names: list[str]) -> dict:
        """make_bert_fixtures.py's output for the <name>.gguf encoders in models_dir."""
        return self._synthetic("make_bert_fixtures.py", "bert_embeddings.json", models_dir, names)

    def _synthetic(self, script: str, output: str, models_dir: Path, names: list[str],
                   extra_args: list[str] = ()) -> dict:
        """The output of a script that reads the synthetic <name>.gguf files of
        models_dir (--models-dir) and writes one JSON file (--out) with, per
        name, a "model_sha256" that a stored fixture must match."""
        files = [models_dir / f"{n}.gguf" for n in names]

        def same_models(stored):
            return [f"{n}: model file differs" for n, f in zip(names, files)
                    if stored["configs"].get(n, {}).get("model_sha256") != file_sha256(f)]

        def make():
            live = run_script(script, ["--out", "{out}/" + output, "--models-dir", str(models_dir), *extra_args],
                              [], files, [output])
            if live is None:
                return self._stored(FIXTURES / output, same_models)
            return live[output]

        return self._once(script, make)

    def greedy(self, name: str, model_path: Path) -> dict:
        """make_greedy_fixtures.py's output for one model (a key of its MODELS)."""
        return self._per_model("make_greedy_fixtures.py", "greedy", name, model_path)

    def long_logits(self, name: str, model_path: Path) -> dict:
        """make_long_logits.py's output for one model (a key of make_greedy_fixtures.MODELS)."""
        # Its prompt is made from make_greedy_fixtures.py's texts: that file is an input too.
        return self._per_model("make_long_logits.py", "long_logits", name, model_path,
                               [FIXTURES / "make_greedy_fixtures.py"])

    def logprobs(self, name: str, model_path: Path) -> dict:
        """make_logprobs_fixtures.py's output for one model (a key of make_greedy_fixtures.MODELS)."""
        return self._per_model("make_logprobs_fixtures.py", "logprobs", name, model_path,
                               [FIXTURES / "make_greedy_fixtures.py", FIXTURES / "per_model_fixture.py"])

    def embeddings(self, name: str, model_path: Path) -> dict:
        """make_embedding_fixtures.py's output for one model (a key of make_greedy_fixtures.MODELS)."""
        return self._per_model("make_embedding_fixtures.py", "embeddings", name, model_path,
                               [FIXTURES / "make_greedy_fixtures.py", FIXTURES / "per_model_fixture.py"])

    def vision(self, model: Path, mmproj: Path, images: list[Path], prompts: list[str], flash_attn: str,
               n_batch: int = 512) -> dict:
        """make_vision_fixtures.py's output: libmtmd's embeddings of ``images`` (.npy pixels)
        and the logits after each prompt, for the projector ``mmproj`` over ``model``, the
        context's n_batch (and n_ubatch) ``n_batch``.
        Live only: no stored fixture (the inputs are made by the test)."""
        def make():
            options = ["--flash-attn", flash_attn, *[a for p in prompts for a in ("--prompt", p)]]
            if n_batch != 512:
                options += ["--n-batch", str(n_batch)]
            live = run_script("make_vision_fixtures.py",
                              ["--out", "{out}/vision.json", "--model", str(model), "--mmproj", str(mmproj),
                               "--images", *[str(p) for p in images], *options],
                              options, [model, mmproj, *images], ["vision.json"])
            if live is None:
                skip_or_fail(self.not_built() + " (libmtmd is needed for the image comparisons)")
            return live["vision.json"]

        return self._once(f"vision:{model}:{mmproj}:{flash_attn}:{n_batch}", make)

    def wordpiece(self) -> dict:
        """make_wpm_fixtures.py's output: llama.cpp's ids and text for the vocabularies of tests/support/wpm_vocabs.py."""
        import wpm_vocabs

        def same_vocabs(stored):
            digests = stored["header"].get("vocab_digests", {})
            return [f"vocabulary {n} differs" for n in (*wpm_vocabs.VOCABS, *wpm_vocabs.PROBES)
                    if digests.get(n) != wpm_vocabs.digest(n)]

        def make():
            live = run_script("make_wpm_fixtures.py", ["--out", "{out}/tokenize_wpm.json"], [],
                              [ROOT / "tests" / "support" / "wpm_vocabs.py"], ["tokenize_wpm.json"])
            if live is None:
                return self._stored(FIXTURES / "tokenize_wpm.json", same_vocabs)
            return live["tokenize_wpm.json"]

        return self._once("wordpiece", make)

    def _per_model(self, script: str, stored_dir: str, name: str, model_path: Path,
                   extra_inputs: list[Path] = ()) -> dict:
        """The output <name>.json of a script that takes --out-dir, --models-dir and --only NAME."""
        def same_model(stored):
            sha = stored["header"].get("model_file_sha256")
            return [] if sha == file_sha256(Path(model_path)) else [f"model file: fixture {sha}"]

        def make():
            options = ["--only", name]
            live = run_script(script,
                              ["--out-dir", "{out}", "--models-dir", str(Path(model_path).parent), *options],
                              options, [Path(model_path), *extra_inputs], [f"{name}.json"])
            if live is None:
                return self._stored(FIXTURES / stored_dir / f"{name}.json", same_model)
            return live[f"{name}.json"]

        return self._once(f"{script}:{name}", make)

    def lora_logits(self, cases: list[dict], inputs: list[Path]) -> dict:
        """make_lora_fixtures.py's output for ``cases`` (its --cases format), live only:
        an adapter's effect is checked on this machine's llama.cpp or not at all."""
        def make():
            with tempfile.TemporaryDirectory() as tmp:
                spec = Path(tmp) / "cases.json"
                spec.write_text(json.dumps(cases))
                # The key: the cases with each path as its index in inputs (paths change between
                # sessions), and the files' content.
                index = {str(Path(p)): i for i, p in enumerate(inputs)}
                options = [json.dumps([c | {"model": index[str(Path(c["model"]))],
                                            "adapters": [[index[str(Path(p))], s] for p, s in c["adapters"]]}
                                       for c in cases])]
                live = run_script("make_lora_fixtures.py", ["--cases", str(spec), "--out", "{out}/lora_logits.json"],
                                  options, inputs, ["lora_logits.json"])
            if live is None:
                skip_or_fail(self.not_built())
            return live["lora_logits.json"]

        return self._once("make_lora_fixtures.py", make)

    @staticmethod
    def not_built() -> str:
        return (f"no llama.cpp reference is built for this machine (python scripts/reference_llamacpp.py builds "
                f"it into {builder().reference_dir(machine())})")
