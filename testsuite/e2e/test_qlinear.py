"""ONNX QLinearMatMul and QLinearConv (frontend/onnx_qlinear.c), bit for bit
against an independent numpy reference.

The reference computes as the onnx reference implementation does
(onnx/reference/ops/op_qlinear_matmul.py, op_qlinear_conv.py): the integer
product exactly, the scale factor a_scale * b_scale / y_scale in the scales'
type (float32, float16 or bfloat16, each operation rounded to it), the
product with it and the sum with y_zero_point in float64, rounding half to
even, saturation to the result type.  It places vectors of scales and zero
points as the spec says: per row of a and of y, per column of b, per filter
of w (the onnx reference broadcasts every vector along the last axis, and
its per-filter path assumes 2-D images); where the two agree, a case also
checks numpy against onnx.reference.ReferenceEvaluator.

The cases cover int8 and uint8 operands and results, absent zero points,
N-D batches, values on rounding ties (scale factors 0.5 and 0.25), values
far out of range (saturation), and scales for which the scale factor in the
scales' type differs from float64's and changes results.

Prints 'PASS: e2e-qlinear :: NAME' or 'FAIL: e2e-qlinear :: NAME'.
"""
import os
import shutil
import sys
import tempfile

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from harness import NOVAC, Failure, case, compile_and_run, results, run
from refs import conv_ref

rng = np.random.default_rng(2110)
BF16 = np.dtype(ml_dtypes.bfloat16)
ONNX_TYPE = {np.dtype(np.int8): T.INT8, np.dtype(np.uint8): T.UINT8, np.dtype(np.int32): T.INT32,
             np.dtype(np.float32): T.FLOAT, np.dtype(np.float16): T.FLOAT16, BF16: T.BFLOAT16}


# ---- the numpy reference --------------------------------------------------------

def placed(v, rank, axis):
    """One value as a 0-d array; a vector along axis of a rank-`rank` tensor; N-D as it is."""
    if v.size == 1 and v.ndim <= 1:
        return v.reshape(())
    if v.ndim == 1:
        s = [1] * rank
        s[axis] = v.size
        return v.reshape(s)
    return v


def requant(acc, m, zy, dt):
    d = acc.astype(np.float64) * m.astype(np.float64)
    if zy is not None:
        d = d + zy.astype(np.float64)
    info = np.iinfo(dt)
    return np.clip(np.rint(d), info.min, info.max).astype(dt)


def qmatmul_ref(a, sa, za, b, sb, zb, sy, zy):
    A = a.astype(np.int64) - (0 if za is None else placed(za, a.ndim, -2).astype(np.int64))
    B = b.astype(np.int64) - (0 if zb is None else placed(zb, b.ndim, -1).astype(np.int64))
    acc = np.matmul(A, B)
    r = acc.ndim
    m = (placed(sa, r, -2) * placed(sb, r, -1)) / placed(sy, r, -2)
    return requant(acc, m, None if zy is None else placed(zy, r, -2), (a if zy is None else zy).dtype)


def qconv_ref(x, sx, zx, w, sw, zw, sy, zy, B=None, strides=None, pads=None, dilations=None, group=1):
    ns = x.ndim - 2
    X = x.astype(np.float64) - (0 if zx is None else zx.astype(np.float64).reshape(()))
    W = w.astype(np.float64) - (0 if zw is None else placed(zw, w.ndim, 0).astype(np.float64))
    acc = conv_ref(X, W, strides or [1] * ns, pads or [0] * (2 * ns), dilations or [1] * ns, group)
    if B is not None:
        acc = acc + B.astype(np.float64).reshape([1, -1] + [1] * ns)
    m = (sx.reshape(()) * placed(sw, acc.ndim, 1)) / sy.reshape(())
    return requant(acc, m, None if zy is None else zy.reshape(()), (x if zy is None else zy).dtype)


# ---- models ---------------------------------------------------------------------

