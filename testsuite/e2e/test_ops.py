"""Forward numerics of every nova op against numpy (float64 reference).
f32 models must match within 1e-5 relative error (max-norm), f64 within 1e-12.
The same table runs in f16 and bf16 (16-bit storage, computed in f32 and
rounded once per op): the reference is float64 on the rounded inputs, the
tolerance a few units in the last place of the result's largest element
(2^-11 for f16, 2^-8 for bf16), as a chain of ops rounds once each."""
import os
import sys

import numpy as np

from harness import Failure, case, check_close, compile_and_run, erf, results
from refs import attention_ref, conv_ref, pool_ref, rms_norm_ref as rms_norm, rotary_ref as rotary

rng = np.random.default_rng(1234)
TOL = {"f32": 1e-5, "f64": 1e-12, "f16": 6 * 2.0 ** -11, "bf16": 6 * 2.0 ** -8}
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
try:
    import ml_dtypes
    NP["bf16"] = ml_dtypes.bfloat16
except ImportError:  # onnx brings ml_dtypes; without it the bf16 cases are skipped
    pass


def decl(kind, name, arr, dt):
    return "%s %s: %s[%s]\n" % (kind, name, dt, ", ".join(str(s) for s in arr.shape))


def op_case(name, body, inputs, ref, dt="f32", files=None, extra=""):
    """body: lines computing 'r' from the inputs; inputs: name -> float64 array
    (cast to dt) or integer array; ref: function of the float64 inputs."""
    def run():
        cast = {}
        text = ""
        for k, v in inputs.items():
            if v.dtype.kind == "f":
                cast[k] = v.astype(NP[dt])
                text += decl("input", k, v, dt)
            else:
                cast[k] = v
                text += decl("input", k, v, "i64" if v.dtype == np.int64 else "i32")
        text += extra + body + "\noutput r\n"
        outs, _ = compile_and_run(text, cast, files=files)
        # (bfloat16's numpy kind is "V": the kinds are the float64 inputs')
        ref64 = ref(*[(cast[k].astype(np.float64) if v.dtype.kind == "f" else v) for k, v in inputs.items()])
        check_close(outs[0], ref64, TOL[dt])
    case("%s.%s" % (name, dt), run)


