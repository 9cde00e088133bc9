#!/bin/sh
# testsuite/run.sh [BUILD_DIR]: every test of `make check`.  Each suite prints
# 'PASS: suite :: name' / 'FAIL: suite :: name' lines; this script counts them
# and ends with 'N passed, N failed'.  Exit status 1 if anything failed.
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
export NOVA_BUILD="$B"
LLVM_BIN=$(llvm-config-22 --bindir 2>/dev/null || echo /usr/lib/llvm-22/bin)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

suite() { # name, command...
  name=$1; shift
  echo "== $name"
  one=$(mktemp)
  "$@" > "$one" 2>&1 || true
  cat "$one" >> "$log"
  grep -E '^(FAIL|XPASS|UNRESOLVED|TIMEOUT)' -A12 "$one" || true
  echo "   $name: $(grep -cE '^PASS: ' "$one") passed, $(grep -cE '^(FAIL|XPASS|UNRESOLVED|TIMEOUT): ' "$one") failed"
  rm -f "$one"
}

suite novac "$LLVM_BIN/lit" -v --no-progress-bar testsuite/lit
suite e2e-ops python3 testsuite/e2e/test_ops.py
suite e2e-examples python3 testsuite/e2e/test_examples.py
suite e2e-onnx-models python3 testsuite/e2e/test_onnx_models.py
suite grad python3 testsuite/e2e/test_grads.py
suite e2e-train python3 testsuite/e2e/test_train_onnx.py
suite e2e-checkpoint python3 testsuite/e2e/test_checkpoint.py
[ -f testsuite/runtime/run.sh ] && suite runtime sh testsuite/runtime/run.sh "$B"
[ -f testsuite/bad/run.sh ] && suite bad sh testsuite/bad/run.sh "$B"
[ -f testsuite/configurator/run.sh ] && suite configurator sh testsuite/configurator/run.sh "$B"
[ -f testsuite/bad_onnx/run.sh ] && suite bad-onnx sh testsuite/bad_onnx/run.sh "$B"
[ -f testsuite/fuzz/mutate.py ] && suite fuzz python3 testsuite/fuzz/mutate.py "$B" 200
[ -f testsuite/fuzz/regress.sh ] && suite fuzz-regress sh testsuite/fuzz/regress.sh "$B"
[ -f testsuite/onnx/subset.txt ] && suite onnx python3 testsuite/onnx/conformance.py --build "$B" --subset testsuite/onnx/subset.txt

pass=$(grep -cE '^PASS: ' "$log")
fail=$(grep -cE '^(FAIL|XPASS|UNRESOLVED|TIMEOUT): ' "$log")
echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
