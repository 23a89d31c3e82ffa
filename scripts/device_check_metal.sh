#!/usr/bin/env bash
# elelem's Metal backend on an Apple Silicon Mac (macOS 13.3 or later), the one
# script a Mac user or a CI runner with a Mac runs: it cannot run on Linux.
#
#   bash scripts/device_check_metal.sh              # build this tree (pip install .) and check it
#   bash scripts/device_check_metal.sh WHEEL.whl    # check a built wheel (cibuildwheel's macOS arm64 one)
#
# In a fresh virtual environment (build/metal-check/venv), with the Xcode
# Command Line Tools (the shaders are embedded as source and compiled by the
# Metal driver at run time, so Xcode's `metal` compiler is not needed):
#
#   1. the build: pip install . (Metal is on by default on macOS, its
#      shaders embedded: GGML_METAL_EMBED_LIBRARY) or the wheel given;
#   2. what it ships: libggml-metal.so with the shaders in its __ggml_metallib
#      section and no default.metallib beside it, and every ggml library
#      finding the others through @loader_path (no build folder in an rpath);
#   3. elelem info --system and --devices: the Metal module loaded, MTL0 listed;
#   4. tests/test_metal.py: the build switches, the device layer with Metal's
#      names, and every layer of a tiny model on MTL0 by default, its logits
#      and tokens against the CPU's, flash attention off and on;
#   5. the fallback: with Metal's devices hidden (GGML_METAL_DEVICES=0) a run
#      logs why it is on the CPU and still generates; -ngl 4 is then an error;
#   6. scripts/device_check.py --backend Metal: the packaged models (where
#      ~/.cache/elelem/models has them, else synthetic ones of their shapes)
#      with every layer on MTL0, teacher-forced against the CPU, and decode
#      and prefill tok/s beside the unified memory's bandwidth bound.
#
# Exit status 0 when every step passed.  Environment: PYTHON (default python3),
# CMAKE_BUILD_PARALLEL_LEVEL.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/build/metal-check"
PY="${PYTHON:-python3}"
WHEEL="${1:-}"

say() { printf '\n== %s\n' "$*"; }
fail() { echo "device_check_metal: FAIL: $*" >&2; exit 1; }

[ "$(uname -s)" = "Darwin" ] && [ "$(uname -m)" = "arm64" ] \
    || { echo "device_check_metal: needs an Apple Silicon Mac (this is $(uname -s) $(uname -m))" >&2; exit 2; }
sw_vers
system_profiler SPDisplaysDataType 2>/dev/null | grep -E "Chipset Model|Metal" || true

say "1. build"
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q --upgrade pip setuptools cmake   # tests/test_metal.py reads setup.py and runs cmake/metal.cmake
t0=$SECONDS
if [ -n "$WHEEL" ]; then
    "$VPY" -m pip install "$WHEEL[test]"
else
    (cd "$ROOT" && ELELEM_METAL=1 "$VPY" -m pip install ".[test]")
fi
echo "installed in $((SECONDS - t0)) s"
LIB="$(cd "$WORK" && "$VPY" -c 'import elelem._core as c; print(c.LIB_DIR)')"
case "$LIB" in "$WORK"/venv/*) ;; *) fail "elelem imported from $LIB, not the venv" ;; esac

say "2. what the build ships ($LIB)"
ls -l "$LIB"
[ -f "$LIB/libggml-metal.so" ] || fail "no libggml-metal.so: built without Metal"
otool -l "$LIB/libggml-metal.so" | grep -q "sectname __ggml_metallib" \
    || fail "libggml-metal.so has no embedded shaders (__ggml_metallib)"
[ ! -e "$LIB/default.metallib" ] || fail "a default.metallib beside the module: the shaders were not embedded"
for f in "$LIB"/*.dylib "$LIB"/*.so "$(dirname "$LIB")"/_core*.so; do
    rpaths="$(otool -l "$f" | awk '/cmd LC_RPATH/ {getline; getline; print $2}')"
    for r in $rpaths; do
        case "$r" in @loader_path|@loader_path/_lib) ;; *) fail "$(basename "$f") has the rpath $r" ;; esac
    done
    otool -L "$f" | tail -n +2 | awk '{print $1}' | while read -r dep; do
        case "$dep" in @rpath/libggml*|/usr/lib/*|/System/Library/*) ;; *) fail "$(basename "$f") links $dep" ;; esac
    done
done
echo "the shaders are embedded; every library finds the others through @loader_path"

say "3. elelem info"
(cd "$WORK" && "$VPY" -m elelem info --system)
devices="$(cd "$WORK" && "$VPY" -m elelem info --devices)"
echo "$devices"
grep -q "Metal module: loaded" <<<"$devices" || fail "the Metal module did not load"
grep -q "MTL0" <<<"$devices" || fail "no MTL0 device"

say "4. tests/test_metal.py"
# from a copy of tests/ beside no elelem/ folder, so that the installed elelem is the one imported
rm -rf "$WORK/run" && mkdir -p "$WORK/run/third_party/ggml"
cp -R "$ROOT/tests" "$ROOT/cmake" "$ROOT/pyproject.toml" "$ROOT/setup.py" "$WORK/run/"
cp "$ROOT/third_party/ggml/LICENSE" "$WORK/run/third_party/ggml/"
(cd "$WORK/run" && "$VPY" -m pytest -q -p no:cacheprovider tests/test_metal.py -rs) | tee "$WORK/tests.txt"
# the live tests must have run here, not skipped
if grep -q "skipped" "$WORK/tests.txt"; then fail "a Metal test skipped on this Mac"; fi

say "5. the fallback, with Metal's devices hidden"
(cd "$WORK/run" && "$VPY" - <<'PY'
import sys
sys.path.insert(0, "tests/support")
from synthetic import TinyConfig, write_model
write_model("four.gguf", TinyConfig(n_layer=4, n_ctx_train=512, n_vocab=128))
PY
)
out="$(cd "$WORK/run" && GGML_METAL_DEVICES=0 "$VPY" -m elelem run -m four.gguf -n 4 --raw --temperature 0 -v hi 2>&1)" \
    || fail "the CPU fallback run failed: $out"
grep -q "offload: every layer on the CPU: no GPU" <<<"$out" || fail "the fallback was not logged: $out"
echo "$out" | grep "offload:"
if (cd "$WORK/run" && GGML_METAL_DEVICES=0 "$VPY" -m elelem run -m four.gguf -n 4 -ngl 4 hi >/dev/null 2>&1); then
    fail "-ngl 4 with no Metal device ran instead of refusing"
fi
echo "-ngl 4 without a device: refused"

say "6. scripts/device_check.py --backend Metal"
cp -R "$ROOT/scripts" "$WORK/run/"
(cd "$WORK/run" && "$VPY" scripts/device_check.py --backend Metal --json "$WORK/metal.json")

say "device_check_metal: ok ($WORK/metal.json)"
