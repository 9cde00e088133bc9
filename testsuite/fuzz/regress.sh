#!/bin/sh
# testsuite/fuzz/regress.sh [BUILD_DIR]: every input that once made a parser
# crash, leak, hang or exhaust memory (found by the libFuzzer campaigns of
# testsuite/fuzz/fuzz_*.c) must now give exit 0, or 1 with a diagnostic, with
# no signal, within 20 s, through the real binaries:
#   regress_onnx/*.onnx, regress_nova/*.nova   novac FILE --emit=nova
#   regress_st/*                               novarun STEP --load FILE, --data FILE
#   regress_pb/*                               novarun STEP --inputs DIR (FILE as input_0.pb)
# STEP is a small training step compiled here (x f32[4,3], y i64[4]).
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# check NAME DIAG CMD...: CMD exits 0, or 1 with a line matching DIAG.
check() {
  name=$1 diag=$2
  shift 2
  timeout 20 "$@" > "$tmp/log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] || { [ "$rc" -eq 1 ] && grep -q "$diag" "$tmp/log"; }; then
    echo "PASS: fuzz :: regress/$name"
  else
    echo "FAIL: fuzz :: regress/$name"
    echo "    exit status $rc"
    head -n 3 "$tmp/log" | sed 's/^/    | /'
  fi
}

for f in testsuite/fuzz/regress_onnx/*.onnx testsuite/fuzz/regress_nova/*.nova; do
  [ -f "$f" ] || continue
  name=$(basename "$f")
  name=${name%.onnx}
  check "${name%.nova}" "error:" "$B/bin/novac" "$f" --emit=nova -o "$tmp/out.mlir"
done

# novarun's diagnostics are 'novarun: FILE: why' lines
cat > "$tmp/step.nova" <<'EOF'
input x: f32[4, 3]
label y: i64[4]
param w: f32[3, 5] = he
param b: f32[5] = zeros
output loss = cross_entropy(x @ w + b, y)
EOF
if ! "$B/bin/novac" "$tmp/step.nova" --train -o "$tmp/step.so" > "$tmp/log" 2>&1; then
  echo "FAIL: fuzz :: regress/novarun_step"
  head -n 3 "$tmp/log" | sed 's/^/    | /'
  exit 0
fi
for f in testsuite/fuzz/regress_st/*; do
  [ -f "$f" ] || continue
  check "$(basename "$f").load" "^novarun: " "$B/bin/novarun" "$tmp/step.so" --seed 1 --load "$f" -q
  check "$(basename "$f").data" "^novarun: " "$B/bin/novarun" "$tmp/step.so" --data "$f" -q
done
mkdir -p "$tmp/in"
cp testsuite/fuzz/corpus_pb/int64_data.pb "$tmp/in/input_1.pb" # y: [4, 0, 2, 1]
for f in testsuite/fuzz/regress_pb/*; do
  [ -f "$f" ] || continue
  cp "$f" "$tmp/in/input_0.pb"
  check "$(basename "$f")" "^novarun: " "$B/bin/novarun" "$tmp/step.so" --inputs "$tmp/in" -q
done
exit 0
