#!/bin/sh
# testsuite/cuda/run.sh [BUILD_DIR]: --target=cuda without a GPU.
#
# Every example and exported model, forward and training step, is compiled
# for sm_80 (a100-80gb), sm_86 (rtx3060) and sm_90 (h100): novac must exit 0,
# ptxas must have accepted the PTX (the manifest lists each kernel with the
# registers ptxas reported), the step.so must link with no undefined symbol
# (novac links with --no-undefined; the CUDA driver is opened at run time)
# and export the step ABI, and --emit=ptx must target the right sm.  Every
# contraction of the GPT block and the transformer block must be a GEMM
# kernel (the 16-bit ones on the tensor cores: the manifest's counts), every
# contraction of a CNN's bf16 step a tensor-core kernel, and
# no kernel of random GEMM shapes may exceed its device (kernel_limits.py).  Then the
# errors a user can meet: no GPU driver at run time, ptxas missing or
# failing, a model larger than the device, a CPU model given to the cuda
# target, --explain-config on both targets.
#
# Prints 'PASS: cuda :: NAME' / 'FAIL: cuda :: NAME' (reasons indented) and
# exits 0; testsuite/run.sh counts the lines.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
NOVAC=$PWD/$B/bin/novac
NOVARUN=$PWD/$B/bin/novarun
T=$(mktemp -d "${TMPDIR:-/tmp}/nova-cuda.XXXXXX") || exit 0
trap 'rm -rf "$T"' EXIT INT TERM

pass() { echo "PASS: cuda :: $1"; }
fail() {
  echo "FAIL: cuda :: $1"
  shift
  for line in "$@"; do printf '%s\n' "$line" | sed 's/^/    /'; done
}

# expect NAME RC TEXT CMD...: CMD exits RC and its stderr contains TEXT
expect() {
  name=$1 rc=$2 text=$3
  shift 3
  "$@" >"$T/out" 2>"$T/err"
  got=$?
  if [ "$got" -eq "$rc" ] && grep -q -- "$text" "$T/err"; then
    pass "$name"
  else
    fail "$name" "exit $got (expected $rc), stderr:" "$(head -c 1500 "$T/err")" "(expected to contain: $text)"
  fi
}

M=testsuite/onnx/models
models="mlp:examples/mlp.nova:--dim=batch=8
transformer_block:examples/transformer_block.nova:--dim=batch=2
onnx_mlp:$M/mlp/model.onnx:--dim=batch=4
onnx_cnn:$M/cnn/model.onnx:--dim=batch=2
onnx_gpt_block:$M/gpt_block/model.onnx:--dim=batch=2
norm_rotary:testsuite/cuda/norm_rotary.nova:"

# build NAME SRC DIMS DEVICE SM TRAIN
build() {
  name=$1 src=$2 dims=$3 dev=$4 sm=$5 train=$6
  so=$T/$name.so
  rm -f "$so" "$T/$name.json"
  # shellcheck disable=SC2086
  if ! "$NOVAC" "$src" $dims $train --target=cuda --device="$dev" -o "$so" >"$T/log" 2>&1; then
    fail "$name" "novac exited $?:" "$(head -c 2000 "$T/log")"
    return
  fi
  reasons=""
  [ -s "$so" ] || reasons="$reasons|no step.so"
  nm -D --defined-only "$so" 2>/dev/null | grep -q ' nova_step_open$' || reasons="$reasons|nova_step_open not exported"
  undef=$(nm -D --undefined-only "$so" | awk '{print $2}' | grep -v -E '^(__|_ITM|_Jv)' |
    grep -v -E '@(GLIBC|GCC)' | tr '\n' ' ')
  # (a sanitizer build's step.so takes malloc and the like from the sanitizer's runtime)
  if ! readelf -d "$so" 2>/dev/null | grep -q -E 'lib(a|ub|t)san'; then
    [ -z "$undef" ] || reasons="$reasons|undefined symbols outside libc: $undef"
  fi
  python3 - "$T/$name.json" "$sm" "$train" >"$T/mlog" 2>&1 <<'EOF' || reasons="$reasons|manifest: $(cat "$T/mlog")"
import json, sys
m = json.load(open(sys.argv[1]))
# a training step ends with its finite check (the same graph as the cpu's)
last = m["tensors"][-1]
if sys.argv[3]:
    assert (last["name"], last["role"], last["dtype"], last["shape"]) == ("nonfinite", "status", "bool", []), last
else:
    assert all(t["role"] != "status" for t in m["tensors"]), "a forward step with a status tensor"

assert m["target"] == "cuda", m["target"]
assert m["device"]["arch"] == sys.argv[2], m["device"]
ks = m["kernels"]
assert ks, "no kernels"
for k in ks:
    assert k["registers"] > 0, "kernel %s: ptxas reported no registers" % k["name"]
    assert k["block"][0] >= 1 and k["grid"][0] >= 1, k
assert m["memory"]["scratch_bytes"] >= 0
EOF
  if [ -z "$reasons" ]; then pass "$name"; else fail "$name" "$(echo "$reasons" | tr '|' '\n' | sed '/^$/d')"; fi
}

