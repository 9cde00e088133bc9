#!/bin/sh
# testsuite/deps/run.sh [BUILD_DIR]: novac's make dependency rules (-M, -MM,
# -MD, -MMD, -MF, -MT, -MQ, -MP) and examples/Makefile, which builds steps
# with them: a touched model or external data file rebuilds, a changed flag
# rebuilds, nothing changed runs nothing.
# Prints 'PASS: deps :: NAME' / 'FAIL: deps :: NAME' (with the reasons).
SUITE=deps
. "$(dirname "$0")/../driver_suite.sh"

# a linear model whose weights live in lin.onnx.data (ONNX external data),
# and a .nova model reading a parameter from w.bin
python3 - "$T" <<'EOF' || { fail setup "could not write the models"; exit 0; }
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
d = sys.argv[1]
w = nh.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
b = nh.from_array(np.zeros(4, np.float32), "b")
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y0"]), h.make_node("Add", ["y0", "b"], ["y"])], "g",
                 [h.make_tensor_value_info("x", T.FLOAT, ["batch", 8])],
                 [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])], initializer=[w, b])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), d + "/lin.onnx", save_as_external_data=True,
          all_tensors_to_one_file=True, location="lin.onnx.data", size_threshold=0)
np.ones((4, 4), np.float32).tofile(d + "/w.bin")
open(d + "/small.nova", "w").write('input x: f32[2, 4]\nparam w: f32[4, 4] = file("w.bin")\noutput y = x @ w\n')
EOF

cd "$T" || exit 0
# -M: the rule on stdout, novac's runtime files in it, nothing compiled
out=$("$NOVAC" lin.onnx --dim=batch=2 -M 2>&1)
rc=$?
if [ $rc = 0 ] && printf '%s\n' "$out" | head -n 1 | grep -q "^lin.so: lin.onnx lin.onnx.data" &&
  printf '%s\n' "$out" | grep -q "libnovart.a" && printf '%s\n' "$out" | grep -q "nova/step.h" && [ ! -e lin.so ]; then
  pass M
else
  fail M "exit $rc" "$out" "$(ls)"
fi
same MM "lin.so: lin.onnx lin.onnx.data" "$("$NOVAC" lin.onnx --dim=batch=2 -MM 2>&1)"
same MM.nova "small.so: small.nova w.bin" "$("$NOVAC" small.nova -MM 2>&1)"
# -MT replaces the target (several accumulate), -MQ quotes it for make, -MP adds phony targets
same MT-MQ-MP "$(printf 'a.so b$$c: lin.onnx lin.onnx.data\n\nlin.onnx.data:')" \
  "$("$NOVAC" lin.onnx --dim=batch=2 -MM -MT a.so -MQ 'b$c' -MP 2>&1)"
# -o names the target; a --device file and a --precision-policy file are prerequisites
cat >dev.json <<'EOF'
{"name": "gpu0", "kind": "gpu", "peak_tflops_fp32": 60, "peak_tflops_tf32": 400, "peak_tflops_fp16": 800,
 "peak_tflops_bf16": 800, "mem_bw_gbs": 3000, "l2_bytes": 52428800, "sm_count": 132, "max_threads_per_block": 1024,
 "max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "regs_per_sm": 65536, "max_regs_per_thread": 255,
 "smem_per_sm": 233472, "smem_per_block": 49152, "smem_per_block_optin": 232448, "cc_major": 9, "cc_minor": 0,
 "has_mma_sync_f16": true, "has_mma_sync_bf16": true, "has_mma_sync_tf32": true, "has_wgmma": true,
 "total_mem_bytes": 80000000000}
EOF
echo '{}' >policy.json
same device-policy "out/l.so: lin.onnx lin.onnx.data dev.json policy.json" \
  "$("$NOVAC" lin.onnx --dim=batch=2 --target=cuda --device=dev.json --precision=bf16 --precision-policy=policy.json \
     -MM -o out/l.so 2>&1)"
# -MF: the rule to a file
if "$NOVAC" lin.onnx --dim=batch=2 -MM -MF rule.d >log 2>&1 && [ "$(cat rule.d)" = "lin.so: lin.onnx lin.onnx.data" ] &&
  [ ! -s log ]; then
  pass MF
