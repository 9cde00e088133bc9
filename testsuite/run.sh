#!/bin/sh
# testsuite/run.sh [BUILD_DIR]: every test of `make check`.  Each suite prints
# 'PASS: suite :: name' / 'FAIL: suite :: name' lines; this script counts them
# and ends with 'N passed, N failed'.  Exit status 1 if anything failed.
# NOVA_SUITES=gpu (make check-gpu): instead, the numeric suites compiled with
# --target=cuda --device=auto and run on this machine's GPU; skipped with a
# message, not failed, where there is none.
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

if [ "${NOVA_SUITES:-all}" = gpu ]; then
  if ! why=$(python3 testsuite/gpu/has_gpu.py); then
    echo "check-gpu: skipped: $why"
    echo
    echo "0 passed, 0 failed"
    exit 0
  fi
  echo "check-gpu: $why"
  for t in ops grads gemm examples onnx_models train_onnx checkpoint; do
    suite "gpu-$t" env NOVA_TEST_FLAGS="--target=cuda --device=auto" NOVA_TEST_TAG=gpu/ python3 "testsuite/e2e/test_$t.py"
  done
  for t in gemm onnx_models; do
    suite "gpu-tf32-$t" env NOVA_TEST_FLAGS="--target=cuda --device=auto --matmul-precision=tf32" \
      NOVA_TEST_TAG=gpu-tf32/ python3 "testsuite/e2e/test_$t.py"
  done
  pass=$(grep -cE '^PASS: ' "$log")
  fail=$(grep -cE '^(FAIL|XPASS|UNRESOLVED|TIMEOUT): ' "$log")
  echo
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
  exit
fi

suite novac "$LLVM_BIN/lit" -v --no-progress-bar testsuite/lit
suite e2e-ops python3 testsuite/e2e/test_ops.py
suite e2e-gemm python3 testsuite/e2e/test_gemm.py
suite e2e-memplan python3 testsuite/e2e/test_memplan.py
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
[ -f testsuite/cuda/run.sh ] && suite cuda sh testsuite/cuda/run.sh "$B"
# the GPU mapping (kernels, launches, copies, constants) checked on the CPU:
# the same numeric tests with every kernel run as loops over its grid and block
SIM="--target=cuda --device=h100 --gpu-sim"
for t in ops grads gemm examples onnx_models train_onnx; do
  suite "gpu-sim-$t" env NOVA_TEST_FLAGS="$SIM" NOVA_TEST_TAG=gpu-sim/ python3 "testsuite/e2e/test_$t.py"
done
# the tensor-core GEMM (mma.sync fragments emulated per warp)
for t in gemm onnx_models; do
  suite "gpu-sim-tf32-$t" env NOVA_TEST_FLAGS="$SIM --matmul-precision=tf32" NOVA_TEST_TAG=gpu-sim-tf32/ \
    python3 "testsuite/e2e/test_$t.py"
done
[ -f testsuite/onnx/subset.txt ] && suite onnx python3 testsuite/onnx/conformance.py --build "$B" --subset testsuite/onnx/subset.txt

pass=$(grep -cE '^PASS: ' "$log")
fail=$(grep -cE '^(FAIL|XPASS|UNRESOLVED|TIMEOUT): ' "$log")
echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
