#!/usr/bin/env python3
"""testsuite/bad_onnx/make_cases.py: writes the malformed-ONNX corpus.

    python3 testsuite/bad_onnx/make_cases.py [OUT_DIR]

Writes, into OUT_DIR (default testsuite/bad_onnx/cases/), one small .onnx
file per case, each with a mistake novac must report (broken protobuf,
graph errors, unsupported ops, dtypes or opsets, attributes out of range,
unbound symbolic dimensions, bad tensor data, external data outside the
model's folder, ...), and a sidecar NAME.expect:

    EXPECT: TEXT    the diagnostic must contain TEXT
    ARGS: ...       extra novac arguments (optional)
    BUILD: also     also check a full build to a step.so (optional)

The output is deterministic (fixed bytes, fixed random seed, no
timestamps), so running it again rewrites the same files; the files are
tiny and committed.  testsuite/bad_onnx/run.sh runs novac on them.
"""
import os
import random
import shutil
import sys

import numpy as np

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    sys.exit("make_cases.py: needs the onnx Python package (pip install onnx numpy)")

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17
F = TensorProto.FLOAT
I64 = TensorProto.INT64

CASES = []  # (name, bytes, expect, args, build, max_bytes)


def case(name, expect, args="", build=False, max_bytes=4096):
    """Decorator: the function returns a ModelProto or raw bytes (smaller
    than max_bytes)."""
    def reg(fn):
        CASES.append((name, fn, expect, args, build, max_bytes))
        return fn
    return reg


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset=OPSET, domains=(), value_info=()):
    g = helper.make_graph(nodes, "bad", list(inputs), list(outputs), initializer=list(inits),
                          value_info=list(value_info))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains]
    m = helper.make_model(g, opset_imports=ops, producer_name="novac-testsuite")
    m.ir_version = 8
    return m


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def base_model():
    """A valid model: y = Relu(x @ W), x[2,3], W[3,4] -> y[2,4]."""
    w = const("W", np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    return model([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                  helper.make_node("Relu", ["h"], ["y"], name="act")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 4])], [w])


def unary(op, in_shape, out_shape, name="n0", elem=F, out_elem=None, **attrs):
    return model([helper.make_node(op, ["x"], ["y"], name=name, **attrs)],
                 [vi("x", elem, in_shape)], [vi("y", out_elem or elem, out_shape)])


def parses(b):
    try:
        onnx.ModelProto().ParseFromString(b)
        return True
    except Exception:
        return False


# ---- the file itself ---------------------------------------------------------

@case("truncated", "not a valid ONNX model", build=True)
def _():
    b = base_model().SerializeToString()
    cut = len(b) // 2
    while parses(b[:cut]):  # a cut on a field boundary would still parse
        cut += 1
    return b[:cut]


@case("corrupt_varint", "not a valid ONNX model")
def _():
    b = bytearray(base_model().SerializeToString())
    i = b.index(0x3a) + 1  # field 7 (graph): skip its length, corrupt its first field's tag
    while b[i] & 0x80:
        i += 1
    b[i + 1:i + 13] = b"\xff" * 12  # a varint longer than 10 bytes
    assert not parses(bytes(b))
    return bytes(b)


@case("corrupt_length", "not a valid ONNX model")
def _():
    b = bytearray(base_model().SerializeToString())
    i = b.index(0x3a)  # field 7 (graph), length-delimited
    b[i + 1:i + 2] = b"\xf0\xff\xff\xff\x0f"  # a length far past the end of the file
    assert not parses(bytes(b))
    return bytes(b)


def pb_varint(v):
    out = bytearray()
    while True:
        out.append((v & 0x7f) | (0x80 if v > 0x7f else 0))
        v >>= 7
        if not v:
            return bytes(out)


def pb_field(num, payload):
    """A length-delimited field NUM holding PAYLOAD."""
    return pb_varint(num << 3 | 2) + pb_varint(len(payload)) + payload