else
  fail MF "$(cat log)" "$(cat rule.d 2>/dev/null)"
fi
# -MMD: compiles and writes OUTPUT.d with the command line recorded
mkdir -p out
if "$NOVAC" lin.onnx --dim=batch=2 -MMD -MP -o out/lin.so >log 2>&1 && [ -f out/lin.so ] && [ -f out/lin.d ] &&
  [ "$(head -n 1 out/lin.d)" = "out/lin.so: lin.onnx lin.onnx.data" ] &&
  grep -qx "novac_cmd_out/lin.so := $NOVAC lin.onnx --dim=batch=2 -MMD -MP -o out/lin.so" out/lin.d &&
  grep -qx "lin.onnx.data:" out/lin.d; then
  pass MMD
else
  fail MMD "$(cat log)" "$(cat out/lin.d 2>/dev/null)"
fi
# a failed compile writes no .d
if ! "$NOVAC" lin.onnx -MMD -o out/bad.so >log 2>&1 && [ ! -e out/bad.d ] && [ ! -e out/bad.so ]; then
  pass MMD-failed
else
  fail MMD-failed "$(cat log)" "$(ls out)"
fi
# bad usage: exit 2 with the reason
for c in "-MF" "-MT" "-MQ"; do
  "$NOVAC" lin.onnx -M "$c" >log 2>&1
  rc=$?
  if [ $rc = 2 ] && grep -q -- "$c needs a" log; then pass "usage$c"; else fail "usage$c" "exit $rc" "$(cat log)"; fi
done
"$NOVAC" lin.onnx -MT x >log 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "add -M, -MM, -MD or -MMD" log; then pass usage-no-M; else fail usage-no-M "exit $rc" "$(cat log)"; fi

# examples/Makefile in a folder of models
mk() { make -f "$ROOT/examples/Makefile" NOVAC="$NOVAC" MODELS=lin.onnx "$@" 2>&1; }
stamp() { ls --full-time lin.so 2>/dev/null; }
rm -f lin.so lin.d lin.json
out=$(mk NOVACFLAGS=--dim=batch=2)
if [ -f lin.so ] && [ -f lin.d ] && printf '%s' "$out" | grep -q "lin.onnx --dim=batch=2 -MMD -MP -o lin.so"; then
  pass makefile-build
else
  fail makefile-build "$out"
fi
s0=$(stamp)
out=$(mk NOVACFLAGS=--dim=batch=2)
if [ -z "$out" ] && [ "$(stamp)" = "$s0" ]; then pass makefile-nothing; else fail makefile-nothing "$out"; fi
# the model's external data touched: rebuilt
sleep 1
touch lin.onnx.data
out=$(mk NOVACFLAGS=--dim=batch=2)
if printf '%s' "$out" | grep -q -- "-o lin.so" && [ "$(stamp)" != "$s0" ]; then pass makefile-data; else fail makefile-data "$out"; fi
# the model touched: rebuilt
s0=$(stamp)
sleep 1
touch lin.onnx
out=$(mk NOVACFLAGS=--dim=batch=2)
if printf '%s' "$out" | grep -q -- "-o lin.so" && [ "$(stamp)" != "$s0" ]; then pass makefile-model; else fail makefile-model "$out"; fi
# a flag changed: rebuilt, then nothing
s0=$(stamp)
out=$(mk NOVACFLAGS="--dim=batch=4 -O1")
if printf '%s' "$out" | grep -q -- "--dim=batch=4 -O1 -MMD" && [ "$(stamp)" != "$s0" ]; then
  pass makefile-flags
else
  fail makefile-flags "$out"
fi
out=$(mk NOVACFLAGS="--dim=batch=4 -O1")
if [ -z "$out" ]; then pass makefile-flags-again; else fail makefile-flags-again "$out"; fi
# the external data file gone from the model: -MP's phony target keeps make going
rm -f lin.onnx.data
out=$(mk NOVACFLAGS="--dim=batch=4 -O1")
case $out in
  *"No rule to make target"*) fail makefile-phony "$out" ;;
  *) pass makefile-phony ;;
esac
