#!/bin/sh
# testsuite/faults/kill.sh [BUILD_DIR]: novac killed by SIGKILL (README.md here).
#
#   kill/AT       a compile of examples/transformer_block.nova --train over an
#                 older step.so + step.json, killed -9 at AT (a fraction of
#                 its time unkilled): every process it started is gone within
#                 5 s; the pair left is the older one, the new one, or a new
#                 .so beside the older manifest that novarun refuses; the next
#                 compile into the same path with the same TMPDIR succeeds and
#                 leaves no novac.* / novac-cg.* folder and no PATH.tmp.*
#   concurrent    two compiles side by side in one TMPDIR, while short ones
#                 start (each sweeping TMPDIR): all succeed, nothing left
#   sweep         which folders a novac start removes: an unlocked .lock, no
#                 .lock and over a minute old; kept: a .lock held, no .lock
#                 and young, .keep, a symlink (never followed), other names
#   mismatch      a new step.so beside the manifest of another compile (a
#                 compile killed between its two renames): novarun refuses it
# Prints 'PASS: faults-kill :: NAME' or 'FAIL: ...' with reasons, indented.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
ROOT=$PWD
case $B in /*) ;; *) B=$ROOT/$B ;; esac
NOVAC=$B/bin/novac
NOVARUN=$B/bin/novarun
BIG="$ROOT/examples/transformer_block.nova --dim=batch=8 --train"
TINY=$ROOT/testsuite/faults/tiny.nova

for f in "$NOVAC" "$NOVARUN"; do
  if [ ! -x "$f" ]; then
    echo "FAIL: faults-kill :: setup"
    echo "    $f is missing; build it first"
    exit 0
  fi
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nova-kill.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT INT TERM

result() { # name, reasons
  if [ -z "$2" ]; then echo "PASS: faults-kill :: $1"; else echo "FAIL: faults-kill :: $1$2"; fi
}

# descendants PID: every process below PID (from /proc), one per line
descendants() {
  for s in /proc/[0-9]*/stat; do
    { read -r line < "$s"; } 2> /dev/null && echo "$line"
  done | sed -n 's/^\([0-9][0-9]*\) (.*) [A-Za-z] \([0-9][0-9]*\) .*/\1 \2/p' | awk -v root="$1" '
    { par[$1] = $2 }
    END {
      below[root] = 1
      do { more = 0; for (p in par) if (!(p in below) && (par[p] in below)) { below[p] = 1; more = 1 } } while (more)
      for (p in below) if (p != root) print p
    }'
}

# alive PIDS...: those still running (a zombie is gone)
alive() {
  for p in "$@"; do
    st=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$p/stat" 2> /dev/null)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ] && printf '%s ' "$p"
  done
}

# stale_folders DIR: novac's temporary folders in DIR
stale_folders() { find "$1" -mindepth 1 -maxdepth 1 \( -name 'novac.*' -o -name 'novac-cg.*' \) | sed 's|.*/||' | tr '\n' ' '; }

# ---- references: the older pair (tiny.nova) and the new one (the big model)
mkdir -p "$tmp/old" "$tmp/new" "$tmp/rtmp"
if ! (cd "$tmp/old" && TMPDIR="$tmp/rtmp" "$NOVAC" "$TINY" --train -o step.so) > "$tmp/setup.log" 2>&1; then
  echo "FAIL: faults-kill :: setup"
  sed 's/^/    | /' "$tmp/setup.log" | head -n 20
  exit 0
fi
start=$(date +%s%N)
if ! (cd "$tmp/new" && TMPDIR="$tmp/rtmp" "$NOVAC" $BIG -o step.so) > "$tmp/setup.log" 2>&1; then
  echo "FAIL: faults-kill :: setup"
  sed 's/^/    | /' "$tmp/setup.log" | head -n 20
  exit 0
fi
# the big compile's time, in ms
ms=$((($(date +%s%N) - start) / 1000000))
folders=0 # kills that left a temporary folder for the next compile to sweep

