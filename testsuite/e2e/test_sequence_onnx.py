"""ONNX sequences, resolved when compiling (frontend/onnx_seq.c).

SplitToSequence, SequenceAt, SequenceConstruct, ConcatFromSequence,
SequenceLength, SequenceEmpty, SequenceInsert and SequenceErase, as the
dynamo exporter writes them for torch.split / chunk / unbind followed by
indexing, and for list building followed by torch.cat / stack:

  forward    each model's outputs against onnx.reference.ReferenceEvaluator
             (float32: relative error, max-norm, at most 1e-5; integers exact);
  folding    sequences of known tensors stay known (no nova op is left to the
             step; a shape taken apart and put together again still reshapes);
  training   --train through SplitToSequence / SequenceAt / ConcatFromSequence:
             every gradient against central finite differences of the
             reference in float64 (at most 1e-6);
  torch      data/seq_split_attention (written by data/make_seq_torch.py from
             a torch.nn.Module by the dynamo exporter): it holds the sequence
             operators, compiles, and matches PyTorch's output and the reference;
  errors     a position not known when compiling or out of range, a sequence
             graph input or output, a sequence where a tensor belongs: exit 1
             with 'm.onnx: node 'NAME' (Op): error: ...' (or the graph's
             input/output named).

Prints 'PASS: e2e-seq :: NAME' or 'FAIL: e2e-seq :: NAME'.
"""
import os
import shutil
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from harness import NOVAC, NOVARUN, Failure, case, check_close, compile_and_run, fd_grad, read_pb, rel_err, run

SUITE = "e2e-seq"
HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)
ONNX_T = {np.float32: T.FLOAT, np.float64: T.DOUBLE, np.int64: T.INT64}


def u(*shape):
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


def i64(v, name):
    return nh.from_array(np.array(v, dtype=np.int64), name)


def const(name, arr):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(arr), name))


def make(nodes, inputs, outputs, inits=(), opset=18):
    """inputs: name -> array (graph inputs); outputs: names (types left to inference)."""
    vin = [h.make_tensor_value_info(k, ONNX_T[v.dtype.type], list(v.shape)) for k, v in inputs.items()]
    vout = [h.make_value_info(o, onnx.TypeProto()) for o in outputs]
    g = h.make_graph(nodes, "seq", vin, vout, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def fwd_case(name, nodes, inputs, outputs, inits=(), banned=()):
    """Compiles and runs the model; every output against the reference.
    banned: nova ops that must not be left in the step (folded)."""
    def go():
        m = make(nodes, inputs, outputs, inits)
        want = ReferenceEvaluator(m).run(None, inputs)
        if banned:
            ir = nova_ir(m)
            for op in banned:
                if '"nova.%s"' % op in ir:
                    raise Failure("nova.%s was left to the step:\n%s" % (op, ir[:2000]))
        outs, _ = compile_and_run(m.SerializeToString(), inputs)
        if len(outs) != len(want):
            raise Failure("%d outputs, expected %d" % (len(outs), len(want)))
        for k, (got, ref) in enumerate(zip(outs, want)):
            ref = np.asarray(ref)
            if got.dtype != ref.dtype or got.shape != ref.shape:
                raise Failure("output %d: %s %s, expected %s %s" % (k, got.dtype, got.shape, ref.dtype, ref.shape))
            check_close(got, ref, 1e-5 if ref.dtype.kind == "f" else 0, "output %d (%s)" % (k, outputs[k]))
    case("seq.%s" % name, go, suite=SUITE)


def nova_ir(m):
    d = tempfile.mkdtemp(prefix="nova-seq-")
    try:
        path = os.path.join(d, "m.onnx")
        onnx.save(m, path)
        return run([NOVAC, path, "--emit=nova", "-o", "-"]).stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)


def at(seq, pos, out):
    return [const(out + "_p", np.int64(pos)), h.make_node("SequenceAt", [seq, out + "_p"], [out])]


# ---- forward: every operator ---------------------------------------------------------
fwd_case("split_chunk_size_uneven",  # 5 rows in chunks of 2: 2, 2, 1
         [const("two", np.int64(2)), h.make_node("SplitToSequence", ["x", "two"], ["s"])]
         + at("s", 0, "a") + at("s", 1, "b") + at("s", -1, "c") + [h.make_node("SequenceLength", ["s"], ["n"])],
         {"x": u(5, 3)}, ["a", "b", "c", "n"])