def r(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


_causal = np.triu(np.full((6, 9), -np.inf), 1 + 3)
_causal[2, :] = -np.inf  # a fully masked row: 0


def cross_entropy(logits, labels):
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    picked = np.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return np.mean(lse - picked)


for dt in ("f32", "f64") + tuple(t for t in ("f16", "bf16") if t in NP):
    op_case("add_broadcast", "r = a + b", {"a": r(3, 4, 5), "b": r(4, 1)}, lambda a, b: a + b, dt)
    op_case("sub", "r = a - b", {"a": r(3, 5), "b": r(5)}, lambda a, b: a - b, dt)
    op_case("mul", "r = a * b", {"a": r(1, 5), "b": r(4, 1)}, lambda a, b: a * b, dt)
    op_case("div", "r = a / b", {"a": r(4, 5), "b": r(4, 5, lo=0.5, hi=2)}, lambda a, b: a / b, dt)
    op_case("scalar_literal", "r = 2.5 * a - 1 / (a * a + 1)", {"a": r(6)}, lambda a: 2.5 * a - 1 / (a * a + 1), dt)
    op_case("neg", "r = -a", {"a": r(7)}, lambda a: -a, dt)
    op_case("exp", "r = exp(a)", {"a": r(3, 4)}, np.exp, dt)
    op_case("log", "r = log(a)", {"a": r(3, 4, lo=0.1, hi=5)}, np.log, dt)
    op_case("sqrt", "r = sqrt(a)", {"a": r(3, 4, lo=0.1, hi=5)}, np.sqrt, dt)
    op_case("tanh", "r = tanh(a)", {"a": r(3, 4)}, np.tanh, dt)
    op_case("sigmoid", "r = sigmoid(a)", {"a": r(3, 4, lo=-6, hi=6)}, lambda a: 1 / (1 + np.exp(-a)), dt)
    op_case("relu", "r = relu(a)", {"a": r(5, 4)}, lambda a: np.maximum(a, 0), dt)
    op_case("gelu", "r = gelu(a)", {"a": r(5, 4, lo=-4, hi=4)}, lambda a: 0.5 * a * (1 + erf(a / np.sqrt(2))), dt)
    op_case("matmul_2d", "r = a @ b", {"a": r(5, 7), "b": r(7, 3)}, lambda a, b: a @ b, dt)
    op_case("matmul_3d_2d", "r = matmul(a, b)", {"a": r(2, 5, 7), "b": r(7, 3)}, lambda a, b: a @ b, dt)
    op_case("matmul_batched_4d", "r = a @ b", {"a": r(2, 3, 4, 6), "b": r(2, 3, 6, 5)}, lambda a, b: a @ b, dt)
    op_case("softmax_last", "r = softmax(a)", {"a": r(4, 9, lo=-5, hi=5)}, lambda a: softmax(a, -1), dt)
    op_case("softmax_axis0", "r = softmax(a, axis=0)", {"a": r(4, 3, 2)}, lambda a: softmax(a, 0), dt)
    # rows longer than a warp's lanes, not a multiple of 32 (the GPU's row kernels loop per lane)
    op_case("softmax_wide", "r = softmax(a)", {"a": r(5, 1000, lo=-5, hi=5)}, lambda a: softmax(a, -1), dt)
    op_case("log_softmax", "r = log_softmax(a, axis=1)", {"a": r(3, 6, lo=-5, hi=5)},
            lambda a: np.log(softmax(a, 1)), dt)
    op_case("layer_norm", "r = layer_norm(a, g, b)", {"a": r(2, 3, 8), "g": r(8), "b": r(8)}, layer_norm, dt)
    op_case("layer_norm_wide", "r = layer_norm(a, g, b)", {"a": r(3, 777), "g": r(777), "b": r(777)}, layer_norm, dt)
    op_case("attention_mha", "r = attention(q, k, v)", {"q": r(2, 3, 6, 8), "k": r(2, 3, 9, 8), "v": r(2, 3, 9, 5)},
            attention_ref, dt)
    op_case("attention_gqa_causal", "r = attention(q, k, v, m, scale=0.2)",
            {"q": r(1, 6, 6, 4), "k": r(1, 2, 9, 4), "v": r(1, 2, 9, 3), "m": _causal},
            lambda q, k, v, m: attention_ref(q, k, v, m, 0.2), dt)
    op_case("attention_softcap_bias", "r = attention(q, k, v, b, softcap=3)",
            {"q": r(2, 2, 3, 4, lo=-4, hi=4), "k": r(2, 2, 5, 4, lo=-4, hi=4), "v": r(2, 2, 5, 4), "b": r(2, 1, 1, 5)},
            lambda q, k, v, b: attention_ref(q, k, v, b, cap=3), dt)
    op_case("layer_norm_eps", "r = layer_norm(a, g, b, eps=0.1)", {"a": r(4, 5), "g": r(5), "b": r(5)},
            lambda a, g, b: layer_norm(a, g, b, 0.1), dt)
    op_case("rms_norm", "r = rms_norm(a, g)", {"a": r(2, 3, 8), "g": r(8)}, rms_norm, dt)
    op_case("rms_norm_eps", "r = rms_norm(a, g, eps=0.5)", {"a": r(4, 5, lo=-0.5, hi=0.5), "g": r(5)},
            lambda a, g: rms_norm(a, g, 0.5), dt)
    op_case("rms_norm_rank1_eps0", "r = rms_norm(a, g, eps=0)", {"a": r(7), "g": r(7)},
            lambda a, g: rms_norm(a, g, 0.0), dt)
    op_case("rms_norm_wide", "r = rms_norm(a, g)", {"a": r(3, 1000), "g": r(1000)}, rms_norm, dt)
    op_case("rotary_halves", "r = rotary(a, c, s)", {"a": r(2, 3, 4, 8), "c": r(1, 1, 4, 4), "s": r(1, 1, 4, 4)},
            rotary, dt)
    op_case("rotary_interleaved", "r = rotary(a, c, s, interleaved=1)",
            {"a": r(2, 4, 3, 6), "c": r(2, 4, 1, 3), "s": r(1, 4, 1, 3)},
            lambda a, c, s: rotary(a, c, s, True), dt)
    op_case("rotary_no_broadcast", "r = rotary(a, c, s, interleaved=0)", {"a": r(5, 10), "c": r(5, 5), "s": r(5, 5)},
            rotary, dt)
    op_case("rotary_rank1_pair", "r = rotary(a, c, s, interleaved=1)", {"a": r(2), "c": r(1), "s": r(1)},
            lambda a, c, s: rotary(a, c, s, True), dt)
    op_case("rotary_of_computed", "r = rotary(a * 2, cos(t), sin(t), interleaved=1) + 1",
            {"a": r(3, 16, 64), "t": r(1, 16, 32, lo=-3, hi=3)},
            lambda a, t: rotary(a * 2, np.cos(t), np.sin(t), True) + 1, dt)
    op_case("reduce_sum_all", "r = reduce_sum(a)", {"a": r(3, 4, 5)}, lambda a: a.sum(), dt)
    op_case("reduce_sum_axes", "r = reduce_sum(a, axes=[0, 2])", {"a": r(3, 4, 5)}, lambda a: a.sum((0, 2)), dt)
    op_case("reduce_mean_keep", "r = reduce_mean(a, axes=[-1], keepdims=1)", {"a": r(3, 4, 5)},
            lambda a: a.mean(-1, keepdims=True), dt)
    op_case("reduce_max", "r = reduce_max(a, axes=[1])", {"a": r(3, 4, 5)}, lambda a: a.max(1), dt)
    op_case("reduce_max_keep_all", "r = reduce_max(a, keepdims=1)", {"a": r(3, 4)},
            lambda a: a.max(keepdims=True), dt)
    op_case("reshape", "r = reshape(a, shape=[4, -1, 3])", {"a": r(2, 6, 4)}, lambda a: a.reshape(4, -1, 3), dt)
    op_case("reshape_to_scalar", "r = reshape(a, shape=[])", {"a": r(1, 1)}, lambda a: a.reshape(()), dt)
    op_case("reshape_from_scalar", "r = reshape(reduce_sum(a), shape=[1, 1])", {"a": r(3)},
            lambda a: a.sum().reshape(1, 1), dt)
    op_case("transpose_default", "r = transpose(a)", {"a": r(2, 3, 4)}, lambda a: a.transpose(), dt)
    op_case("transpose_perm", "r = transpose(a, perm=[1, 2, 0])", {"a": r(2, 3, 4)},
            lambda a: a.transpose(1, 2, 0), dt)
    op_case("broadcast", "r = broadcast(a, shape=[2, 3, 4])", {"a": r(3, 1)},
            lambda a: np.broadcast_to(a, (2, 3, 4)), dt)
    op_case("concat", "r = concat(a, b, c, axis=1)", {"a": r(2, 1, 3), "b": r(2, 4, 3), "c": r(2, 2, 3)},
            lambda a, b, c: np.concatenate([a, b, c], 1), dt)
    op_case("slice", "r = slice(a, axis=1, start=1, end=7, step=2)", {"a": r(3, 8)}, lambda a: a[:, 1:7:2], dt)
    op_case("slice_negative", "r = slice(a, axis=-1, start=-3)", {"a": r(3, 8)}, lambda a: a[:, -3:], dt)
    op_case("gather_axis0", "r = gather(t, i)", {"t": r(10, 4), "i": rng.integers(0, 10, (2, 3))},
            lambda t, i: t[i], dt)
    op_case("gather_axis1_i32", "r = gather(t, i, axis=1)",
            {"t": r(3, 6, 2), "i": rng.integers(0, 6, (4,)).astype(np.int32)},
            lambda t, i: np.take(t, i, axis=1), dt)
    op_case("cross_entropy", "r = cross_entropy(l, y)", {"l": r(6, 5, lo=-4, hi=4), "y": rng.integers(0, 5, (6,))},
            cross_entropy, dt)
    op_case("cross_entropy_3d", "r = cross_entropy(l, y)",
            {"l": r(2, 3, 7, lo=-4, hi=4), "y": rng.integers(0, 7, (2, 3))}, cross_entropy, dt)
    # long rows and long columns: on the cuda target the reductions are split among threads (gpu_reduce.c:
    # lanes along a row of 128 or more, blocks of rows for a column with few outputs); a row of 250 splits
    # 25 ways, a softmax over 256 and a layer norm over 384 32 ways, a sum over 640 rows 16 blocks
    op_case("softmax_long_rows", "r = softmax(a)", {"a": r(5, 256, lo=-5, hi=5)}, lambda a: softmax(a, -1), dt)
    op_case("layer_norm_long_rows", "r = layer_norm(a, g, b)", {"a": r(2, 3, 384), "g": r(384), "b": r(384)},
            layer_norm, dt)
    op_case("reduce_max_long_rows", "r = reduce_max(a, axes=[1])", {"a": r(6, 250)}, lambda a: a.max(1), dt)
    op_case("reduce_sum_long_columns", "r = reduce_sum(a, axes=[0, 1])", {"a": r(20, 32, 6)},
            lambda a: a.sum((0, 1)), dt)
    op_case("cross_entropy_long_rows", "r = cross_entropy(l, y)",
            {"l": r(4, 300, lo=-4, hi=4), "y": rng.integers(0, 300, (4,))}, cross_entropy, dt)
    op_case("pow", "r = pow(a, b)", {"a": r(3, 4, lo=0.2, hi=3), "b": r(4, lo=-2, hi=2)}, np.power, dt)
    op_case("abs", "r = abs(a)", {"a": r(3, 4)}, np.abs, dt)
    op_case("erf", "r = erf(a)", {"a": r(3, 4)}, erf, dt)
    op_case("minimum", "r = minimum(a, b)", {"a": r(3, 4), "b": r(1, 4)}, np.minimum, dt)
    op_case("maximum", "r = maximum(a, b)", {"a": r(3, 4), "b": r(3, 1)}, np.maximum, dt)
    op_case("where_less", "r = where(less(a, b), a * 2, b)", {"a": r(3, 4), "b": r(4)},
            lambda a, b: np.where(a < b, a * 2, b), dt)
    op_case("greater_equal_cast", "r = cast(greater(a, b), to=%s) + cast(equal(a, a), to=%s)" % (dt, dt),
            {"a": r(3, 4), "b": r(3, 4)}, lambda a, b: (a > b).astype(np.float64) + 1.0, dt)
    op_case("int_arithmetic_cast", "r = cast(i * j + i - j / (j * j + 1), to=%s)" % dt,
            {"i": rng.integers(-50, 50, (3, 4)), "j": rng.integers(1, 9, (4,))},
            lambda i, j: (i * j + i - np.trunc(j / (j * j + 1)).astype(np.int64)).astype(np.float64), dt)
    op_case("cast_float_to_int", "r = cast(cast(a, to=i32), to=%s)" % dt, {"a": r(3, 4, lo=-9, hi=9)},
            lambda a: np.trunc(a), dt)
    op_case("conv2d_strided_dilated_padded", "r = conv(x, w, strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2])",
            {"x": r(2, 3, 9, 8), "w": r(4, 3, 3, 2)}, lambda x, w: conv_ref(x, w, (2, 1), (1, 0, 1, 1), (1, 2), 1), dt)
    op_case("conv2d_groups", "r = conv(x, w, groups=3, pads=[1, 1, 1, 1])", {"x": r(1, 3, 5, 5), "w": r(6, 1, 3, 3)},
            lambda x, w: conv_ref(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 3), dt)
    op_case("conv1d", "r = conv(x, w, strides=[2])", {"x": r(2, 2, 11), "w": r(3, 2, 4)},
            lambda x, w: conv_ref(x, w, (2,), (0, 0), (1,), 1), dt)
    op_case("max_pool_ceil", "r = max_pool(x, kernel=[3, 2], strides=[2, 2], pads=[1, 1, 1, 0], ceil_mode=1)",
            {"x": r(2, 3, 9, 8)}, lambda x: pool_ref(x, (3, 2), (2, 2), (1, 1, 1, 0), True, "max", False), dt)
    op_case("avg_pool_exclude_pad", "r = avg_pool(x, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])",
            {"x": r(2, 3, 9, 8)}, lambda x: pool_ref(x, (3, 3), (2, 2), (1, 1, 1, 1), False, "avg", False), dt)
    op_case("avg_pool_include_pad_ceil", "r = avg_pool(x, kernel=[2, 3], strides=[2, 2], pads=[0, 1, 1, 1], "
            "count_include_pad=1, ceil_mode=1)", {"x": r(1, 2, 7, 6)},
            lambda x: pool_ref(x, (2, 3), (2, 2), (0, 1, 1, 1), True, "avg", True), dt)
    c = rng.uniform(-1, 1, (3, 4))
    op_case("const_file", "r = a * c", {"a": r(3, 4)}, lambda a: a * c.astype(NP[dt]).astype(np.float64),
            dt, files={"c.bin": c.astype(NP[dt])}, extra="const c: %s[3, 4] = file(\"c.bin\")\n" % dt)
    op_case("const_causal_mask", "r = a + m", {"a": r(2, 4, 4)}, lambda a: a + np.triu(np.full((4, 4), -7.0), 1),
            dt, extra="const m: %s[4, 4] = causal_mask(-7)\n" % dt)



def exp_erf_accuracy():
    """f32 exp and erf over their whole range (the cpu target computes them
    with polynomials): exp within 1.5 ulp of the float64 value wherever that
    is a normal f32, erf within 1e-6 relative (|x| > 1e-3) and 1e-6
    absolute; inf, -inf, NaN, 0, overflow and underflow as expf/erff give."""
    import math
    a = np.concatenate([np.linspace(-110, 95, 40000), np.linspace(-6, 6, 40000),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.73, 200.0, -200.0, 1e-30]]).astype(np.float32)
    outs, _ = compile_and_run("input a: f32[%d]\ne = exp(a)\nf = erf(a)\noutput e\noutput f\n" % a.size, {"a": a})
    e, f = outs[0].astype(np.float64), outs[1].astype(np.float64)
    a64 = a.astype(np.float64)
    with np.errstate(over="ignore"):
        ref = np.exp(a64)
        ref32 = ref.astype(np.float32)
    normal = np.isfinite(ref32) & (ref32 >= np.finfo(np.float32).tiny)
    ulp = np.abs(e[normal] - ref[normal]) / np.spacing(ref32[normal]).astype(np.float64)
    if ulp.max() > 1.5:
        raise Failure("exp: %.2f ulp at x = %r" % (ulp.max(), a[normal][np.argmax(ulp)]))
    special = {"nan": (-9, np.nan, np.nan), "inf": (-8, np.inf, 1.0), "-inf": (-7, 0.0, -1.0), "0": (-6, 1.0, 0.0),
               "overflow": (-4, np.inf, 1.0), "200": (-3, np.inf, 1.0), "-200": (-2, 0.0, -1.0)}
    for what, (i, ve, vf) in special.items():
        if not (np.array_equal([e[i]], [ve], equal_nan=True) and np.array_equal([f[i]], [vf], equal_nan=True)):
            raise Failure("%s: exp %r erf %r, expected %r %r" % (what, e[i], f[i], ve, vf))
    fin = np.isfinite(a64)
    rf = np.array([math.erf(v) for v in a64[fin]])
    err = np.abs(f[fin] - rf)
    rel = err / np.maximum(np.abs(rf), 1e-30)
    if err.max() > 1e-6 or rel[np.abs(a64[fin]) > 1e-3].max() > 1e-6:
        raise Failure("erf: abs %.2e rel %.2e" % (err.max(), rel[np.abs(a64[fin]) > 1e-3].max()))