# ---- kill -9 at a fraction of the compile's time
kill_at() { # percent
  name=kill/$1% why=
  c=$tmp/k$1
  mkdir -p "$c/out" "$c/tmp"
  # a compile done before the kill (a loaded machine is slower, then
  # faster) is tried again with half the delay, up to 4 times
  p=$1 rc=0 try=0
  while [ "$rc" -eq 0 ] && [ $try -lt 4 ]; do
    cp "$tmp/old/step.so" "$tmp/old/step.json" "$c/out/"
    (cd "$c/out" && TMPDIR="$c/tmp" exec "$NOVAC" $BIG -o step.so > "$c/log" 2>&1) &
    pid=$!
    sleep "$(awk -v ms="$ms" -v p="$p" 'BEGIN { printf "%.3f", ms * p / 100000 }')"
    kids=$(descendants "$pid" | tr '\n' ' ')
    kill -9 "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    rc=$?
    p=$((p / 2)) try=$((try + 1))
  done
  [ "$rc" -eq 137 ] || why="$why
    the compile was not killed mid-way (exit $rc)"
  [ -n "$(stale_folders "$c/tmp")" ] && folders=$((folders + 1))
  left=
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    # shellcheck disable=SC2086
    left=$(alive $kids)
    [ -z "$left" ] && break
    sleep 0.5
  done
  [ -z "$left" ] || why="$why
    processes it started still run 5 s later: $(for p in $left; do tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-80; echo; done)"
  # what the kill left: the older pair, the new one, or a pair novarun refuses
  so=other man=other
  cmp -s "$c/out/step.so" "$tmp/old/step.so" && so=old
  cmp -s "$c/out/step.so" "$tmp/new/step.so" && so=new
  cmp -s "$c/out/step.json" "$tmp/old/step.json" && man=old
  cmp -s "$c/out/step.json" "$tmp/new/step.json" && man=new
  case $so/$man in
  old/old | new/new) ;;
  new/old)
    if (cd "$c/out" && TMPDIR="$c/tmp" "$NOVARUN" step.so --seed 1 -q > "$c/run.log" 2>&1); then
      why="$why
    novarun loads a new step.so beside the older manifest"
    fi ;;
  *) why="$why
    the pair left is step.so: $so, step.json: $man (a partial or lost file)" ;;
  esac
  # the next compile: same path, same TMPDIR
  if ! (cd "$c/out" && TMPDIR="$c/tmp" "$NOVAC" "$TINY" --train -o step.so > "$c/log2" 2>&1 &&
    TMPDIR="$c/tmp" "$NOVARUN" step.so --seed 1 -q > "$c/run2.log" 2>&1); then
    why="$why
    the next compile failed: $(head -n 2 "$c/log2" "$c/run2.log" | cut -c1-200)"
  fi
  left=$(stale_folders "$c/tmp")
  [ -z "$left" ] || why="$why
    the next compile left in TMPDIR: $left"
  left=$(find "$c/out" -name '*.tmp.*' | sed 's|.*/||' | tr '\n' ' ')
  [ -z "$left" ] || why="$why
    temporaries left beside the output: $left"
  result "$name" "$why"
}
for p in 15 40 70 90; do kill_at $p; done
[ $folders -gt 0 ] || echo "FAIL: faults-kill :: kill/sweep
    no kill left a temporary folder: the sweep at the next start was not tried"

# ---- concurrent compiles in one TMPDIR, short ones sweeping meanwhile
c=$tmp/conc why=
mkdir -p "$c/a" "$c/b" "$c/s" "$c/tmp"
(cd "$c/a" && TMPDIR="$c/tmp" "$NOVAC" $BIG -o step.so > log 2>&1) &
pa=$!
(cd "$c/b" && TMPDIR="$c/tmp" "$NOVAC" $BIG -o step.so > log 2>&1) &
pb=$!
n=0
while [ $n -lt 4 ]; do
  (cd "$c/s" && TMPDIR="$c/tmp" "$NOVAC" "$TINY" --train -o "s$n.so" > "log$n" 2>&1) || why="$why
    a short compile failed: $(head -n 2 "$c/s/log$n")"
  n=$((n + 1))
done
wait $pa || why="$why
    compile a failed: $(head -n 3 "$c/a/log")"
wait $pb || why="$why
    compile b failed: $(head -n 3 "$c/b/log")"
for d in a b; do cmp -s "$c/$d/step.so" "$tmp/new/step.so" || why="$why
    compile $d made a different step.so"; done
left=$(stale_folders "$c/tmp")
[ -z "$left" ] || why="$why
    left in TMPDIR: $left"
result concurrent "$why"

# ---- which folders a start sweeps
c=$tmp/sweep why=
t=$c/tmp
mkdir -p "$t/novac.unlock" "$t/novac-cg.oldnol" "$t/novac.young1" "$t/novac.locked" "$t/novac.kept01" \
  "$t/novacx.other1" "$c/target" "$c/out"
touch "$t/novac.unlock/.lock" "$t/novac.unlock/part0.o" "$t/novac.locked/.lock" "$t/novac.kept01/.keep" \
  "$t/novac.kept01/step.o" "$t/novacx.other1/.lock" "$c/target/.lock" "$c/target/precious"
touch -d '-2 minutes' "$t/novac-cg.oldnol"
ln -s "$c/target" "$t/novac.symlnk"
flock "$t/novac.locked/.lock" sleep 30 &
holder=$!
sleep 0.3
(cd "$c/out" && TMPDIR="$t" "$NOVAC" "$TINY" --train -o step.so > log 2>&1) || why="$why
    the compile failed: $(head -n 2 "$c/out/log")"
kill "$holder" 2> /dev/null
wait "$holder" 2> /dev/null
for gone in novac.unlock novac-cg.oldnol; do
  [ ! -e "$t/$gone" ] || why="$why
    $gone was not removed"
done
for kept in novac.young1 novac.locked novac.kept01/step.o novacx.other1/.lock novac.symlnk; do
  [ -e "$t/$kept" ] || [ -L "$t/$kept" ] || why="$why
    $kept was removed"
done
[ -e "$c/target/.lock" ] && [ -e "$c/target/precious" ] || why="$why
    the sweep followed a symlink"
result sweep "$why"

# ---- a new .so beside another compile's manifest
c=$tmp/mix why=
mkdir -p "$c"
cp "$tmp/new/step.so" "$c/step.so"
cp "$tmp/old/step.json" "$c/step.json"
(cd "$c" && "$NOVARUN" step.so --seed 1 -q > log 2>&1)
rc=$?
[ "$rc" -eq 1 ] || why="$why
    exit $rc, expected 1"
grep -q 'does not match its manifest' "$c/log" || why="$why
    no message saying the pair does not match: $(head -c 200 "$c/log")"
result mismatch "$why"
exit 0