def model(op, names, vals, attrs, out_dtype):
    """One node; vals[i] None: input omitted (""); every present value a graph input."""
    ins = [h.make_tensor_value_info(n, ONNX_TYPE[v.dtype], list(v.shape)) for n, v in zip(names, vals) if v is not None]
    node = h.make_node(op, [n if v is not None else "" for n, v in zip(names, vals)], ["y"], **attrs)
    g = h.make_graph([node], op, ins, [h.make_tensor_value_info("y", ONNX_TYPE[np.dtype(out_dtype)], None)])
    opset = 21 if op == "QLinearMatMul" else 10
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def check(name, op, names, vals, attrs, want, onnx_ref=False):
    def go():
        m = model(op, names, vals, attrs, want.dtype)
        feeds = {n: v for n, v in zip(names, vals) if v is not None}
        if onnx_ref:  # the numpy reference agrees with onnx's where onnx's places vectors as the spec does
            o = ReferenceEvaluator(m).run(None, feeds)[0]
            if o.dtype != want.dtype or not np.array_equal(o, want):
                raise Failure("the numpy reference disagrees with onnx's:\n%s\n%s" % (want.ravel()[:12], o.ravel()[:12]))
        outs, _ = compile_and_run(m.SerializeToString(), feeds)
        got = outs[0]
        if got.dtype != want.dtype or got.shape != want.shape:
            raise Failure("got %s %s, expected %s %s" % (got.dtype, got.shape, want.dtype, want.shape))
        bad = np.argwhere(got != want)
        if len(bad):
            i = tuple(bad[0])
            raise Failure("%d of %d values differ; first at %s: %s, expected %s" % (len(bad), want.size, i, got[i], want[i]))
    case("qlinear.%s" % name, go, suite="e2e-qlinear")


MM = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]
CONV = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B"]


def q(dt, *shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dt)


def s(dt, *vals):
    return np.array(vals, dtype=dt)


def mm_case(name, a, sa, za, b, sb, zb, sy, zy, onnx_ref=False):
    vals = [a, sa, za, b, sb, zb, sy, zy]
    check(name, "QLinearMatMul", MM, vals, {}, qmatmul_ref(*vals), onnx_ref)