fwd_case("split_sizes_then_concat",
         [const("sz", np.array([1, 3, 2])), h.make_node("SplitToSequence", ["x", "sz"], ["s"], axis=-1)]
         + at("s", 2, "a") + at("s", -2, "b")
         + [h.make_node("ConcatFromSequence", ["s"], ["c"], axis=1), h.make_node("Relu", ["b"], ["rb"])],
         {"x": u(2, 6)}, ["a", "rb", "c"])
fwd_case("unbind_keepdims0_stack",  # torch.unbind(x, 1) then torch.stack(.., dim=2)
         [h.make_node("SplitToSequence", ["x"], ["s"], axis=1, keepdims=0)] + at("s", 1, "a")
         + [h.make_node("ConcatFromSequence", ["s"], ["st"], axis=2, new_axis=1),
            h.make_node("ConcatFromSequence", ["s"], ["sl"], axis=-1, new_axis=1),
            h.make_node("SequenceLength", ["s"], ["n"])],
         {"x": u(3, 2, 4)}, ["a", "st", "sl", "n"])
fwd_case("split_parts_of_one_keepdims1",
         [h.make_node("SplitToSequence", ["x"], ["s"], axis=0)] + at("s", 2, "a")
         + [h.make_node("ConcatFromSequence", ["s"], ["c"], axis=0)],
         {"x": u(3, 4)}, ["a", "c"])
fwd_case("construct_concat_stack",
         [h.make_node("SequenceConstruct", ["x", "y", "x"], ["s"]),
          h.make_node("ConcatFromSequence", ["s"], ["c"], axis=1),
          h.make_node("SequenceConstruct", ["x", "z"], ["s2"]),
          h.make_node("ConcatFromSequence", ["s2"], ["st"], axis=0, new_axis=1)] + at("s", 1, "b"),
         {"x": u(2, 3), "y": u(2, 5), "z": u(2, 3)}, ["c", "st", "b"])
fwd_case("empty_insert_erase",
         [h.make_node("SequenceEmpty", [], ["e"], dtype=T.FLOAT),
          h.make_node("SequenceInsert", ["e", "x"], ["s1"]),               # [x]
          const("p0", np.int64(0)), h.make_node("SequenceInsert", ["s1", "y", "p0"], ["s2"]),      # [y, x]
          const("pm1", np.int64(-1)), h.make_node("SequenceInsert", ["s2", "z", "pm1"], ["s3"]),   # [y, z, x]
          h.make_node("SequenceInsert", ["s3", "x"], ["s4"]),              # [y, z, x, x]
          const("p1", np.int64(1)), h.make_node("SequenceErase", ["s4", "p1"], ["s5"]),  # [y, x, x]
          h.make_node("SequenceErase", ["s5"], ["s6"]),                    # [y, x]
          h.make_node("SequenceLength", ["s4"], ["n4"]), h.make_node("SequenceLength", ["s6"], ["n6"]),
          h.make_node("ConcatFromSequence", ["s6"], ["c"], axis=0),
          h.make_node("ConcatFromSequence", ["s3"], ["c3"], axis=-1)] + at("s3", 1, "m"),
         {"x": u(2, 3), "y": u(2, 3), "z": u(2, 3)}, ["n4", "n6", "c", "c3", "m"])
fwd_case("insert_int64_identity",  # an int64 sequence passed through Identity
         [h.make_node("SequenceConstruct", ["i"], ["s"]), h.make_node("Identity", ["s"], ["t"]),
          h.make_node("SequenceInsert", ["t", "i"], ["t2"]),
          h.make_node("ConcatFromSequence", ["t2"], ["c"], axis=0, new_axis=1)] + at("t2", -1, "a"),
         {"i": np.arange(6, dtype=np.int64).reshape(2, 3)}, ["c", "a"])