# (build sets name, src, ...: the loop's own variables are named otherwise)
echo "$models" | while IFS=: read -r model msrc mdims; do
  for d in a100-80gb:sm_80 rtx3060:sm_86 h100:sm_90; do
    dev=${d%%:*} sm=${d#*:}
    build "$model.$sm" "$msrc" "$mdims" "$dev" "$sm" ""
    build "$model.train.$sm" "$msrc" "$mdims" "$dev" "$sm" "--train"
  done
done

# mixed precision: the GEMMs of 16-bit values on the tensor cores, in the
# manifest's schedules and in the PTX: mma.sync fed by ldmatrix (.trans for
# an operand stored with k along its rows) from stages cp.async fills
for p in bf16:bf16 fp16:f16; do
  prec=${p%%:*} kind=${p#*:}
  for d in a100-80gb:sm_80 h100:sm_90; do
    dev=${d%%:*} sm=${d#*:}
    build "transformer_block.$prec.train.$sm" examples/transformer_block.nova "--dim=batch=2 --precision=$prec" \
      "$dev" "$sm" "--train"
    n=$(grep -c "mma.sync.m16n8k16 $kind," "$T/transformer_block.$prec.train.$sm.json" 2>/dev/null)
    if "$NOVAC" examples/transformer_block.nova --dim=batch=2 --precision="$prec" --train --target=cuda \
      --device="$dev" --emit=ptx -o "$T/k.ptx" 2>"$T/log" && [ "${n:-0}" -ge 1 ] &&
      grep -q "mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.$kind\.$kind\.f32" "$T/k.ptx" &&
      grep -q "cp\.async\.cg\.shared\.global" "$T/k.ptx" && grep -q "cp\.async\.wait_group" "$T/k.ptx" &&
      grep -q "ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16" "$T/k.ptx" &&
      grep -q "ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16" "$T/k.ptx"; then
      pass "mma-$prec.$sm"
    else
      fail "mma-$prec.$sm" "manifest kernels with mma.sync.m16n8k16 $kind: ${n:-0}" "$(head -c 1000 "$T/log")"
    fi
  done
done

# every contraction a GEMM kernel (batched ones on the grid's z), the 16-bit
# ones on the tensor cores: the manifest's counts against the contractions
# the half-contract stage leaves (linalg.contract), on sm_80, sm_89, sm_90
for m in gpt_block:$M/gpt_block/model.onnx:--dim=batch=2 transformer_block:examples/transformer_block.nova:--dim=batch=2; do
  name=${m%%:*} rest=${m#*:} src=${rest%%:*} dims=${rest#*:}
  for d in a100-80gb:sm_80 l4:sm_89 h100:sm_90; do
    dev=${d%%:*} sm=${d#*:}
    for prec in fp32 bf16; do
      so=$T/gemms.$name.$prec.$sm.so
      # shellcheck disable=SC2086
      if "$NOVAC" "$src" $dims --precision=$prec --train --target=cuda --device="$dev" -o "$so" \
        --dump-after=half-contract 2>"$T/ir" >/dev/null; then
        contracts=$(grep -c "linalg.contract" "$T/ir")
        half=$(grep "linalg.contract" "$T/ir" | grep -c "xbf16>, tensor<[0-9x]*xbf16>")
        counts=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['gemm_kernels'], m['tensor_core_kernels'], max(k['grid'][2] for k in m['kernels']))" "${so%.so}.json")
        set -- $counts
        if [ "$contracts" -ge 1 ] && [ "$1" = "$contracts" ] && [ "$2" = "$half" ] && [ "$3" -gt 1 ] &&
          { [ "$prec" = fp32 ] || [ "$half" -ge 1 ]; }; then
          pass "gemms.$name.$prec.$sm"
        else
          fail "gemms.$name.$prec.$sm" "contractions $contracts (bf16 $half); manifest gemm_kernels, tensor_core_kernels, largest grid z: $counts"
        fi
      else
        fail "gemms.$name.$prec.$sm" "$(head -c 1500 "$T/ir")"
      fi
    done
  done
done

# convolutions under --precision=bf16 (im2col of the bf16 values, then the
# GEMM): every contraction of a CNN's training step on the tensor cores
for m in onnx_cnn:$M/cnn/model.onnx:--dim=batch=2 resnet18:testsuite/zoo/resnet18.ts/model.onnx:; do
  name=${m%%:*} rest=${m#*:} src=${rest%%:*} dims=${rest#*:}
  for d in a100-80gb:sm_80 h100:sm_90; do
    dev=${d%%:*} sm=${d#*:}
    [ "$name" = resnet18 ] && [ "$sm" = sm_80 ] && continue
    so=$T/convs.$name.$sm.so
    # shellcheck disable=SC2086
    if "$NOVAC" "$src" $dims --precision=bf16 --train --target=cuda --device="$dev" -o "$so" \
      --dump-after=half-contract 2>"$T/ir" >/dev/null; then
      contracts=$(grep -c "linalg.contract" "$T/ir")
      half=$(grep "linalg.contract" "$T/ir" | grep -c "xbf16>, tensor<[0-9x]*xbf16>")
      counts=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['gemm_kernels'], m['tensor_core_kernels'])" "${so%.so}.json")
      if [ "$contracts" -ge 2 ] && [ "$half" = "$contracts" ] && [ "$counts" = "$contracts $contracts" ]; then
        pass "convs-bf16.$name.$sm"
      else
        fail "convs-bf16.$name.$sm" "contractions $contracts (bf16 $half); manifest gemm_kernels, tensor_core_kernels: $counts"
      fi
    else
      fail "convs-bf16.$name.$sm" "$(head -c 1500 "$T/ir")"
    fi
  done
done

# the 4-layer GPT of the GPU benchmark (bench/gpt_nova.py: width 256, 4 heads,
# context 128, vocabulary 512) under --precision=bf16 on sm_90: every
# contraction on the tensor cores but one, the token embedding's gradient
# (a one-hot product, exact in f32)
python3 bench/gpt_nova.py 4 256 4 128 512 >"$T/gpt4.nova"
if "$NOVAC" "$T/gpt4.nova" --dim=batch=8 --precision=bf16 --train --optimizer=adamw --target=cuda --device=h100 \
  -o "$T/gpt4.so" --dump-after=half-contract 2>"$T/ir" >/dev/null; then
  contracts=$(grep -c "linalg.contract" "$T/ir")
  half=$(grep "linalg.contract" "$T/ir" | grep -c "xbf16>, tensor<[0-9x]*xbf16>")
  f32=$(grep "linalg.contract" "$T/ir" | grep -v "xbf16>, tensor<[0-9x]*xbf16>" | grep -c "tensor<1024x512xf32>, tensor<1024x256xf32>")
  counts=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['gemm_kernels'], m['tensor_core_kernels'])" "$T/gpt4.json")
  # (most products start from a zero C: the kernel writes C, the fill folded in)
  written=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(sum(1 for k in m['kernels'] if k.get('gemm', {}).get('c') == 'written'))" "$T/gpt4.json")
  if [ "$contracts" -ge 70 ] && [ "$half" = $((contracts - 1)) ] && [ "$f32" = 1 ] && [ "$counts" = "$contracts $half" ] &&
    [ "$written" -ge $((contracts / 2)) ]; then
    pass "gemms.gpt4.bf16.sm_90"
  else
    fail "gemms.gpt4.bf16.sm_90" "contractions $contracts (bf16 $half, the embedding gradient $f32); manifest gemm_kernels, tensor_core_kernels: $counts; writing C: $written"
  fi
else
  fail "gemms.gpt4.bf16.sm_90" "$(head -c 1500 "$T/ir")"
fi

# the configurator's choices follow the device: the 4-layer GPT's GEMM tiles
# and launch configurations differ between an H100 (132 SMs, 228 KiB of
# shared memory an SM) and an RTX 3060 (28 SMs, 100 KiB), and every kernel
# names the limit that decided it
if "$NOVAC" "$T/gpt4.nova" --dim=batch=8 --precision=bf16 --train --optimizer=adamw --target=cuda --device=rtx3060 \
  -o "$T/gpt4_rtx.so" >"$T/log" 2>&1 && python3 - "$T/gpt4.json" "$T/gpt4_rtx.json" >"$T/cmp" 2>&1 <<'EOF'
import json, sys
a, b = (json.load(open(p))["kernels"] for p in sys.argv[1:3])
assert len(a) == len(b), "kernel counts differ: %d, %d" % (len(a), len(b))
cfg = lambda k: (k["grid"], k["block"], (k.get("gemm") or {}).get("tile"), (k.get("gemm") or {}).get("stages"))
gemms = [(x, y) for x, y in zip(a, b) if x.get("gemm")]
dg = sum(1 for x, y in gemms if cfg(x) != cfg(y))
assert dg >= len(gemms) // 4, "only %d of %d GEMM configurations differ" % (dg, len(gemms))
words = ("limit", "blocks/SM", "waves", "fits one block", "no parallel")
bad = [k["name"] + ": " + k["schedule"] for k in a + b if not any(w in k["schedule"] for w in words)]
assert not bad, "kernels whose schedule names no limit: %s" % bad[:3]
print("%d of %d GEMM configurations differ" % (dg, len(gemms)))
EOF
then
  pass "device-choices ($(cat "$T/cmp"))"
else
  fail device-choices "$(head -c 1500 "$T/log")" "$(cat "$T/cmp")"
fi
# split-K: the 4-layer GPT's weight gradients (few output tiles, K = the
# batch's tokens) are split on the H100, each followed by the kernel that
# sums its ranges; every range at least 8 k tiles
if python3 - "$T/gpt4.json" >"$T/cmp" 2>&1 <<'EOF'
import json, sys
ks = json.load(open(sys.argv[1]))["kernels"]
split = [(i, k) for i, k in enumerate(ks) if (k.get("gemm") or {}).get("split_k", 1) > 1]
assert split, "no GEMM is split"
for i, k in split:
    g = k["gemm"]
    assert "split-K" in ks[i + 1]["schedule"], "%s is not followed by its sum: %s" % (k["name"], ks[i + 1]["schedule"])
    assert k["grid"][2] == g["batch"] * g["split_k"], "%s: grid %s, batch %d, split %d" % (k["name"], k["grid"], g["batch"], g["split_k"])
    assert -(-g["k"] // g["tile"][2]) >= 8 * (g["split_k"] - 1), "%s: %d ranges of a %d-deep K" % (k["name"], g["split_k"], g["k"])
print("%d of %d GEMMs split" % (len(split), sum(1 for k in ks if k.get("gemm"))))
EOF
then
  pass "split-k.gpt4 ($(cat "$T/cmp"))"
else
  fail split-k.gpt4 "$(cat "$T/cmp")"
fi
# epilogues: the forward projections' bias (and the MLP's GELU) applied in
# the GEMMs' stores, their own kernels gone (ptxas accepted them above)
n=$(python3 -c "import json,sys; print(sum(1 for k in json.load(open(sys.argv[1]))['kernels'] if (k.get('gemm') or {}).get('epilogue')))" "$T/gpt4.json")
if [ "${n:-0}" -ge 8 ]; then pass "gemm-epilogue.gpt4 ($n GEMMs)"; else fail gemm-epilogue.gpt4 "GEMMs with an epilogue: ${n:-0}"; fi

# row kernels: the 4-layer GPT's softmaxes, layer norms, log-sum-exps and
# their backwards run as row kernels (a group of lanes per row), several
# of them holding a whole layer norm (two reductions and the ops around
# them); the PTX combines lanes by butterfly shuffles, and no reduction
# along a row is left split in two
rows=$(python3 -c "import json,sys,re; k=json.load(open(sys.argv[1]))['kernels']; r=[x for x in k if x['kind'] == 'row']; print(len(r), sum(1 for x in r if int(re.search(r'\((\d+) reductions\)', x['schedule']).group(1)) >= 2))" "$T/gpt4.json" 2>&1)
if [ "${rows%% *}" -ge 40 ] 2>/dev/null && [ "${rows##* }" -ge 8 ]; then
  pass "row-kernels.gpt4 ($rows)"
else
  fail row-kernels.gpt4 "row kernels, of them with two reductions or more: $rows"
fi
if "$NOVAC" examples/transformer_block.nova --dim=batch=2 --train --target=cuda --device=h100 --emit=ptx \
  -o "$T/rows.ptx" --explain-config >"$T/rows.explain" 2>"$T/log" &&
  grep -q "shfl\.sync\.bfly\.b32" "$T/rows.ptx" && ! grep -q "split across threads along rows" "$T/rows.explain"; then
  pass row-kernels.ptx
else
  fail row-kernels.ptx "$(head -c 1000 "$T/log")" "$(grep "split across" "$T/rows.explain")"
fi

# an exported cross-entropy (SoftmaxCrossEntropyLoss with ignore_index, over
# 256 classes) trains: its log-sum-exp and the ops around it make one row
# kernel (a warp per row, lanes combined by shuffles); ptxas accepts the
# step, and under --gpu-sim its loss equals numpy's
python3 - "$T" <<'EOF' >"$T/sce.log" 2>&1
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
sys.path.insert(0, "testsuite/e2e")
from harness import write_pb
d = sys.argv[1]
rng = np.random.default_rng(5)
w = (rng.standard_normal((16, 256)) * 0.3).astype(np.float32)
g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["l"]),
                  h.make_node("SoftmaxCrossEntropyLoss", ["l", "y"], ["loss"], reduction="mean", ignore_index=-100)],
                 "sce", [h.make_tensor_value_info("x", T.FLOAT, [8, 16]), h.make_tensor_value_info("y", T.INT64, [8])],
                 [h.make_tensor_value_info("loss", T.FLOAT, [])], initializer=[nh.from_array(w, "w")])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), d + "/sce.onnx")