def conv_case(name, vals, attrs, onnx_ref=False):
    ref_attrs = {k: v for k, v in attrs.items() if k in ("strides", "pads", "dilations", "group")}
    if attrs.get("auto_pad") == "SAME_UPPER":  # stride 1: (k - 1) d split, the extra one at the end
        tot = [(k - 1) * d for k, d in zip(vals[3].shape[2:], attrs.get("dilations", [1] * (vals[3].ndim - 2)))]
        ref_attrs["pads"] = [t // 2 for t in tot] + [t - t // 2 for t in tot]
    check(name, "QLinearConv", CONV[:len(vals)], vals, attrs, qconv_ref(*vals, **ref_attrs), onnx_ref)


# ---- QLinearMatMul ----------------------------------------------------------------

U8, I8 = np.uint8, np.int8
for _dt in (U8, I8):
    for _st in (np.float32, np.float16):
        mm_case("matmul_2d_%s_%s" % (np.dtype(_dt).name, np.dtype(_st).name), q(_dt, 5, 7), s(_st, 0.021), q(_dt, 1),
                q(_dt, 7, 6), s(_st, 0.017), q(_dt, 1), s(_st, 0.3), q(_dt, 1), onnx_ref=True)
mm_case("matmul_bfloat16_scales", q(U8, 4, 9), s(BF16, 0.0213), q(U8), q(U8, 9, 5), s(BF16, 0.0171), q(U8),
        s(BF16, 0.71), q(U8))
# int8 a, uint8 b, int8 result; batches broadcast against a 2-D b
mm_case("matmul_mixed_types_batched", q(I8, 2, 3, 4, 6), s(np.float32, 0.05), q(I8), q(U8, 6, 5), s(np.float32, 0.02),
        q(U8), s(np.float32, 0.4), q(I8), onnx_ref=True)
mm_case("matmul_3d_both_batched", q(U8, 3, 2, 8), s(np.float32, 0.01), q(U8, 1), q(U8, 3, 8, 4), s(np.float32, 0.03),
        q(U8, 1), s(np.float32, 0.5), q(U8, 1), onnx_ref=True)
mm_case("matmul_1d_a", q(U8, 6), s(np.float32, 0.01), q(U8), q(U8, 6, 3), s(np.float32, 0.03), q(U8),
        s(np.float32, 0.2), q(U8), onnx_ref=True)
# per row of a (M = 3, K = 5), per column of b (N = 4), per row of y
mm_case("matmul_per_row_column", q(U8, 3, 5), s(np.float32, 0.01, 0.02, 0.03), q(U8, 3), q(I8, 5, 4),
        s(np.float32, 0.04, 0.01, 0.02, 0.05), q(I8, 4), s(np.float32, 0.5, 0.4, 0.3), q(U8, 3))
mm_case("matmul_per_column_onnx", q(I8, 3, 5), s(np.float32, 0.01), q(I8), q(I8, 5, 4),
        s(np.float32, 0.04, 0.01, 0.02, 0.05), q(I8, 4), s(np.float32, 0.3), q(I8), onnx_ref=True)
# N-D forms: [D, M, 1] per row, [D, 1, N] per column
mm_case("matmul_nd_scales", q(U8, 2, 3, 5), rng.uniform(0.01, 0.03, (2, 3, 1)).astype(np.float32), q(U8, 2, 3, 1),
        q(U8, 2, 5, 4), rng.uniform(0.01, 0.03, (2, 1, 4)).astype(np.float32), q(U8, 2, 1, 4), s(np.float32, 0.3), q(U8),
        onnx_ref=True)
# no zero points: 0, the result a's type
mm_case("matmul_no_zero_points", q(I8, 3, 4), s(np.float32, 0.02), None, q(I8, 4, 2), s(np.float32, 0.03), None,
        s(np.float32, 0.25), None, onnx_ref=True)
# ties: scale factor 0.5 and 0.25, every result an exact half or quarter (halves go to even)
_a = np.arange(-12, 12).astype(I8).reshape(4, 6)
mm_case("matmul_ties_half", _a, s(np.float32, 1.0), s(I8, 0), np.eye(6, dtype=I8) * 1 + 0, s(np.float32, 0.5),
        s(I8, 0), s(np.float32, 1.0), s(I8, 3), onnx_ref=True)
mm_case("matmul_ties_quarter", np.arange(0, 48).astype(U8).reshape(6, 8), s(np.float16, 0.5), s(U8, 7),
        np.eye(8, dtype=U8) * 2, s(np.float16, 0.25), s(U8, 0), s(np.float16, 1.0), s(U8, 4), onnx_ref=True)
# saturation: results far below and above the range of either type
for _dt in (U8, I8):
    mm_case("matmul_saturate_%s" % np.dtype(_dt).name, q(I8, 6, 8), s(np.float32, 0.5), s(I8, 0), q(I8, 8, 5),
            s(np.float32, 0.5), s(I8, 0), s(np.float32, 0.01), np.zeros(1, dtype=_dt) + (3 if _dt == U8 else -2),
            onnx_ref=True)


def sensitive(st, n, zy=0):
    """Scales whose scale factor in type st differs from float64's, and n
    integers acc in [1, 50000] whose results differ between the two."""
    r = np.random.default_rng(5)
    accs = np.arange(1, 50001, dtype=np.float64)
    while True:
        sc = r.uniform(0.002, 0.2, 3).astype(st)
        m_st = (sc[0] * sc[1]) / sc[2]
        m64 = (sc[0].astype(np.float64) * sc[1].astype(np.float64)) / sc[2].astype(np.float64)
        d_st, d64 = np.rint(accs * np.float64(m_st) + zy), np.rint(accs * m64 + zy)
        hit = accs[(d_st != d64) & (d_st < 250) & (d_st > 5)]
        if len(hit) >= n:
            return sc, hit[:n].astype(np.int64)


def sensitive_case(name, st):
    """a [n, 200] uint8 with row sums acc, b's first column ones: y[:, 0] = requant(acc)."""
    sc, acc = sensitive(st, 6)
    K = 200
    a = np.zeros((len(acc), K), dtype=U8)
    for i, v in enumerate(acc):
        full, rest = divmod(int(v), 255)
        a[i, :full], a[i, full] = 255, rest
    b = np.concatenate([np.ones((K, 1), dtype=U8), q(U8, K, 2)], 1)
    mm_case(name, a, sc[:1], s(U8, 0), b, sc[1:2], s(U8, 0), sc[2:], s(U8, 0), onnx_ref=True)


sensitive_case("matmul_scale_factor_in_float32", np.float32)
sensitive_case("matmul_scale_factor_in_float16", np.float16)


# ---- QLinearConv ------------------------------------------------------------------

def f32(*v):
    return s(np.float32, *v)


conv_case("conv_2d_per_tensor_padded_strided", [q(U8, 2, 3, 7, 6), f32(0.02), q(U8), q(U8, 4, 3, 3, 2), f32(0.03), q(U8),
                                                f32(0.5), q(U8)],
          {"pads": [1, 0, 1, 1], "strides": [2, 1], "kernel_shape": [3, 2]}, onnx_ref=True)
conv_case("conv_2d_per_filter_bias", [q(I8, 1, 4, 5, 5), f32(0.05), q(I8), q(I8, 3, 4, 3, 3), f32(0.01, 0.02, 0.03),
                                      s(I8, 0, 3, -5), f32(0.9), q(I8), rng.integers(-3000, 3000, 3).astype(np.int32)],
          {"pads": [1, 1, 1, 1]}, onnx_ref=True)
conv_case("conv_groups_dilations_uint8_out", [q(I8, 2, 4, 6, 7), f32(0.03), q(I8), q(I8, 6, 2, 2, 3),
                                               f32(0.01, 0.02, 0.03, 0.04, 0.05, 0.06), np.zeros(6, dtype=I8),
                                               f32(0.2), q(U8)],
          {"group": 2, "dilations": [2, 1]})
conv_case("conv_1d_per_filter", [q(U8, 2, 3, 9), f32(0.02), q(U8), q(U8, 4, 3, 3), f32(0.01, 0.02, 0.015, 0.03),
                                 q(U8, 4), f32(0.6), q(U8)], {"strides": [2]})
conv_case("conv_3d_per_filter", [q(I8, 1, 2, 4, 4, 3), f32(0.02), q(I8), q(I8, 2, 2, 2, 2, 2), f32(0.01, 0.04),
                                 q(I8, 2), f32(0.3), q(I8)], {"pads": [1, 0, 0, 0, 1, 1]})
conv_case("conv_auto_pad_same_upper", [q(U8, 1, 2, 5, 5), f32(0.02), q(U8), q(U8, 2, 2, 3, 3), f32(0.03), q(U8),
                                       f32(0.5), q(U8)],
          {"auto_pad": "SAME_UPPER"}, onnx_ref=True)
# ties and saturation: x_scale * w_scale / y_scale = 0.5, results spread far past [0, 255]
conv_case("conv_ties_saturate", [np.arange(50).astype(U8).reshape(1, 2, 5, 5), f32(1.0), s(U8, 0),
                                 np.array([1, 1, 1, 0, 1, 0, 0, 0], dtype=U8).reshape(4, 2, 1, 1), f32(0.5), s(U8, 0),
                                 f32(1.0), s(U8, 1), np.array([-41, 0, 3, 301], dtype=np.int32)], {}, onnx_ref=True)
conv_case("conv_no_zero_points", [q(I8, 1, 2, 4, 4), f32(0.03), None, q(I8, 3, 2, 2, 2), f32(0.02), None, f32(0.1), None],
          {}, onnx_ref=True)


# ---- refused forms -------------------------------------------------------------------

def refused(name, op, names, vals, out_dtype, message):
    def go():
        d = tempfile.mkdtemp(prefix="nova-qlinear-")
        try:
            path = os.path.join(d, "m.onnx")
            onnx.save(model(op, names, vals, {}, out_dtype), path)
            p = run([NOVAC, path, "-o", os.path.join(d, "m.so")], expect_rc=1)
            if message not in p.stderr:
                raise Failure("stderr lacks '%s':\n%s" % (message, p.stderr))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("qlinear.refused_%s" % name, go, suite="e2e-qlinear")


refused("row_scale_length", "QLinearMatMul", MM, [q(U8, 3, 5), f32(0.1, 0.2, 0.3, 0.4), q(U8), q(U8, 5, 2), f32(0.1), q(U8),
                                                  f32(0.1), q(U8)], U8,
        "a_scale must be a single value or a vector of 3 (one per row of a), got shape [4]")
refused("conv_x_scale_vector", "QLinearConv", CONV[:8], [q(U8, 1, 2, 3, 3), f32(0.1, 0.2), q(U8), q(U8, 2, 2, 1, 1),
                                                        f32(0.1), q(U8), f32(0.1), q(U8)], U8,
        "x_scale must be a single value, got 2")
refused("zero_point_type", "QLinearMatMul", MM, [q(U8, 3, 5), f32(0.1), q(I8), q(U8, 5, 2), f32(0.1), q(U8), f32(0.1),
                                                 q(U8)], U8, "a_zero_point must have its operand's type")


def main():
    print("# e2e-qlinear: %d passed, %d failed" % (results["pass"], results["fail"]), flush=True)
    return 1 if results["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
