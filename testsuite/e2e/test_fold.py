"""Compile-time evaluation of ONNX subgraphs whose inputs are all known
(frontend/onnx_eval.c): the folded nodes must leave the step (checked in
--emit=nova) and the values must be those numpy computes.

Each case builds a model whose constants go through a chain of ops and
then meet a graph input x: y = x + f(constants) (or an index use of it).
The reference is numpy on the same constants."""
import os
import shutil
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from harness import NOVAC, NOVARUN, Failure, case, check_close, read_pb, run, write_pb


def const(name, arr):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(arr), name))


def fold_case(name, consts, nodes, result, ref, x_shape, x_dtype=np.float32, combine="Add", banned=(), opset=17):
    """consts: name -> array (Constant nodes); nodes: the chain, ending in
    `result`; y = combine(x, result); ref: y from x in numpy.  banned: nova
    ops that must not be left in the step."""
    def go():
        ttype = {np.float32: T.FLOAT, np.int64: T.INT64}[x_dtype]
        all_nodes = [const(k, v) for k, v in consts.items()] + nodes + [h.make_node(combine, ["x", result], ["y"])]
        g = h.make_graph(all_nodes, name, [h.make_tensor_value_info("x", ttype, list(x_shape))],
                         [h.make_tensor_value_info("y", ttype, None)])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
        d = tempfile.mkdtemp(prefix="nova-fold-")
        try:
            path = os.path.join(d, "m.onnx")
            onnx.save(m, path)
            ir = run([NOVAC, path, "--emit=nova", "-o", "-"]).stdout
            for op in banned:
                if '"nova.%s"' % op in ir:
                    raise Failure("nova.%s was left to the step:\n%s" % (op, ir[:2000]))
            x = (np.random.default_rng(3).standard_normal(x_shape) * 3).astype(x_dtype)
            os.mkdir(os.path.join(d, "in"))
            write_pb(os.path.join(d, "in", "input_0.pb"), x, "x")
            so = os.path.join(d, "m.so")
            run([NOVAC, path, "-o", so])
            run([NOVARUN, so, "--inputs", os.path.join(d, "in"), "--outputs", os.path.join(d, "out"), "-q"])
            got = read_pb(os.path.join(d, "out", "output_0.pb"))
            want = ref(x)
            if got.dtype != want.dtype or got.shape != want.shape:
                raise Failure("got %s %s, expected %s %s" % (got.dtype, got.shape, want.dtype, want.shape))
            check_close(got, want, 1e-6)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("fold.%s" % name, go)


# T5's relative-position buckets: Range, Sub, Abs, Cast, Div, Log, Mul, Cast of log(0) (-inf -> the
# most negative int64, as numpy and PyTorch give on x86), Min, Less, Where, then a Gather of a table.
L, NB, MAXD = 6, 8, 16


