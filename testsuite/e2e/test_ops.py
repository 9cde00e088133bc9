"""Forward numerics of every nova op against numpy (float64 reference).
f32 models must match within 1e-5 relative error (max-norm), f64 within 1e-12."""
import sys

import numpy as np

from harness import Failure, case, check_close, compile_and_run, erf, results
from refs import conv_ref, pool_ref

rng = np.random.default_rng(1234)
TOL = {"f32": 1e-5, "f64": 1e-12}
NP = {"f32": np.float32, "f64": np.float64}


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
        ref64 = ref(*[(v.astype(np.float64) if v.dtype.kind == "f" else v) for v in cast.values()])
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


def cross_entropy(logits, labels):
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    picked = np.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return np.mean(lse - picked)


for dt in ("f32", "f64"):
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
    op_case("log_softmax", "r = log_softmax(a, axis=1)", {"a": r(3, 6, lo=-5, hi=5)},
            lambda a: np.log(softmax(a, 1)), dt)
    op_case("layer_norm", "r = layer_norm(a, g, b)", {"a": r(2, 3, 8), "g": r(8), "b": r(8)}, layer_norm, dt)
    op_case("layer_norm_eps", "r = layer_norm(a, g, b, eps=0.1)", {"a": r(4, 5), "g": r(5), "b": r(5)},
            lambda a, g, b: layer_norm(a, g, b, 0.1), dt)
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
    op_case("const_file", "r = a * c", {"a": r(3, 4)}, lambda a: a * c.astype(np.float32 if dt == "f32" else np.float64),
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

if __name__ == "__main__":
    sys.exit(0)
