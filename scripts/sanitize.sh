#!/usr/bin/env bash
# Build elelem with AddressSanitizer + UndefinedBehaviorSanitizer in a separate
# venv, then run the test suite (-m "not slow") and a short fuzz campaign under
# it, and print a summary.
#
#   scripts/sanitize.sh            # all steps
#   scripts/sanitize.sh build      # or: test, fuzz, summary (steps reuse earlier ones)
#
# Nothing here touches the editable install or the source tree's build/ folder:
# the source is copied to $ELELEM_ASAN_DIR/src (default /tmp/elelem-asan) and
# installed, non-editable, into $ELELEM_ASAN_DIR/venv with ELELEM_SANITIZE=1
# (see setup.py).  Tests and fuzzers run from $ELELEM_ASAN_DIR/run, a copy of
# tests/ and scripts/ without elelem/, so `import elelem` can only find
# the sanitized build.  (third_party/ is copied too: a few tests read ggml's
# headers.)
#
# Python itself is not instrumented, so libasan is preloaded and leak checking
# is off (the interpreter never frees everything at exit).  ASan stops at the
# first memory error (abort_on_error: the fuzz runner sees a SIGABRT and saves
# the input); UBSan reports are logged and counted without stopping, because
# ggml's SIMD kernels contain intentional type punning that UBSan may flag.
#
# Environment: ELELEM_ASAN_DIR, FUZZ_ITERATIONS (GGUF cases, default 300),
# FUZZ_TEXT_ITERATIONS (tokenizer and template cases each, default 200),
# PYTEST_ARGS (extra pytest arguments), CMAKE_BUILD_PARALLEL_LEVEL (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${ELELEM_ASAN_DIR:-/tmp/elelem-asan}"
VENV="$WORK/venv"
SRC="$WORK/src"
RUN="$WORK/run"
LOGS="$WORK/logs"
PY="$VENV/bin/python"
FUZZ_ITERATIONS="${FUZZ_ITERATIONS:-300}"
FUZZ_TEXT_ITERATIONS="${FUZZ_TEXT_ITERATIONS:-200}"
STEP="${1:-all}"

say() { printf '\n== %s\n' "$*"; }

copy_tree() {  # copy the files git knows about (tracked, and untracked but not ignored) from $ROOT
    local dest="$1"; shift
    mkdir -p "$dest"
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard -- "$@" \
        | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf -) | tar -xf - -C "$dest"
}

sanitizer_env() {
    LIBASAN="$(gcc -print-file-name=libasan.so)"
    export LD_PRELOAD="$LIBASAN"
    export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1:log_path=$LOGS/asan:symbolize=1"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:log_path=$LOGS/ubsan"
    export ELELEM_FUZZ_NO_RLIMIT=1   # ASan's shadow memory needs a huge address space
    export PYTHONDONTWRITEBYTECODE=1
}

