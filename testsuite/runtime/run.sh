#!/bin/sh
# testsuite/runtime/run.sh [BUILD_DIR]: tests of the step runtime
# (libnovart.a), of tensor_pb and of novarun, against BUILD_DIR (default
# build) as `make build/lib/novac/libnovart.a build/bin/novarun` leaves it.
#
# Prints one `PASS: runtime :: NAME` or `FAIL: runtime :: NAME` line per
# test, the reasons indented below a failure, and always exits 0: the
# top-level runner counts the lines.  In a build directory whose name
# contains "asan" (or "tsan") the test programs and steps get the sanitizer flags
# (override with NOVA_TEST_SAN); elsewhere, where valgrind is installed,
# the unit tests and novarun also run under valgrind.  .pb files are written
# and read with Python's onnx package when it is installed (an independent
# implementation), else with tpb_tool over tensor_pb.

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
B=${1:-build}
CC=${CC:-cc}

pass() { echo "PASS: runtime :: $1"; }
fail() {
  echo "FAIL: runtime :: $1"
  shift
  for line in "$@"; do printf '%s\n' "$line" | sed 's/^/    /'; done
}

if ! B=$(cd "$B" 2>/dev/null && pwd) || [ ! -f "$B/lib/novac/libnovart.a" ] || [ ! -x "$B/bin/novarun" ]; then
  fail setup "build directory '${1:-build}' lacks lib/novac/libnovart.a or bin/novarun;" \
    "run: make B=${1:-build} ${1:-build}/lib/novac/libnovart.a ${1:-build}/bin/novarun"
  exit 0
fi
case $(basename "$B") in
  *asan*) SAN=${NOVA_TEST_SAN-"-fsanitize=address,undefined -fno-omit-frame-pointer"} ;;
  *tsan*) SAN=${NOVA_TEST_SAN-"-fsanitize=thread"} ;;
  *) SAN=${NOVA_TEST_SAN-} ;;
esac
# UBSan only prints by default; a report must fail the test that caused it.
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export UBSAN_OPTIONS
T=$(mktemp -d "${TMPDIR:-/tmp}/nova-rt.XXXXXX") || { fail setup "mktemp failed"; exit 0; }
trap 'rm -rf "$T"' EXIT INT TERM
CFLAGS="-std=c11 -D_GNU_SOURCE -Wall -Wextra -Wpedantic -Wshadow -Wmissing-prototypes -Werror -g -O1"
INC="-I$root/include -I$root/runtime -I$root/driver -I$B/gen"
RTLIB=$B/lib/novac/libnovart.a
NOVARUN=$B/bin/novarun
VALGRIND=
[ -z "$SAN" ] && command -v valgrind >/dev/null 2>&1 && VALGRIND="valgrind -q --leak-check=full --errors-for-leak-kinds=all --error-exitcode=99"

# build NAME CMD...: compiles, reporting a failure as test NAME.
build() {
  name=$1
  shift
  if ! "$@" >"$T/build.log" 2>&1; then
    fail "$name" "build failed: $*" "$(cat "$T/build.log")"
    return 1
  fi
}

# unit NAME PROGRAM ARGS...: runs a C test that prints its own PASS/FAIL
# lines; a non-zero exit (crash, sanitizer or valgrind report) fails NAME.
unit() {
  name=$1
  shift
  "$@" >"$T/unit.out" 2>"$T/unit.err"
  rc=$?
  cat "$T/unit.out"
  [ $rc -eq 0 ] || fail "$name" "exit status $rc" "$(tail -n 30 "$T/unit.err")"
}

# under_valgrind NAME PROGRAM ARGS...: PROGRAM runs clean under valgrind
# (its own PASS/FAIL lines were already reported by unit).
under_valgrind() {
  name=$1
  shift
  if $VALGRIND "$@" >/dev/null 2>"$T/vg.err"; then pass "$name"; else fail "$name" "$(tail -n 40 "$T/vg.err")"; fi
}

# ---- unit tests ------------------------------------------------------------
if build step.build $CC $CFLAGS $SAN $INC "$here/test_step.c" "$here/fixture_graph.c" "$RTLIB" \
  -Wl,--wrap=calloc,--wrap=aligned_alloc -lpthread -lm -o "$T/test_step"; then
  unit step.exit "$T/test_step"
  [ -n "$VALGRIND" ] && under_valgrind step.valgrind "$T/test_step"
fi
if build parallel.build $CC $CFLAGS $SAN $INC "$here/test_parallel.c" "$root/runtime/rt_parallel.c" "$root/runtime/rt_trace.c" -lpthread \
  -o "$T/test_parallel"; then
  if NOVA_NUM_THREADS=3 timeout 120 "$T/test_parallel" >"$T/par.out" 2>&1 && grep -q "parallel: ok" "$T/par.out"
  then pass parallel.every_iteration_once; else fail parallel.every_iteration_once "$(cat "$T/par.out")"; fi
