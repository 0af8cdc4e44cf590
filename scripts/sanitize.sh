#!/usr/bin/env bash
# The native kernels built with AddressSanitizer and UndefinedBehaviorSanitizer, and the fuzz and kernel tests run on
# that build (SPECWISE_NATIVE_LIB): any out-of-bounds access or undefined behaviour stops the run with a report.
# Usage: scripts/sanitize.sh [test files and pytest arguments]   (make sanitize: every kernel test; run before each
# release. CI runs it over the fuzz tests.)
#        scripts/sanitize.sh --build-only   the build alone (CI builds it while the environments are set up)
# The build is redone when a kernel source or this script is newer than it, each source compiled on a core of its
# own. The tests run in worker processes (pytest-xdist, TEST_WORKERS, default 2), each pass on every core as without
# workers (SPECWISE_NUM_THREADS), so that the threads' shares of the work are checked too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=build/sanitize
KERNELS=specwise/models/kernels
mkdir -p "$OUT"
if [ ! -f "$OUT/_native.so" ] \
    || [ -n "$(find "$KERNELS" scripts/sanitize.sh -newer "$OUT/_native.so" \( -name '*.[ch]' -o -name '*.inc' -o -name sanitize.sh \))" ]; then
    # the interpreter's headers: those of .venv's Python, or of the one scripts/setup.sh makes it from
    BASE="$PY"
    [ -x "$BASE" ] || BASE="${PYTHON:-python3}"
    INCLUDE=$("$BASE" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    FLAGS=(-fPIC -O1 -g -fno-omit-frame-pointer -std=c11 -fopenmp -fno-math-errno
        -fsanitize=address,undefined -fno-sanitize-recover=all -I"$INCLUDE")
    rm -rf "$OUT/objects" && mkdir -p "$OUT/objects"
    printf '%s\n' "$KERNELS"/*.c | xargs -P "$(nproc 2>/dev/null || echo 2)" -I{} \
        sh -c 'source=$1 objects=$2; shift 2; exec gcc -c "$@" "$source" -o "$objects/$(basename "$source" .c).o"' \
        _ {} "$OUT/objects" "${FLAGS[@]}"
    gcc -shared -fsanitize=address,undefined -fopenmp "$OUT"/objects/*.o -lm -o "$OUT/_native.so.tmp"
    mv "$OUT/_native.so.tmp" "$OUT/_native.so"
fi
if [ "${1:-}" = --build-only ]; then exit 0; fi
TESTS=(tests/test_fuzz_gguf.py tests/test_fuzz_index.py tests/test_fuzz_heads.py tests/test_fuzz_layer_calls.py
    tests/test_fuzz_float_layer_calls.py
    tests/test_quant.py tests/test_quantized_model.py tests/test_quantized_batch.py tests/test_suffix.py
    tests/test_head.py tests/test_spm_tokenizer.py)
if [ $# -gt 0 ]; then TESTS=(); fi
# the sanitizers' runtimes first in the process (Python itself is not instrumented); leaks are not looked for (the
# interpreter keeps its own allocations to the end)
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export SPECWISE_NATIVE_LIB="$PWD/$OUT/_native.so"
export SPECWISE_CACHE="$PWD/$OUT/cache"
export SPECWISE_NUM_THREADS="${SPECWISE_NUM_THREADS:-$(nproc 2>/dev/null || echo 2)}"
"$PY" -c 'from specwise.models.kernels import library_path, native_library; assert native_library() is not None; print("sanitizer build:", library_path())'
"$PY" -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" --dist worksteal "${TESTS[@]}" "$@"