x = rng.standard_normal((8, 16)).astype(np.float32)
y = rng.integers(0, 256, 8).astype(np.int64)
y[3] = -100
import os
os.makedirs(d + "/sce_in", exist_ok=True)
write_pb(d + "/sce_in/input_0.pb", x, "x")
write_pb(d + "/sce_in/input_1.pb", y, "y")
l = x.astype(np.float64) @ w.astype(np.float64)
lse = np.log(np.exp(l - l.max(1, keepdims=True)).sum(1)) + l.max(1)
keep = y != -100
print(repr(float(np.mean((lse - l[np.arange(8), np.where(keep, y, 0)])[keep]))))
EOF
want=$(tail -n 1 "$T/sce.log")
if "$NOVAC" "$T/sce.onnx" --train --target=cuda --device=h100 --explain-config -o "$T/sce.so" >"$T/sce.explain" 2>"$T/log" &&
  grep -q "^nova_k[0-9]* *row .*(2 reductions) in one kernel" "$T/sce.explain" &&
  "$NOVAC" "$T/sce.onnx" --train --target=cuda --device=h100 --gpu-sim -o "$T/sce_sim.so" 2>>"$T/log" &&
  "$NOVARUN" "$T/sce_sim.so" --inputs "$T/sce_in" --outputs "$T/sce_out" -q 2>>"$T/log" &&
  python3 -c "import sys; sys.path.insert(0, 'testsuite/e2e'); from harness import read_pb; got = float(read_pb(sys.argv[1])); want = float(sys.argv[2]); sys.exit(0 if abs(got - want) <= 1e-5 * abs(want) else 1)" "$T/sce_out/output_0.pb" "$want" 2>>"$T/log"; then
  pass row-kernel-sce