fi
if build contract.build $CC $CFLAGS $SAN $INC "$here/test_contract.c" "$root/runtime/rt_contract.c" \
  "$root/runtime/rt_parallel.c" "$root/runtime/rt_trace.c" -lpthread -lm -o "$T/test_contract"; then
  for run in 0:3:any 0:1:any 1:3:any 0:2:avx2; do
    plain=${run%%:*} isa=${run##*:} threads=${run#*:} threads=${threads%:*}
    if NOVA_NUM_THREADS=$threads NOVA_CONTRACT_PLAIN=$plain NOVA_CONTRACT_ISA=$isa timeout 120 "$T/test_contract" \
      >"$T/con.out" 2>&1 && grep -q "contract: ok" "$T/con.out"
    then pass contract.plain_${plain}_threads_${threads}_isa_$isa
    else fail contract.plain_${plain}_threads_${threads}_isa_$isa "$(cat "$T/con.out")"; fi
  done
fi
if build memref.build $CC $CFLAGS $SAN $INC "$here/test_memref.c" "$root/runtime/rt_memref.c" -o "$T/test_memref"; then
  if timeout 120 "$T/test_memref" >"$T/mr.out" 2>&1 && grep -q "memref: ok" "$T/mr.out"
  then pass memref.strided_copy; else fail memref.strided_copy "$(cat "$T/mr.out")"; fi
fi
PB_SRC="$root/driver/tensor_pb.c $root/support/util.c $B/obj/gen/onnx.pb-c.o -lprotobuf-c"
if build tensor_pb.build $CC $CFLAGS $SAN $INC "$here/test_tensor_pb.c" $PB_SRC -o "$T/test_tensor_pb"; then
  unit tensor_pb.exit "$T/test_tensor_pb" "$T"
  [ -n "$VALGRIND" ] && under_valgrind tensor_pb.valgrind "$T/test_tensor_pb" "$T"
fi

# ---- steps for novarun -------------------------------------------------------
# A step.so as novac links one: its descriptor plus the whole runtime.
mkstep() {
  $CC -shared -fPIC $SAN $INC "$@" -Wl,--whole-archive "$RTLIB" -Wl,--no-whole-archive
}
build novarun.build mkstep "$here/fixture_graph.c" -o "$T/fixture.so" || exit 0
build novarun.build mkstep -DFIXTURE_ABI=99 "$here/fixture_graph.c" -o "$T/abi99.so" || exit 0
echo 'int not_a_step(void); int not_a_step(void) { return 0; }' >"$T/notstep.c"
build novarun.build $CC -shared -fPIC "$T/notstep.c" -o "$T/notstep.so" || exit 0
build novarun.build $CC $CFLAGS $SAN $INC "$here/tpb_tool.c" $PB_SRC -o "$T/tpb_tool" || exit 0

# (names starting with _ are the toolchain's, e.g. ASan's __odr_asan.*)
exports=$(nm -D --defined-only "$T/fixture.so" | awk '$3 !~ /^_/ {print $3}' | sort | tr '\n' ' ')
want="nova_dtype_name nova_dtype_size nova_role_name nova_rt_graph nova_step_all_sum nova_step_bind nova_step_close nova_step_error nova_step_eval nova_step_find nova_step_get nova_step_graph_hash nova_step_last_run_ms nova_step_launch nova_step_num_launches nova_step_num_tensors nova_step_open nova_step_run nova_step_set_profiling nova_step_set_size nova_step_sizes nova_step_target nova_step_tensor nova_step_trace_start nova_step_trace_write nova_step_world "
if [ "$exports" = "$want" ]; then pass novarun.exports; else fail novarun.exports "exported: $exports" "expected: $want"; fi

# ---- .pb files ---------------------------------------------------------------
if [ -z "$NOVA_TEST_NO_ONNX" ] && python3 -c 'import onnx, numpy' >/dev/null 2>&1; then HAVE_ONNX=1; else HAVE_ONNX=; fi

# mkpb FILE NAME DTYPE DIMS VALUES [typed]: as tpb_tool write; "typed"
# stores the values in the typed field instead of raw_data (onnx only).
mkpb() {
  if [ -n "$HAVE_ONNX" ]; then
    python3 - "$@" <<'EOF'
import sys, numpy as np
from onnx import helper, numpy_helper, TensorProto
path, name, dtype, dims, values = sys.argv[1:6]
typed = len(sys.argv) > 6
np_type = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "bool": np.bool_}[dtype]
shape = [] if dims == "-" else [int(d) for d in dims.split(",")]
vals = [] if values == "-" else [float(v) for v in values.split(",")]
a = np.array(vals, dtype=np_type).reshape(shape)
if typed:
    t = helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(a.dtype), shape, a.flatten().tolist(), raw=False)
else:
    t = numpy_helper.from_array(a, name)
open(path, "wb").write(t.SerializeToString())
EOF
  else
    "$T/tpb_tool" write "$@"
  fi
}

