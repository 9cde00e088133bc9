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

report() { # name, file with a suite's output: counted, its failures shown
  cat "$2" >> "$log"
  grep -E '^(FAIL|XPASS|UNRESOLVED|TIMEOUT)' -A12 "$2" || true
  echo "   $1: $(grep -cE '^PASS: ' "$2") passed, $(grep -cE '^(FAIL|XPASS|UNRESOLVED|TIMEOUT): ' "$2") failed"
}

# The count of everything run, the last line; exit 1 if anything failed.
finish() {
  pass=$(grep -cE '^PASS: ' "$log")
  fail=$(grep -cE '^(FAIL|XPASS|UNRESOLVED|TIMEOUT): ' "$log")
  echo
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
  exit
}

suite() { # name, command...
  name=$1; shift
  echo "== $name"
  one=$(mktemp)
  "$@" > "$one" 2>&1 || true
  report "$name" "$one"
  rm -f "$one"
}

if [ "${NOVA_SUITES:-all}" = gpu ]; then
  # NOVA_GPU_FLAGS (default "--target=cuda --device=auto"): the target flags.
  # With NOVA_STEP_CACHE_MODE=fill (bench/pack_gpu.sh) the suites run here,
  # without a GPU, to record every compile (tools/stepcache.py); with =use they
  # run on a GPU machine from the recorded steps, without novac.
  # The suites run side by side (each its own process and CUDA context).
  GF=${NOVA_GPU_FLAGS:---target=cuda --device=auto}
  if [ "${NOVA_STEP_CACHE_MODE:-}" = fill ]; then
    echo "check-gpu: recording the compiles in $NOVA_STEP_CACHE (--gpu-sim runs here)"
  elif ! why=$(python3 testsuite/gpu/has_gpu.py); then
    echo "check-gpu: skipped: $why"
    echo
    echo "0 passed, 0 failed"
    exit 0
  else
    echo "check-gpu: $why"
  fi
  # NOVA_GPU_LOG_DIR: keep each suite's output there (written as it runs)
  gdir=${NOVA_GPU_LOG_DIR:-$(mktemp -d)}
  mkdir -p "$gdir"
  for t in ops grads gemm examples onnx_models train_onnx checkpoint amp; do
    env NOVA_TEST_FLAGS="$GF" NOVA_TEST_TAG=gpu/ PYTHONUNBUFFERED=1 python3 "testsuite/e2e/test_$t.py" \
      > "$gdir/gpu-$t" 2>&1 &
  done
  for t in gemm onnx_models; do
    env NOVA_TEST_FLAGS="$GF --matmul-precision=tf32" NOVA_TEST_TAG=gpu-tf32/ PYTHONUNBUFFERED=1 \
      python3 "testsuite/e2e/test_$t.py" > "$gdir/gpu-tf32-$t" 2>&1 &
  done
  wait
  for f in "$gdir"/gpu-*; do
    echo "== ${f##*/}"
    report "${f##*/}" "$f"
  done
  [ -n "${NOVA_GPU_LOG_DIR:-}" ] || rm -rf "$gdir"
  finish
fi

if [ "${NOVA_SUITES:-all}" = fast ]; then
  # NOVA_SUITES=fast (make check-asan-fast, CI): the suites that exercise the
  # parsers, the driver, the runtime and bad input, a few minutes even in a
  # sanitizer build
  suite novac "$LLVM_BIN/lit" -v --no-progress-bar testsuite/lit
  suite runtime sh testsuite/runtime/run.sh "$B"
  suite bad sh testsuite/bad/run.sh "$B"
  suite bad-onnx sh testsuite/bad_onnx/run.sh "$B"
  suite fuzz-regress sh testsuite/fuzz/regress.sh "$B"
  suite e2e-examples python3 testsuite/e2e/test_examples.py
  finish
fi

suite novac "$LLVM_BIN/lit" -v --no-progress-bar testsuite/lit
suite e2e-ops python3 testsuite/e2e/test_ops.py
suite e2e-gemm python3 testsuite/e2e/test_gemm.py
suite e2e-train-loop python3 testsuite/e2e/test_train_loop.py
suite e2e-sizes python3 testsuite/e2e/test_sizes.py
suite e2e-memplan python3 testsuite/e2e/test_memplan.py
suite e2e-data-parallel python3 testsuite/e2e/test_data_parallel.py
suite e2e-data-parallel-mpi python3 testsuite/e2e/test_data_parallel_mpi.py
suite e2e-examples python3 testsuite/e2e/test_examples.py
suite e2e-onnx-models python3 testsuite/e2e/test_onnx_models.py
suite e2e-fold python3 testsuite/e2e/test_fold.py
suite e2e-init python3 testsuite/e2e/test_init.py
suite e2e-chunks python3 testsuite/e2e/test_chunks.py
suite e2e-qlinear python3 testsuite/e2e/test_qlinear.py
suite e2e-labels python3 testsuite/e2e/test_labels.py
suite grad python3 testsuite/e2e/test_grads.py
suite grad-onnx python3 testsuite/e2e/test_grads_onnx.py
suite e2e-seq python3 testsuite/e2e/test_sequence_onnx.py
suite e2e-train python3 testsuite/e2e/test_train_onnx.py
suite e2e-checkpoint python3 testsuite/e2e/test_checkpoint.py
suite e2e-torch-ckpt python3 testsuite/e2e/test_torch_ckpt.py
suite zoo python3 testsuite/zoo/test_zoo.py
suite e2e-train-roles python3 testsuite/e2e/test_train_roles.py
suite e2e-batchnorm-train python3 testsuite/e2e/test_batchnorm_train.py
suite e2e-eval python3 testsuite/e2e/test_eval.py
suite e2e-dropout python3 testsuite/e2e/test_dropout.py
suite e2e-amp python3 testsuite/e2e/test_amp.py
# the whole-model numeric tests again with every optimization off (-O0: no
# fusion, plan, in-place updates, tiling, threads): the same results
suite O0-zoo env NOVA_TEST_FLAGS=-O0 NOVA_TEST_TAG=O0/ python3 testsuite/zoo/test_zoo.py
for t in examples onnx_models train_onnx; do
  suite "O0-$t" env NOVA_TEST_FLAGS=-O0 NOVA_TEST_TAG=O0/ python3 "testsuite/e2e/test_$t.py"
