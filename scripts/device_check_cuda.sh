#!/usr/bin/env bash
# The one CUDA check to run on a lent NVIDIA machine (the H200), with a CUDA
# build of elelem prepared on a machine without a GPU.  It installs nothing
# and finishes in a few minutes.
#
# Here, after the build (ELELEM_CUDA=1, see README "CUDA"), in the checkout
# whose working tree travels to the device:
#
#   scripts/device_check_cuda.sh pack [LIB_DIR]
#
#     copies LIB_DIR (default: elelem/_lib of this checkout) into .cuda-carry/,
#     which .git/info/exclude ignores, and prints its size: what travels is
#     at most 64 MiB, the working tree included.  libggml-cuda.so for sm_90
#     is 64 MiB by itself, so it travels xz-compressed (37 MiB) and is
#     unpacked there with Python's lzma.
#
# There (the device tool's run, carry=[".cuda-carry"], timeout_s=480):
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
#   4. [placeholder] elelem's own offload, LLM(n_gpu_layers=...), once it exists.
#
# The log is also written to $OUT/device_check_cuda.log when $OUT is set.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.cuda-carry"

pack() {
    local src="${1:-$ROOT/elelem/_lib}"
    [ -f "$src/libggml-cuda.so" ] || { echo "no libggml-cuda.so in $src: build with ELELEM_CUDA=1 first" >&2; exit 1; }
    rm -rf "$CARRY"
    mkdir -p "$CARRY"
    cp "$src"/libggml-base.so.0 "$src"/libggml.so.0 "$src"/libggml-cpu*.so "$CARRY/"
    xz -T2 -6 -c "$src/libggml-cuda.so" > "$CARRY/libggml-cuda.so.xz"
    local exclude
    exclude="$(git -C "$ROOT" rev-parse --git-path info/exclude)"
    case "$exclude" in /*) ;; *) exclude="$ROOT/$exclude" ;; esac
    grep -qx '/.cuda-carry/' "$exclude" 2>/dev/null || echo '/.cuda-carry/' >> "$exclude"
    du -ah "$CARRY"
    echo "tracked + untracked-not-ignored files: $(git -C "$ROOT" ls-files -co --exclude-standard -z | (cd "$ROOT" && du -ch --files0-from=- 2>/dev/null | tail -n 1 | cut -f1))"
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
    if [ ! -f "$CARRY/libggml-cuda.so" ] && [ -f "$CARRY/libggml-cuda.so.xz" ]; then
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$CARRY/libggml-cuda.so.xz" "$CARRY/libggml-cuda.so"
    fi
    [ -f "$CARRY/libggml-cuda.so" ] || { echo "FAIL: $CARRY/libggml-cuda.so missing: pack here, and carry .cuda-carry"; return 1; }

    echo "== 1. nvidia-smi"
    timeout 30 nvidia-smi || { echo "FAIL: nvidia-smi"; status=1; }
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm,clocks.max.mem --format=csv || true

    echo "== 2. what the CUDA module needs, and where it is found here"
    py="$(python_with_numpy)" || return 1
    echo "python: $py ($("$py" --version 2>&1))"
    (readelf -d "$CARRY/libggml-cuda.so" 2>/dev/null || objdump -p "$CARRY/libggml-cuda.so") | grep -E 'NEEDED|RUNPATH|RPATH'
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libcudart\.so|libcublas' || true

    echo "== 3. ggml devices and matrix products (scripts/ggml_cuda_smoke.py)"
    # GGML_CUDA_DISABLE_GRAPHS is left unset: graphs are compiled in (USE_GRAPHS=1 in the features line).
    timeout 240 "$py" "$ROOT/scripts/ggml_cuda_smoke.py" "$CARRY" --require-gpu || { echo "FAIL: smoke test (rc $?)"; status=1; }

    echo "== 4. PLACEHOLDER: elelem's offload (LLM(n_gpu_layers=...)), once the engine has it"
    # Not run yet: elelem loads only its CPU module today.  When offload lands:
    #  - elelem._core must be built for this machine's Python (3.12 here; the
    #    build machine's is 3.11): carry a cp312 build, or carry the Cython
    #    output elelem/_native/core.cpp (2.9 MB, git-ignored: copy it into
    #    .cuda-carry) and compile that one file here against .cuda-carry's
    #    libggml (gcc, Python headers and numpy are on this machine);
    #  - the three models are not here (no network): carry the GGUF files only if
    #    they fit 64 MiB with the rest (smollm2-135m Q4_1 is 94 MiB: it does not),
    #    else use a small synthetic GGUF made by tests' helpers;
    #  - then: greedy tokens of LLM(n_gpu_layers=-1) against n_gpu_layers=0, decode
    #    and prefill(512) tok/s, 8 batched streams (issue 17).
    echo "(skipped: not implemented yet)"

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