def nested_sequence_model(levels):
    """A model whose graph input 'x' is a sequence of a sequence ... of an
    int32 tensor, LEVELS sequences deep (2 messages per level, TypeProto and
    TypeProto.Sequence), written by hand: the onnx package's own parser
    stops at 100 levels."""
    t = pb_field(1, b"\x08\x06")                 # TypeProto.tensor_type {elem_type: INT32}
    for _ in range(levels):
        t = pb_field(4, pb_field(1, t))          # TypeProto.sequence_type {elem_type: t}
    vi_x = pb_field(1, b"x") + pb_field(2, t)    # ValueInfoProto {name, type}
    graph = pb_field(2, b"deep") + pb_field(11, vi_x) + pb_field(12, vi_x)
    opset = pb_field(1, b"") + b"\x10" + pb_varint(OPSET)
    return b"\x08\x08" + pb_field(7, graph) + pb_field(8, opset)


# protobuf-c's unpack recurses once per nested message: 5,000 sequence types
# (10,000 messages, 69 KB) overflowed novac's stack
@case("nested_type_5000_levels", "nests messages more than 64 deep (a Sequence inside a TypeProto at byte 267)",
      max_bytes=131072)
def _():
    return nested_sequence_model(5000)


@case("nested_type_past_limit", "nests messages more than 64 deep")
def _():
    return nested_sequence_model(40)


# 4 + 2 * 20 + 1 = 45 levels: within the limit, refused for what it is
@case("nested_type_within_limit", "graph input 'x' is not a tensor but seq(seq(")
def _():
    return nested_sequence_model(20)


@case("wrong_magic_png", "not a valid ONNX model")
def _():
    return b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"


@case("random_bytes", "not a valid ONNX model")
def _():
    rng = random.Random(20240601)
    while True:
        b = bytes(rng.getrandbits(8) for _ in range(256))
        if not parses(b):
            return b


@case("empty_file", "the model has no graph", build=True)
def _():
    return b""


@case("text_file", "not a valid ONNX model")
def _():
    return (b"# a .nova text graph saved with the wrong extension\n"
            b"input x: f32[2, 3]\nparam w: f32[3, 4] = he(seed=1)\n"
            b"y = relu(matmul(x, w))\noutput y\n")


@case("no_graph", "the model has no graph")
def _():
    m = onnx.ModelProto()
    m.ir_version = 8
    m.opset_import.add().version = OPSET
    return m


# ---- opsets and domains ---------------------------------------------------------

@case("opset_6", "opset 6 is too old")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [2, 3])],
                 [vi("y", F, [2, 3])], opset=6)


@case("opset_too_new", "opset 99 is newer than novac knows")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [2, 3])],
                 [vi("y", F, [2, 3])], opset=99)


@case("no_default_opset", "the model imports no opset of the default ONNX domain")
def _():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [2, 3])], [vi("y", F, [2, 3])])
    del m.opset_import[:]
    m.opset_import.extend([helper.make_opsetid("com.microsoft", 1)])
    return m


@case("lstm_reverse_run_time_lens",
      "node 'lstm0' (LSTM): error: sequence_lens shorter than the sequence need direction forward")
def _():
    w = const("W", np.zeros((1, 8, 3), np.float32))
    r = const("R", np.zeros((1, 8, 2), np.float32))
    return model([helper.make_node("LSTM", ["x", "W", "R", "", "lens"], ["y"], name="lstm0", hidden_size=2,
                                   direction="reverse")],
                 [vi("x", F, [4, 1, 3]), vi("lens", TensorProto.INT32, [1])], [vi("y", F, [4, 1, 1, 2])], [w, r])


@case("einsum_output_label_unknown", "node 'es' (Einsum): error: output label 'z' is in no input")
def _():
    w = const("W", np.ones((3, 4), np.float32))
    return model([helper.make_node("Einsum", ["x", "W"], ["y"], name="es", equation="ij,jk->iz")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 4])], [w])


@case("if_condition_at_run_time",
      "node 'branch' (If): error: the condition must be known when compiling (a branch chosen at run time is not supported)")
def _():
    g1 = helper.make_graph([helper.make_node("Relu", ["x"], ["a"])], "then", [], [vi("a", F, [2, 3])])
    g2 = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [], [vi("b", F, [2, 3])])
    return model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=g1, else_branch=g2)],
                 [vi("x", F, [2, 3]), vi("c", TensorProto.BOOL, [])], [vi("y", F, [2, 3])])