# the qkv split of attention, as the dynamo exporter writes torch.split(qkv(x), C, dim=-1)
_C = 4
fwd_case("dynamo_qkv_split_attention",
         [h.make_node("MatMul", ["x", "w"], ["qkv"]), const("c", np.int64(_C)),
          h.make_node("SplitToSequence", ["qkv", "c"], ["s"], axis=-1)]
         + at("s", 0, "q") + at("s", 1, "k") + at("s", 2, "v")
         + [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), h.make_node("MatMul", ["q", "kt"], ["qk"]),
            const("sc", np.float32(1 / np.sqrt(_C))), h.make_node("Mul", ["qk", "sc"], ["qks"]),
            h.make_node("Softmax", ["qks"], ["p"], axis=-1), h.make_node("MatMul", ["p", "v"], ["y"])],
         {"x": u(2, 5, 6)}, ["y"], inits=[nh.from_array(u(6, 3 * _C), "w")])

# ---- folding: known sequences stay known ----------------------------------------------------
_K = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
fwd_case("fold_split_of_constant",
         [const("k", _K), const("sz", np.array([1, 3])), h.make_node("SplitToSequence", ["k", "sz"], ["s"], axis=1)]
         + at("s", 1, "a") + [h.make_node("Add", ["x", "a"], ["y"])],
         {"x": u(3, 3)}, ["y"], banned=("slice", "concat"))
fwd_case("fold_stack_of_constants",
         [const("k", _K), h.make_node("SplitToSequence", ["k"], ["s"], axis=0, keepdims=0),
          h.make_node("SequenceErase", ["s", "zero"], ["s2"]),
          h.make_node("ConcatFromSequence", ["s2"], ["st"], axis=1, new_axis=1), h.make_node("Mul", ["x", "st"], ["y"])],
         {"x": u(4, 2)}, ["y"], inits=[i64(0, "zero")], banned=("slice", "concat", "reshape"))
fwd_case("fold_shape_through_a_sequence",  # Shape -> SplitToSequence -> SequenceAt, swapped -> Reshape
         [h.make_node("Shape", ["x"], ["sh"]), h.make_node("SplitToSequence", ["sh"], ["s"])]
         + at("s", 0, "d0") + at("s", 1, "d1")
         + [h.make_node("SequenceConstruct", ["d1", "d0"], ["s2"]),
            h.make_node("ConcatFromSequence", ["s2"], ["shape"], axis=0),
            h.make_node("Reshape", ["x", "shape"], ["y"])],
         {"x": u(2, 6)}, ["y"])
# If with a known condition whose branch builds a sequence
_then = h.make_graph([h.make_node("SequenceConstruct", ["x", "x"], ["ts"])], "then", [],
                     [h.make_tensor_sequence_value_info("ts", T.FLOAT, None)])
_else = h.make_graph([h.make_node("SequenceConstruct", ["x"], ["es"])], "else", [],
                     [h.make_tensor_sequence_value_info("es", T.FLOAT, None)])
fwd_case("if_branch_sequence",
         [const("cond", np.array(True)), h.make_node("If", ["cond"], ["s"], then_branch=_then, else_branch=_else),
          h.make_node("ConcatFromSequence", ["s"], ["c"], axis=0), h.make_node("SequenceLength", ["s"], ["n"])],
         {"x": u(2, 2)}, ["c", "n"])


