# testsuite/driver_suite.sh: what the shell suites of novac's command line
# share (sourced after setting SUITE, with the build folder as $1): NOVAC
# (absolute), ROOT (the source tree, the current folder), T (a temporary
# folder, removed on exit), and pass / fail / same to report
# 'PASS: SUITE :: NAME' or 'FAIL: SUITE :: NAME' with the reasons indented.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
ROOT=$PWD
NOVAC=$B/bin/novac
case $NOVAC in /*) ;; *) NOVAC=$ROOT/$NOVAC ;; esac
T=$(mktemp -d "${TMPDIR:-/tmp}/nova-$SUITE.XXXXXX") || exit 0
trap 'rm -rf "$T"' EXIT INT TERM

pass() { echo "PASS: $SUITE :: $1"; }
fail() {
  echo "FAIL: $SUITE :: $1"
  shift
  for m in "$@"; do printf '%s\n' "$m" | sed 's/^/    /'; done
}
# same NAME WANT GOT
same() {
  if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "expected: $2" "got:      $3"; fi
}