@case("op_unnamed_unsupported", "node #1 (Det): error: operator Det (domain ai.onnx, opset 17) is not supported")
def _():
    return model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Det", ["h"], ["y"])],
                 [vi("x", F, [3, 3])], [vi("y", F, [])])


@case("op_com_microsoft",
      "node 'fmm' (FusedMatMul): error: operator FusedMatMul of domain 'com.microsoft' is not supported")
def _():
    w = const("W", np.ones((3, 4), np.float32))
    return model([helper.make_node("FusedMatMul", ["x", "W"], ["y"], name="fmm", domain="com.microsoft")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 4])], [w], domains=[("com.microsoft", 1)])


# ---- graph structure ---------------------------------------------------------

@case("cycle", "(the graph is not in topological order, or has a cycle)")
def _():
    return model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                  helper.make_node("Relu", ["a"], ["b"], name="second")],
                 [vi("x", F, [2, 3])], [vi("b", F, [2, 3])])


@case("undefined_value", "node 'add' (Add): error: input 1 ('nowhere') is not defined")
def _():
    return model([helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 3])])


@case("missing_initializer", "node 'mm' (MatMul): error: input 1 ('W') is not defined")
def _():
    # W is declared (value_info) and used, but is neither a graph input nor an initializer.
    m = base_model()
    del m.graph.initializer[:]
    m.graph.value_info.extend([vi("W", F, [3, 4])])
    return m


@case("output_not_computed", "graph output 'z' is not computed by any node")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [2, 3])],
                 [vi("y", F, [2, 3]), vi("z", F, [2, 3])])


@case("duplicate_node_output", "output 'y' is already defined")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r1"),
                  helper.make_node("Neg", ["x"], ["y"], name="r2")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 3])])


@case("duplicate_graph_output", "output 'y' is declared twice")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [2, 3])],
                 [vi("y", F, [2, 3]), vi("y", F, [2, 3])])


@case("no_outputs", "the graph has no outputs")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [2, 3])], [])


@case("output_shape_mismatch", "graph output 'y': dimension 1 is declared 5")
def _():
    return unary("Relu", [2, 3], [2, 5])


@case("initializer_duplicate", "initializer 'W' has the name of a graph input or an earlier initializer")
def _():
    m = base_model()
    m.graph.initializer.extend([const("W", np.zeros((3, 4), np.float32))])
    return m


@case("node_without_op_type", "node without an op_type")
def _():
    m = base_model()
    m.graph.node[1].op_type = ""
    return m


# ---- attributes and shapes out of range ------------------------------------------

@case("softmax_axis_5", "node 'sm' (Softmax): error: softmax: axis 5 is out of range for rank 2", build=True)
def _():
    return unary("Softmax", [2, 3], [2, 3], name="sm", axis=5)


@case("transpose_perm_not_permutation", "node 'tp' (Transpose): error: transpose: perm is not a permutation")
def _():
    return unary("Transpose", [2, 3, 4], [2, 2, 4], name="tp", perm=[0, 0, 2])


@case("transpose_perm_out_of_range", "node 'tp' (Transpose): error: transpose: perm is not a permutation")
def _():
    return unary("Transpose", [2, 3], [3, 2], name="tp", perm=[1, 7])


@case("gather_axis_out_of_range", "node 'ga' (Gather): error: axis 3 is out of range for rank 2")
def _():
    idx = const("idx", np.array([0, 1], np.int64))
    return model([helper.make_node("Gather", ["x", "idx"], ["y"], name="ga", axis=3)],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 3])], [idx])


@case("gather_index_out_of_range", "node 'ga' (Gather): error: gather: constant indices hold a value outside [0, 4)")
def _():
    idx = const("idx", np.array([0, 9], np.int64))
    return model([helper.make_node("Gather", ["x", "idx"], ["y"], name="ga", axis=0)],
                 [vi("x", F, [4, 3])], [vi("y", F, [2, 3])], [idx])


@case("concat_shape_mismatch", "node 'cat' (Concat): error: concat: operand 1 is f32 [2,4], operand 0 is f32 [2,3]")
def _():
    return model([helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=0)],
                 [vi("a", F, [2, 3]), vi("b", F, [2, 4])], [vi("y", F, [4, 3])])