# dumppb FILE: "NAME DTYPE [DIMS] V0 V1 ..." as tpb_tool print.
dumppb() {
  if [ -n "$HAVE_ONNX" ]; then
    python3 - "$1" <<'EOF'
import sys, onnx
from onnx import numpy_helper
t = onnx.load_tensor(sys.argv[1])
a = numpy_helper.to_array(t)
kind = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "bool": "bool"}[str(a.dtype)]
vals = ["%.9g" % v if kind in ("f32", "f64") else "%d" % v for v in a.flatten().tolist()]
print(" ".join([t.name or "-", kind, "[" + ",".join(str(d) for d in a.shape) + "]"] + vals))
EOF
  else
    "$T/tpb_tool" print "$1"
  fi
}

# inputs DIR [LAYOUT]: the fixture's inputs in DIR, as input_K.pb
# (LAYOUT "positional", the default) or NAME.pb ("named").
inputs() {
  mkdir -p "$1"
  if [ "${2:-positional}" = named ]; then set -- "$1" x scale idx lbl; else set -- "$1" input_0 input_1 input_2 input_3; fi
  mkpb "$1/$2.pb" x f32 2,3 1,2,3,4,5,6 &&
    mkpb "$1/$3.pb" scale f32 - 2 &&
    mkpb "$1/$4.pb" idx i64 4 4,0,2,1 &&
    mkpb "$1/$5.pb" lbl i32 2 1,2
}
inputs "$T/in" || { fail novarun.inputs "cannot write the input .pb files"; exit 0; }
inputs "$T/named" named || { fail novarun.inputs "cannot write the input .pb files"; exit 0; }

# ---- novarun -------------------------------------------------------------------
# novarun NAME WANT_RC [ARGS...]: runs novarun (under valgrind where it
# applies) with stdout in $T/out, stderr in $T/err; on an exit status other
# than WANT_RC reports NAME as failed and returns 1.  A failing run must
# explain itself with a `novarun: ` line.
novarun() {
  name=$1 want_rc=$2
  shift 2
  $NOVARUN_PREFIX "$NOVARUN" "$@" >"$T/out" 2>"$T/err"
  rc=$?
  if [ $rc -ne "$want_rc" ]; then
    fail "$name" "novarun $* exited $rc, expected $want_rc" "stderr: $(head -c 2000 "$T/err")"
    return 1
  fi
  if [ "$want_rc" -ne 0 ] && ! grep -q '^novarun: ' "$T/err"; then
    fail "$name" "novarun $* exited $rc without a 'novarun: ' diagnostic" "stderr: $(cat "$T/err")"
    return 1
  fi
}

# has NAME FILE TEXT: FILE contains the fixed string TEXT, else NAME fails.
has() {
  grep -qF -- "$3" "$2" && return 0
  fail "$1" "expected in $(basename "$2"): $3" "got: $(head -c 2000 "$2")"
  return 1
}

# output_is NAME FILE TEXT: dumppb FILE prints TEXT.
output_is() {
  got=$(dumppb "$2" 2>&1)
  [ "$got" = "$3" ] && return 0
  fail "$1" "$2: got '$got'" "expected '$3'"
  return 1
}

Y='y f32 [2,3] 2.5 3 8 8.5 9 14'
G='g f32 [4] 50 10 30 20'

run_ok() {
  novarun novarun.run_positional 0 "$T/fixture.so" --inputs "$T/in" --outputs "$T/out1/new/dir" &&
    output_is novarun.run_positional "$T/out1/new/dir/output_0.pb" "$Y" &&
    output_is novarun.run_positional "$T/out1/new/dir/output_1.pb" "$G" &&
    output_is novarun.run_positional "$T/out1/new/dir/output_2.pb" 'loss f32 [] 49' &&
    has novarun.run_positional "$T/err" "10 tensors, 4 bound" &&
    has novarun.run_positional "$T/err" "output 0 'y' f32 [2,3] -> $T/out1/new/dir/output_0.pb" &&
    has novarun.run_positional "$T/err" "loss 2 'loss' f32 []" &&
    pass novarun.run_positional

  novarun novarun.run_named 0 --outputs "$T/out2" --inputs "$T/named" "$T/fixture.so" &&
    output_is novarun.run_named "$T/out2/output_0.pb" "$Y" &&
    output_is novarun.run_named "$T/out2/output_1.pb" "$G" && pass novarun.run_named

  novarun novarun.repeat 0 "$T/fixture.so" --inputs="$T/in" --outputs="$T/out3" --repeat 3 &&
    output_is novarun.repeat "$T/out3/output_2.pb" 'loss f32 [] 51' &&
    has novarun.repeat "$T/err" "per run (median of 3)" && pass novarun.repeat

  novarun novarun.print 0 "$T/fixture.so" --inputs "$T/in" --print -q &&
    has novarun.print "$T/out" 'y f32 [2,3] = [2.5, 3, 8, 8.5, 9, 14]  min 2.5  max 14  mean 7.5' &&
    has novarun.print "$T/out" 'loss f32 [] = [49]  min 49  max 49  mean 49' &&
    if [ -s "$T/err" ]; then fail novarun.print "-q, yet stderr: $(cat "$T/err")"; else pass novarun.print; fi

  (cd "$T" && novarun novarun.bare_file_name 0 fixture.so --inputs in -q) && pass novarun.bare_file_name

  mkdir -p "$T/renamed" && cp "$T/in/"*.pb "$T/renamed/" && mkpb "$T/renamed/input_0.pb" q f32 2,3 1,2,3,4,5,6 &&
    novarun novarun.name_warning 0 "$T/fixture.so" --inputs "$T/renamed" &&
    has novarun.name_warning "$T/err" "warning: $T/renamed/input_0.pb holds tensor 'q', bound to input 0 of the step, 'x'" &&
    pass novarun.name_warning

  if [ -n "$HAVE_ONNX" ]; then
    mkdir -p "$T/typed" && mkpb "$T/typed/input_0.pb" x f32 2,3 1,2,3,4,5,6 typed &&
      mkpb "$T/typed/input_1.pb" scale f32 - 2 typed && mkpb "$T/typed/input_2.pb" idx i64 4 4,0,2,1 typed &&
      mkpb "$T/typed/input_3.pb" lbl i32 2 1,2 typed &&
      novarun novarun.typed_inputs 0 "$T/fixture.so" --inputs "$T/typed" --outputs "$T/out4" &&
      output_is novarun.typed_inputs "$T/out4/output_0.pb" "$Y" && pass novarun.typed_inputs
  fi
}