done
# the whole-model tests again with every tiled kernel called, as in a large
# step (codegen/kernel_once.c; by default from 2,048 kernel ops): the same results
suite calls-zoo env NOVAC_KERNEL_CALLS=1 NOVA_TEST_TAG=calls/ python3 testsuite/zoo/test_zoo.py
for t in grads_onnx batchnorm_train dropout eval; do
  suite "calls-$t" env NOVAC_KERNEL_CALLS=1 NOVA_TEST_TAG=calls/ python3 "testsuite/e2e/test_$t.py"
done
# the whole-model numeric tests with each training step compiled under
# --memory-limit at 0.75x its plan (passes/recompute.c: matmuls, norms and
# softmaxes recomputed from checkpoints): the same results.  Four models;
# NOVA_CHECK_ALL=1 (make check-all) every one (15 min on 2 cores).
if [ "${NOVA_CHECK_ALL:-0}" = 1 ]; then
  suite remat-zoo env NOVA_TEST_MEMORY_FRACTION=0.75 NOVA_TEST_TAG=remat/ python3 testsuite/zoo/test_zoo.py
else
  suite remat-zoo env NOVA_TEST_MEMORY_FRACTION=0.75 NOVA_TEST_TAG=remat/ python3 testsuite/zoo/test_zoo.py \
    gpt2.ts resnet18.dynamo llama.ts dropbn_train.ts
fi
[ -f testsuite/runtime/run.sh ] && suite runtime sh testsuite/runtime/run.sh "$B"
[ -f testsuite/bad/run.sh ] && suite bad sh testsuite/bad/run.sh "$B"
# the Nth allocation, write or fsync failed, compiles and training runs
# killed -9: clean errors, no partial or lost file, nothing left behind
[ -f testsuite/faults/run.sh ] && suite faults sh testsuite/faults/run.sh "$B"
[ -f testsuite/faults/kill.sh ] && suite faults-kill sh testsuite/faults/kill.sh "$B"
[ -f testsuite/configurator/run.sh ] && suite configurator sh testsuite/configurator/run.sh "$B"
[ -f testsuite/bad_onnx/run.sh ] && suite bad-onnx sh testsuite/bad_onnx/run.sh "$B"
[ -f testsuite/fuzz/mutate.py ] && suite fuzz python3 testsuite/fuzz/mutate.py "$B" 200
[ -f testsuite/fuzz/regress.sh ] && suite fuzz-regress sh testsuite/fuzz/regress.sh "$B"
[ -f testsuite/deps/run.sh ] && suite deps sh testsuite/deps/run.sh "$B"
[ -f testsuite/cache/run.sh ] && suite cache sh testsuite/cache/run.sh "$B"
[ -f testsuite/cuda/run.sh ] && suite cuda sh testsuite/cuda/run.sh "$B"
# the GPU mapping (kernels, launches, copies, constants) checked on the CPU:
# the same numeric tests with every kernel run as loops over its grid and block
SIM="--target=cuda --device=h100 --gpu-sim"
for t in ops grads gemm examples onnx_models train_onnx qlinear amp; do
  suite "gpu-sim-$t" env NOVA_TEST_FLAGS="$SIM" NOVA_TEST_TAG=gpu-sim/ python3 "testsuite/e2e/test_$t.py"
done
# the tensor-core GEMM (mma.sync fragments emulated per warp)
for t in gemm onnx_models; do
  suite "gpu-sim-tf32-$t" env NOVA_TEST_FLAGS="$SIM --matmul-precision=tf32" NOVA_TEST_TAG=gpu-sim-tf32/ \
    python3 "testsuite/e2e/test_$t.py"
done
[ -f testsuite/onnx/subset.txt ] && suite onnx python3 testsuite/onnx/conformance.py --build "$B" --subset testsuite/onnx/subset.txt

finish
