#!/bin/sh
# testsuite/faults/run.sh [BUILD_DIR]: fault injection (README.md here).
#
# Three jobs, each over a folder that already holds the older, good results:
#   compile   novac tiny.nova --train --lr=0.05 -o step.so   (over an older
#             step.so + step.json compiled with --lr=0.1)
#   emit      novac tiny.nova --emit=nova -o m.nova          (over an older m.nova)
#   train     novarun step.so --seed 1 --steps 3 --load ckpt.safetensors
#             --save ckpt.safetensors --dump dump --outputs o (over the
#             checkpoint and the dumps of an older run)
# For each job, a first run under the shim (libnvfault.so) counts its
# allocations, writes and fsyncs; then the Nth of each kind is failed, for
# every N up to the count, or for 40 N spread over it (the first and the
# last among them), and once for N past the count (nothing fails).  The
# writes fail with ENOSPC or EIO by turns, and a few runs fail every write
# from the Nth on (a full disk).  Each case passes when:
#   - the exit status is 1 with a message naming the failure ('error:' or
#     'novarun:', and 'No space left on device', 'Input/output error', 'out of
#     memory' or 'Cannot allocate memory'), or 0 when no fault was injected;
#     never a signal;
#   - every result is either the older file, byte for byte, or the new one,
#     byte for byte as a run without faults makes it (all new after exit 0);
#     a new step.so beside the older manifest only where novarun refuses the
#     pair;
#   - no PATH.tmp.* beside the results, nothing left in the case's TMPDIR.
# Prints 'PASS: faults :: JOB/KIND' or 'FAIL: ...' with the failing N and
# reasons, indented.  Exits 0 whatever the results.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
ROOT=$PWD
case $B in /*) ;; *) B=$ROOT/$B ;; esac
NOVAC=$B/bin/novac
NOVARUN=$B/bin/novarun
SHIM=$B/lib/libnvfault.so
MODEL=$ROOT/testsuite/faults/tiny.nova
TIMEOUT=${NOVA_FAULTS_TIMEOUT:-60}
SAMPLES=${NOVA_FAULTS_SAMPLES:-40}
CAUSE='No space left on device|Input/output error|out of memory|Cannot allocate memory'
export NOVAC_JOBS=2 # code generation in two worker processes, on any machine

for f in "$NOVAC" "$NOVARUN" "$SHIM"; do
  if [ ! -e "$f" ]; then
    echo "FAIL: faults :: setup"
    echo "    $f is missing; build it first (make all)"
    exit 0
  fi
done

# a sanitizer's runtime must come first and owns malloc: no shim beside it
if ldd "$NOVAC" 2> /dev/null | grep -qE 'lib(a|t|ub)san'; then
  echo "faults: skipped: $NOVAC is a sanitizer build (the shim cannot be preloaded into it)"
  exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nova-faults.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT INT TERM
ref=$tmp/ref

# ---- the references: older results and the new ones a run without faults makes
setup() {
  mkdir -p "$ref/old" "$ref/new" "$ref/emit" "$ref/train" "$ref/tmp" || return 1
  (
    cd "$ref/old" || exit 1
    export TMPDIR="$ref/tmp"
    "$NOVAC" "$MODEL" --train --lr=0.1 -o step.so &&
      "$NOVARUN" step.so --seed 2 --steps 2 --save ckpt.safetensors --dump dump --outputs o -q &&
      printf '// an older m.nova\n' > m.nova &&
      cd "$ref/new" && "$NOVAC" "$MODEL" --train --lr=0.05 -o step.so &&
      cd "$ref/emit" && "$NOVAC" "$MODEL" --emit=nova -o m.nova &&
      cd "$ref/train" && cp -r "$ref/old/step.so" "$ref/old/step.json" "$ref/old/ckpt.safetensors" . &&
      "$NOVARUN" step.so --seed 1 --steps 3 --load ckpt.safetensors --save ckpt.safetensors \
        --dump dump --outputs o -q &&
      "$NOVARUN" step.so --seed 1 --load ckpt.safetensors -q
  ) > "$tmp/setup.log" 2>&1
}
if ! setup; then
  echo "FAIL: faults :: setup"
  sed 's/^/    | /' "$tmp/setup.log" | head -n 20
  exit 0
fi

# populate JOB DIR: DIR gets the older results JOB runs over
populate() {
  case $1 in
  compile) cp "$ref/old/step.so" "$ref/old/step.json" "$2/" ;;
  emit) cp "$ref/old/m.nova" "$2/" ;;
  train) cp -r "$ref/old/step.so" "$ref/old/step.json" "$ref/old/ckpt.safetensors" "$ref/old/dump" \
    "$ref/old/o" "$2/" ;;
  esac
}

# results JOB: the files JOB writes (relative to its folder)
results() {
  case $1 in
  compile) echo "step.so step.json" ;;
  emit) echo "m.nova" ;;
  train) (cd "$ref/train" && echo ckpt.safetensors dump/* o/*) ;;
  esac
}

# newref JOB: the folder holding JOB's new results
newref() {
  case $1 in compile) echo "$ref/new" ;; emit) echo "$ref/emit" ;; train) echo "$ref/train" ;; esac
}

# run JOB CASE_DIR [VAR=VALUE...]: runs JOB in CASE_DIR/out under the shim
run() {
  job=$1 c=$2
  shift 2
  case $job in
  compile | emit) in=exe,libcjson ;;
  train) in=exe,libcjson,libprotobuf-c,step.so ;;
  esac
  case $job in
  compile) set -- "$@" "$NOVAC" "$MODEL" --train --lr=0.05 -o step.so ;;
  emit) set -- "$@" "$NOVAC" "$MODEL" --emit=nova -o m.nova ;;
  train) set -- "$@" "$NOVARUN" step.so --seed 1 --steps 3 --load ckpt.safetensors --save ckpt.safetensors \
    --dump dump --outputs o -q ;;
  esac
  (cd "$c/out" && timeout -k 5 "$TIMEOUT" env TMPDIR="$c/tmp" LD_PRELOAD="$SHIM" NV_FAULT_PATH="$c" \
    NV_FAULT_MALLOC_IN="$in" NV_FAULT_REPORT="$c/report" "$@" \
    > "$c/stdout" 2> "$c/stderr" < /dev/null)
}

# fresh: an empty case folder with the older results, in $c
fresh() {
  c=$tmp/case
  rm -rf "$c"
  mkdir -p "$c/out" "$c/tmp"
  populate "$1" "$c/out"
}

# report_field NAME: a count from the shim's report of the last case
report_field() { sed -n "s/.*$1=\([0-9]*\).*/\1/p" "$c/report" 2>/dev/null | head -n 1; }

