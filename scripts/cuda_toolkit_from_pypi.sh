#!/usr/bin/env bash
# Assemble a CUDA toolkit tree, that CMake's FindCUDAToolkit and nvcc accept,
# out of NVIDIA's PyPI wheels, so that elelem's CUDA backend module can be
# built on a machine with no GPU and no system CUDA:
#
#   python -m pip install "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
#       "nvidia-cuda-runtime==13.0.*" "nvidia-cublas==13.0.*" "nvidia-cuda-cccl==13.0.*"
#   eval "$(scripts/cuda_toolkit_from_pypi.sh)"        # exports CUDAToolkit_ROOT, CUDACXX
#   ELELEM_CUDA=1 python -m pip install .
#
#   scripts/cuda_toolkit_from_pypi.sh [PYTHON] [TOOLKIT_DIR]
#     PYTHON       the interpreter whose site-packages hold the wheels (default: python3)
#     TOOLKIT_DIR  where to put the tree (default: <that environment's prefix>/cuda-toolkit)
#
# Why CUDA 13 wheels: the cu12 nvcc wheels (nvidia-cuda-nvcc-cu12 12.8, 12.9)
# hold only ptxas and libnvvm, not nvcc, cicc, cudafe++, fatbinary or nvlink,
# so no .cu file can be compiled from them.  The CUDA 13 wheels install one
# toolkit-shaped folder, site-packages/nvidia/cu13/{bin,include,lib,nvvm}.
# What it lacks, and this tree adds as symlinks:
#   - lib64/ (nvcc's profile and FindCUDAToolkit look there) with the
#     unversioned names the linker wants (libcudart.so -> libcudart.so.13);
#   - bin/ beside nvcc.profile: nvcc reads the profile from the folder it was
#     started from, symlinks not resolved, and takes TOP=bin/.. from it.
# No libcuda.so (the driver) is in the wheels: setup.py builds ggml with
# GGML_CUDA_NO_VMM, so the module never links the driver (README, "CUDA").
#
# The last line printed to stdout is shell: `export CUDAToolkit_ROOT=... CUDACXX=...`.
set -euo pipefail

PYTHON="${1:-python3}"
SITE="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PREFIX="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
WHEELS="$SITE/nvidia/cu13"
TK="${2:-$PREFIX/cuda-toolkit}"

die() { echo "cuda_toolkit_from_pypi: $*" >&2; exit 1; }

[ -x "$WHEELS/bin/nvcc" ] || {
    if [ -d "$SITE/nvidia/cuda_nvcc" ]; then
        die "$SITE has the cu12 wheels: nvidia-cuda-nvcc-cu12 ships no nvcc (only ptxas). Install the CUDA 13 wheels (see the top of this script)"
    fi
    die "no $WHEELS/bin/nvcc: pip install nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt (13.0.*) into $PREFIX first"
}
[ -x "$WHEELS/nvvm/bin/cicc" ] || die "no $WHEELS/nvvm/bin/cicc: pip install \"nvidia-nvvm==13.0.*\""
[ -f "$WHEELS/include/crt/host_config.h" ] || die "no crt headers: pip install \"nvidia-cuda-crt==13.0.*\""
[ -f "$WHEELS/include/cuda_runtime.h" ] || die "no cuda_runtime.h: pip install \"nvidia-cuda-runtime==13.0.*\""
[ -f "$WHEELS/include/cublas_v2.h" ] || die "no cublas_v2.h: pip install \"nvidia-cublas==13.0.*\""
[ -d "$WHEELS/include/cccl/cub" ] || die "no CCCL (cub, thrust): pip install \"nvidia-cuda-cccl==13.0.*\""

rm -rf "$TK"
mkdir -p "$TK/bin" "$TK/lib64"
for f in "$WHEELS"/bin/*; do ln -s "$f" "$TK/bin/"; done   # nvcc, nvcc.profile, crt/, ptxas, ...
ln -s "$WHEELS/include" "$TK/include"
ln -s "$WHEELS/nvvm" "$TK/nvvm"
for f in "$WHEELS"/lib/*.so* "$WHEELS"/lib/*.a; do
    [ -e "$f" ] || continue
    name="$(basename "$f")"
    ln -s "$f" "$TK/lib64/$name"
    case "$name" in  # libcudart.so.13 -> also libcudart.so, for -lcudart
        *.so.*) [ -e "$TK/lib64/${name%%.so.*}.so" ] || ln -s "$name" "$TK/lib64/${name%%.so.*}.so" ;;
    esac
done
ln -s lib64 "$TK/lib"
# FindCUDAToolkit reads the version from version.json when nvcc is not asked.
version="$("$TK/bin/nvcc" --version | sed -n "s/.*, V\([0-9.]*\)$/\1/p")"
printf '{"cuda": {"name": "CUDA SDK", "version": "%s"}}\n' "$version" > "$TK/version.json"

echo "CUDA $version toolkit assembled from $WHEELS in $TK" >&2
echo "export CUDAToolkit_ROOT=$TK CUDACXX=$TK/bin/nvcc"