else
  fail row-kernel-sce "$(head -c 1500 "$T/log")" "$(head -c 500 "$T/sce.log")"
fi

# no emitted kernel exceeds its device (kernel_limits.py; NOVA_SEED: another draw of shapes)
python3 testsuite/cuda/kernel_limits.py "$NOVAC" "$T" "${NOVA_SEED:-17}" >"$T/limits" 2>&1
if [ "$(cat "$T/limits")" = ok ]; then pass kernel-limits; else fail kernel-limits "$(head -c 2000 "$T/limits")"; fi

# sm_75 (a T4 as a device file): its f16 tensor cores have no m16n8k16, so
# fp16 compiles with SIMT GEMMs; it has no bf16 arithmetic at all, so bf16
# (an option or the model's precision statement) is refused, naming the device
cat >"$T/t4-device.json" <<'EOF'
{"name": "t4", "kind": "gpu", "peak_tflops_fp32": 8.1, "peak_tflops_tf32": 0, "peak_tflops_fp16": 65,
 "peak_tflops_bf16": 0, "mem_bw_gbs": 320, "l2_bytes": 4194304, "sm_count": 40, "max_threads_per_block": 1024,
 "max_threads_per_sm": 1024, "max_blocks_per_sm": 16, "regs_per_sm": 65536, "max_regs_per_thread": 255,
 "smem_per_sm": 65536, "smem_per_block": 49152, "smem_per_block_optin": 65536, "cc_major": 7, "cc_minor": 5,
 "has_mma_sync_f16": true, "has_mma_sync_bf16": false, "has_mma_sync_tf32": false, "has_wgmma": false,
 "total_mem_bytes": 16000000000}
