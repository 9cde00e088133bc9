#!/bin/sh
# testsuite/bad/run.sh [BUILD_DIR]: novac on malformed input.
#
# Every testsuite/bad/*.nova is a small model with one mistake.  Its header
# says what novac must report:
#   # EXPECT: TEXT     stderr contains TEXT (the important part of the message)
#   # AT: LINE:COL     the first diagnostic points at LINE:COL
#   # ARGS: ...        extra command-line arguments (e.g. --dim=batch=4)
#   # BUILD: also|only also (or only) check a full build to a step.so; 'only'
#                      is for mistakes found only when building (param files)
# A file that cannot carry a comment (empty, binary) has them in a sidecar
# NAME.expect, with or without the leading '# '.
#
# Each case runs `novac FILE --emit=nova` (and the full build where BUILD
# says so) with a 20 s timeout, and passes when: the exit status is exactly 1
# (not a signal, not a hang, not 0 or 2); stderr has no sanitizer report; the
# first line of stderr is 'FILE:LINE:COL: error: ...' (or 'FILE: error: ...',
# or 'novac: error: ...' naming FILE, where there is no position); it matches
# AT and contains EXPECT; and the failed run left no output behind (no .so,
# no .json, no temporary files, no IR on stdout).
#
# Prints 'PASS: bad :: NAME' or 'FAIL: bad :: NAME' and the reasons, indented;
# a build check is named 'NAME/build'.  Exits 0 whatever the results.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
NOVAC=$B/bin/novac
case $NOVAC in /*) ;; *) NOVAC=$PWD/$NOVAC ;; esac
DIR=testsuite/bad
TIMEOUT=${NOVA_BAD_TIMEOUT:-20}

if [ ! -x "$NOVAC" ]; then
  echo "FAIL: bad :: setup"
  echo "    $NOVAC is missing; build it first"
  exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nova-bad.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT INT TERM

# directive FILE KEY: the value of 'KEY:' from FILE's header or sidecar.
directive() {
  tr -d '\r' <"$1" 2>/dev/null | sed -n "s/^\(# \)\{0,1\}$2: *//p" | head -n 1
}

# check NAME FILE MODE: runs one case; MODE is nova or build.
check() {
  name=$1 f=$2 mode=$3
  meta=$f
  [ -f "${f%.nova}.expect" ] && meta=${f%.nova}.expect
  expect=$(directive "$meta" EXPECT)
  at=$(directive "$meta" AT)
  args=$(directive "$meta" ARGS)
  rm -rf "$tmp/out" "$tmp/tmp"
  mkdir -p "$tmp/out" "$tmp/tmp"
  reasons=""
  fail() { reasons="$reasons
    $1"; }

  if [ "$mode" = build ]; then
    # shellcheck disable=SC2086
    TMPDIR=$tmp/tmp timeout -k 5 "$TIMEOUT" "$NOVAC" "$f" $args -o "$tmp/out/out.so" \
      >"$tmp/stdout" 2>"$tmp/stderr" </dev/null
  else
    # shellcheck disable=SC2086
    TMPDIR=$tmp/tmp timeout -k 5 "$TIMEOUT" "$NOVAC" "$f" $args --emit=nova \
      >"$tmp/stdout" 2>"$tmp/stderr" </dev/null
  fi
  rc=$?
  broken=no

  [ -n "$expect" ] || fail "no '# EXPECT:' line in $meta"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "hang: no exit within ${TIMEOUT}s (exit $rc)"
  elif [ "$rc" -ge 128 ]; then
    fail "crash: killed by signal $((rc - 128)) (exit $rc)"
  elif [ "$rc" -ne 1 ]; then
    fail "exit status $rc, expected 1"
  fi
  if grep -aqE 'ERROR: (Address|Leak|Memory|Thread)Sanitizer|runtime error:|SUMMARY: [A-Za-z]*Sanitizer' "$tmp/stderr"; then
    fail "sanitizer report: $(grep -aE 'ERROR: [A-Za-z]*Sanitizer|runtime error:' "$tmp/stderr" | head -n 1 | cut -c1-200)"
    broken=yes
  fi

  first=$(head -n 1 "$tmp/stderr" | tr -d '\r')
  pos=""
  { [ "$rc" -ge 124 ] || [ $broken = yes ]; } && first=crashed # the rest would only repeat it
  case $first in
  crashed) ;;
  "$f":[0-9]*:[0-9]*": error: "*)
    pos=$(printf '%s\n' "${first#"$f":}" | sed -n 's/^\([0-9][0-9]*:[0-9][0-9]*\): error: .*/\1/p')
    [ -n "$pos" ] || fail "malformed location in: $first" ;;
  "$f: error: "*) ;;
  "novac: error: "*)
    case $first in *"$f"*) ;; *) fail "diagnostic without a position does not name $f: $first" ;; esac ;;
  "")
    [ "$rc" -ne 0 ] && fail "no diagnostic on stderr" ;;
  *)
    fail "first line of stderr is not 'FILE:LINE:COL: error: ...': $(printf '%.200s' "$first")" ;;
  esac
  if [ -n "$at" ] && [ -n "$first" ] && [ "$first" != crashed ] && [ "$pos" != "$at" ]; then
    fail "points at ${pos:-no position}, expected $at"
  fi
  if [ "$first" != crashed ] && [ -n "$expect" ] && ! grep -aqF -- "$expect" "$tmp/stderr"; then
    fail "stderr lacks: $expect"
  fi
  left=$(find "$tmp/out" "$tmp/tmp" -mindepth 1 -maxdepth 1 -exec basename {} \; | tr '\n' ' ')
  if [ "$rc" -ne 0 ] && [ -n "$left" ]; then
    fail "a failed run left files behind: $left"
  fi
  if [ "$rc" -ne 0 ] && [ -s "$tmp/stdout" ]; then
    fail "a failed run printed output: $(head -c 100 "$tmp/stdout" | LC_ALL=C tr -c '\40-\176' ' ')"
  fi

  if [ -z "$reasons" ]; then
    echo "PASS: bad :: $name"
  else
    echo "FAIL: bad :: $name$reasons"
    if [ -s "$tmp/stderr" ]; then
      echo "    stderr:"
      head -n 4 "$tmp/stderr" | cut -c1-200 | LC_ALL=C tr -c '\11\12\40-\176' '?' | sed 's/^/      | /'
    fi
  fi
}

n=0
for f in "$DIR"/*.nova; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .nova)
  meta=$f
  [ -f "${f%.nova}.expect" ] && meta=${f%.nova}.expect
  build=$(directive "$meta" BUILD)
  [ "$build" = only ] || check "$name" "$f" nova
  case $build in also | only) check "$name/build" "$f" build ;; esac
  n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "FAIL: bad :: setup
    no cases in $DIR"
exit 0
