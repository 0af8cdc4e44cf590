#!/usr/bin/env bash
# The native kernels built with AddressSanitizer and UndefinedBehaviorSanitizer, and the fuzz and kernel tests run on
# that build (SPECWISE_NATIVE_LIB): any out-of-bounds access or undefined behaviour stops the run with a report.
# Usage: scripts/sanitize.sh [test files and pytest arguments]   (make sanitize: every kernel test; run before each
# release. CI runs it over the fuzz tests.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=build/sanitize
KERNELS=specwise/models/kernels
mkdir -p "$OUT"
INCLUDE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
gcc -shared -fPIC -O1 -g -fno-omit-frame-pointer -std=c11 -fopenmp -fno-math-errno \
    -fsanitize=address,undefined -fno-sanitize-recover=all -I"$INCLUDE" \
    "$KERNELS"/*.c -lm -o "$OUT/_native.so"
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
"$PY" -c 'from specwise.models.kernels import library_path, native_library; assert native_library() is not None; print("sanitizer build:", library_path())'
"$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
