#!/bin/sh
# testsuite/fuzz/regress.sh [BUILD_DIR]: every input that once made the ONNX
# loader crash, leak or exhaust memory (found by the libFuzzer campaign of
# fuzz_onnx.c) must now give exit 0 or 1 with no signal, within 20 s.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in testsuite/fuzz/regress_onnx/*.onnx; do
  [ -f "$f" ] || continue
  name=$(basename "$f" .onnx)
  timeout 20 "$B/bin/novac" "$f" --emit=nova -o "$tmp/out.mlir" > "$tmp/log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] || { [ "$rc" -eq 1 ] && grep -q "error:" "$tmp/log"; }; then
    echo "PASS: fuzz :: regress/$name"
  else
    echo "FAIL: fuzz :: regress/$name"
    echo "    exit status $rc"
    head -n 3 "$tmp/log" | sed 's/^/    | /'
  fi
done
exit 0
