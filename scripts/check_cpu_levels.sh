#!/usr/bin/env bash
# Run elelem under qemu-user on older x86-64 CPUs than this one, and check
# that each build does what it promises there:
#
# - the portable build (ELELEM_PORTABLE=1, every CPU variant) picks the
#   variant that CPU runs (haswell on Haswell, sse42 on Nehalem), loads
#   SmolLM2 and generates;
# - a native build (one CPU module for the build machine) refuses, with an
#   ImportError that says why, on a CPU that lacks its instruction sets,
#   instead of dying of SIGILL.
#
#   scripts/check_cpu_levels.sh PORTABLE_PYTHON [NATIVE_PYTHON]
#
# Each PYTHON is an interpreter whose environment has that build of elelem
# installed (scripts/build_wheel.sh makes one with the portable wheel:
# dist/work/venv/bin/python).  NATIVE_PYTHON defaults to python3.  qemu-user
# comes from Debian's qemu-user package, installed here when missing.  QEMU's
# TCG emulates up to AVX2, so the levels checked are Haswell and Nehalem.
set -euo pipefail

PORTABLE="$(realpath -s "${1:?usage: $0 PORTABLE_PYTHON [NATIVE_PYTHON]}")"
# The interpreter itself, not a wrapper script (pyenv's shims are bash): qemu-user runs ELF files only.
NATIVE="$("${2:-python3}" -c 'import sys; print(sys.executable)')"
# Run from a folder with no elelem/ in it: from a checkout, `python -c` would
# import the source tree instead of the installed package.
cd "$(mktemp -d)"
MODEL="${ELELEM_CHECK_MODEL:-smollm2-135m}"

if ! command -v qemu-x86_64 >/dev/null; then
    echo "installing qemu-user (Debian)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null
fi

# The model is resolved (pulled if need be) natively, once: emulated, it
# would only be slower.
MODEL_PATH="$("$PORTABLE" -c "from elelem.model.hub import resolve_model; print(resolve_model('$MODEL'))")"

GENERATE='
import sys, elelem
from elelem import _core
with elelem.LLM(sys.argv[1], n_ctx=64, n_threads=1) as llm:
    text = llm.generate("The capital of France is", max_tokens=3, temperature=0)
print(_core.cpu_backend_info()["variant"], repr(text))
'

# NumPy's bundled OpenBLAS picks its kernels from CPUID, and under qemu-user
# it takes the emulated Nehalem for a Haswell (OPENBLAS_VERBOSE=2: "Core:
# Haswell") and dies of SIGILL in `import numpy`, before elelem is imported
# (seen with numpy 2.2.6 to 2.4.6 on an AVX-512 host).  Real Nehalems are
# detected as such; here the emulated CPU is named to it.
export_blas_core() { export OPENBLAS_CORETYPE="$1"; }

failures=0
check_portable() {  # CPU EXPECTED_VARIANT
    local out status=0
    export_blas_core "$1"
    out="$(qemu-x86_64 -cpu "$1" "$PORTABLE" -c "$GENERATE" "$MODEL_PATH" 2>/tmp/elelem-qemu-$1.err)" || status=$?
    if [ "$status" -ne 0 ]; then
        echo "FAIL portable on $1: exit $status"; tail -n 5 "/tmp/elelem-qemu-$1.err"; failures=$((failures + 1))
    elif [ "${out%% *}" != "$2" ] || [ "${out#* }" = "''" ]; then
        echo "FAIL portable on $1: expected variant $2 and some text, got: $out"; failures=$((failures + 1))
    else
        echo "ok   portable on $1: $out"
    fi
}

check_native_refuses() {  # CPU
    local status=0
    export_blas_core "$1"
    qemu-x86_64 -cpu "$1" "$NATIVE" -c "import elelem._core" 2>/tmp/elelem-qemu-native.err || status=$?
    if [ "$status" -eq 1 ] && grep -q "ImportError: this elelem was built for another CPU" /tmp/elelem-qemu-native.err; then
        echo "ok   native on $1: refused with ImportError (no SIGILL)"
    elif [ "$status" -eq 0 ]; then
        echo "skip native on $1: this native build runs there (it was built for a CPU no newer than $1)"
    else
        echo "FAIL native on $1: exit $status (128+4 is SIGILL)"; tail -n 5 /tmp/elelem-qemu-native.err
        failures=$((failures + 1))
    fi
}

check_portable Haswell haswell
check_portable Nehalem sse42
check_native_refuses Nehalem

if [ "$failures" -ne 0 ]; then
    echo "$failures CPU-level check(s) failed"
    exit 1
fi
echo "CPU-level checks passed"