@case("concat_axis_out_of_range", "node 'cat' (Concat): error: concat: axis -3 is out of range for rank 2")
def _():
    return model([helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=-3)],
                 [vi("a", F, [2, 3]), vi("b", F, [2, 3])], [vi("y", F, [4, 3])])


@case("matmul_inner_mismatch", "node 'mm' (MatMul): error: matmul: inner dimensions differ")
def _():
    w = const("W", np.ones((5, 4), np.float32))
    return model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 4])], [w])


@case("add_broadcast_mismatch", "node 'add' (Add): error: add: shapes [2,3] and [4] cannot be broadcast together")
def _():
    return model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
                 [vi("a", F, [2, 3]), vi("b", F, [4])], [vi("y", F, [2, 3])])


@case("reshape_two_minus_one", "node 'rs' (Reshape): error: more than one -1 in the target shape")
def _():
    s = const("shape", np.array([-1, -1], np.int64))
    return model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
                 [vi("x", F, [2, 6])], [vi("y", F, [3, 4])], [s])


@case("reshape_wrong_count", "node 'rs' (Reshape): error: reshape: [2,6] has 12 elements, target [5,5] has 25")
def _():
    s = const("shape", np.array([5, 5], np.int64))
    return model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
                 [vi("x", F, [2, 6])], [vi("y", F, [5, 5])], [s])


@case("reshape_shape_from_input", "node 'rs' (Reshape): error: the target shape must be known when compiling")
def _():
    return model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
                 [vi("x", F, [2, 6]), vi("shape", I64, [2])], [vi("y", F, [3, 4])])