# bad NAME WANT_RC TEXT ARGS...: novarun ARGS exits WANT_RC, saying TEXT.
bad() {
  name=$1 want_rc=$2 text=$3
  shift 3
  novarun "$name" "$want_rc" "$@" && has "$name" "$T/err" "$text" && pass "$name"
}

# badinput NAME TEXT FILE DTYPE DIMS VALUES: input_0.pb replaced by that
# tensor (FILE "-": removed), novarun exits 1 saying TEXT.
badinput() {
  name=$1 text=$2
  rm -rf "$T/bad" && mkdir -p "$T/bad" && cp "$T/in/"*.pb "$T/bad/"
  case $3 in
    -) rm -f "$T/bad/input_0.pb" ;;
    *) shift 2 && mkpb "$T/bad/input_0.pb" "$@" ;;
  esac
  bad "$name" 1 "$text" "$T/fixture.so" --inputs "$T/bad"
}

run_bad() {
  bad bad.missing_step 1 "novarun: $T/nope.so: No such file or directory" "$T/nope.so" --inputs "$T/in"
  bad bad.not_a_step 1 "is not a step.so written by novac" "$T/notstep.so" --inputs "$T/in"
  echo 'not an ELF file' >"$T/text.so"
  bad bad.not_a_shared_object 1 "novarun: cannot load step '$T/text.so'" "$T/text.so"
  # a step.so cut short: an error before dlopen, not a SIGBUS
  size=$(wc -c <"$T/fixture.so")
  for cut in 40:40 1k:1024 half:$((size / 2)) all_but_1:$((size - 1)); do
    head -c "${cut#*:}" "$T/fixture.so" >"$T/cut.so"
    bad "bad.truncated_step_${cut%%:*}" 1 "novarun: cannot load step '$T/cut.so': truncated: the file is ${cut#*:} bytes" \
      "$T/cut.so"
  done
  bad bad.abi_mismatch 1 "step ABI mismatch: the step was compiled for step ABI version 99" "$T/abi99.so"
  bad bad.no_inputs 1 "the step has 4 inputs ('x', ...); give them with --inputs DIR" "$T/fixture.so"
  bad bad.inputs_dir_missing 1 "$T/none: No such file or directory" "$T/fixture.so" --inputs "$T/none"
  badinput bad.missing_input "no file for input 'x': neither $T/bad/input_0.pb nor $T/bad/x.pb exists" -
  badinput bad.wrong_dtype "$T/bad/input_0.pb: holds f64 [2,3], but input 'x' of the step is f32 [2,3]" \
    x f64 2,3 1,2,3,4,5,6
  badinput bad.wrong_shape "$T/bad/input_0.pb: holds f32 [3,2], but input 'x' of the step is f32 [2,3]" \
    x f32 3,2 1,2,3,4,5,6
  badinput bad.wrong_rank "$T/bad/input_0.pb: holds f32 [6], but input 'x' of the step is f32 [2,3]" \
    x f32 6 1,2,3,4,5,6
  rm -rf "$T/bad" && mkdir -p "$T/bad" && cp "$T/in/"*.pb "$T/bad/"
  mkpb "$T/bad/input_2.pb" idx i64 4 0,1,7,2
  bad bad.index_out_of_range 1 "run failed: tensor 'idx': value 7 at flat index 2 is outside [0, 5)" \
    "$T/fixture.so" --inputs "$T/bad"
  cp "$T/in/input_2.pb" "$T/bad/"
  printf 'garbage\377\377' >"$T/bad/input_1.pb"
  bad bad.corrupt_pb 1 "$T/bad/input_1.pb: not an ONNX TensorProto" "$T/fixture.so" --inputs "$T/bad"
  size=$(wc -c <"$T/in/input_0.pb")
  head -c $((size - 5)) "$T/in/input_0.pb" >"$T/bad/input_1.pb"
  bad bad.truncated_pb 1 "$T/bad/input_1.pb: not an ONNX TensorProto" "$T/fixture.so" --inputs "$T/bad"
  : >"$T/bad/input_1.pb"
  bad bad.empty_pb 1 "$T/bad/input_1.pb: empty file" "$T/fixture.so" --inputs "$T/bad"
  if [ -n "$HAVE_ONNX" ]; then
    python3 -c "
import onnx
t = onnx.TensorProto(name='scale', data_type=onnx.TensorProto.FLOAT, dims=[2], float_data=[1.0, 2.0, 3.0])
open('$T/bad/input_1.pb', 'wb').write(t.SerializeToString())"
    bad bad.count_mismatch 1 "$T/bad/input_1.pb: float_data holds 3 values; shape [2] needs 2" \
      "$T/fixture.so" --inputs "$T/bad"
  fi
  echo x >"$T/afile"
  bad bad.outputs_not_a_dir 1 "novarun: $T/afile exists and is not a directory" "$T/fixture.so" --inputs "$T/in" --outputs "$T/afile"
  bad usage.no_arguments 2 "novarun: no step.so given"
  bad usage.unknown_option 2 "unknown option '--frobnicate'" "$T/fixture.so" --frobnicate
  bad usage.bad_repeat 2 "--repeat needs an integer from 1 to 10000000, not 'x'" "$T/fixture.so" --repeat x
  bad usage.zero_repeat 2 "--repeat needs an integer from 1 to 10000000, not '0'" --repeat=0 "$T/fixture.so"
  bad usage.missing_value 2 "option '--inputs' needs a value" "$T/fixture.so" --inputs
  bad usage.two_steps 2 "more than one step.so given" "$T/fixture.so" "$T/abi99.so"
  bad usage.two_batch_sources 2 "--inputs and --data both give the batch" "$T/fixture.so" --inputs "$T/in" --data x.st
  bad usage.bad_seed 2 "--seed needs an integer from 0 to 18446744073709551615, not '-1'" "$T/fixture.so" --seed -1
  # numbers are whole tokens: strtol would skip the blank, take the '+'
  bad usage.steps_blank 2 "--steps needs an integer from 1 to 10000000, not ' 5'" "$T/fixture.so" --steps " 5"
  bad usage.steps_suffix 2 "--steps needs an integer from 1 to 10000000, not '5x'" "$T/fixture.so" --steps 5x
  bad usage.repeat_plus 2 "--repeat needs an integer from 1 to 10000000, not '+2'" "$T/fixture.so" --repeat +2
  bad usage.lr_blank 2 "--lr needs a number >= 0, not ' 0.1'" "$T/fixture.so" --lr " 0.1"
  bad usage.seed_trailing 2 "--seed needs an integer from 0 to 18446744073709551615, not '7 '" "$T/fixture.so" --seed "7 "
  novarun usage.help 0 --help && has usage.help "$T/out" "usage: novarun STEP.so" && pass usage.help
  novarun usage.version 0 --version && has usage.version "$T/out" "novarun $(cat "$root/VERSION")" &&
    pass usage.version
}