EOF
if "$NOVAC" examples/transformer_block.nova --dim=batch=2 --precision=fp16 --train --target=cuda \
  --device="$T/t4-device.json" -o "$T/t4.so" >"$T/log" 2>&1 && grep -q "SIMT tile" "$T/t4.json" &&
  ! grep -q "m16n8k16" "$T/t4.json"; then
  pass "sm_75-fp16"
else
  fail "sm_75-fp16" "$(head -c 1500 "$T/log")"
fi
expect sm_75-bf16 1 "precision=bf16: t4 (sm_75) has no bf16 arithmetic or tensor cores (sm_80 and newer have)" \
  "$NOVAC" examples/transformer_block.nova --dim=batch=2 --precision=bf16 --train --target=cuda \
  --device="$T/t4-device.json" -o "$T/t4b.so"
[ ! -e "$T/t4b.so" ] && pass sm_75-bf16-no-output || fail sm_75-bf16-no-output "a refused compile left $T/t4b.so"
printf 'precision bf16\ninput x: f32[4, 8]\nparam w: f32[8, 8] = normal(0.1)\ny = x @ w\noutput y\n' >"$T/p.nova"
expect sm_75-bf16-statement 1 "the model's precision statement" "$NOVAC" "$T/p.nova" --target=cuda \
  --device="$T/t4-device.json" -o "$T/t4c.so"