@case("slice_axis_out_of_range", "node 'sl' (Slice): error: axis 5 is out of range for rank 2", build=True)
def _():
    inits = [const("starts", np.array([0], np.int64)), const("ends", np.array([1], np.int64)),
             const("axes", np.array([5], np.int64))]
    return model([helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"], name="sl")],
                 [vi("x", F, [2, 4])], [vi("y", F, [2, 1])], inits)


@case("slice_step_zero", "node 'sl' (Slice): error: a step of 0")
def _():
    inits = [const("starts", np.array([0], np.int64)), const("ends", np.array([2], np.int64)),
             const("axes", np.array([1], np.int64)), const("steps", np.array([0], np.int64))]
    return model([helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"], name="sl")],
                 [vi("x", F, [2, 4])], [vi("y", F, [2, 2])], inits)


@case("conv_channel_mismatch", "node 'cv' (Conv): error: conv: 1 groups do not fit input [1,3,8,8]")
def _():
    w = const("W", np.ones((4, 5, 3, 3), np.float32))
    return model([helper.make_node("Conv", ["x", "W"], ["y"], name="cv")],
                 [vi("x", F, [1, 3, 8, 8])], [vi("y", F, [1, 4, 6, 6])], [w])


@case("cast_to_float8", "node 'c' (Cast): error: cast to float8e4m3fn is not supported")
def _():
    return unary("Cast", [2, 3], [2, 3], name="c", out_elem=TensorProto.FLOAT8E4M3FN, to=TensorProto.FLOAT8E4M3FN)


# ---- inputs: symbolic dims, dtypes ------------------------------------------------

@case("unbound_dim", "dimension 0 is symbolic ('batch'); bind it with --dim=batch=N", build=True)
def _():
    return unary("Relu", ["batch", 3], ["batch", 3])


@case("unbound_second_dim", "dimension 1 is symbolic ('seq'); bind it with --dim=seq=N", args="--dim=batch=2")
def _():
    return unary("Relu", ["batch", "seq"], ["batch", "seq"])


@case("anonymous_dim", "dimension 0 has no size and no name")
def _():
    return unary("Relu", [None, 3], [None, 3])


@case("input_float8", "graph input 'x' has element type float8e5m2")
def _():
    return unary("Relu", [2, 3], [2, 3], elem=TensorProto.FLOAT8E5M2)


@case("input_int4", "graph input 'x' has element type int4")
def _():
    return unary("Identity", [2, 4], [2, 4], elem=TensorProto.INT4)


@case("input_complex64", "graph input 'x' has element type complex64")
def _():
    return unary("Identity", [2, 3], [2, 3], elem=TensorProto.COMPLEX64)


@case("relu_uint8", "node 'n0' (Relu): error: relu: operand must be a floating-point tensor (f32, f64, f16 or bf16), got u8")
def _():
    return unary("Relu", [2, 3], [2, 3], elem=TensorProto.UINT8)


@case("input_sequence", "graph input 'x' is not a tensor but seq(tensor(float))")
def _():
    seq = helper.make_tensor_sequence_value_info("x", F, [2, 3])
    return model([helper.make_node("Identity", ["x"], ["y"], name="id")], [seq], [vi("y", F, [2, 3])])


def split_seq(nodes, outputs, inputs=()):
    """x (4, 3) split into a sequence s of four (1, 3) rows, then nodes."""
    return model([helper.make_node("SplitToSequence", ["x"], ["s"], name="split")] + nodes,
                 [vi("x", F, [4, 3])] + list(inputs), outputs)


@case("output_sequence", "graph output 's' is not a tensor but seq(tensor(float))")
def _():
    return split_seq([], [helper.make_tensor_sequence_value_info("s", F, [1, 3])])


@case("sequence_at_position_not_known", "node 'at' (SequenceAt): error: the position must be known when compiling")
def _():
    return split_seq([helper.make_node("SequenceAt", ["s", "i"], ["y"], name="at")], [vi("y", F, [1, 3])],
                     [vi("i", I64, [])])


@case("sequence_at_position_out_of_range",
      "node 'at' (SequenceAt): error: position -5 is out of range for a sequence of 4 tensors ([-4, 3])")
def _():
    return split_seq([helper.make_node("Constant", [], ["i"], value=helper.make_tensor("i", I64, [], [-5])),
                      helper.make_node("SequenceAt", ["s", "i"], ["y"], name="at")], [vi("y", F, [1, 3])])


@case("sequence_into_tensor_op", "node 'r' (Relu): error: input 0 ('s') is a sequence of 4 tensors; Relu takes a tensor there")
def _():
    return split_seq([helper.make_node("Relu", ["s"], ["y"], name="r")], [vi("y", F, [1, 3])])


@case("split_to_sequence_sizes_mismatch", "node 'split' (SplitToSequence): error: split sizes add up to 3, the axis has 4")
def _():
    return model([helper.make_node("SplitToSequence", ["x", "sz"], ["s"], name="split"),
                  helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, name="cat")],
                 [vi("x", F, [4, 3])], [vi("y", F, [4, 3])], [const("sz", np.array([1, 2], np.int64))])


@case("input_no_shape", "graph input 'x' has no shape")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                 [helper.make_tensor_value_info("x", F, None)], [vi("y", F, [2, 3])])


@case("string_tensor", "tensor 'words' has element type string")
def _():
    t = helper.make_tensor("words", TensorProto.STRING, [2], [b"hello", b"world"])
    return model([helper.make_node("Identity", ["words"], ["y"], name="id")], [],
                 [vi("y", TensorProto.STRING, [2])], [t])


@case("initializer_float8", "tensor 'W' has element type float8e4m3fn")
def _():
    w = helper.make_tensor("W", TensorProto.FLOAT8E4M3FN, [3, 4], [1.0] * 12)
    return model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 4])], [w])


# ---- tensor data -------------------------------------------------------------

def matmul_with(w):
    return model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 4])], [w])


@case("raw_data_wrong_length", "tensor 'W': holds 40 bytes of data, its shape [3,4] needs 48", build=True)
def _():
    w = TensorProto(name="W", data_type=F, dims=[3, 4], raw_data=bytes(40))
    return matmul_with(w)


@case("float_data_wrong_count", "tensor 'W': holds 20 bytes of data, its shape [3,4] needs 48")
def _():
    w = TensorProto(name="W", data_type=F, dims=[3, 4])
    w.float_data.extend([1.0] * 5)
    return matmul_with(w)


@case("negative_dim_initializer", "tensor 'W': dimension 0 is -3 (negative or too large)")
def _():
    w = TensorProto(name="W", data_type=F, dims=[-3, 4], raw_data=bytes(48))
    return matmul_with(w)