build() {
    say "copying the source to $SRC"
    # Copied over the previous copy, so its build/ folder makes a rebuild
    # incremental (ggml is only recompiled when it changed).
    copy_tree "$SRC"
    rm -f "$SRC"/elelem/*.so "$SRC"/elelem/_core.cpp  # always a fresh Cython build of the extension
    if [ ! -x "$PY" ]; then
        say "creating $VENV"
        python3 -m venv "$VENV"
    fi
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "numpy>=1.25" "jinja2>=3.1.6" "regex>=2023.0" "pytest>=8" "hypothesis>=6.100" \
        "gguf>=0.10" "Cython>=3.0.10" "cmake>=3.18" ninja setuptools wheel
    say "building with ELELEM_SANITIZE=1 (ggml and the extension with -fsanitize=address,undefined)"
    (cd "$SRC" && ELELEM_SANITIZE=1 CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$PY" -m pip install --no-build-isolation --no-deps --force-reinstall . 2>&1 | tail -n 3)
    local so
    so="$(cd "$WORK" && "$PY" -I -c 'import importlib.util as u; print(u.find_spec("elelem._core").origin)' || true)"
    ldd "$so" | grep -E 'asan|ubsan' || { echo "the extension is not linked against the sanitizers: $so"; exit 1; }
}

prepare_run() {
    rm -rf "$RUN"
    copy_tree "$RUN" tests scripts pyproject.toml third_party  # some tests read ggml's sources
    mkdir -p "$LOGS"
    (cd "$RUN" && env LD_PRELOAD="$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \
        "$PY" -c 'import elelem, elelem._core as c; print("elelem from", elelem.__file__); print("core  from", c.__file__)')
}

run_tests() {
    say "test suite under ASan/UBSan (-m 'not slow')"
    prepare_run
    rm -f "$LOGS"/asan.* "$LOGS"/ubsan.*
    sanitizer_env
    set +e
    (cd "$RUN" && "$PY" -m pytest tests -m "not slow" -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$LOGS/pytest.txt" | tail -n 25)
    echo "${PIPESTATUS[0]}" > "$LOGS/pytest.rc"
    set -e
}

run_fuzz() {
    say "short fuzz campaigns under ASan/UBSan"
    [ -d "$RUN/tests" ] || prepare_run
    rm -rf "$WORK/fuzz" "$WORK/crashers"  # this run's failures only
    sanitizer_env
    set +e
    (cd "$RUN" && "$PY" scripts/fuzz.py --target gguf --iterations "$FUZZ_ITERATIONS" --seed 1 \
        --real smollm2-135m --out "$WORK/fuzz" --fixtures "$WORK/crashers" --case-timeout 120 2>&1 \
        | tee "$LOGS/fuzz-gguf.txt" | tail -n 15)
    for target in tokenizer template; do
        (cd "$RUN" && "$PY" scripts/fuzz.py --target "$target" --iterations "$FUZZ_TEXT_ITERATIONS" --seed 1 \
            --out "$WORK/fuzz" --fixtures "$WORK/crashers" --case-timeout 120 2>&1 \
            | tee "$LOGS/fuzz-$target.txt" | tail -n 6)
    done
    set -e
}

summary() {
    say "summary"
    echo "pytest: $(grep -E '(passed|failed|error)' "$LOGS/pytest.txt" | tail -n 1 || echo 'not run')"
    for target in gguf tokenizer template; do
        [ -f "$LOGS/fuzz-$target.txt" ] && echo "fuzz:   $(grep -E "^$target: " "$LOGS/fuzz-$target.txt" | tail -n 1)"
    done
    local ubsan
    ubsan=$(cat "$LOGS"/ubsan.* 2>/dev/null | grep -c 'runtime error:' || true)
    # An ASan report counts against elelem when its stack reaches the extension
    # or ggml; the rest are tests and fuzz self-tests crashing on purpose
    # (ctypes.string_at(0), os.abort()).
    echo "AddressSanitizer reports:"
    local f own=0 other=0
    for f in "$LOGS"/asan.*; do
        [ -f "$f" ] || continue
        if grep -qE '_core\.cpython|third_party/ggml|/ggml-|elelem/' "$f"; then
            own=$((own + 1))
            echo "  IN ELELEM/GGML: $f: $(grep -m1 'ERROR: AddressSanitizer' "$f" | sed 's/^==[0-9]*==//')"
            grep -m3 -E '_core|ggml' "$f" | sed 's/^/      /'
        else
            other=$((other + 1))
        fi
    done
    echo "  $own in elelem or ggml, $other elsewhere (intentional crashes in tests)"
    # Fuzz runners send their reports to stderr, which is kept with each failure.
    local kinds
    kinds=$(for f in "$WORK"/fuzz/failures/*.json; do
        if [ -f "$f" ]; then grep -o 'ERROR: AddressSanitizer: [a-zA-Z-]*' "$f" | head -n 1 || true; fi
    done | sed 's/ERROR: AddressSanitizer: //' | sort | uniq -c | tr -s ' \n' ' ')
    echo "  in fuzz failures (one per failing case): ${kinds:-none} (see $WORK/fuzz/failures)"
    echo "UndefinedBehaviorSanitizer reports: $ubsan (unique locations below)"
    cat "$LOGS"/ubsan.* 2>/dev/null | grep 'runtime error:' | sed -E 's/^.*\/(third_party|elelem)/\1/' \
        | sort | uniq -c | sort -rn | head -n 20 || true
    echo "logs: $LOGS"
}

case "$STEP" in
    build) build ;;
    test) run_tests; summary ;;
    fuzz) run_fuzz; summary ;;
    summary) summary ;;
    all) build; run_tests; run_fuzz; summary ;;
    *) echo "usage: $0 [all|build|test|fuzz|summary]"; exit 2 ;;
esac