# --emit=ptx targets the device's architecture
for d in a100-80gb:sm_80 rtx3060:sm_86 h100:sm_90 l4:sm_89; do
  dev=${d%%:*} sm=${d#*:}
  if "$NOVAC" examples/mlp.nova --dim=batch=2 --target=cuda --device="$dev" --emit=ptx -o "$T/k.ptx" 2>"$T/log" &&
    grep -q "^\.target $sm\$" "$T/k.ptx" && grep -q "\.entry nova_k0" "$T/k.ptx"; then
    pass "emit-ptx.$sm"
  else
    fail "emit-ptx.$sm" "$(head -c 1000 "$T/log")" "$(grep '\.target' "$T/k.ptx" 2>/dev/null)"
  fi
done


"$NOVAC" examples/mlp.nova --dim=batch=2 --target=cuda --device=h100 -o "$T/run.so" 2>"$T/log" ||
  fail setup "$(cat "$T/log")"
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  expect no-driver 1 "needs the CUDA driver" "$NOVARUN" "$T/run.so" --inputs examples/data/mlp
else
  echo "SKIP: cuda :: no-driver (this machine has a CUDA driver; make check-gpu runs the steps)"
fi
expect ptxas-missing 1 "NOVAC_PTXAS=$T/none" env NOVAC_PTXAS="$T/none" "$NOVAC" examples/mlp.nova --dim=batch=2 \
  --target=cuda --device=h100 -o "$T/x.so"
expect ptxas-fails 1 "ptxas failed" env NOVAC_PTXAS=/bin/false "$NOVAC" examples/mlp.nova --dim=batch=2 \
  --target=cuda --device=h100 -o "$T/x.so"
[ ! -e "$T/x.so" ] && [ ! -e "$T/x.json" ] && pass "ptxas-fails-no-output" ||
  fail "ptxas-fails-no-output" "a failed build left $T/x.so or x.json"
expect too-large 1 "needs .* MiB of device memory" "$NOVAC" examples/mlp.nova --dim=batch=20000000 --target=cuda \
  --device=rtx3060 -o "$T/x.so"
expect cpu-model-for-cuda 1 "CPU" "$NOVAC" examples/mlp.nova --dim=batch=2 --target=cuda --device=host -o "$T/x.so"
expect gpu-model-for-cpu 1 "GPU model" "$NOVAC" examples/mlp.nova --dim=batch=2 --device=h100 -o "$T/x.so"
expect unknown-device 1 "known: host, auto, " "$NOVAC" examples/mlp.nova --dim=batch=2 --target=cuda --device=h1000 \
  -o "$T/x.so"
expect gpu-sim-needs-cuda 1 "needs --target=cuda" "$NOVAC" examples/mlp.nova --dim=batch=2 --gpu-sim -o "$T/x.so"
# --gemm-tile (tile searches): a tile the generator or the device cannot take is refused, naming the limit
TB="examples/transformer_block.nova --dim=batch=2 --precision=bf16 --target=cuda --device=h100 -o $T/x.so"
# shellcheck disable=SC2086
{
expect gemm-tile-syntax 2 "takes BMxBNxBK,WMxWN" "$NOVAC" $TB --gemm-tile=128x128
expect gemm-tile-cpu 1 "needs --target=cuda" "$NOVAC" examples/mlp.nova --dim=batch=2 --gemm-tile=64x64x32,32x32 -o "$T/x.so"
expect gemm-tile-warps 1 "at most 8 warps a block" "$NOVAC" $TB --gemm-tile=128x256x32,32x32
expect gemm-tile-stages-syntax 2 "takes BMxBNxBK,WMxWN\\[,S\\]" "$NOVAC" $TB --gemm-tile=64x64x32,32x32,9
expect gemm-tile-smem 1 "exceed a block's shared memory (opt-in) (bf16 operands: [0-9]* bytes of shared memory in 3 stages" \
  "$NOVAC" $TB --gemm-tile=128x256x128,64x64,3
expect gemm-tile-mma 1 "whole 16x8 mma tiles" "$NOVAC" $TB --gemm-tile=64x64x32,24x32
expect gemm-tile-bk 1 "BK must be a multiple of 16" "$NOVAC" $TB --gemm-tile=64x64x24,32x32
expect gemm-tile-tf32-smem 1 "(tf32 operands: [0-9]* bytes of shared memory in 2 stages, 8 warps; h100 holds 232448" \
  "$NOVAC" examples/mlp.nova --dim=batch=2 --target=cuda --device=h100 --matmul-precision=tf32 \
  --gemm-tile=128x256x128,64x64,2 -o "$T/x.so"
}
if "$NOVAC" $TB --gemm-tile=64x128x32,32x64 --explain-config >"$T/log" 2>&1 &&
  grep -q "tile 64x128x32, 2x2 warps of 32x64, [1-4] stages* ([a-z 0-9]*) (--gemm-tile)" "$T/log" &&
  ! grep "mma.sync" "$T/log" | grep -v "^ " | grep -qv "(--gemm-tile)"; then
  pass gemm-tile-applied
else
  fail gemm-tile-applied "$(head -c 1500 "$T/log")"
fi
if "$NOVAC" $TB --gemm-tile=64x128x32,32x64,3 --explain-config >"$T/log" 2>&1 &&
  ! grep "mma.sync" "$T/log" | grep -v "^ " | grep -qv "tile 64x128x32, 2x2 warps of 32x64, 3 stages (given)"; then
  pass gemm-tile-stages-applied
else
  fail gemm-tile-stages-applied "$(head -c 1500 "$T/log")"
fi

# The runtime's CUDA path against a stand-in driver (fake_driver.c: host
# memory, launches counted, not run): opening, uploads, one launch per
# kernel of the manifest, profiling, checkpoints, and each error a GPU
# machine can give.  The step is built for plain x86-64 so that valgrind,
# where installed and the build is not sanitized, can check the runtime's
# memory use.
mkdir -p "$T/fake"
if cc -std=c11 -Wall -Wextra -Werror -shared -fPIC testsuite/cuda/fake_driver.c -o "$T/fake/libcuda.so.1" 2>"$T/log"
then
  "$NOVAC" examples/mlp.nova --dim=batch=8 --train --target=cuda --device=h100 --cpu=x86-64 -o "$T/f.so" 2>"$T/log" ||
    fail fake-setup "$(cat "$T/log")"
  nk=$(python3 -c "import json; print(len(json.load(open('$T/f.json'))['kernels']))")
  fake() { env LD_LIBRARY_PATH="$T/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
  rm -f "$T/launches"
  if fake FAKE_CUDA_LOG="$T/launches" "$NOVARUN" "$T/f.so" --inputs examples/data/mlp --repeat 2 --profile \
      >"$T/out" 2>"$T/err" && grep -q "per run on the GPU (CUDA events" "$T/err" &&
    grep -q "profile of the last run: $nk launches" "$T/err" && [ "$(wc -l <"$T/launches")" -eq $((2 * nk)) ]; then
    pass fake-driver.run-profile
  else
    fail fake-driver.run-profile "$nk kernels in the manifest; launches logged: $(wc -l <"$T/launches" 2>/dev/null)" \
      "$(head -c 1500 "$T/err")"
  fi
  if fake "$NOVARUN" "$T/f.so" --inputs examples/data/mlp --steps 3 --save "$T/ck.st" --dump "$T/dump" -q \
      2>"$T/err" && fake "$NOVARUN" "$T/f.so" --inputs examples/data/mlp --load "$T/ck.st" --steps 1 -q 2>>"$T/err"
  then
    pass fake-driver.train-save-load
  else
    fail fake-driver.train-save-load "$(head -c 1500 "$T/err")"
  fi
  # valgrind cannot run a program built with AddressSanitizer (make check-asan).
  if command -v valgrind >/dev/null 2>&1 && ! ldd "$NOVARUN" 2>/dev/null | grep -q libasan; then
    if fake valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite "$NOVARUN" "$T/f.so" \
        --inputs examples/data/mlp --steps 2 --profile -q >"$T/out" 2>"$T/err"; then
      pass fake-driver.valgrind
    else
      fail fake-driver.valgrind "$(grep -v '^novarun:' "$T/err" | head -30)"
    fi
  fi
  expect fake-driver.old-gpu 1 "compiled for sm_90; CUDA device 0 (Fake GPU) is sm_80" \
    fake FAKE_CUDA_CC=80 "$NOVARUN" "$T/f.so" --inputs examples/data/mlp
  expect fake-driver.device-memory 1 "of device memory (tensors" \
    fake FAKE_CUDA_FREE=100000 "$NOVARUN" "$T/f.so" --inputs examples/data/mlp
  expect fake-driver.launch-fails 1 "launching kernel nova_k2 .*CUDA_ERROR_LAUNCH_FAILED" \
    fake FAKE_CUDA_FAIL_LAUNCH=3 "$NOVARUN" "$T/f.so" --inputs examples/data/mlp
  expect fake-driver.bad-device-index 1 "NOVA_CUDA_DEVICE=3: this machine has 1 CUDA device" \
    fake NOVA_CUDA_DEVICE=3 "$NOVARUN" "$T/f.so" --inputs examples/data/mlp
  if fake FAKE_CUDA_NO_BINARY=1 "$NOVARUN" "$T/f.so" --inputs examples/data/mlp -q 2>"$T/err"; then
    pass fake-driver.ptx-fallback
  else
    fail fake-driver.ptx-fallback "$(head -c 1000 "$T/err")"
  fi
  # a bf16 GEMM whose 4 pipeline stages (74 KiB) exceed the 48 KiB of static shared memory: launched with the
  # dynamic shared memory the manifest gives, after opting the kernel in; refused, naming it, by a smaller GPU
  printf 'param a: f32[256, 256] = uniform(-1, 1)\nparam b: f32[256, 512] = uniform(-1, 1)\nc = matmul(a, b)\noutput c\n' \
    >"$T/big.nova"
  "$NOVAC" "$T/big.nova" --precision=bf16 --target=cuda --device=h100 --cpu=x86-64 --gemm-tile=128x128x32,64x32,4 \
    -o "$T/big.so" 2>"$T/log" || fail fake-setup "$(cat "$T/log")"
  dyn=$(python3 -c "import json; print([k.get('dynamic_shared_memory', 0) for k in json.load(open('$T/big.json'))['kernels'] if k.get('gemm')][0])")
  rm -f "$T/launches"
  if [ "$dyn" = 75776 ] && fake FAKE_CUDA_LOG="$T/launches" "$NOVARUN" "$T/big.so" -q 2>"$T/err" &&
    grep -q " 75776$" "$T/launches"; then
    pass fake-driver.dynamic-shared-memory
  else
    fail fake-driver.dynamic-shared-memory "manifest: $dyn bytes" "$(cat "$T/launches" 2>/dev/null)" "$(head -c 800 "$T/err")"
  fi
  expect fake-driver.shared-memory-limit 1 "kernel nova_k[0-9]* needs 75776 bytes of shared memory a block, more than this GPU" \
    fake FAKE_CUDA_SMEM_OPTIN=65536 "$NOVARUN" "$T/big.so"
  "$NOVAC" examples/mlp.nova --dim=batch=8 -o "$T/cpu.so" 2>"$T/log" || fail fake-setup "$(cat "$T/log")"
  expect fake-driver.profile-cpu-step 1 "per-kernel profiling needs a --target=cuda step" \
    "$NOVARUN" "$T/cpu.so" --inputs examples/data/mlp --profile
else
  fail fake-setup "cannot build the fake driver:" "$(cat "$T/log")"
fi

# --explain-config: every kernel with its grid ([x,y,z]), block and deciding limit
if "$NOVAC" examples/mlp.nova --dim=batch=8 --train --target=cuda --device=h100 --explain-config -o "$T/e.so" \
  >"$T/explain" 2>"$T/log" && grep -q "^device: h100: sm_90" "$T/explain" &&
  grep -q "^nova_k0 " "$T/explain" && grep -q "matmul" "$T/explain" && grep -q "^configurator: .* ms" "$T/explain" &&
  grep -q "^nova_k0 .* \[[0-9]*,[0-9]*,[0-9]*\] " "$T/explain"; then
  n=$(grep -c "^nova_k" "$T/explain")
  k=$(python3 -c "import json; print(len(json.load(open('$T/e.json'))['kernels']))")
  if [ "$n" = "$k" ]; then pass explain-config.cuda; else fail explain-config.cuda "$n kernels explained, $k in the manifest"; fi
else
  fail explain-config.cuda "$(cat "$T/log")" "$(head -20 "$T/explain")"
fi
if "$NOVAC" examples/mlp.nova --dim=batch=8 --train --explain-config -o "$T/c.so" >"$T/explain" 2>"$T/log" &&
  grep -q "^device: host" "$T/explain" && grep -q "register block" "$T/explain" && grep -q "^configurator: " "$T/explain"
then
  pass explain-config.cpu
else
  fail explain-config.cpu "$(cat "$T/log")" "$(head -20 "$T/explain")"
fi
exit 0