def t5_buckets():
    ctx = np.arange(L)[:, None]
    rel = np.abs(np.arange(L)[None, :] - ctx)
    with np.errstate(divide="ignore", invalid="ignore"):
        large = (np.log(rel.astype(np.float32) / np.float32(NB / 2)) / np.float32(np.log(MAXD / (NB / 2)))
                 * np.float32(NB / 2)).astype(np.int64) + NB // 2
    return np.where(rel < NB // 2, rel, np.minimum(large, NB - 1))


TABLE = np.random.default_rng(1).standard_normal((NB, 3)).astype(np.float32)
fold_case("t5_relative_position_buckets",
          {"s0": np.int64(0), "L": np.int64(L), "one": np.int64(1), "ax1": np.array([1]), "ax0": np.array([0]),
           "half": np.float32(NB / 2), "lden": np.float32(np.log(MAXD / (NB / 2))), "nbf": np.float32(NB / 2),
           "halfi": np.int64(NB // 2), "top": np.int64(NB - 1), "table": TABLE},
          [h.make_node("Range", ["s0", "L", "one"], ["ctx"]), h.make_node("Unsqueeze", ["ctx", "ax1"], ["c2"]),
           h.make_node("Unsqueeze", ["ctx", "ax0"], ["m2"]), h.make_node("Sub", ["m2", "c2"], ["rel"]),
           h.make_node("Abs", ["rel"], ["arel"]), h.make_node("Cast", ["arel"], ["f"], to=T.FLOAT),
           h.make_node("Div", ["f", "half"], ["q"]), h.make_node("Log", ["q"], ["lq"]),
           h.make_node("Div", ["lq", "lden"], ["r1"]), h.make_node("Mul", ["r1", "nbf"], ["r2"]),
           h.make_node("Cast", ["r2"], ["i2"], to=T.INT64), h.make_node("Add", ["i2", "halfi"], ["i3"]),
           h.make_node("Min", ["i3", "top"], ["i4"]), h.make_node("Less", ["arel", "halfi"], ["small"]),
           h.make_node("Where", ["small", "arel", "i4"], ["bucket"]), h.make_node("Gather", ["table", "bucket"], ["bias"])],
          "bias", lambda x: x + TABLE[t5_buckets()], (L, L, 3), banned=("log", "minimum", "where", "cast", "gather"))

# Every family of elementwise op on constants (float and integer), reductions and data movement
A = np.array([[0.5, -1.25, 2.0], [3.5, -0.75, 1.5]], dtype=np.float32)
I = np.array([[7, -3, 4], [-8, 5, 2]], dtype=np.int64)
fold_case("float_chain", {"a": A, "b": np.float32(0.75), "ax": np.array([1]), "shp": np.array([2, 3])},
          [h.make_node("Sin", ["a"], ["s"]), h.make_node("Cosh", ["s"], ["c"]), h.make_node("Floor", ["a"], ["fl"]),
           h.make_node("Mod", ["a", "b"], ["md"], fmod=1), h.make_node("Softplus", ["a"], ["sp"]),
           h.make_node("Add", ["c", "fl"], ["t1"]), h.make_node("Mul", ["t1", "md"], ["t2"]),
           h.make_node("Add", ["t2", "sp"], ["t3"]), h.make_node("ReduceSum", ["t3", "ax"], ["r"], keepdims=1),
           h.make_node("Transpose", ["t3"], ["tt"]), h.make_node("Reshape", ["tt", "shp"], ["t4"]),
           h.make_node("Sub", ["t4", "r"], ["out"])],
          "out",
          lambda x: x + ((np.cosh(np.sin(A)) + np.floor(A)) * np.fmod(A, np.float32(0.75)) + np.log1p(np.exp(A))).T.reshape(2, 3)
          - ((np.cosh(np.sin(A)) + np.floor(A)) * np.fmod(A, np.float32(0.75)) + np.log1p(np.exp(A))).sum(1, keepdims=True),
          (2, 3), banned=("sin", "cosh", "floor", "fmod", "reduce_sum", "transpose"))
fold_case("integer_chain", {"i": I, "k": np.int64(3)},
          [h.make_node("Mod", ["i", "k"], ["m"]), h.make_node("Div", ["i", "k"], ["q"]),
           h.make_node("Mul", ["m", "q"], ["p"]), h.make_node("ReduceMax", ["p"], ["mx"], axes=[0], keepdims=0),
           h.make_node("Neg", ["mx"], ["out"])],
          "out", lambda x: x + -(np.mod(I, 3) * np.trunc(I / 3).astype(np.int64)).max(0), (3,), x_dtype=np.int64,
          banned=("mod", "div", "mul", "reduce_max"))


# If with a condition known when compiling (here from a shape): the chosen branch is imported
# in place and sees the outer values; the other branch is never converted
_then = h.make_graph([h.make_node("Mul", ["a", "two"], ["t_out"])], "then", [], [h.make_tensor_value_info("t_out", T.FLOAT, None)])
_else = h.make_graph([h.make_node("Det", ["a"], ["e_out"])], "else", [], [h.make_tensor_value_info("e_out", T.FLOAT, None)])
fold_case("if_known_condition", {"a": A, "two": np.float32(2), "k": np.int64(1), "idx": np.int64(0)},
          [h.make_node("Shape", ["a"], ["s"]), h.make_node("Gather", ["s", "idx"], ["d0"]),
           h.make_node("Greater", ["d0", "k"], ["c"]),
           h.make_node("If", ["c"], ["out"], then_branch=_then, else_branch=_else)],
          "out", lambda x: x + A * 2, (2, 3), banned=("mul",))

# NonZero of a constant: its positions are known when compiling
_nz = np.array([[0, 3, 0], [5, 0, 7]], dtype=np.float32)
fold_case("nonzero_constant", {"a": _nz},
          [h.make_node("NonZero", ["a"], ["nz"]), h.make_node("Cast", ["nz"], ["nzf"], to=T.FLOAT)],
          "nzf", lambda x: x + np.stack(np.nonzero(_nz)).astype(np.float32), (2, 3))

# RMSNormalization and RotaryEmbedding (opset 23) of constants: the rms_norm and
# rotary nodes evaluated, the position ids' gather of the caches too
_rng = np.random.default_rng(7)
_xr, _wr = _rng.standard_normal((2, 3, 4)).astype(np.float32), _rng.standard_normal((3, 4)).astype(np.float32)
_rms = (_xr.astype(np.float64) / np.sqrt((_xr.astype(np.float64) ** 2).mean((1, 2), keepdims=True) + 0.1) * _wr)
fold_case("rms_normalization", {"a": _xr, "w": _wr},
          [h.make_node("RMSNormalization", ["a", "w"], ["r"], axis=1, epsilon=0.1)],
          "r", lambda x: (x + _rms).astype(np.float32), (2, 3, 4), banned=("rms_norm",), opset=23)


def _rotary_ref(q, c, s, pos, interleaved, heads, rd):
    """[B, S, heads * D], caches [P, rd/2] at pos [B, S]: the first rd of each head rotated."""
    B, S, _ = q.shape
    t = q.astype(np.float64).reshape(B, S, heads, -1)
    cs, sn = c[pos][:, :, None, :].astype(np.float64), s[pos][:, :, None, :].astype(np.float64)
    r = t[..., :rd]
    x1, x2 = (r[..., 0::2], r[..., 1::2]) if interleaved else (r[..., :rd // 2], r[..., rd // 2:])
    re, im = x1 * cs - x2 * sn, x2 * cs + x1 * sn
    r = np.stack([re, im], -1).reshape(r.shape) if interleaved else np.concatenate([re, im], -1)
    return np.concatenate([r, t[..., rd:]], -1).reshape(q.shape)


_q, _c, _s = (_rng.standard_normal(sh).astype(np.float32) for sh in ((2, 3, 16), (6, 2), (6, 2)))
_pos = np.array([[5, 0, 2], [1, 1, -2]], dtype=np.int64)
for _il in (0, 1):
    fold_case("rotary_embedding_position_ids_%s" % ("interleaved" if _il else "halves"),
              {"q": _q, "c": _c, "s": _s, "p": _pos},
              [h.make_node("RotaryEmbedding", ["q", "c", "s", "p"], ["r"], interleaved=_il, num_heads=2,
                           rotary_embedding_dim=4)],
              "r", lambda x, il=_il: (x + _rotary_ref(_q, _c, _s, _pos, il, 2, 4)).astype(np.float32), (2, 3, 16),
              banned=("rotary", "gather"), opset=23)