case("exp_erf_accuracy_f32", exp_erf_accuracy)


# ---- element types beyond f32/f64/i32/i64/bool, through ONNX models ---------
# numpy (ml_dtypes for bfloat16) is the reference.  f16 and bf16 ops compute
# in f32 and round once per op, as numpy's float16 does: single ops must agree
# exactly, reductions and matmuls within an ulp of the result.
from onnx import TensorProto, helper  # noqa: E402

try:
    import ml_dtypes
    BF16 = ml_dtypes.bfloat16
except ImportError:  # onnx brings ml_dtypes; without it the bf16 cases are skipped
    BF16 = None

XT = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": BF16, "i8": np.int8, "u8": np.uint8,
      "i16": np.int16, "u16": np.uint16, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
      "bool": np.bool_}
XT = {k: v for k, v in XT.items() if v is not None}
ONNX_T = {k: helper.np_dtype_to_tensor_dtype(np.dtype(v)) for k, v in XT.items()}
FLOATS = ("f32", "f64", "f16", "bf16")


def onnx_model(nodes, inputs, outputs, inits=(), opset=21):
    """inputs: name -> array; outputs: (name, dtype key); serialized ModelProto."""
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                                       for k, v in inputs.items()],
                          [helper.make_tensor_value_info(n, ONNX_T[t], None) for n, t in outputs], initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def check_equal(got, ref, what):
    got, ref = np.asarray(got), np.asarray(ref)
    if got.dtype != ref.dtype or got.shape != ref.shape:
        raise Failure("%s: %s %s, expected %s %s" % (what, got.dtype, got.shape, ref.dtype, ref.shape))
    g64, r64 = got.astype(np.float64), ref.astype(np.float64)
    if not np.array_equal(g64, r64, equal_nan=True):
        bad = np.argwhere(~((g64 == r64) | (np.isnan(g64) & np.isnan(r64))))[0]
        raise Failure("%s: at %s got %r, expected %r" % (what, list(bad), got[tuple(bad)], ref[tuple(bad)]))