# samples K: the N to try for a count K
samples() {
  k=$1
  if [ "$k" -le "$SAMPLES" ]; then
    seq 1 "$k"
  else
    awk -v k="$k" -v s="$SAMPLES" 'BEGIN { for (i = 0; i < s; i++) print 1 + int((k - 1) * i / (s - 1)) }' | uniq
  fi
  echo $((k + 1))
}

# check JOB N RC: the reasons case N failed, in $why (empty: it passed)
check() {
  job=$1 n=$2 rc=$3 why=
  hit=$(report_field hit)
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    why="$why; hang (exit $rc)"
  elif [ "$rc" -ge 128 ]; then
    why="$why; killed by signal $((rc - 128))"
  elif [ "$rc" -eq 1 ]; then
    grep -qE '(error:|novarun:)' "$c/stderr" || why="$why; exit 1 without a diagnostic"
    grep -qE "$CAUSE" "$c/stderr" || why="$why; the message does not name the failure"
    [ "${hit:-0}" -gt 0 ] || why="$why; exit 1 though no fault was injected"
  elif [ "$rc" -ne 0 ]; then
    why="$why; exit status $rc"
  fi
  new=$(newref "$job")
  mixed=
  for f in $(results "$job"); do
    if [ -e "$c/out/$f" ] && cmp -s "$c/out/$f" "$new/$f"; then
      :
    elif [ "$rc" -eq 0 ]; then
      why="$why; exit 0 but $f is not the new one"
    elif [ -e "$ref/old/$f" ] && [ -e "$c/out/$f" ] && cmp -s "$c/out/$f" "$ref/old/$f"; then
      [ "$f" = step.so ] || [ "$f" = step.json ] && mixed="$mixed old:$f"
    elif [ ! -e "$ref/old/$f" ] && [ ! -e "$c/out/$f" ]; then
      :
    else
      why="$why; $f is neither the older file nor the new one (partial?)"
    fi
  done
  case $job in
  compile)
    if [ -n "$mixed" ] && [ "$mixed" != " old:step.so old:step.json" ]; then
      # a new .so beside the older manifest (or the reverse): refused, never loaded
      if (cd "$c/out" && TMPDIR="$c/tmp" "$NOVARUN" step.so --seed 1 -q > "$c/mix.log" 2>&1); then
        why="$why; novarun loads a mismatched pair ($mixed)"
      elif ! grep -q 'does not match its manifest' "$c/mix.log"; then
        why="$why; a mismatched pair refused without saying so: $(head -c 150 "$c/mix.log")"
      fi
    fi ;;
  train)
    for f in step.so step.json; do cmp -s "$c/out/$f" "$ref/old/$f" || why="$why; training changed $f"; done ;;
  esac
  left=$(find "$c/out" -name '*.tmp.*' | sed "s|$c/||" | tr '\n' ' ')
  [ -z "$left" ] || why="$why; temporaries left: $left"
  left=$(find "$c/tmp" -mindepth 1 -maxdepth 1 | sed "s|$c/||" | tr '\n' ' ')
  [ -z "$left" ] || why="$why; left in TMPDIR: $left"
}