# ---- training: gradients through the sequence operators --------------------------------------
def train_model(P, W):
    """loss = sum(y * W[0]) + sum(st * W[1]) with y = cat([tanh(b), a]) of the split of x @ w1,
    st = stack of w2's rows (unbind) in reverse, all float64 initializers."""
    X = np.linspace(-1, 1, 12).reshape(2, 6)
    nodes = [const("X", X), h.make_node("MatMul", ["X", "w1"], ["hh"]), const("sz", np.array([2, 3])),
             h.make_node("SplitToSequence", ["hh", "sz"], ["s"], axis=1)] + at("s", 0, "a") + at("s", -1, "b") + [
        h.make_node("Tanh", ["b"], ["tb"]), h.make_node("SequenceConstruct", ["tb", "a"], ["s2"]),
        h.make_node("ConcatFromSequence", ["s2"], ["y"], axis=1),
        h.make_node("SplitToSequence", ["w2"], ["r"], axis=0, keepdims=0)] + at("r", 0, "r0") + at("r", 2, "r2") + [
        h.make_node("SequenceConstruct", ["r2", "r0"], ["r3"]), h.make_node("SequenceInsert", ["r3", "r0"], ["r4"]),
        h.make_node("ConcatFromSequence", ["r4"], ["st"], axis=0, new_axis=1),
        const("W0", W[0]), const("W1", W[1]), h.make_node("Mul", ["y", "W0"], ["yw"]),
        h.make_node("Mul", ["st", "W1"], ["sw"]), h.make_node("ReduceSum", ["yw"], ["l0"], keepdims=0),
        h.make_node("ReduceSum", ["sw"], ["l1"], keepdims=0), h.make_node("Add", ["l0", "l1"], ["loss"])]
    g = h.make_graph(nodes, "train", [], [h.make_tensor_value_info("loss", T.DOUBLE, [])],
                     [nh.from_array(v, k) for k, v in P.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


def train_case():
    P0 = {"w1": rng.uniform(-1, 1, (6, 5)), "w2": rng.uniform(-1, 1, (3, 4))}
    W = [rng.uniform(-1, 1, (2, 5)), rng.uniform(-1, 1, (3, 4))]

    def loss(P):
        return float(ReferenceEvaluator(train_model(P, W)).run(None, {})[0])
    d = tempfile.mkdtemp(prefix="nova-seq-")
    try:
        path = os.path.join(d, "m.onnx")
        onnx.save(train_model(P0, W), path)
        so = os.path.join(d, "m.so")
        run([NOVAC, path, "--train", "--keep-grads", "--optimizer=sgd", "--lr=0", "-o", so])
        run([NOVARUN, so, "--steps", "1", "--dump", os.path.join(d, "dump"), "-q"])
        check_close(read_pb(os.path.join(d, "dump", "loss.pb")), loss(P0), 1e-12, "loss")
        for k, v in P0.items():
            got = read_pb(os.path.join(d, "dump", "grad.%s.pb" % k))
            P = {kk: vv.copy() for kk, vv in P0.items()}
            want = fd_grad(lambda: loss(P), P, k)
            e = rel_err(got, want)
            if not e <= 1e-6:
                raise Failure("grad of %s: relative error %.3g\n got %s\n ref %s" % (k, e, got, want))
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("seq.train_split_at_concat_grads", train_case, suite=SUITE)


# ---- a torch.nn.Module through the dynamo exporter -------------------------------------------
def torch_case():
    base = os.path.join(HERE, "data", "seq_split_attention")
    m = onnx.load(os.path.join(base, "model.onnx"))
    ops = {n.op_type for n in m.graph.node}
    if not {"SplitToSequence", "SequenceAt"} <= ops:
        raise Failure("the export holds no sequence operators: %s" % sorted(ops))
    x, y_torch = read_pb(os.path.join(base, "input_0.pb")), read_pb(os.path.join(base, "output_0.pb"))
    y_ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    check_close(y_ref, y_torch, 1e-5, "reference against PyTorch")
    outs, _ = compile_and_run(m.SerializeToString(), {"x": x})
    check_close(outs[0], y_torch, 1e-5, "against PyTorch")
    check_close(outs[0], y_ref, 1e-5, "against the reference")


case("seq.torch_dynamo_split_chunk", torch_case, suite=SUITE)


# ---- errors -------------------------------------------------------------------------------
def bad_case(name, model, expect, first=None):
    """novac exits 1; stderr starts with FIRST (default: the model's path) and contains EXPECT."""
    def go():
        d = tempfile.mkdtemp(prefix="nova-seq-")
        try:
            path = os.path.join(d, "m.onnx")
            onnx.save(model, path)
            p = run([NOVAC, path, "-o", os.path.join(d, "m.so")], expect_rc=1)
            want_first = path + ": " + (first or "")
            if not p.stderr.startswith(want_first) or expect not in p.stderr:
                raise Failure("expected '%s...%s' in:\n%s" % (want_first, expect, p.stderr))
            if os.path.exists(os.path.join(d, "m.so")):
                raise Failure("a failed compile left m.so behind")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("seq.bad.%s" % name, go, suite=SUITE)


_split = [h.make_node("SplitToSequence", ["x"], ["s"], axis=0, name="split")]
_x = {"x": u(2, 3)}
bad_case("position_not_constant",
         make(_split + [h.make_node("SequenceAt", ["s", "i"], ["y"], name="pick")],
              dict(_x, i=np.array(0, dtype=np.int64)), ["y"]),
         "the position must be known when compiling", "node 'pick' (SequenceAt): error: ")
bad_case("position_out_of_range",
         make(_split + [const("p", np.int64(2)), h.make_node("SequenceAt", ["s", "p"], ["y"], name="pick")], _x, ["y"]),
         "position 2 is out of range for a sequence of 2 tensors ([-2, 1])", "node 'pick' (SequenceAt): error: ")
bad_case("insert_position_out_of_range",
         make(_split + [const("p", np.int64(-3)), h.make_node("SequenceInsert", ["s", "x", "p"], ["t"], name="ins"),
                        h.make_node("ConcatFromSequence", ["t"], ["y"], axis=0)], _x, ["y"]),
         "position -3 is out of range for a sequence of 2 tensors ([-2, 2])", "node 'ins' (SequenceInsert): error: ")
bad_case("erase_empty",
         make([h.make_node("SequenceEmpty", [], ["e"]), h.make_node("SequenceErase", ["e"], ["t"], name="er"),
               h.make_node("SequenceLength", ["t"], ["y"])], {}, ["y"]),
         "the sequence is empty", "node 'er' (SequenceErase): error: ")
bad_case("sequence_into_a_tensor_op",
         make(_split + [h.make_node("Relu", ["s"], ["y"], name="relu")], _x, ["y"]),
         "input 0 ('s') is a sequence of 2 tensors; Relu takes a tensor there", "node 'relu' (Relu): error: ")
bad_case("tensor_into_a_sequence_op",
         make([const("p", np.int64(0)), h.make_node("SequenceAt", ["x", "p"], ["y"], name="pick")], _x, ["y"]),
         "input 0 ('x') is a tensor; SequenceAt takes a sequence there", "node 'pick' (SequenceAt): error: ")
bad_case("insert_dtype_mismatch",
         make([h.make_node("SequenceEmpty", [], ["e"], dtype=T.INT64), h.make_node("SequenceInsert", ["e", "x"], ["t"], name="ins"),
               h.make_node("SequenceLength", ["t"], ["y"])], _x, ["y"]),
         "the tensor is f32, the sequence holds i64", "node 'ins' (SequenceInsert): error: ")
_g = h.make_graph([h.make_node("SequenceAt", ["xs", "p"], ["y"])], "g",
                  [h.make_tensor_sequence_value_info("xs", T.FLOAT, [2, 3])],
                  [h.make_tensor_value_info("y", T.FLOAT, [2, 3])], [i64(0, "p")])
bad_case("sequence_graph_input", h.make_model(_g, opset_imports=[h.make_opsetid("", 18)]),
         "graph input 'xs' is not a tensor but seq(tensor(float))", "error: ")
_g = h.make_graph(_split, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                  [h.make_tensor_sequence_value_info("s", T.FLOAT, None)])
bad_case("sequence_graph_output", h.make_model(_g, opset_imports=[h.make_opsetid("", 18)]),
         "graph output 's' is not a tensor but seq(tensor(float))", "error: ")
bad_case("sequence_graph_output_undeclared", make(_split, _x, ["s"]),
         "graph output 's' is a sequence of 2 f32 tensors", "error: ")
bad_case("concat_shapes_differ",
         make([h.make_node("SequenceConstruct", ["x", "y"], ["s"]),
               h.make_node("ConcatFromSequence", ["s"], ["c"], axis=1, name="cat")], dict(_x, y=u(3, 3)), ["c"]),
         "element 1 is [3,3], element 0 is [2,3]: they may differ along the axis only",
         "node 'cat' (ConcatFromSequence): error: ")
bad_case("stack_shapes_differ",
         make([h.make_node("SequenceConstruct", ["x", "y"], ["s"]),
               h.make_node("ConcatFromSequence", ["s"], ["c"], axis=0, new_axis=1, name="st")], dict(_x, y=u(2, 4)), ["c"]),
         "element 1 is [2,4], element 0 is [2,3]: stacking takes equal shapes", "node 'st' (ConcatFromSequence): error: ")
bad_case("split_not_known",
         make([h.make_node("SplitToSequence", ["x", "n"], ["s"], name="split"), h.make_node("SequenceLength", ["s"], ["y"])],
              dict(_x, n=np.array(1, dtype=np.int64)), ["y"]),
         "split must be known when compiling", "node 'split' (SplitToSequence): error: ")
