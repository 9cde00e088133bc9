#!/bin/sh
# bench/run_gpu.sh [BUILD_DIR]: everything a GPU session runs, in order:
#   1. make -j$(nproc) all        (a no-op where the build is up to date)
#   2. make check-gpu             (its last 3 lines are kept and printed)
#   3. python3 bench/bench_gpu.py BUILD_DIR --out bench/gpu_results.md
#   4. prints the report
# Fails soft: every step runs even if one before it failed; the exit status is
# 1 if any step failed (or timed out), else 0.
# Environment:
#   NOVA_SKIP_MAKE=1             assume BUILD_DIR is built: no make at all (step 1
#                                skipped; step 2 runs the gpu suites directly,
#                                as make check-gpu does after its build)
#   NOVA_MAKE_TIMEOUT=S          (default 600) limit of step 1
#   NOVA_CHECK_GPU_TIMEOUT=S     (default 240) limit of step 2
#   NOVA_BENCH_TIMEOUT=S         (default 420) limit of step 3 (the script keeps
#                                itself to ~330 s: --budget)
#   NOVA_BENCH_OUT=FILE          (default bench/gpu_results.md)
#   NOVA_BENCH_BUDGET=S          (default 330) bench_gpu.py --budget
#   NOVA_LOG_DIR=DIR             keep the full logs there (default a temporary dir)
#   NOVA_PACK=DIR|FILE.tar.xz    a GPU machine without novac: the steps recorded
#                                by bench/pack_gpu.sh in DIR or its archive (unpacked
#                                into $TMPDIR); implies NOVA_SKIP_MAKE=1, BUILD_DIR=DIR,
#                                the --device the pack was made for
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}
DEVICE=auto
if [ -n "${NOVA_PACK:-}" ]; then
  case "$NOVA_PACK" in
    *.tar.xz)
      u=$(mktemp -d "${TMPDIR:-/tmp}/nova-pack.XXXXXX")
      trap 'rm -rf "$u"' EXIT
      tar xJf "$NOVA_PACK" -C "$u" || exit 1
      NOVA_PACK=$(ls -d "$u"/*/ | head -n 1) ;;
  esac
  B=$(cd "$NOVA_PACK" && pwd) || exit 1
  DEVICE=$(cat "$B/device")
  export NOVA_SKIP_MAKE=1 NOVA_STEP_CACHE="$B/steps" NOVA_STEP_CACHE_MODE=use
  export NOVA_GPU_FLAGS="--target=cuda --device=$DEVICE"
  export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
OUT=${NOVA_BENCH_OUT:-bench/gpu_results.md}
LOGDIR=${NOVA_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/nova-run-gpu.XXXXXX")}
mkdir -p "$LOGDIR"
failed=""
t_start=$(date +%s)

note() { echo "run_gpu: $*"; }
fail() { failed="$failed $1"; note "FAILED: $1 ($2)"; }
lim() { # seconds, command...: the command under timeout when there is one
  s=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout -k 10 "$s" "$@"; else "$@"; fi
}

NPROC=$(nproc 2>/dev/null || echo 4)

# 1. build
if [ "${NOVA_SKIP_MAKE:-0}" = 1 ]; then
  note "make skipped (NOVA_SKIP_MAKE=1)"
else
  note "make -j$NPROC B=$B all"
  lim "${NOVA_MAKE_TIMEOUT:-600}" make -j"$NPROC" B="$B" all > "$LOGDIR/make.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    tail -n 15 "$LOGDIR/make.log"
    fail make "exit $rc"
  else
    note "make: ok"
  fi
fi
for exe in novac novarun; do
  [ -n "${NOVA_PACK:-}" ] && [ $exe = novac ] && continue
  [ -x "$B/bin/$exe" ] || fail "build" "$B/bin/$exe missing"
done

# 2. the numeric suites on the GPU
if [ "${NOVA_SKIP_MAKE:-0}" = 1 ]; then
  note "NOVA_SUITES=gpu sh testsuite/run.sh $B (check-gpu without its build)"
  lim "${NOVA_CHECK_GPU_TIMEOUT:-240}" env NOVA_SUITES=gpu NOVA_GPU_LOG_DIR="$LOGDIR/suites" sh testsuite/run.sh "$B" > "$LOGDIR/check-gpu.log" 2>&1
else
  note "make check-gpu B=$B"
  lim "${NOVA_CHECK_GPU_TIMEOUT:-240}" env NOVA_GPU_LOG_DIR="$LOGDIR/suites" make --no-print-directory check-gpu B="$B" > "$LOGDIR/check-gpu.log" 2>&1
fi
rc=$?
CHECK_TAIL=$(tail -n 3 "$LOGDIR/check-gpu.log")
echo "$CHECK_TAIL" | sed 's/^/  check-gpu| /'
if [ $rc -ne 0 ]; then
  grep -E '^(FAIL|TIMEOUT)' "$LOGDIR/check-gpu.log" | head -n 20 | sed 's/^/  check-gpu| /'
  fail check-gpu "exit $rc$( [ $rc -eq 124 ] && echo ', timed out')"
fi
case "$CHECK_TAIL" in *"skipped:"*) fail check-gpu "skipped: no usable GPU" ;; esac

# 3. the benchmark
note "python3 bench/bench_gpu.py $B --out $OUT"
lim "${NOVA_BENCH_TIMEOUT:-420}" python3 bench/bench_gpu.py "$B" --device="$DEVICE" \
  --budget "${NOVA_BENCH_BUDGET:-330}" --out "$OUT" > "$LOGDIR/bench.out" 2> "$LOGDIR/bench.err"
rc=$?
if [ $rc -ne 0 ]; then
  tail -n 20 "$LOGDIR/bench.err"
  fail bench_gpu "exit $rc$( [ $rc -eq 124 ] && echo ', timed out')"
fi

# 4. the report
echo
if [ -s "$OUT" ] && grep -q "report written to" "$LOGDIR/bench.err"; then
  cat "$OUT"
elif [ -s "$LOGDIR/bench.out" ]; then
  note "no new $OUT; the script's stdout:"
  cat "$LOGDIR/bench.out"
else
  fail report "no report written"
fi
echo
echo "check-gpu (last 3 lines):"
echo "$CHECK_TAIL"
note "done in $(( $(date +%s) - t_start )) s; logs in $LOGDIR"
if [ -n "$failed" ]; then
  note "failed:$failed"
  exit 1
fi
note "all steps passed"
exit 0
