#!/usr/bin/env bash
# The one CUDA check to run on a lent NVIDIA machine (the H200), with a CUDA
# build of elelem prepared on a machine without a GPU.  It installs nothing
# and finishes in a few minutes.
#
# Here, after the build (ELELEM_CUDA=1, see README "CUDA"), in the checkout
# whose working tree travels to the device:
#
#   ELELEM_PORTABLE=1 ELELEM_CUDA=1 ELELEM_VULKAN=1 python setup.py build_ext --inplace
#   scripts/device_check_cuda.sh pack [LIB_DIR]
#
#     copies LIB_DIR (default: elelem/_lib of this checkout) into .cuda-carry/,
#     which .git/info/exclude ignores, and prints its size: what travels is
#     at most 64 MiB, the working tree included (20 MB).  libggml-cuda.so for
#     sm_90 is 64 MiB by itself, so it travels xz-compressed (37 MiB), as do
#     the Vulkan module (3 MiB), the CPU modules (ELELEM_PORTABLE=1: every
#     x86-64 variant, since that machine's CPU is not this one's), elelem's
#     core as Cython's C++ output (core.cpp, compiled there for its Python
#     and its numpy), and the pure-Python gguf and yaml packages (the
#     synthetic models are written there); all unpacked with Python's lzma.
#
# There (the device tool's run, carry=[".cuda-carry"], timeout_s=600):
#
#   bash scripts/device_check_cuda.sh
#
#   1. nvidia-smi;
#   2. the CUDA runtime libraries the module needs, found on that machine (its
#      PyTorch venv holds the nvidia-cuda-runtime / nvidia-cublas 13 wheels;
#      cuBLAS is 0.5 GB, far over what may travel, so it is never carried);
#   3. scripts/ggml_cuda_smoke.py: the devices ggml sees through the CUDA
#      module, and matrix products (f32, f16, q4_0, q8_0; batch 1 and 512) on
#      the GPU against ggml's CPU backend;
#   4. elelem's core compiled for that machine's Python, and elelem/_lib
#      filled from .cuda-carry;
#   5. scripts/device_check.py for CUDA, then for Vulkan (where the machine
#      has a Vulkan driver for the card): greedy tokens against the CPU
#      (three models), prefill(512) and decode tok/s for Qwen2.5-Coder-0.5B
#      Q4_K_M's shapes with CUDA graphs, 8 batched streams.
#
# The log is also written to $OUT/device_check_cuda.log when $OUT is set.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.cuda-carry"