# ---- checkpoints (--save, --load) and batches (--data, --seed) ----------------
# mkst FILE SPEC: a safetensors file (st_tool.py write); showst FILE: its lines.
mkst() { python3 "$here/st_tool.py" write "$@"; }
showst() { python3 "$here/st_tool.py" print "$1"; }

# The fixture's state: w [3], emb [5] (params), runs [1] (opt_state, +1 per run).
ST_W='"w": ["f32", [3], [0, 0, 100]]'
ST_EMB='"emb": ["f32", [5], [10, 20, 30, 40, 50]]'

# lines_are NAME GOT WANT: GOT (text) equals WANT, else NAME fails.
lines_are() {
  [ "$2" = "$3" ] && return 0
  fail "$1" "got: $2" "expected: $3"
  return 1
}

run_checkpoint() {
  mkdir -p "$T/ck" && novarun ckpt.save 0 "$T/fixture.so" --inputs "$T/in" --save "$T/ck/one.st" -q &&
    lines_are ckpt.save "$(showst "$T/ck/one.st")" "w f32 [3] 0.5 -1 2
emb f32 [5] 10 20 30 40 50
runs f32 [1] 1
meta format novac
meta graph_hash 0123456789abcdef
meta step 0" &&
    lines_are ckpt.save "$(ls -a "$T/ck" | tr '\n' ' ')" ". .. one.st " && pass ckpt.save

  # runs comes back as 1, so this run's loss is 45 + 3 + 2
  novarun ckpt.load 0 "$T/fixture.so" --inputs "$T/in" --load "$T/ck/one.st" --outputs "$T/ck/out" -q &&
    output_is ckpt.load "$T/ck/out/output_2.pb" 'loss f32 [] 50' && pass ckpt.load

  # w = [0, 0, 100], runs = 10: the loss is sum(y) 242 + lbl 3 + runs 11
  mkst "$T/ck/w.st" "{$ST_W, $ST_EMB, \"runs\": [\"f32\", [1], [10]]}" &&
    novarun ckpt.load_values 0 "$T/fixture.so" --inputs "$T/in" --load "$T/ck/w.st" --outputs "$T/ck/out2" &&
    output_is ckpt.load_values "$T/ck/out2/output_0.pb" 'y f32 [2,3] 2 4 106 8 10 112' &&
    output_is ckpt.load_values "$T/ck/out2/output_2.pb" 'loss f32 [] 256' &&
    has ckpt.load_values "$T/err" "records no graph_hash; its tensors match the step" && pass ckpt.load_values

  mkst "$T/ck/other.st" "{\"__metadata__\": {\"graph_hash\": \"feedfeedfeedfeed\", \"step\": \"7\"}, $ST_W, $ST_EMB,
    \"runs\": [\"f32\", [1], [0]]}" &&
    novarun ckpt.other_graph 0 "$T/fixture.so" --inputs "$T/in" --load "$T/ck/other.st" --save "$T/ck/again.st" -q &&
    has ckpt.other_graph "$T/err" "was written for graph feedfeedfeedfeed, this step is graph 0123456789abcdef" &&
    has ckpt.other_graph "$T/err" "match by name, dtype and shape" &&
    lines_are ckpt.other_graph "$(showst "$T/ck/again.st" | tail -n 2)" "meta graph_hash 0123456789abcdef
meta step 7" && pass ckpt.other_graph

  mkst "$T/ck/lacks.st" "{\"__metadata__\": {\"graph_hash\": \"feedfeedfeedfeed\"}, $ST_W, $ST_EMB}"
  bad ckpt.missing_opt_state 1 "the checkpoint lacks opt_state 'runs' (f32 [1]) of the step (the checkpoint was written for graph feedfeedfeedfeed, this step is graph 0123456789abcdef)" \
    "$T/fixture.so" --inputs "$T/in" --load "$T/ck/lacks.st"
  mkst "$T/ck/role.st" "{$ST_W, $ST_EMB, \"runs\": [\"f32\", [1], [0]], \"y\": [\"f32\", [2,3], [1,2,3,4,5,6]]}"
  bad ckpt.not_state 1 "tensor 'y' is the step's output, not a param or opt_state" \
    "$T/fixture.so" --inputs "$T/in" --load "$T/ck/role.st"
  mkst "$T/ck/shape.st" "{$ST_W, $ST_EMB, \"runs\": [\"f32\", [], [0]]}"
  bad ckpt.opt_state_shape 1 "tensor 'runs': the checkpoint holds f32 [], the step's opt_state is f32 [1]" \
    "$T/fixture.so" --inputs "$T/in" --load "$T/ck/shape.st"
  mkst "$T/ck/step.st" "{\"__metadata__\": {\"step\": \"-3\"}, $ST_W, $ST_EMB, \"runs\": [\"f32\", [1], [0]]}"
  bad ckpt.bad_step 1 "__metadata__ \"step\" is \"-3\", not a number of steps" \
    "$T/fixture.so" --inputs "$T/in" --load "$T/ck/step.st"
  mkst "$T/ck/trail.st" "{$ST_W, $ST_EMB, \"runs\": [\"f32\", [1], [0]]}" && printf 'junk' >> "$T/ck/trail.st"
  bad ckpt.trailing_bytes 1 "$T/ck/trail.st: 4 bytes after the last tensor's data" \
    "$T/fixture.so" --inputs "$T/in" --load "$T/ck/trail.st"
  bad ckpt.save_fifo 1 "not a regular file; refusing to replace it with a checkpoint" \
    "$T/fixture.so" --inputs "$T/in" --save /dev/null
  bad ckpt.save_no_dir 1 "writing $T/ck/none/x.st: No such file or directory" \
    "$T/fixture.so" --inputs "$T/in" --save "$T/ck/none/x.st"
}