@case("huge_tensor_no_data", "tensor 'W': holds 0 bytes of data, its shape [3,3000000000] needs 36000000000")
def _():
    # 9e9 elements (36 GB of float) declared, no data and no external data: the
    # diagnostic must be about the missing data, whatever memory the machine has.
    w = TensorProto(name="W", data_type=F, dims=[3, 3000000000])
    return model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                 [vi("x", F, [2, 3])], [vi("y", F, [2, 3000000000])], [w])


@case("big_tensor_no_data", "tensor 'W': holds 0 bytes of data, its shape [2,1073741824] needs 8589934592")
def _():
    # 2^31 elements (8 GiB of float) declared, within novac's element limit, no data.
    w = TensorProto(name="W", data_type=F, dims=[2, 1073741824])
    return model([helper.make_node("Add", ["x", "W"], ["y"], name="add")],
                 [vi("x", F, [2, 1])], [vi("y", F, [2, 1073741824])], [w])


def external(location, nbytes=48, offset=None):
    w = TensorProto(name="W", data_type=F, dims=[3, 4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", nbytes)):
        if v is not None:
            e = w.external_data.add()
            e.key, e.value = k, str(v)
    return matmul_with(w)


@case("external_missing_file", "tensor 'W': cannot open external data", build=True)
def _():
    return external("missing_weights.bin")


@case("external_absolute_path",
      "tensor 'W': external data location '/etc/passwd' must be a relative path inside the model's folder")
def _():
    return external("/etc/passwd")


@case("external_dotdot_path",
      "tensor 'W': external data location '../bad_onnx.bin' must be a relative path inside the model's folder")
def _():
    return external("../bad_onnx.bin")


@case("external_no_location", "tensor 'W': external data without a location")
def _():
    return external("")


@case("external_wrong_length", "tensor 'W': external data length 12, expected 48 bytes")
def _():
    return external("missing_weights.bin", nbytes=12)


@case("external_short_file", "holds fewer than 0 + 48 bytes")
def _():
    # points at the .expect sidecar next to it: a file that exists but is too short
    return external("external_short_file.expect")


# ---- required inputs given as '' (ONNX's "omitted optional input") -------------------

def omitted(op, inputs, inits, out_shape, **attrs):
    return model([helper.make_node(op, inputs, ["y"], name="n", **attrs)], [],
                 [vi("y", I64, out_shape)], inits)


@case("omitted_input_add_const", "node 'n' (Add): error: input 1 is required")
def _():
    return omitted("Add", ["a", ""], [const("a", np.array([1, 2, 3], np.int64))], [3])


@case("omitted_input_where_const", "node 'n' (Where): error: input 1 is required")
def _():
    a = const("a", np.array([1, 2, 3], np.int64))
    c = const("c", np.array([True, False, True]))
    return omitted("Where", ["c", "", "a"], [a, c], [3])


@case("omitted_input_range", "node 'n' (Range): error: input 1 is required")
def _():
    return omitted("Range", ["s", "", "d"], [const("s", np.array(0, np.int64)), const("d", np.array(1, np.int64))],
                   [3])


@case("omitted_input_gather_const", "node 'n' (Gather): error: input 1 is required")
def _():
    return omitted("Gather", ["a", ""], [const("a", np.array([1, 2, 3], np.int64))], [3], axis=0)


@case("omitted_input_concat", "node 'n' (Concat): error: input 1 is required")
def _():
    return model([helper.make_node("Concat", ["x", ""], ["y"], name="n", axis=0)],
                 [vi("x", F, [3])], [vi("y", F, [3])])


@case("reshape_target_overflows", "node 'rs' (Reshape): error:")
def _():
    # 3 * (2^62 + 1) * 4 wraps around to 12 in 64-bit arithmetic, the input's element count
    s = const("shape", np.array([3, 4611686018427387905, 4], np.int64))
    return model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
                 [vi("x", F, [2, 6])], [vi("y", F, [3, 1, 4])], [s])


@case("initializer_zero_dim_huge_dims", "error:")
def _():
    # a zero-sized tensor whose other dims are huge: its element count is 0,
    # but the dims multiply past 2^63 wherever they are multiplied
    t = TensorProto(name="z", data_type=I64, dims=[0, 4611686018427387904, 8])
    return model([helper.make_node("Shape", ["z"], ["sh"], name="sh"),
                  helper.make_node("Reshape", ["x", "sh"], ["y"], name="rs")],
                 [vi("x", F, [2, 6])], [vi("y", F, [3, 4])], [t])


# ---- constants folded at compile time that are too large ---------------------------
# (the allocation fails at once where memory is not overcommitted without limit)

@case("range_too_large", "the range is too large")
def _():
    # 2^34 int64 elements (128 GiB), the most novac's element limit allows
    inits = [const("s", np.array(0, np.int64)), const("l", np.array(2 ** 34, np.int64)),
             const("d", np.array(1, np.int64))]
    return model([helper.make_node("Range", ["s", "l", "d"], ["y"], name="rg")], [],
                 [vi("y", I64, [2 ** 34])], inits)


@case("constant_of_shape_too_large", "too large")
def _():
    # 2^34 float elements (64 GiB)
    v = helper.make_tensor("v", F, [1], [1.0])
    return model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos", value=v)], [],
                 [vi("y", F, [2 ** 17, 2 ** 17])], [const("s", np.array([2 ** 17, 2 ** 17], np.int64))])