def source_values(src):
    """Values of dtype SRC for the cast tests: in range for every target
    they may go to (float -> int: integral parts that fit; unsigned: >= 0)."""
    if src == "bool":
        return np.array([True, False, True, True])
    v = np.array([0, 1, 2, 3, 7, 100, 127, -1, -5, -100, -128, 0.5, -0.25, 1.75, 126.5, 99.9], np.float64)
    if src[0] == "u":
        v = np.abs(v)
    if src not in FLOATS:
        v = np.trunc(v)
    return v.astype(XT[src])


def cast_ref(v, src, dst):
    if src in FLOATS and dst not in FLOATS and dst != "bool":
        return np.trunc(v.astype(np.float64)).astype(np.int64).astype(XT[dst])  # truncation toward zero
    return v.astype(XT[dst])


def cast_all_from(src):
    def run():
        v = source_values(src)
        dsts = list(XT)
        nodes = [helper.make_node("Cast", ["x"], ["y_" + d], to=ONNX_T[d]) for d in dsts]
        outs, _ = compile_and_run(onnx_model(nodes, {"x": v}, [("y_" + d, d) for d in dsts]), {"x": v})
        for d, got in zip(dsts, outs):
            keep = np.ones(v.shape, bool)
            if src in FLOATS and d[0] == "u":
                keep = v.astype(np.float64) >= 0
            check_equal(got[keep], cast_ref(v, src, d)[keep], "%s -> %s" % (src, d))
    case("onnx_cast_from_%s" % src, run)