run_batches() {
  # x [2,3], scale [], idx [4], lbl [2] from 4 samples: step 2 takes samples 2-3 of x
  # and lbl, 1 of scale, all of idx; step 3 wraps around to samples 0-1 and 2
  mkdir -p "$T/data"
  mkst "$T/data/d.st" '{"x": ["f32", [4,3], [1,2,3,4,5,6,0,0,0,0,0,0]], "scale": ["f32", [4], [2,1,2,9]],
    "idx": ["i64", [4], [4,0,2,1]], "lbl": ["i32", [4], [1,2,0,0]]}' &&
    novarun data.steps 0 "$T/fixture.so" --data "$T/data/d.st" --steps 3 --loss-log "$T/data/log" -q &&
    lines_are data.steps "$(cat "$T/data/log")" "1 49
2 5
3 51" && pass data.steps
  novarun data.plain_run 0 "$T/fixture.so" --data "$T/data/d.st" --outputs "$T/data/out" &&
    output_is data.plain_run "$T/data/out/output_2.pb" 'loss f32 [] 49' &&
    has data.plain_run "$T/err" "4 bound from $T/data/d.st" && pass data.plain_run
  mkst "$T/data/s.st" '{"x": ["f32", [4,3], [1,2,3,4,5,6,0,0,0,0,0,0]], "scale": ["f32", [3], [2,1,2]],
    "idx": ["i64", [4], [4,0,2,1]], "lbl": ["i32", [4], [1,2,0,0]]}'
  bad data.unequal_samples 1 "tensor 'scale' holds 3 samples, the tensors before it 4" \
    "$T/fixture.so" --data "$T/data/s.st"
  mkst "$T/data/few.st" '{"x": ["f32", [1,3], [1,2,3]], "scale": ["f32", [1], [2]],
    "idx": ["i64", [1], [4]], "lbl": ["i32", [1], [1]]}'
  bad data.too_few_samples 1 "tensor 'x' holds 1 samples, fewer than one batch of the step's input (2)" \
    "$T/fixture.so" --data "$T/data/few.st"
  mkst "$T/data/dt.st" '{"x": ["f64", [4,3], [1,2,3,4,5,6,0,0,0,0,0,0]]}'
  bad data.wrong_dtype 1 "tensor 'x' is f64 [4,3], but for the step's input f32 [2,3] it must be f32 [S,3] (S samples)" \
    "$T/fixture.so" --data "$T/data/dt.st"
  mkst "$T/data/miss.st" '{"x": ["f32", [4,3], [1,2,3,4,5,6,0,0,0,0,0,0]]}'
  bad data.missing 1 "no tensor 'scale' for the step's input 'scale' (f32 [])" "$T/fixture.so" --data "$T/data/miss.st"
  mkst "$T/data/extra.st" '{"w": ["f32", [4,3], [1,2,3,4,5,6,0,0,0,0,0,0]]}'
  bad data.not_an_input 1 "tensor 'w' is the step's param, not an input or label" \
    "$T/fixture.so" --data "$T/data/extra.st"

  # --seed: idx and lbl must land inside their bounds, or the runs fail
  novarun seed.steps 0 "$T/fixture.so" --seed 7 --steps 4 --loss-log "$T/data/seed1" -q &&
    novarun seed.steps 0 "$T/fixture.so" --seed=7 --steps 4 --loss-log "$T/data/seed2" -q &&
    novarun seed.steps 0 "$T/fixture.so" --seed 8 --steps 4 --loss-log "$T/data/seed3" -q &&
    lines_are seed.steps "$(cat "$T/data/seed2")" "$(cat "$T/data/seed1")" &&
    if cmp -s "$T/data/seed1" "$T/data/seed3"; then fail seed.steps "seeds 7 and 8 gave the same losses";
    else pass seed.steps; fi
}