@case("constant_of_shape_2_pow_28", "the constant of shape [268435456] is too large: more than 256 MiB")
def _():
    # 1 GiB of floats from 8 bytes of shape: refused before it is allocated or filled
    v = helper.make_tensor("v", F, [1], [1.0])
    return model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos", value=v)], [],
                 [vi("y", F, [2 ** 28])], [const("s", np.array([2 ** 28], np.int64))])


@case("constant_of_shape_2_pow_14_squared", "the constant of shape [16384,16384] is too large: more than 256 MiB")
def _():
    v = helper.make_tensor("v", F, [1], [1.0])
    return model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos", value=v)], [],
                 [vi("y", F, [2 ** 14, 2 ** 14])], [const("s", np.array([2 ** 14, 2 ** 14], np.int64))])


@case("constant_of_shape_count_wraps", "too large")
def _():
    # 2^62 * 4 elements: the count wraps around to 0 in 64-bit arithmetic; the
    # Gather of one row must not read 4 floats out of whatever buffer was made
    v = helper.make_tensor("v", F, [1], [1.5])
    return model([helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos", value=v),
                  helper.make_node("Gather", ["c", "i"], ["y"], name="ga", axis=0)], [],
                 [vi("y", F, [4])], [const("s", np.array([2 ** 62, 4], np.int64)), const("i", np.array(1, np.int64))])



def range_model(dt, elem, start, limit, delta):
    inits = [const("s", np.array(start, dt)), const("l", np.array(limit, dt)), const("d", np.array(delta, dt))]
    return model([helper.make_node("Range", ["s", "l", "d"], ["y"], name="rg")], [], [vi("y", elem, [None])], inits)


@case("range_int_count_overflows", "too large")
def _():
    # 2^64 - 1 elements: limit - start does not fit in int64
    return range_model(np.int64, I64, -2 ** 63, 2 ** 63 - 1, 1)


@case("range_float_count_overflows", "too large")
def _():
    return range_model(np.float32, F, 0.0, 1e30, 1.0)


@case("range_float_nan_delta", "node 'rg' (Range): error:")
def _():
    return range_model(np.float32, F, 0.0, 10.0, float("nan"))


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "cases")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    names = set()
    for name, fn, expect, args, build, max_bytes in CASES:
        assert name not in names, name
        names.add(name)
        m = fn()
        b = m if isinstance(m, bytes) else m.SerializeToString()
        assert len(b) < max_bytes, (name, len(b))
        with open(os.path.join(out, name + ".onnx"), "wb") as f:
            f.write(b)
        with open(os.path.join(out, name + ".expect"), "w") as f:
            f.write("EXPECT: %s\n" % expect)
            if args:
                f.write("ARGS: %s\n" % args)
            if build:
                f.write("BUILD: also\n")
    print("wrote %d cases to %s" % (len(CASES), os.path.relpath(out)))


if __name__ == "__main__":
    main(sys.argv)