# job JOB KIND [sticky]: every sampled N of KIND over JOB
job() {
  job=$1 kind=$2 mode=${3:-}
  name=$job/$(echo "$kind" | tr 'A-Z' 'a-z')${mode:+-$mode}
  fresh "$job"
  run "$job" "$c" NV_FAULT_MALLOC=0
  rc=$?
  k=$(report_field "$(echo "$kind" | tr 'A-Z' 'a-z')")
  if [ "$rc" -ne 0 ] || [ -z "$k" ]; then
    echo "FAIL: faults :: $name"
    echo "    the counting run failed (exit $rc):"
    head -n 5 "$c/stderr" | sed 's/^/      | /'
    return
  fi
  if [ "$mode" = sticky ]; then
    list="1 $(((k + 1) / 2)) $k"
  else
    list=$(samples "$k")
  fi
  bad= cases=0 e=ENOSPC
  for n in $list; do
    fresh "$job"
    if [ "$e" = ENOSPC ]; then e=EIO; else e=ENOSPC; fi
    run "$job" "$c" "NV_FAULT_$kind=$n" NV_FAULT_ERRNO=$e ${mode:+NV_FAULT_STICKY=1}
    rc=$?
    check "$job" "$n" "$rc"
    cases=$((cases + 1))
    if [ -n "$why" ]; then
      bad="$bad
    N=$n ($e): exit $rc${why}
      | $(head -n 2 "$c/stderr" | cut -c1-200 | tr '\n' ' ')"
    fi
  done
  if [ -z "$bad" ]; then
    echo "PASS: faults :: $name ($cases cases, count $k)"
  else
    echo "FAIL: faults :: $name (count $k)$bad"
  fi
}

# NOVA_FAULTS_KINDS (default "WRITE FSYNC MALLOC"): the kinds to try
KINDS=${NOVA_FAULTS_KINDS:-WRITE FSYNC MALLOC}
for j in compile emit train; do
  for kind in $KINDS; do job $j "$kind"; done
  case " $KINDS " in *" WRITE "*) [ $j = emit ] || job $j WRITE sticky ;; esac
done

exit 0