NOVARUN_PREFIX=
run_ok
run_bad
if python3 -c '' 2>/dev/null; then
  run_checkpoint
  run_batches
fi

# The same success and failure paths once more under valgrind: no error, no leak.
# ---- the thread pool across fork() (a step compiled by novac, 2 threads) ----------
if [ -x "$B/bin/novac" ] &&
  build fork.build "$B/bin/novac" "$root/examples/mlp.nova" --dim=batch=256 -o "$T/mlp256.so" &&
  build fork.build $CC $CFLAGS $SAN $INC "$here/fork_step.c" -ldl -o "$T/fork_step"; then
  if NOVA_NUM_THREADS=2 timeout 60 "$T/fork_step" "$T/mlp256.so" >"$T/fork.out" 2>&1 && grep -q "fork: ok" "$T/fork.out"
  then pass fork.child_runs_its_own_pool; else fail fork.child_runs_its_own_pool "$(cat "$T/fork.out")"; fi
fi

# ---- a training step's learning rate through the ABI ---------------------------
if [ -x "$B/bin/novac" ] &&
  build lr.build "$B/bin/novac" "$root/examples/mlp.nova" --train --dim=batch=4 -o "$T/mlp_train.so" &&
  build lr.build $CC $CFLAGS $SAN $INC "$here/lr_step.c" -ldl -o "$T/lr_step"; then
  if timeout 60 "$T/lr_step" "$T/mlp_train.so" >"$T/lr.out" 2>&1 && grep -q "lr: ok" "$T/lr.out"
  then pass lr.not_finite_refused; else fail lr.not_finite_refused "$(cat "$T/lr.out")"; fi
fi