for _src in XT:
    cast_all_from(_src)


def onnx_not():
    """Not on a bool tensor and on a comparison's result (x xor true on i1)."""
    x = np.array([[True, False, True], [False, False, True]])
    a = rng.standard_normal((2, 3)).astype(np.float32)
    nodes = [helper.make_node("Not", ["x"], ["n"]), helper.make_node("Less", ["a", "z"], ["l"]),
             helper.make_node("Not", ["l"], ["m"])]
    z = helper.make_tensor("z", helper.np_dtype_to_tensor_dtype(np.dtype(np.float32)), [], [0.0])
    outs, _ = compile_and_run(onnx_model(nodes, {"x": x, "a": a}, [("n", "bool"), ("m", "bool")], inits=[z]),
                              {"x": x, "a": a})
    check_equal(outs[0], ~x, "Not(x)")
    check_equal(outs[1], ~(a < 0), "Not(a < 0)")


case("onnx_not_bool", onnx_not)


def cast_rounding():
    """f64 and f32 to f16/bf16 round to nearest even once (no double rounding
    through f32), across the normal and subnormal ranges and to inf."""
    r64 = np.concatenate([rng.uniform(-70000, 70000, 3000), rng.uniform(-1, 1, 3000) * 2.0 ** rng.integers(-30, 10, 3000),
                          [65504.0, 65519.99, 65520.0, -65520.0, 2 ** -24, 2 ** -25, 1.5 * 2 ** -25, 1 + 2 ** -11,
                           1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -8 + 2 ** -45, 3.4e38, 3.4e39, np.inf, -np.inf, np.nan, -0.0]])
    # midpoints of f16 and bf16 nudged by less than an f32 ulp: rounding to f32 first would land on the tie
    h = rng.uniform(-100, 100, 500).astype(np.float16).astype(np.float64)
    r64 = np.concatenate([r64, h + np.spacing(h.astype(np.float16)).astype(np.float64) / 2 * (1 + 2.0 ** -30)])
    dsts = ["f16"] + (["bf16"] if BF16 else [])
    nodes = [helper.make_node("Cast", [x], ["%s_%s" % (x, d)], to=ONNX_T[d]) for x in ("a", "b") for d in dsts]
    with np.errstate(over="ignore"):
        ins = {"a": r64, "b": r64.astype(np.float32)}
    outs, _ = compile_and_run(onnx_model(nodes, ins, [("%s_%s" % (x, d), d) for x in ("a", "b") for d in dsts]), ins)
    k = 0
    for x in ("a", "b"):
        for d in dsts:
            with np.errstate(over="ignore"):
                ref = ins[x].astype(XT[d]) if d == "f16" else exact_bf16(ins[x])
            check_equal(outs[k], ref, "%s %s -> %s" % (x, ins[x].dtype, d))
            k += 1


