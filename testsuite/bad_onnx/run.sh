#!/bin/sh
# testsuite/bad_onnx/run.sh [BUILD_DIR]: novac on malformed or unsupported ONNX models.
#
# Every testsuite/bad_onnx/cases/NAME.onnx (written by make_cases.py) has a
# sidecar NAME.expect:
#   EXPECT: TEXT     stderr contains TEXT (the important part of the message)
#   ARGS: ...        extra command-line arguments (e.g. --dim=batch=4)
#   BUILD: also      also check a full build to a step.so in a temporary folder
#
# Each case runs `novac NAME.onnx --emit=nova` (and the full build where BUILD
# says so) with a 20 s timeout (NOVA_BAD_TIMEOUT), and passes when: the exit
# status is exactly 1 (not a signal, not a hang, not 0 or 2); stderr has no
# sanitizer report; the first line of stderr starts with the model's path
# ('FILE: error: ...' or 'FILE: node ...: error: ...'); stderr contains
# EXPECT; and the failed run left no output behind (no output file, no .json,
# no temporary files, nothing on stdout).
#
# Prints 'PASS: bad-onnx :: NAME' or 'FAIL: bad-onnx :: NAME' and the reasons,
# indented; a build check is named 'NAME/build'.  Exits 0 whatever the results.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
NOVAC=$B/bin/novac
case $NOVAC in /*) ;; *) NOVAC=$PWD/$NOVAC ;; esac
DIR=testsuite/bad_onnx/cases
TIMEOUT=${NOVA_BAD_TIMEOUT:-20}
SUITE=bad-onnx

if [ ! -x "$NOVAC" ]; then
  echo "FAIL: $SUITE :: setup"
  echo "    $NOVAC is missing; build it first"
  exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nova-bad-onnx.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT INT TERM

# directive FILE KEY: the value of 'KEY:' in FILE.
directive() {
  tr -d '\r' <"$1" 2>/dev/null | sed -n "s/^\(# \)\{0,1\}$2: *//p" | head -n 1
}

# check NAME FILE MODE: runs one case; MODE is nova or build.
check() {
  name=$1 f=$2 mode=$3
  meta=${f%.onnx}.expect
  expect=$(directive "$meta" EXPECT)
  args=$(directive "$meta" ARGS)
  rm -rf "$tmp/out" "$tmp/tmp"
  mkdir -p "$tmp/out" "$tmp/tmp"
  reasons=""
  fail() { reasons="$reasons
    $1"; }

  if [ "$mode" = build ]; then
    out=$tmp/out/step.so
    # shellcheck disable=SC2086
    TMPDIR=$tmp/tmp timeout -k 5 "$TIMEOUT" "$NOVAC" "$f" $args -o "$out" \
      >"$tmp/stdout" 2>"$tmp/stderr" </dev/null
  else
    out=$tmp/out/model.nova
    # shellcheck disable=SC2086
    TMPDIR=$tmp/tmp timeout -k 5 "$TIMEOUT" "$NOVAC" "$f" $args --emit=nova -o "$out" \
      >"$tmp/stdout" 2>"$tmp/stderr" </dev/null
  fi
  rc=$?
  broken=no

  [ -n "$expect" ] || fail "no 'EXPECT:' line in $meta"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "hang: no exit within ${TIMEOUT}s (exit $rc)"
    broken=yes
  elif [ "$rc" -ge 128 ]; then
    fail "crash: killed by signal $((rc - 128)) (exit $rc)"
    broken=yes
  elif [ "$rc" -ne 1 ]; then
    fail "exit status $rc, expected 1"
  fi
  if grep -aqE 'ERROR: (Address|Leak|Memory|Thread)Sanitizer|runtime error:|SUMMARY: [A-Za-z]*Sanitizer' "$tmp/stderr"; then
    fail "sanitizer report: $(grep -aE 'ERROR: [A-Za-z]*Sanitizer|runtime error:' "$tmp/stderr" | head -n 1 | cut -c1-200)"
    broken=yes
  fi

  first=$(head -n 1 "$tmp/stderr" | tr -d '\r')
  if [ $broken = no ]; then
    case $first in
    "$f: error: "* | "$f: node "*": error: "*) ;;
    "")
      fail "no diagnostic on stderr" ;;
    *)
      fail "first line of stderr does not start with '$f: ': $(printf '%.200s' "$first")" ;;
    esac
    if [ -n "$expect" ] && ! grep -aqF -- "$expect" "$tmp/stderr"; then
      fail "stderr lacks: $expect"
    fi
  fi
  left=$(find "$tmp/out" "$tmp/tmp" -mindepth 1 -maxdepth 1 -exec basename {} \; | tr '\n' ' ')
  if [ "$rc" -ne 0 ] && [ -n "$left" ]; then
    fail "a failed run left files behind: $left"
  fi
  if [ "$rc" -ne 0 ] && [ -s "$tmp/stdout" ]; then
    fail "a failed run printed output: $(head -c 100 "$tmp/stdout" | LC_ALL=C tr -c '\40-\176' ' ')"
  fi

  if [ -z "$reasons" ]; then
    echo "PASS: $SUITE :: $name"
  else
    echo "FAIL: $SUITE :: $name$reasons"
    if [ -s "$tmp/stderr" ]; then
      echo "    stderr:"
      head -n 4 "$tmp/stderr" | cut -c1-200 | LC_ALL=C tr -c '\11\12\40-\176' '?' | sed 's/^/      | /'
    fi
  fi
}

n=0
for f in "$DIR"/*.onnx; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .onnx)
  check "$name" "$f" nova
  [ "$(directive "${f%.onnx}.expect" BUILD)" = also ] && check "$name/build" "$f" build
  n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "FAIL: $SUITE :: setup
    no cases in $DIR (python3 testsuite/bad_onnx/make_cases.py writes them)"
exit 0