# ---- a non-finite loss or gradient: NOVA_ERR_NONFINITE, nothing updated --------
# every optimizer, with in-place updates (-O2) and with copies after the run (-O0,
# with the gradients kept as outputs: the message names one)
if [ -x "$B/bin/novac" ] &&
  build nonfinite.build $CC $CFLAGS $SAN $INC "$here/nonfinite_step.c" -ldl -o "$T/nonfinite_step"; then
  for opt in sgd momentum adamw; do
    for O in -O2 -O0; do
      name=nonfinite.$opt$O
      keep=; [ "$O" = -O0 ] && keep=--keep-grads
      if ! "$B/bin/novac" "$here/nonfinite.nova" --dim=batch=2 --train --optimizer=$opt $O $keep \
        -o "$T/nf_$opt$O.so" >"$T/nf.out" 2>&1; then
        fail "$name" "novac failed" "$(cat "$T/nf.out")"
      elif NOVA_NUM_THREADS=1 timeout 60 "$T/nonfinite_step" "$T/nf_$opt$O.so" >"$T/nf.out" 2>&1 &&
        grep -q "nonfinite: ok" "$T/nf.out"; then
        pass "$name"
      else
        fail "$name" "$(cat "$T/nf.out")"
      fi
    done
  done
  # novarun: step 2's batch (samples 2-3) holds a NaN.  By default the run
  # stops there (exit 1) and --save writes the state after step 1; with
  # --skip-nonfinite the step is counted and skipped, and the state after
  # steps 1, 3, 4 is that of a run on batches 1, 3, 4 alone.
  if python3 -c '' 2>/dev/null && [ -f "$T/nf_adamw-O2.so" ]; then
    NF=$T/nf_adamw-O2.so X1='1,2,-1,0.5,-2,3' X3='-1,0.5,2,1,1,-3' X4='2,2,-1,0,1,1'
    T1='1,-1,0.25,2' T3='0,1,-2,0.5' T4='1,1,0,-1'
    mkst "$T/nf_bad.st" "{\"x\": [\"f32\", [8,3], [$X1,1,NaN,3,4,5,6,$X3,$X4]],
      \"t\": [\"f32\", [8,2], [$T1,0,0,1,1,$T3,$T4]]}" &&
      mkst "$T/nf_good.st" "{\"x\": [\"f32\", [6,3], [$X1,$X3,$X4]], \"t\": [\"f32\", [6,2], [$T1,$T3,$T4]]}" &&
      mkst "$T/nf_one.st" "{\"x\": [\"f32\", [2,3], [$X1]], \"t\": [\"f32\", [2,2], [$T1]]}"
    novarun novarun.nonfinite_stops 1 "$NF" --data "$T/nf_bad.st" --steps 4 --save "$T/nf_stop.st" &&
      has novarun.nonfinite_stops "$T/err" "novarun: step 2: non-finite loss; parameters unchanged (the loss is NaN)" &&
      novarun novarun.nonfinite_stops 0 "$NF" --data "$T/nf_one.st" --steps 1 --save "$T/nf_step1.st" -q &&
      if cmp -s "$T/nf_stop.st" "$T/nf_step1.st"; then pass novarun.nonfinite_stops
      else fail novarun.nonfinite_stops "the checkpoint differs from one saved after step 1" \
        "$(showst "$T/nf_stop.st")" "$(showst "$T/nf_step1.st")"; fi
    novarun novarun.skip_nonfinite 0 "$NF" --data "$T/nf_bad.st" --steps 4 --skip-nonfinite --save "$T/nf_skip.st" &&
      has novarun.skip_nonfinite "$T/err" "novarun: warning: step 2: non-finite loss; parameters unchanged, step skipped" &&
      has novarun.skip_nonfinite "$T/err" "novarun: 1 of 4 steps skipped (non-finite loss or gradients)" &&
      novarun novarun.skip_nonfinite 0 "$NF" --data "$T/nf_good.st" --steps 3 --save "$T/nf_three.st" -q &&
      if [ "$(showst "$T/nf_skip.st" | grep -v '^meta')" = "$(showst "$T/nf_three.st" | grep -v '^meta')" ]; then
        pass novarun.skip_nonfinite
      else fail novarun.skip_nonfinite "the state after skipping differs from a run without the bad batch" \
        "$(showst "$T/nf_skip.st")" "$(showst "$T/nf_three.st")"; fi
    novarun novarun.skip_nonfinite_usage 2 "$NF" --data "$T/nf_bad.st" --skip-nonfinite &&
      has novarun.skip_nonfinite_usage "$T/err" "--skip-nonfinite needs --steps N" && pass novarun.skip_nonfinite_usage
  fi
fi

if [ -n "$VALGRIND" ]; then
  NOVARUN_PREFIX=$VALGRIND
  novarun valgrind.novarun_run 0 "$T/fixture.so" --inputs "$T/in" --outputs "$T/out5" --print &&
    output_is valgrind.novarun_run "$T/out5/output_0.pb" "$Y" && pass valgrind.novarun_run
  novarun valgrind.novarun_bad_input 1 "$T/fixture.so" --inputs "$T/bad" && pass valgrind.novarun_bad_input
  novarun valgrind.novarun_abi 1 "$T/abi99.so" && pass valgrind.novarun_abi
  if python3 -c '' 2>/dev/null; then
    novarun valgrind.novarun_checkpoint 0 "$T/fixture.so" --data "$T/data/d.st" --steps 3 --load "$T/ck/one.st" \
      --save "$T/ck/vg.st" -q && pass valgrind.novarun_checkpoint
    novarun valgrind.novarun_bad_checkpoint 1 "$T/fixture.so" --seed 3 --steps 2 --load "$T/ck/role.st" &&
      pass valgrind.novarun_bad_checkpoint
    novarun valgrind.novarun_bad_data 1 "$T/fixture.so" --data "$T/data/s.st" && pass valgrind.novarun_bad_data
  fi
fi
exit 0