def exact_bf16(v):
    """bfloat16 nearest to each value (ties to even), computed exactly from
    the value's bits (ml_dtypes may round doubles through float32)."""
    out = []
    for x in np.asarray(v, np.float64):
        if np.isnan(x):
            out.append(np.nan)
            continue
        a = abs(float(x))
        if a == 0 or np.isinf(x):
            out.append(x)
            continue
        e = max(int(np.floor(np.log2(a))), -126)
        q = 2.0 ** (e - 7)
        m = np.round(a / q) * q  # np.round: ties to even; a / q exact
        out.append(np.copysign(np.inf if m > (2 - 2 ** -7) * 2.0 ** 127 else m, x))
    return np.array(out).astype(BF16)


case("onnx_cast_rounding_f16_bf16", cast_rounding)


def unsigned_arith(dt):
    """Arithmetic, comparisons and reductions on values a signed lowering
    gets wrong: unsigned ones above the signed range, signed narrow ones."""
    def run():
        t = XT[dt]
        hi = int(np.iinfo(t).max)
        if dt[0] == "u":
            a = np.array([[hi - 50, 3, hi // 2 + 5], [7, hi, 200]], dtype=object).astype(t)
            b = np.array([[2, hi - 1, 9], [hi // 2 + 7, 5, 3]], dtype=object).astype(t)
        else:
            lo = int(np.iinfo(t).min)
            a = np.array([[lo + 3, -3, 100], [7, hi, -9]], t)
            b = np.array([[2, -7, 9], [-100, 5, 4]], t)
        bin_ops = ["Add", "Sub", "Mul", "Div", "Mod", "Max", "Min"]
        cmp_ops = ["Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"]
        nodes = [helper.make_node(o, ["a", "b"], [o]) for o in bin_ops + cmp_ops]
        red = [("ReduceMax", "rmax", {}), ("ReduceMin", "rmin", {}), ("ReduceMax", "rmax0", {"axes": [0]}),
               ("ReduceMin", "rmin1", {"axes": [1]}), ("ReduceSum", "rsum", {})]
        nodes += [helper.make_node(o, ["a"], [n], keepdims=0, **kw) for o, n, kw in red]
        nodes += [helper.make_node("Abs", ["a"], ["abs"]), helper.make_node("Sign", ["a"], ["sign"]),
                  helper.make_node("CumSum", ["a", "ax"], ["cumsum"])]
        names = bin_ops + cmp_ops + [n for _, n, _ in red] + ["abs", "sign", "cumsum"]
        ax = helper.make_tensor("ax", TensorProto.INT64, [], [1])
        model = onnx_model(nodes, {"a": a, "b": b}, [(n, "bool" if n in cmp_ops else dt) for n in names], inits=[ax],
                           opset=17)
        outs, _ = compile_and_run(model, {"a": a, "b": b})
        ao, bo = a.astype(object), b.astype(object)
        trunc_div = np.array([[int(x / y) if (x < 0) != (y < 0) else x // y for x, y in zip(r, s)] for r, s in zip(ao, bo)])
        with np.errstate(over="ignore"):
            ref = [a + b, a - b, a * b, trunc_div.astype(t), np.mod(a, b), np.maximum(a, b), np.minimum(a, b),
                   a < b, a > b, a <= b, a >= b, a == b, a.max(), a.min(), a.max(0), a.min(1), a.sum(dtype=t),
                   np.abs(a), np.sign(a), np.cumsum(a, 1, dtype=t)]
        for n, got, r in zip(names, outs, ref):
            check_equal(got, np.asarray(r), "%s %s" % (dt, n))
    case("onnx_int_arith_%s" % dt, run)


for _dt in ("u8", "u16", "u32", "u64", "i8", "i16"):
    unsigned_arith(_dt)


def u64_above_2_63():
    """uint64 2^63 + 5 and friends: every signed reading of them is negative."""
    a = np.array([2 ** 63 + 5, 2 ** 64 - 1, 3, 2 ** 63], np.uint64)
    b = np.array([3, 2 ** 63 + 1, 2 ** 63 + 7, 1], np.uint64)
    ops = ["Div", "Mod", "Max", "Min", "Less", "Greater"]
    nodes = [helper.make_node(o, ["a", "b"], [o]) for o in ops]
    nodes += [helper.make_node("ReduceMax", ["a"], ["rmax"], keepdims=0), helper.make_node("ReduceMin", ["b"], ["rmin"], keepdims=0),
              helper.make_node("Cast", ["a"], ["f64"], to=TensorProto.DOUBLE), helper.make_node("Cast", ["fa"], ["u"], to=TensorProto.UINT64)]
    fa = np.array([2.0 ** 63 + 4096, 1.5, 2.0 ** 64 - 4096, 0.0], np.float64)
    names = ops + ["rmax", "rmin", "f64", "u"]
    kinds = ["u64"] * 4 + ["bool"] * 2 + ["u64", "u64", "f64", "u64"]
    outs, _ = compile_and_run(onnx_model(nodes, {"a": a, "b": b, "fa": fa}, list(zip(names, kinds))), {"a": a, "b": b, "fa": fa})
    ref = [a // b, a % b, np.maximum(a, b), np.minimum(a, b), a < b, a > b, a.max(), b.min(), a.astype(np.float64),
           np.array([2 ** 63 + 4096, 1, 2 ** 64 - 4096, 0], np.uint64)]
    for n, got, r in zip(names, outs, ref):
        check_equal(got, np.asarray(r), "u64 " + n)


case("onnx_u64_above_2_63", u64_above_2_63)


def half_arith(dt):
    def run():
        t = XT[dt]
        a = r(3, 4, lo=-3, hi=3).astype(t)
        b = r(3, 4, lo=0.5, hi=2).astype(t)
        w = r(4, 5).astype(t)
        un = ["Exp", "Tanh", "Sigmoid", "Relu", "Abs", "Neg", "Erf", "Floor", "Sin"]
        bi = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]
        nodes = [helper.make_node(o, ["b", "a"] if o == "Pow" else ["a", "b"], [o]) for o in bi]
        nodes += [helper.make_node(o, ["a"], [o]) for o in un]
        nodes += [helper.make_node("Sqrt", ["b"], ["Sqrt"]), helper.make_node("Less", ["a", "b"], ["Less"]),
                  helper.make_node("Where", ["Less", "a", "b"], ["Where"]),
                  helper.make_node("ReduceSum", ["a"], ["rsum"], keepdims=0), helper.make_node("ReduceMax", ["a"], ["rmax"], keepdims=0),
                  helper.make_node("MatMul", ["a", "w"], ["mm"]), helper.make_node("Softmax", ["a"], ["sm"], axis=1),
                  helper.make_node("Transpose", ["a"], ["tr"]), helper.make_node("Concat", ["a", "b"], ["cat"], axis=0)]
        names = bi + un + ["Sqrt", "Less", "Where", "rsum", "rmax", "mm", "sm", "tr", "cat"]
        ins = {"a": a, "b": b, "w": w}
        outs, _ = compile_and_run(onnx_model(nodes, ins, [(n, "bool" if n == "Less" else dt) for n in names]), ins)
        A, B, W = (x.astype(np.float32) for x in (a, b, w))
        e = np.exp(A)
        ref = [A + B, A - B, A * B, A / B, np.maximum(A, B), np.minimum(A, B), np.power(B, A),
               np.exp(A), np.tanh(A), 1 / (1 + np.exp(-A)), np.maximum(A, 0), np.abs(A), -A, erf(A).astype(np.float32),
               np.floor(A), np.sin(A), np.sqrt(B), A < B, np.where(A < B, A, B), A.sum(), A.max(), A @ W,
               e / e.sum(1, keepdims=True), A.T, np.concatenate([A, B])]
        exact = set(bi + un + ["Sqrt", "Less", "Where", "rmax", "tr", "cat"]) - {"Pow"}
        ulp = 2.0 ** (-10 if dt == "f16" else -7)
        for n, got, rf in zip(names, outs, ref):
            rf = np.asarray(rf)
            want = rf if n == "Less" else rf.astype(t)
            if n in exact:  # one f32 op, rounded once: numpy's answer to the bit
                check_equal(got, want, "%s %s" % (dt, n))
            else:
                if got.dtype != want.dtype:
                    raise Failure("%s %s: dtype %s, expected %s" % (dt, n, got.dtype, want.dtype))
                check_close(got.astype(np.float64), rf.astype(np.float64), 2 * ulp, "%s %s" % (dt, n))
    case("onnx_half_arith_%s" % dt, run)


for _dt in ("f16", "bf16"):
    if _dt in XT:
        half_arith(_dt)


def typed_constants():
    """Initializers and Constant values of the new dtypes, in int32_data /
    uint64_data (the typed fields ONNX keeps them in) and in raw_data."""
    x8 = np.array([250, 1, 128], np.uint8)
    xh = np.array([1.5, -2.25, 1000.0], np.float16)
    inits = [helper.make_tensor("k8", TensorProto.UINT8, [3], [10, 255, 128]),            # int32_data
             helper.make_tensor("ki8", TensorProto.INT8, [3], [-128, 127, -1]),
             helper.make_tensor("k64", TensorProto.UINT64, [2], [2 ** 63 + 5, 7]),        # uint64_data
             helper.make_tensor("kh", TensorProto.FLOAT16, [3], [0.5, 3.0, -1.0]),             # int32_data: the bits
             helper.make_tensor("kr", TensorProto.INT16, [3], np.array([-300, 2, 30000], np.int16).tobytes(), raw=True)]
    nodes = [helper.make_node("Constant", [], ["c16"], value=helper.make_tensor("v", TensorProto.UINT16, [3], [65535, 1, 40000])),
             helper.make_node("Add", ["x8", "k8"], ["s8"]), helper.make_node("Cast", ["ki8"], ["ci8"], to=TensorProto.INT16),
             helper.make_node("Add", ["ci8", "kr"], ["s16"]), helper.make_node("Mul", ["xh", "kh"], ["mh"]),
             helper.make_node("Cast", ["x8"], ["x16"], to=TensorProto.UINT16), helper.make_node("Max", ["x16", "c16"], ["m16"]),
             helper.make_node("Identity", ["k64"], ["k64o"])]
    ins = {"x8": x8, "xh": xh}
    outs, _ = compile_and_run(onnx_model(nodes, ins, [("s8", "u8"), ("s16", "i16"), ("mh", "f16"), ("m16", "u16"), ("k64o", "u64")],
                                         inits), ins)
    ref = [x8 + np.array([10, 255, 128], np.uint8), np.array([-128, 127, -1], np.int16) + np.array([-300, 2, 30000], np.int16),
           xh * np.array([0.5, 3.0, -1.0], np.float16), np.maximum(x8.astype(np.uint16), np.array([65535, 1, 40000], np.uint16)),
           np.array([2 ** 63 + 5, 7], np.uint64)]
    for k, (got, rf) in enumerate(zip(outs, ref)):
        check_equal(got, rf, "output %d" % k)


case("onnx_typed_constants", typed_constants)


def rejected_types():
    """float8, int4, float4 and string are refused, naming the type."""
    import subprocess
    import tempfile
    from harness import NOVAC
    kinds = [("FLOAT8E4M3FN", "float8e4m3fn"), ("FLOAT8E5M2", "float8e5m2"), ("INT4", "int4"), ("UINT4", "uint4"),
             ("FLOAT4E2M1", "float4e2m1"), ("STRING", "string")]
    with tempfile.TemporaryDirectory() as d:
        for enum, name in kinds:
            if not hasattr(TensorProto, enum):
                continue
            t = getattr(TensorProto, enum)
            g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "m", [helper.make_tensor_value_info("x", t, [2])],
                                  [helper.make_tensor_value_info("y", t, [2])])
            path = os.path.join(d, name + ".onnx")
            with open(path, "wb") as f:
                f.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString())
            p = subprocess.run([NOVAC, path, "-o", os.path.join(d, "m.so")], capture_output=True, text=True)
            want = "graph input 'x' has element type %s" % name
            if p.returncode != 1 or want not in p.stderr:
                raise Failure("%s: exit %d, stderr %r (expected exit 1 and %r)" % (enum, p.returncode, p.stderr, want))
        # a Cast to float8 is refused at the node
        g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], name="c8", to=TensorProto.FLOAT8E4M3FN)], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2])])
        path = os.path.join(d, "cast8.onnx")
        with open(path, "wb") as f:
            f.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString())
        p = subprocess.run([NOVAC, path, "-o", os.path.join(d, "m.so")], capture_output=True, text=True)
        if p.returncode != 1 or "node 'c8' (Cast)" not in p.stderr or "float8e4m3fn" not in p.stderr:
            raise Failure("cast to float8: exit %d, stderr %r" % (p.returncode, p.stderr))


case("onnx_rejected_types", rejected_types)

if __name__ == "__main__":
    sys.exit(0)
