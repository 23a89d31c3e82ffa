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
#   scripts/arm64_check.sh wheel   (hours under emulation; minutes on arm64)
#       Builds the portable wheel in an arm64 Debian 12 userland, installs it
#       and runs the CPU-backend tests and a tiny synthetic model there.  On
#       an arm64 machine it runs directly; on x86-64 it needs debootstrap,
#       qemu-user-static and binfmt_misc registered for aarch64 (chroot
#       runs the compilers pip starts through it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${ARM64_WORK:-$ROOT/build/arm64}"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
QEMU_CPUS="${QEMU_CPUS:-cortex-a53 cortex-a76 neoverse-n1 a64fx max}"

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
        -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
        -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
        -DCMAKE_C_COMPILER_TARGET=aarch64-linux-gnu -DCMAKE_CXX_COMPILER_TARGET=aarch64-linux-gnu \
        -DCMAKE_FIND_ROOT_PATH=/usr/aarch64-linux-gnu -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER \
        -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY \
        -DCMAKE_BUILD_TYPE=Release -DELELEM_CPU_VARIANTS=all \
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

emulate() {
    local start=$SECONDS lib="$WORK/ggml-cross/lib" core="$WORK/core"
    [ -f "$lib/libggml.so.0" ] && [ -f "$core/portable.o" ] || { echo "arm64_check: run '$0 cross' first" >&2; exit 2; }
    local sysroot="$WORK/sysroot" site="$WORK/site" pkg="$WORK/pkg" synth="$WORK/synth"
    if [ ! -x "$sysroot/usr/bin/python3.11" ]; then
        dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; apt-get update -q; }
        mkdir -p "$WORK/debs" "$sysroot"
        (cd "$WORK/debs" && apt-get download -q libc6:arm64 libgcc-s1:arm64 libstdc++6:arm64 \
            python3.11-minimal:arm64 libpython3.11-minimal:arm64 libpython3.11-stdlib:arm64 libpython3.11:arm64 \
            libpython3.11-dev:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 \
            liblzma5:arm64 libuuid1:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 \
            libsqlite3-0:arm64 libcrypt1:arm64)
        for deb in "$WORK"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
    fi
    if [ ! -d "$site/numpy" ]; then
        mkdir -p "$WORK/wheels" "$site"
        pip download -q --only-binary=:all: --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
            --python-version 3.11 --implementation cp "numpy==$(python -c 'import numpy; print(numpy.__version__)')" \
            regex jinja2 markupsafe -d "$WORK/wheels"
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

    # the models, NumPy's logits and x86-64 elelem's, made here
    mkdir -p "$synth"
    (cd "$ROOT" && python - "$synth" <<'PY'
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, "tests/support")
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
    local failed=0
    for cpu in cortex-a76 max; do
        echo "== qemu-aarch64 -cpu $cpu"
        (cd "$WORK" && PYTHONPATH="$pkg:$site" qemu-aarch64-static -L "$sysroot" -cpu "$cpu" \
            "$sysroot/usr/bin/python3.11" -m elelem info --system | grep -E "^(cpu variant|variants|compiled with|small-batch)")
        (cd "$WORK" && PYTHONPATH="$pkg:$site" qemu-aarch64-static -L "$sysroot" -cpu "$cpu" \
            "$sysroot/usr/bin/python3.11" "$synth/run_arm.py" "$synth") || failed=1
    done
    # SmolLM2-135M (Q4_1), where the tests have fetched it: greedy tokens must
    # equal x86-64's; the teacher-forced logits are printed, not checked
    # (ggml's ARM kernels round otherwise than elelem's and ggml's x86 ones)
    local smol="${ELELEM_MODELS:-$HOME/.cache/elelem/models}/smollm2-135m-instruct-q4_1.gguf"
    if [ -f "$smol" ]; then
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
        local x86_tokens arm_tokens
        x86_tokens="$(cd "$WORK" && PYTHONPATH="$ROOT" python "$synth/smol.py" "$smol" "$synth/smol-x86.npy")"
        arm_tokens="$(cd "$WORK" && PYTHONPATH="$pkg:$site" qemu-aarch64-static -L "$sysroot" -cpu cortex-a76 \
            "$sysroot/usr/bin/python3.11" "$synth/smol.py" "$smol" "$synth/smol-arm.npy")"
        python -c "import numpy as np, sys; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); \
print(f'SmolLM2-135M Q4_1, teacher-forced: max|arm - x86-64| {np.abs(a - b).max() / np.abs(a).max():.2e} of the largest logit, ' \
      f'argmax differs at positions {np.nonzero(a.argmax(1) != b.argmax(1))[0].tolist()} of {len(a)}')" \
            "$synth/smol-x86.npy" "$synth/smol-arm.npy"
        echo "SmolLM2-135M Q4_1 greedy: x86-64 [$x86_tokens], aarch64 (cortex-a76) [$arm_tokens]"
        [ "$x86_tokens" = "$arm_tokens" ] || failed=1
    fi
    [ "$failed" -eq 0 ] || { echo "arm64_check: the emulated runs differ (see above)" >&2; exit 1; }
    echo "arm64_check emulate: ok in $((SECONDS - start)) s"
}

wheel() {
    local start=$SECONDS
    if [ "$(uname -m)" = "aarch64" ]; then
        run_wheel_here "$ROOT"
    else
        need debootstrap "apt-get install debootstrap"
        need qemu-aarch64-static "apt-get install qemu-user-static"
        [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || {
            echo "arm64_check: binfmt_misc has no qemu-aarch64 entry: chroot cannot run arm64 programs" \
                 "(update-binfmts --enable qemu-aarch64, or docker run --privileged tonistiigi/binfmt --install arm64)" >&2
            exit 2; }
        local rootfs="$WORK/rootfs"
        if [ ! -x "$rootfs/usr/bin/python3" ]; then
            debootstrap --arch=arm64 --variant=minbase \
                --include=python3,python3-venv,python3-dev,build-essential,git,ca-certificates \
                bookworm "$rootfs" http://deb.debian.org/debian
            # GCC 12 cannot target ggml's Armv9.2 (SME) variants: clang 19 builds them
            chroot "$rootfs" apt-get install -y --no-install-recommends clang-19
        fi
        mkdir -p "$rootfs/src"
        git -C "$ROOT" ls-files -z | rsync -a --from0 --files-from=- "$ROOT/" "$rootfs/src/elelem/"
        cp "$0" "$rootfs/src/arm64_check.sh"
        mountpoint -q "$rootfs/proc" || mount -t proc proc "$rootfs/proc"
        chroot "$rootfs" bash /src/arm64_check.sh wheel-here /src/elelem
    fi
    echo "arm64_check wheel: done in $((SECONDS - start)) s"
}

run_wheel_here() {
    local src="$1" venv="$WORK/venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    if ! aarch64-linux-gnu-gcc -march=armv9.2-a+sme -x c -c /dev/null -o /dev/null 2>/dev/null \
            && command -v clang-19 >/dev/null; then
        export CC=clang-19 CXX=clang++-19
    fi
    (cd "$src" && ELELEM_PORTABLE=1 CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$venv/bin/pip" wheel -w "$WORK/dist" .)
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
    wheel-here) WORK=/work-arm64; mkdir -p "$WORK"; run_wheel_here "$2" ;;
    *) echo "usage: $0 [cross|emulate|wheel]" >&2; exit 2 ;;
esac
