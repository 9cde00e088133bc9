#!/bin/sh
# check-deps.sh LLVM_CONFIG PROTOC_C ONNX_PROTO [--quiet] [--tests]
# --tests also checks what the test suite needs (numpy and onnx, from pip).
# Says which build dependency is missing; exit 1 if any is.
llvm_config=$1 protoc=$2 onnx_proto=$3 quiet=$4 tests=$5
missing=""
[ -x "$llvm_config" ] || command -v "$llvm_config" >/dev/null 2>&1 || missing="$missing llvm-22-dev"
inc=$("$llvm_config" --includedir 2>/dev/null)
[ -n "$inc" ] && [ -f "$inc/mlir-c/IR.h" ] || missing="$missing libmlir-22-dev"
bindir=$("$llvm_config" --bindir 2>/dev/null)
[ -n "$bindir" ] && [ -x "$bindir/FileCheck" ] || missing="$missing llvm-22-tools"
[ -n "$bindir" ] && [ -x "$bindir/mlir-opt" ] || missing="$missing mlir-22-tools"
command -v "$protoc" >/dev/null 2>&1 || missing="$missing protobuf-c-compiler"
[ -f /usr/include/protobuf-c/protobuf-c.h ] || missing="$missing libprotobuf-c-dev"
[ -f /usr/include/cjson/cJSON.h ] || missing="$missing libcjson-dev"
[ -f "$onnx_proto" ] || missing="$missing libonnx-dev"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
[ "$tests" != --tests ] || command -v mpirun >/dev/null 2>&1 || missing="$missing openmpi-bin"
[ "$tests" != --tests ] || python3 -c 'import numpy' >/dev/null 2>&1 || missing="$missing numpy(pip)"
[ "$tests" != --tests ] || python3 -c 'import onnx' >/dev/null 2>&1 || missing="$missing onnx(pip)"
if [ -n "$missing" ]; then
  [ "$quiet" = --quiet ] || echo "novac: missing build dependencies:$missing; run 'make deps' to install them" >&2
  exit 1
fi
exit 0