pack() {
    local src="${1:-$ROOT/elelem/_lib}" f
    [ -f "$src/libggml-cuda.so" ] || { echo "no libggml-cuda.so in $src: build with ELELEM_CUDA=1 first" >&2; exit 1; }
    [ -f "$ROOT/elelem/_native/core.cpp" ] || { echo "no elelem/_native/core.cpp: build elelem first" >&2; exit 1; }
    rm -rf "$CARRY"
    mkdir -p "$CARRY"
    cp "$src"/libggml-base.so.0 "$src"/libggml.so.0 "$src"/LICENSE-ggml "$CARRY/"
    for f in "$src"/libggml-cpu*.so "$src"/libggml-cuda.so "$src"/libggml-vulkan.so; do
        [ -f "$f" ] && xz -T2 -6 -c "$f" > "$CARRY/$(basename "$f").xz"
    done
    xz -T2 -6 -c "$ROOT/elelem/_native/core.cpp" > "$CARRY/core.cpp.xz"
    # gguf (and the yaml it imports) for the synthetic models written there: pure Python.
    python3 - "$CARRY/pylib.tar.xz" <<'PY'
import gguf, yaml, os, sys, tarfile
with tarfile.open(sys.argv[1], "w:xz") as tar:
    for module in (gguf, yaml):
        folder = os.path.dirname(module.__file__)
        tar.add(folder, arcname=os.path.basename(folder),
                filter=lambda info: None if info.name.endswith((".so", ".pyc")) or "__pycache__" in info.name else info)
PY
    local exclude
    exclude="$(git -C "$ROOT" rev-parse --git-path info/exclude)"
    case "$exclude" in /*) ;; *) exclude="$ROOT/$exclude" ;; esac
    grep -qx '/.cuda-carry/' "$exclude" 2>/dev/null || echo '/.cuda-carry/' >> "$exclude"
    du -ah "$CARRY"
    echo "tracked + untracked-not-ignored files: $(git -C "$ROOT" ls-files -co --exclude-standard -z | (cd "$ROOT" && du -ch --files0-from=- 2>/dev/null | tail -n 1 | cut -f1))"
}

unpack() {
    # elelem/_lib from the carried libraries, as the build would have left it.
    local lib="$ROOT/elelem/_lib" f
    mkdir -p "$lib"
    cp "$CARRY"/libggml-base.so.0 "$CARRY"/libggml.so.0 "$CARRY"/LICENSE-ggml "$lib/"
    for f in "$CARRY"/*.so.xz "$CARRY"/core.cpp.xz; do
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$f" "$lib/$(basename "${f%.xz}")"
    done
    mv "$lib/core.cpp" "$ROOT/elelem/_native/core.cpp"
    mkdir -p "$CARRY/pylib" && tar -xJf "$CARRY/pylib.tar.xz" -C "$CARRY/pylib"
}

compile_core() {
    # elelem/_core for this machine's Python and numpy, from Cython's C++ output (setup.py's flags).
    local py="$1" ext inc
    ext="$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
    inc="-I$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') -I$("$py" -c 'import numpy; print(numpy.get_include())') -I$ROOT/third_party/ggml/include -I$ROOT/elelem/_native/kernels"
    local objs=() k
    for k in small_batch small_batch_avx2 small_batch_avx512 small_batch_avx512_q6_k small_batch_q4_k; do
        gcc -O3 -g0 -fPIC $inc -c "$ROOT/elelem/_native/kernels/$k.c" -o "/tmp/elelem-$k.o" || return 1
        objs+=("/tmp/elelem-$k.o")
    done
    g++ -O3 -g0 -fPIC -shared -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION $inc "$ROOT/elelem/_native/core.cpp" \
        "${objs[@]}" "$ROOT/elelem/_lib/libggml.so.0" "$ROOT/elelem/_lib/libggml-base.so.0" \
        '-Wl,-rpath,$ORIGIN/_lib' -lm -lpthread -o "$ROOT/elelem/_core$ext"
}

python_with_numpy() {
    local p
    for p in "${ELELEM_DEVICE_PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
        [ -n "$p" ] && "$p" -c "import numpy" 2>/dev/null && { echo "$p"; return; }
    done
    echo "no python3 with numpy found" >&2
    return 1
}

check() {
    local t0=$SECONDS status=0 py
    unpack || { echo "FAIL: unpacking $CARRY: pack here, and carry .cuda-carry"; return 1; }
    [ -f "$ROOT/elelem/_lib/libggml-cuda.so" ] || { echo "FAIL: libggml-cuda.so.xz was not carried: pack here"; return 1; }

    echo "== 1. nvidia-smi"
    timeout 30 nvidia-smi || { echo "FAIL: nvidia-smi"; status=1; }
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm,clocks.max.mem --format=csv || true

    echo "== 2. what the CUDA module needs, and where it is found here"
    py="$(python_with_numpy)" || return 1
    echo "python: $py ($("$py" --version 2>&1))"
    (readelf -d "$ROOT/elelem/_lib/libggml-cuda.so" 2>/dev/null || objdump -p "$ROOT/elelem/_lib/libggml-cuda.so") | grep -E 'NEEDED|RUNPATH|RPATH'
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libcudart\.so|libcublas' || true

    echo "== 3. ggml devices and matrix products (scripts/ggml_cuda_smoke.py)"
    # GGML_CUDA_DISABLE_GRAPHS is left unset: graphs are compiled in (USE_GRAPHS=1 in the features line).
    timeout 120 "$py" "$ROOT/scripts/ggml_cuda_smoke.py" "$ROOT/elelem/_lib" --require-gpu || { echo "FAIL: smoke test (rc $?)"; status=1; }

    echo "== 4. elelem's core for $("$py" --version 2>&1), compiled here from the carried core.cpp"
    compile_core "$py" || { echo "FAIL: compiling elelem._core"; return 1; }
    export PYTHONPATH="$ROOT:$CARRY/pylib${PYTHONPATH:+:$PYTHONPATH}"
    "$py" -c 'import elelem._core as c; print("elelem._core", c.__file__)' || { echo "FAIL: import"; return 1; }

    echo "== 5. elelem's offload (scripts/device_check.py): CUDA, then Vulkan"
    timeout 300 "$py" "$ROOT/scripts/device_check.py" --backend CUDA ${OUT:+--json "$OUT/device_check_cuda.json"} \
        || { echo "FAIL: device_check.py CUDA (rc $?)"; status=1; }
    timeout 150 "$py" "$ROOT/scripts/device_check.py" --backend Vulkan --quick \
        ${OUT:+--json "$OUT/device_check_vulkan.json"} || echo "(Vulkan: rc $?; the machine may have no Vulkan driver)"

    echo "== done in $((SECONDS - t0)) s: $([ $status -eq 0 ] && echo ok || echo FAILED)"
    return $status
}

case "${1:-check}" in
    pack) shift; pack "$@" ;;
    check|run)
        if [ -n "${OUT:-}" ]; then
            check 2>&1 | tee "$OUT/device_check_cuda.log"
            exit "${PIPESTATUS[0]}"
        fi
        check ;;
    *) echo "usage: $0 [pack [LIB_DIR] | check]" >&2; exit 2 ;;
esac
