#!/usr/bin/env bash
# Build tensor_ops._cpp with -fsanitize=address,undefined in a throwaway copy of the tree
# and run the cpp tests (tests/test_cpp.py + the cpp part of the conformance harness)
# against it, with libasan/libubsan preloaded into the (uninstrumented) Python.
#
#   cpp_ext/sanitize.sh            # exit status = pytest's
#   KEEP=1 cpp_ext/sanitize.sh     # keep the temp dir for inspection
#
# The working tree is not modified: the instrumented module lives only in the temp copy.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tensor_ops_asan.XXXXXX")
if [[ "${KEEP:-0}" != 1 ]]; then trap 'rm -rf "$TMP"' EXIT; fi
echo "sanitize: copying the tree to $TMP/src"
mkdir -p "$TMP/src"
tar -C "$ROOT" --exclude=./build --exclude='*.so' --exclude=.git --exclude='__pycache__' \
    --exclude=./backend.json -cf - . | tar -C "$TMP/src" -xf -
cd "$TMP/src"
export TENSOR_OPS_CONFIG="$TMP/backend.json"
echo "sanitize: building with -fsanitize=address,undefined (TENSOR_OPS_CPP_SANITIZE=1)"
TENSOR_OPS_CPP_SANITIZE=1 TENSOR_OPS_REQUIRE_CPP=1 python setup.py -q build_ext --inplace \
    > "$TMP/build.log" 2>&1 || { tail -50 "$TMP/build.log"; exit 2; }
CXX=${CXX:-g++}
LIBASAN=$($CXX -print-file-name=libasan.so)
LIBUBSAN=$($CXX -print-file-name=libubsan.so)
echo "sanitize: LD_PRELOAD=$LIBASAN $LIBUBSAN"
# Python itself "leaks" at exit by design: leak checking off; UB aborts (-fno-sanitize-recover).
# Reports go to files (log_path, one per process: the tests' subprocesses inherit the preload),
# printed below, so a report is told apart from a death that left none.
# detect_stack_use_after_return=0: GCC 11-13's ASan puts stack objects on the fake stack without
# their extended alignment (GCC PR sanitizer/110027, fixed in 13.3 / 14), and the AVX-512 kernels'
# 64-byte vector locals then fault on an aligned load: CI's replica of 2026-12-02 stopped at
# "SEGV on unknown address ... high value address" in BlockSum (variant.h, a struct of __m512
# members) at the probe's first rms_norm, intermittently (where a fake frame lands decides it).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0:log_path=$TMP/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$TMP/ubsan"
export TENSOR_OPS_BACKEND=cpp
# -p no:faulthandler: pytest's faulthandler takes SIGSEGV first and runs ASan's handler on its small
# alternate stack, where ASan's report dies as "nested bug in the same thread" with no stack
# (`LD_PRELOAD=libasan.so python -X faulthandler -c "import ctypes; ctypes.string_at(0)"`);
# without it a crash prints ASan's SEGV report and stack.
run_tests() {
    LD_PRELOAD="$LIBASAN $LIBUBSAN" python -u -m pytest -q -p no:cacheprovider -p no:randomly -p no:faulthandler \
        tests/test_cpp.py tests/test_conformance.py -k "cpp or not conformance" "$@"
}
reports() { ls "$TMP"/asan.* "$TMP"/ubsan.* 2>/dev/null || true; }
set +e
run_tests "$@"
rc=$?
set -e
# A run killed by a signal that left no sanitizer report (twice in CI replicas of 2026-12-02,
# before reports went to files; the third replica's report is the fake-stack fault above) runs
# once more, said loudly; a report, or a test failure, fails at once.
if [[ $rc -ge 128 && -z "$(reports)" ]]; then
    echo "sanitize: pytest died by signal $((rc - 128)) with no sanitizer report; running once more"
    set +e
    run_tests "$@"
    rc=$?
    set -e
fi
for f in $(reports); do
    echo "sanitize: report $f"
    cat "$f"
done
if [[ $rc -ne 0 ]]; then echo "sanitize: pytest exit status $rc"; fi
exit $rc
