"""Gradient check of every op with a backward rule (novac --train), in f64.

Each case is a tiny model whose floating-point operands are params read from
files of random values; the op's result r is weighted by a random constant,
loss = reduce_sum(r * wgt), so every element of the gradient matters.  One
SGD step with lr 0 is run (novarun --steps 1 --dump) and the gradient novac
computed for every param is compared with central finite differences of an
independent numpy float64 implementation of the forward (never of novac):
relative error (max-norm of the difference over max-norm of the reference)
at most 1e-6, with the step h = 1e-6 * max(1, |x|).  Operand values are
drawn where the op is smooth (positive bases for log/sqrt/pow, away from the
kinks of relu/abs/minimum/maximum, no ties for reduce_max, denominators away
from 0), so that x +- h never crosses a kink.

The coverage check reads the op list of frontend/graph.h (NV_OPS) and fails
if an op has neither a gradient case here nor an entry in NOT_DIFFERENTIABLE
or NO_RULE; each op of NO_RULE must make `novac --train` fail with exit 1
and "has no backward rule".

Prints 'PASS: grad :: NAME' or 'FAIL: grad :: NAME' per case; with -v, also
the relative error of every gradient checked.
"""
import math
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from refs import attention_ref, conv_ref, pool_ref, rms_norm_ref as rms_norm, rotary_ref as rotary
from harness import NOVAC, Failure, case, compile_and_train, erf, fd_grad, rel_err, results, run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOL = 1e-6
FLAGS = ["--optimizer=sgd", "--lr=0"]
rng = np.random.default_rng(20260)

# Ops of NV_OPS without a gradient case, and why.
NOT_DIFFERENTIABLE = {
    "input": "a leaf: inputs take no gradient",
    "dropout": "a random mask: its gradient (the mask recomputed) against numpy's Philox in test_dropout.py",
    "param": "a leaf: the gradient's destination (every case has params)",
    "all_reduce": "made by novac --data-parallel after the backward pass, never written in a model (the text "
                  "format refuses it: lit nova/data_parallel.test)",
    "reduce_scatter": "made by novac --shard-optimizer after the backward pass (lit nova/data_parallel.test)",
    "all_gather": "made by novac --shard-optimizer for the updated params (lit nova/data_parallel.test)",
    "shard": "made by novac --shard-optimizer: a rank's share of a param for its update",
    "constant": "a leaf: constants take no gradient",
    "equal": "bool result, not differentiable (used as a where condition)",
    "less": "bool result, not differentiable (used as a where condition)",
    "greater": "bool result, not differentiable",
    "less_equal": "bool result, not differentiable (covered as a where condition in where_less_equal)",
    "greater_equal": "bool result, not differentiable (covered as a where condition in where_greater_equal)",
    "isnan": "bool result, not differentiable",
    "isinf": "bool result, not differentiable",
    "not": "bool operands and result",
    "and": "bool operands and result",
    "or": "bool operands and result",
    "xor": "bool operands and result",
    "shl": "integer operands and result",
    "shr": "integer operands and result",
}
NOT_DIFFERENTIABLE.update({
    "conv_grad_input": "ONNX ConvTranspose; its rule is checked by test_grads_onnx.py (conv_transpose_*)",
    "conv_grad_weight": "backward op made by autodiff (no second derivatives)",
    "max_pool_grad": "backward op made by autodiff (no second derivatives)",
    "max_pool_indices": "integer result (ONNX MaxPool Indices), not differentiable",
    "avg_pool_grad": "backward op made by autodiff (no second derivatives)",
})
# op -> a model using it; novac --train must refuse it
NO_RULE = {"stochastic_round":  # the optimizer's rounding (--bf16-master=none), after the backward pass
           "input s: i64[]\ninput t: i64[]\nparam w: f32[4] = ones\ny = stochastic_round(w, s, t)\n"
           "output loss = reduce_sum(cast(y, to=f32))\n"}
# Forms of ops that have a rule, but not for these attributes (refused the same way).
NO_RULE_FORMS = {}  # name -> (model, message)


# ---- the numpy reference ----------------------------------------------------

def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def cross_entropy(logits, labels):
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
    return np.mean(lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0])


def gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ---- random operands ----------------------------------------------------------

def u(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape)


def away(*shape, hi=2.0, gap=0.1):
    """gap <= |x| <= hi, either sign (away from the kink at 0)."""
    x = rng.uniform(gap, hi, size=shape)
    return np.where(rng.random(shape) < 0.5, -x, x)


def distinct(*shape, lo=-2.0, hi=2.0):
    """Values at least (hi - lo) / (2 n) apart from each other: no ties."""
    n = int(np.prod(shape))
    v = np.linspace(lo, hi, 2 * n)[::2] + rng.uniform(0, (hi - lo) / (8 * n), n)
    return rng.permutation(v).reshape(shape)


def apart(b, *shape, gap=0.1):
    """b (broadcast to shape) plus d, gap <= |d| <= 2: never within gap of b."""
    d = away(*shape, gap=gap)
    return np.broadcast_to(b, shape) + d


# ---- cases ----------------------------------------------------------------------

def decl(kind, name, arr, init=None):
    dt = {"f": "f64", "i": "i64" if arr.dtype == np.int64 else "i32"}[arr.dtype.kind]
    s = "%s %s: %s[%s]" % (kind, name, dt, ", ".join(str(d) for d in arr.shape))
    return s + (" = " + init if init else "") + "\n"


CASES = []  # (name, ops covered, function raising Failure on a mismatch)


def grad_case(name, ops, body, params, ref, inputs=None, loss_expr=None):
    """body: lines defining r from the params and inputs (dicts name ->
    array; integer arrays are i64/i32 inputs, float ones f64 inputs).
    ref(**params, **inputs) computes r in numpy.  With loss_expr (an
    expression of r), the loss is that instead of reduce_sum(r * wgt), and
    ref computes the loss itself."""
    inputs = inputs or {}
    P0 = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
    r0 = np.asarray(ref(**P0, **inputs), dtype=np.float64)
    wgt = rng.uniform(-1, 1, size=r0.shape) if loss_expr is None else None

    def run():
        P = {k: v.copy() for k, v in P0.items()}
        text = "".join(decl("input", k, v) for k, v in inputs.items())
        text += "".join(decl("param", k, v, 'file("%s.bin")' % k) for k, v in P.items())
        files = {k + ".bin": v for k, v in P.items()}
        if wgt is not None:
            files["wgt.bin"] = wgt
            text += decl("const", "wgt", wgt, 'file("wgt.bin")')
            text += body.strip() + "\noutput loss = reduce_sum(r * wgt)\n"
        else:
            text += body.strip() + "\noutput loss = %s\n" % loss_expr
        grads, _, loss = compile_and_train(text, inputs, files=files, flags=FLAGS)
        if sorted(grads) != sorted(P):
            raise Failure("gradients dumped for %s, expected %s" % (sorted(grads), sorted(P)))

        def f():
            r = np.asarray(ref(**P, **inputs), dtype=np.float64)
            return float(np.sum(r * wgt)) if wgt is not None else float(r)
        # the forward agrees, so the reference is the function novac differentiates
        ref_loss = f()
        scale = max(1.0, float(np.sum(np.abs(r0 * wgt))) if wgt is not None else abs(ref_loss))
        if loss is None or not abs(float(loss) - ref_loss) <= 1e-10 * scale:
            raise Failure("loss %r, numpy reference %r" % (loss, ref_loss))
        return [check(grads[k], fd_grad(f, P, k), k, TOL) for k in P]
    CASES.append((name, ops, run))


VERBOSE = "-v" in sys.argv[1:]


def check(got, want, what, tol):
    got = np.asarray(got, dtype=np.float64)
    e = rel_err(got, want)
    if not e <= tol:
        raise Failure("grad of %s %s: relative error %.3g > %.3g (max |diff| %.3g at %s)\n got %s\n ref %s" % (
            what, tuple(want.shape), e, tol, float(np.max(np.abs(got - want))),
            tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(got - want))), want.shape)),
            np.array2string(got.ravel()[:6], precision=6), np.array2string(want.ravel()[:6], precision=6)))
    return "grad of %s %s: relative error %.2g" % (what, tuple(want.shape), e)


# elementwise arithmetic, with broadcasting operands [3, 4], [4], [3, 1]
grad_case("add_broadcast", ["add"], "r = a + b + c", {"a": u(3, 4), "b": u(4), "c": u(3, 1)},
          lambda a, b, c: a + b + c)
grad_case("add_both_broadcast", ["add"], "r = c + d", {"c": u(3, 1), "d": u(2, 1, 4)}, lambda c, d: c + d)
grad_case("sub_broadcast", ["sub"], "r = (a - b) - c", {"a": u(3, 4), "b": u(4), "c": u(3, 1)},
          lambda a, b, c: (a - b) - c)
grad_case("sub_broadcast_first", ["sub"], "r = b - a", {"a": u(3, 4), "b": u(3, 1)}, lambda a, b: b - a)
grad_case("mul_broadcast", ["mul"], "r = a * b * c", {"a": u(3, 4), "b": u(4), "c": u(3, 1)},
          lambda a, b, c: a * b * c)
grad_case("mul_self", ["mul"], "r = a * a", {"a": u(2, 3)}, lambda a: a * a)
grad_case("div_broadcast", ["div"], "r = a / b / c",
          {"a": u(3, 4), "b": away(4, gap=0.5), "c": u(3, 1, lo=0.5, hi=2)}, lambda a, b, c: a / b / c)
grad_case("div_broadcast_numerator", ["div"], "r = c / a",
          {"a": u(3, 4, lo=0.5, hi=2), "c": u(3, 1)}, lambda a, c: c / a)
grad_case("scalar_literals", ["add", "sub", "mul", "div"], "r = 2.5 * a - 1 / (a * a + 1) + 3",
          {"a": u(6)}, lambda a: 2.5 * a - 1 / (a * a + 1) + 3)
grad_case("pow_both", ["pow"], "r = pow(a, b)", {"a": u(3, 4, lo=0.3, hi=3), "b": u(4, lo=-2, hi=2)},
          lambda a, b: np.power(a, b))
grad_case("pow_base_broadcast", ["pow"], "r = pow(a, b)", {"a": u(3, 1, lo=0.3, hi=3), "b": u(3, 4, lo=-2, hi=2)},
          lambda a, b: np.power(a, b))

# elementwise unary
grad_case("neg", ["neg"], "r = -a + neg(b)", {"a": u(3, 4), "b": u(4)}, lambda a, b: -a - b)
grad_case("exp", ["exp"], "r = exp(a)", {"a": u(3, 4)}, lambda a: np.exp(a))
grad_case("log", ["log"], "r = log(a)", {"a": u(3, 4, lo=0.2, hi=5)}, lambda a: np.log(a))
grad_case("sqrt", ["sqrt"], "r = sqrt(a)", {"a": u(3, 4, lo=0.2, hi=5)}, lambda a: np.sqrt(a))
grad_case("tanh", ["tanh"], "r = tanh(a)", {"a": u(3, 4)}, lambda a: np.tanh(a))
grad_case("sigmoid", ["sigmoid"], "r = sigmoid(a)", {"a": u(3, 4, lo=-5, hi=5)}, lambda a: sigmoid(a))
grad_case("relu", ["relu"], "r = relu(a)", {"a": away(4, 5)}, lambda a: np.maximum(a, 0))
grad_case("gelu", ["gelu"], "r = gelu(a)", {"a": u(4, 5, lo=-4, hi=4)}, lambda a: gelu(a))
grad_case("erf", ["erf"], "r = erf(a)", {"a": u(3, 4)}, lambda a: erf(a))
grad_case("abs", ["abs"], "r = abs(a)", {"a": away(3, 4)}, lambda a: np.abs(a))

# minimum, maximum (no ties), where (gradient to both branches)
_b = u(1, 4)
grad_case("minimum_broadcast", ["minimum"], "r = minimum(a, b)", {"a": apart(_b, 3, 4), "b": _b},
          lambda a, b: np.minimum(a, b))
_b = u(3, 1)
grad_case("maximum_broadcast", ["maximum"], "r = maximum(a, b)", {"a": apart(_b, 3, 4), "b": _b},
          lambda a, b: np.maximum(a, b))
grad_case("where_input_condition", ["where"], "r = where(less(p, q), a, b)",
          {"a": u(3, 4), "b": u(4)}, lambda a, b, p, q: np.where(p < q, a, b),
          inputs={"p": u(3, 4), "q": u(3, 4)})
_b = u(4)
grad_case("where_param_condition", ["where"], "r = where(less(a, b), a * 2, exp(b))",
          {"a": apart(_b, 3, 4), "b": _b}, lambda a, b: np.where(a < b, a * 2, np.exp(b)))
grad_case("where_broadcast_condition", ["where"], "r = where(greater(p, q), a, b)",
          {"a": u(1, 4), "b": u(3, 1)}, lambda a, b, p, q: np.where(p > q, a, b),
          inputs={"p": u(3, 4), "q": u(4)})


# cast: f64 -> f32 -> f64 rounds the value, so finite differences of that
# forward (with h = 1e-6 |x|, about 16 f32 ulp) would measure the rounding.
# The reference is the finite difference of the forward without the
# rounding (f64 throughout).  novac's gradient goes through f32 on the way
# back (the incoming gradient cast to f32), so it may differ by the f32
# unit roundoff 2^-24 (~6e-8) per rounding: 1.2e-7 (2 roundings) for the bare
# pair, 1e-6 when tanh and its derivative 1 - y^2 are also computed in f32
# (a handful of roundings, with a margin).
def cast_case(name, body, a, ideal, tol):
    wgt = rng.uniform(-1, 1, size=a.shape)

    def run():
        text = decl("param", "a", a, 'file("a.bin")') + decl("const", "wgt", wgt, 'file("wgt.bin")')
        text += body + "\noutput loss = reduce_sum(r * wgt)\n"
        grads, _, _ = compile_and_train(text, {}, files={"a.bin": a, "wgt.bin": wgt}, flags=FLAGS)
        P = {"a": a.copy()}
        return [check(grads["a"], fd_grad(lambda: float(np.sum(ideal(P["a"]) * wgt)), P, "a"), "a", tol)]
    CASES.append((name, ["cast"], run))


cast_case("cast_f64_f32_f64", "r = cast(cast(a, to=f32), to=f64)", u(3, 4), lambda a: a, 1.2e-7)
cast_case("cast_f32_tanh", "r = cast(tanh(cast(a, to=f32)), to=f64)", u(3, 4), np.tanh, 1e-6)
grad_case("cast_f64_to_f64", ["cast"], "r = cast(a, to=f64) * a", {"a": u(3, 4)}, lambda a: a * a)

# matmul
grad_case("matmul_2d", ["matmul"], "r = a @ b", {"a": u(5, 7), "b": u(7, 3)}, lambda a, b: a @ b)
grad_case("matmul_3d_2d", ["matmul"], "r = matmul(a, b)", {"a": u(2, 5, 7), "b": u(7, 3)}, lambda a, b: a @ b)
grad_case("matmul_batched_4d", ["matmul"], "r = a @ b", {"a": u(2, 3, 4, 6), "b": u(2, 3, 6, 5)},
          lambda a, b: a @ b)

# softmax family, layer_norm
grad_case("softmax_last", ["softmax"], "r = softmax(a)", {"a": u(4, 6, lo=-3, hi=3)}, lambda a: softmax(a, -1))
grad_case("softmax_axis0", ["softmax"], "r = softmax(a, axis=0)", {"a": u(4, 3, 2, lo=-3, hi=3)},
          lambda a: softmax(a, 0))
grad_case("log_softmax_axis1", ["log_softmax"], "r = log_softmax(a, axis=1)", {"a": u(3, 6, 2, lo=-3, hi=3)},
          lambda a: log_softmax(a, 1))
grad_case("log_softmax_last", ["log_softmax"], "r = log_softmax(a)", {"a": u(3, 5, lo=-3, hi=3)},
          lambda a: log_softmax(a, -1))
grad_case("layer_norm", ["layer_norm"], "r = layer_norm(x, g, b)", {"x": u(2, 3, 8), "g": u(8), "b": u(8)},
          lambda x, g, b: layer_norm(x, g, b))
grad_case("layer_norm_eps", ["layer_norm"], "r = layer_norm(x, g, b, eps=0.1)", {"x": u(4, 5), "g": u(5), "b": u(5)},
          lambda x, g, b: layer_norm(x, g, b, 0.1))
grad_case("rms_norm", ["rms_norm"], "r = rms_norm(x, g)", {"x": u(2, 3, 8), "g": u(8)}, lambda x, g: rms_norm(x, g))
grad_case("rms_norm_eps", ["rms_norm"], "r = rms_norm(x, g, eps=0.5)", {"x": u(4, 5, lo=-0.5, hi=0.5), "g": u(5)},
          lambda x, g: rms_norm(x, g, 0.5))
grad_case("rms_norm_rank1_eps0", ["rms_norm"], "r = rms_norm(x, g, eps=0)", {"x": away(6), "g": u(6)},
          lambda x, g: rms_norm(x, g, 0.0))
# rotary: every operand, both pairings, cos and sin broadcast over the batch and the heads
grad_case("rotary_halves", ["rotary"], "r = rotary(x, c, s)", {"x": u(2, 3, 4, 8), "c": u(1, 1, 4, 4), "s": u(1, 1, 4, 4)},
          lambda x, c, s: rotary(x, c, s))
grad_case("rotary_interleaved", ["rotary"], "r = rotary(x, c, s, interleaved=1)",
          {"x": u(2, 4, 3, 6), "c": u(2, 4, 1, 3), "s": u(1, 4, 1, 3)}, lambda x, c, s: rotary(x, c, s, True))
grad_case("rotary_rank1_pair", ["rotary"], "r = rotary(x, c, s, interleaved=1)", {"x": u(2), "c": u(1), "s": u(1)},
          lambda x, c, s: rotary(x, c, s, True))
grad_case("rotary_angles_param", ["rotary", "cos", "sin"], "r = rotary(x * 2, cos(t), sin(t))",
          {"x": u(2, 5, 3, 6), "t": u(1, 5, 1, 3, lo=-3, hi=3)}, lambda x, t: rotary(x * 2, np.cos(t), np.sin(t)))
grad_case("rotary_interleaved_angles_param", ["rotary"], "r = rotary(x, cos(t), sin(t), interleaved=1)",
          {"x": u(3, 8), "t": u(3, 4, lo=-3, hi=3)}, lambda x, t: rotary(x, np.cos(t), np.sin(t), True))

# attention: MHA, grouped heads, scale, softcap, a broadcast bias (trained), a
# mask with -inf including a fully masked row (its output is 0)
_mask = np.where(rng.random((3, 5)) < 0.3, -np.inf, 0.0)
_mask[1, :] = -np.inf
_mask[0, 0] = 0.0
grad_case("attention_mha", ["attention"], "r = attention(q, k, v)",
          {"q": u(2, 2, 3, 4), "k": u(2, 2, 5, 4), "v": u(2, 2, 5, 3)}, attention_ref)
grad_case("attention_gqa_scale", ["attention"], "r = attention(q, k, v, scale=0.3)",
          {"q": u(1, 4, 3, 4), "k": u(1, 2, 5, 4), "v": u(1, 2, 5, 6)}, lambda q, k, v: attention_ref(q, k, v, scale=0.3))
grad_case("attention_softcap_bias", ["attention"], "r = attention(q, k, v, b, softcap=1.5)",
          {"q": u(2, 3, 3, 4), "k": u(2, 3, 4, 4), "v": u(2, 3, 4, 2), "b": u(3, 1, 4)},
          lambda q, k, v, b: attention_ref(q, k, v, b, cap=1.5))
grad_case("attention_masked", ["attention"], "r = attention(q, k, v, mask)",
          {"q": u(2, 2, 3, 4), "k": u(2, 1, 5, 4), "v": u(2, 1, 5, 3)},
          lambda q, k, v, mask: attention_ref(q, k, v, mask), inputs={"mask": _mask})

# reductions
grad_case("reduce_sum_all", ["reduce_sum"], "r = reduce_sum(a)", {"a": u(3, 4, 5)}, lambda a: a.sum())
grad_case("reduce_sum_axes", ["reduce_sum"], "r = reduce_sum(a, axes=[0, 2])", {"a": u(3, 4, 5)},
          lambda a: a.sum((0, 2)))
grad_case("reduce_sum_keepdims", ["reduce_sum"], "r = reduce_sum(a, axes=[1], keepdims=1)", {"a": u(3, 4, 5)},
          lambda a: a.sum(1, keepdims=True))
grad_case("reduce_mean_all", ["reduce_mean"], "r = reduce_mean(a)", {"a": u(3, 4)}, lambda a: a.mean())
grad_case("reduce_mean_keepdims", ["reduce_mean"], "r = reduce_mean(a, axes=[-1], keepdims=1)", {"a": u(3, 4, 5)},
          lambda a: a.mean(-1, keepdims=True))
grad_case("reduce_mean_axes", ["reduce_mean"], "r = reduce_mean(a, axes=[0, 2])", {"a": u(3, 4, 5)},
          lambda a: a.mean((0, 2)))
grad_case("reduce_max_axis", ["reduce_max"], "r = reduce_max(a, axes=[1])", {"a": distinct(3, 4, 5)},
          lambda a: a.max(1))
grad_case("reduce_max_keepdims_axes", ["reduce_max"], "r = reduce_max(a, axes=[0, 2], keepdims=1)",
          {"a": distinct(3, 4, 5)}, lambda a: a.max((0, 2), keepdims=True))
grad_case("reduce_max_all", ["reduce_max"], "r = reduce_max(a)", {"a": distinct(3, 4)}, lambda a: a.max())
grad_case("reduce_max_all_keepdims", ["reduce_max"], "r = reduce_max(a, keepdims=1)", {"a": distinct(3, 4)},
          lambda a: a.max(keepdims=True))

# ops that move elements
grad_case("reshape", ["reshape"], "r = reshape(a, shape=[4, -1, 3]) * 2", {"a": u(2, 6, 4)},
          lambda a: a.reshape(4, -1, 3) * 2)
grad_case("transpose_default", ["transpose"], "r = transpose(a)", {"a": u(2, 3, 4)}, lambda a: a.transpose())
grad_case("transpose_perm", ["transpose"], "r = transpose(a, perm=[1, 2, 0])", {"a": u(2, 3, 4)},
          lambda a: a.transpose(1, 2, 0))
grad_case("broadcast", ["broadcast"], "r = broadcast(a, shape=[2, 3, 4])", {"a": u(3, 1)},
          lambda a: np.broadcast_to(a, (2, 3, 4)))
grad_case("broadcast_rank1", ["broadcast"], "r = broadcast(a, shape=[3, 4])", {"a": u(4)},
          lambda a: np.broadcast_to(a, (3, 4)))
grad_case("concat3_axis1", ["concat"], "r = concat(a, b, c, axis=1)",
          {"a": u(2, 1, 3), "b": u(2, 4, 3), "c": u(2, 2, 3)}, lambda a, b, c: np.concatenate([a, b, c], 1))
grad_case("concat3_axis0", ["concat"], "r = concat(a, b, c)", {"a": u(2, 3), "b": u(1, 3), "c": u(3, 3)},
          lambda a, b, c: np.concatenate([a, b, c], 0))
grad_case("concat2_last", ["concat"], "r = concat(a, b, axis=-1)", {"a": u(3, 2), "b": u(3, 4)},
          lambda a, b: np.concatenate([a, b], -1))
grad_case("slice_inner", ["slice"], "r = slice(a, axis=1, start=2, end=5)", {"a": u(3, 7)}, lambda a: a[:, 2:5])
grad_case("slice_axis0_3d", ["slice"], "r = slice(a, start=1, end=3)", {"a": u(4, 2, 3)}, lambda a: a[1:3])
grad_case("slice_negative", ["slice"], "r = slice(a, axis=-1, start=-3)", {"a": u(3, 8)}, lambda a: a[:, -3:])
grad_case("slice_step2", ["slice"], "r = slice(a, axis=1, start=1, end=7, step=2)", {"a": u(3, 8)},
          lambda a: a[:, 1:7:2])
grad_case("slice_step3_axis0", ["slice"], "r = slice(a, start=0, step=3)", {"a": u(7, 2)}, lambda a: a[0::3])
grad_case("slice_prefix", ["slice"], "r = slice(a, axis=1, end=2)", {"a": u(3, 5)}, lambda a: a[:, :2])
grad_case("gather_rank2", ["gather"], "r = gather(t, i)", {"t": u(6, 4)}, lambda t, i: t[i],
          inputs={"i": np.array([[1, 4, 1], [5, 1, 4]], dtype=np.int64)})
grad_case("gather_rank3", ["gather"], "r = gather(t, i, axis=0)", {"t": u(5, 2, 3)}, lambda t, i: t[i],
          inputs={"i": np.array([3, 0, 3, 3, 2, 0, 4], dtype=np.int64)})
grad_case("gather_i32", ["gather"], "r = gather(t, i)", {"t": u(4, 3)}, lambda t, i: t[i],
          inputs={"i": np.array([2, 2, 0, 2], dtype=np.int32)})

# gather on other axes (the axis moved first, one-hot matmul, moved back)
grad_case("gather_axis1", ["gather"], "r = gather(t, i, axis=1)", {"t": u(3, 6)}, lambda t, i: t[:, i],
          inputs={"i": np.array([4, 0, 4, 5], dtype=np.int64)})
grad_case("gather_axis2_idx2d", ["gather"], "r = gather(t, i, axis=2)", {"t": u(2, 3, 5)}, lambda t, i: t[:, :, i],
          inputs={"i": np.array([[1, 4], [4, 0], [2, 2]], dtype=np.int64)})

# trigonometric and hyperbolic functions, inside their domains
grad_case("sin", ["sin"], "r = sin(a)", {"a": u(3, 4, lo=-3, hi=3)}, lambda a: np.sin(a))
grad_case("cos", ["cos"], "r = cos(a)", {"a": u(3, 4, lo=-3, hi=3)}, lambda a: np.cos(a))
grad_case("tan", ["tan"], "r = tan(a)", {"a": u(3, 4, lo=-1.2, hi=1.2)}, lambda a: np.tan(a))
grad_case("asin", ["asin"], "r = asin(a)", {"a": u(3, 4, lo=-0.8, hi=0.8)}, lambda a: np.arcsin(a))
grad_case("acos", ["acos"], "r = acos(a)", {"a": u(3, 4, lo=-0.8, hi=0.8)}, lambda a: np.arccos(a))
grad_case("atan", ["atan"], "r = atan(a)", {"a": u(3, 4, lo=-3, hi=3)}, lambda a: np.arctan(a))
grad_case("sinh", ["sinh"], "r = sinh(a)", {"a": u(3, 4)}, lambda a: np.sinh(a))
grad_case("cosh", ["cosh"], "r = cosh(a)", {"a": u(3, 4)}, lambda a: np.cosh(a))
grad_case("asinh", ["asinh"], "r = asinh(a)", {"a": u(3, 4, lo=-3, hi=3)}, lambda a: np.arcsinh(a))
grad_case("acosh", ["acosh"], "r = acosh(a)", {"a": u(3, 4, lo=1.2, hi=3)}, lambda a: np.arccosh(a))
grad_case("atanh", ["atanh"], "r = atanh(a)", {"a": u(3, 4, lo=-0.8, hi=0.8)}, lambda a: np.arctanh(a))


def off_grid(*shape, lo=0.15, hi=0.35):
    """Integers plus a fraction in [lo, hi]: floor/ceil/round do not change within +- h."""
    return rng.integers(-3, 3, size=shape) + rng.uniform(lo, hi, size=shape)


# piecewise constant ops: zero gradient through them, the product rule still checked
grad_case("floor", ["floor"], "r = floor(a) * a", {"a": off_grid(3, 4)}, lambda a: np.floor(a) * a)
grad_case("ceil", ["ceil"], "r = ceil(a) * a", {"a": off_grid(3, 4)}, lambda a: np.ceil(a) * a)
grad_case("round", ["round"], "r = round(a) * a", {"a": off_grid(3, 4, lo=0.6, hi=0.9)}, lambda a: np.round(a) * a)
grad_case("sign", ["sign"], "r = sign(a) * a * a", {"a": away(3, 4)}, lambda a: np.sign(a) * a * a)
grad_case("where_less_equal", ["where"], "r = where(less_equal(a, b), a, b * 2)", {"a": u(3, 4), "b": apart(0.0, 3, 4)},
          lambda a, b: np.where(a <= b, a, b * 2))
grad_case("where_greater_equal", ["where"], "r = where(greater_equal(a, b), a * b, b)", {"a": u(3, 4), "b": apart(0.0, 3, 4)},
          lambda a, b: np.where(a >= b, a * b, b))


def quotient_off_grid(b, lo=0.2, hi=0.8):
    """a with a / b an integer plus a fraction in [lo, hi] (either sign): mod's floor stays put."""
    return b * (rng.integers(-3, 3, size=b.shape) + rng.uniform(lo, hi, size=b.shape))


_mb = away(3, 4, gap=0.5)
grad_case("mod", ["mod"], "r = mod(a, b)", {"a": quotient_off_grid(_mb), "b": _mb}, lambda a, b: np.mod(a, b))
grad_case("fmod", ["fmod"], "r = fmod(a, b)", {"a": quotient_off_grid(_mb), "b": _mb}, lambda a, b: np.fmod(a, b))
grad_case("reduce_min_axis", ["reduce_min"], "r = reduce_min(a, axes=[1])", {"a": distinct(3, 4, 5)},
          lambda a: a.min(1))
grad_case("reduce_min_all", ["reduce_min"], "r = reduce_min(a, keepdims=1)", {"a": distinct(3, 4)},
          lambda a: a.min(keepdims=True))
grad_case("reduce_prod_axis", ["reduce_prod"], "r = reduce_prod(a, axes=[1])", {"a": away(3, 4, gap=0.5, hi=1.5)},
          lambda a: a.prod(1))
# rows with one zero (the gradient there is the product of the others) and with two (all zero):
# the product is multilinear, so central differences are exact at 0
_pz = away(4, 5, gap=0.5, hi=1.5)
_pz[0, 2] = 0.0
_pz[1, 0] = _pz[1, 3] = 0.0
grad_case("reduce_prod_zeros", ["reduce_prod"], "r = reduce_prod(a, axes=[1])", {"a": _pz}, lambda a: a.prod(1))


def take_along(t, i, axis):
    return np.take_along_axis(t, np.where(i < 0, i + t.shape[axis], i), axis)


grad_case("gather_elements_axis1", ["gather_elements"], "r = gather_elements(t, i, axis=1)", {"t": u(3, 5)},
          lambda t, i: take_along(t, i, 1),
          inputs={"i": np.array([[0, 4, 4, -1], [2, 2, 0, 1], [3, 3, -2, 3]], dtype=np.int64)})
grad_case("gather_elements_axis0", ["gather_elements"], "r = gather_elements(t, i, axis=0)", {"t": u(4, 3)},
          lambda t, i: take_along(t, i, 0), inputs={"i": np.array([[3, 0, 1], [3, 3, 2]], dtype=np.int64)})


def scatter_elements_ref(d, i, v, axis, add):
    out = d.copy()
    for idx in np.ndindex(*i.shape):
        dst = list(idx)
        dst[axis] = i[idx]
        if add:
            out[tuple(dst)] += v[idx]
        else:
            out[tuple(dst)] = v[idx]
    return out


_si = np.array([[3, 0], [1, 2], [0, 3]], dtype=np.int64)  # distinct in each row
grad_case("scatter_elements_none", ["scatter_elements"], "r = scatter_elements(d, i, v, axis=1)",
          {"d": u(3, 4), "v": u(3, 2)}, lambda d, v, i: scatter_elements_ref(d, i, v, 1, False), inputs={"i": _si})
grad_case("scatter_elements_add", ["scatter_elements"], "r = scatter_elements(d, i, v, axis=0, mode=1)",
          {"d": u(3, 4), "v": u(2, 3)}, lambda d, v, i: scatter_elements_ref(d, i, v, 0, True),
          inputs={"i": np.array([[2, 2, 0], [2, 0, 0]], dtype=np.int64)})


def scatter_nd_ref(d, i, v, add):
    out = d.copy()
    for u_ in np.ndindex(*i.shape[:-1]):
        dst = tuple(i[u_])
        if add:
            out[dst] += v[u_]
        else:
            out[dst] = v[u_]
    return out


grad_case("gather_nd", ["gather_nd"], "r = gather_nd(t, i)", {"t": u(4, 4, 2)}, lambda t, i: t[tuple(i.T)],
          inputs={"i": np.array([[2, 1], [0, 3], [2, 1]], dtype=np.int64)})
grad_case("scatter_nd_none", ["scatter_nd"], "r = scatter_nd(d, i, v)", {"d": u(4, 4, 2), "v": u(2, 2)},
          lambda d, v, i: scatter_nd_ref(d, i, v, False), inputs={"i": np.array([[2, 1], [0, 3]], dtype=np.int64)})
grad_case("scatter_nd_add", ["scatter_nd"], "r = scatter_nd(d, i, v, mode=1)", {"d": u(3, 4), "v": u(3, 4)},
          lambda d, v, i: scatter_nd_ref(d, i, v, True), inputs={"i": np.array([[2], [0], [2]], dtype=np.int64)})


def cumsum_ref(a, axis, exclusive, reverse):
    x = np.flip(a, axis) if reverse else a
    c = np.cumsum(x, axis)
    if exclusive:
        c = c - x
    return np.flip(c, axis) if reverse else c


for _m in range(4):
    grad_case("cumsum_mode%d" % _m, ["cumsum"], "r = cumsum(a, axis=1, mode=%d)" % _m, {"a": u(3, 5, 2)},
              lambda a, m=_m: cumsum_ref(a, 1, m & 1, m & 2))


def cumprod_ref(a, axis, exclusive, reverse):
    x = np.flip(a, axis) if reverse else a
    c = np.cumprod(x, axis)
    if exclusive:
        c = np.concatenate([np.ones_like(np.take(c, [0], axis)), np.delete(c, -1, axis)], axis)
    return np.flip(c, axis) if reverse else c


def with_zeros(*shape):
    """u(*shape) with exact zeros along axis 1 (length 6): one in a line, two in a row, two apart,
    first, last, and lines without any."""
    a = u(*shape)
    for i, places in enumerate(([2], [1, 2], [0], [5], [1, 4], [], [3, 4, 5])):
        a[i % shape[0], places, i // shape[0]] = 0
    return a


# running products (mode 4): no zeros, and zeros where the division-free parts of the rule matter
for _m in range(4, 8):
    grad_case("cumprod_mode%d" % _m, ["cumsum"], "r = cumsum(a, axis=1, mode=%d)" % _m, {"a": u(3, 5, 2)},
              lambda a, m=_m: cumprod_ref(a, 1, m & 1, m & 2))
    grad_case("cumprod_zeros_mode%d" % _m, ["cumsum"], "r = cumsum(a, axis=1, mode=%d)" % _m, {"a": with_zeros(4, 6, 2)},
              lambda a, m=_m: cumprod_ref(a, 1, m & 1, m & 2))
grad_case("cumprod_zeros_axis0", ["cumsum"], "r = cumsum(a, axis=0, mode=6)",
          {"a": np.array([[0.0, 1.5, -0.7], [0.0, 0.0, 1.1], [1.3, -2.0, 0.0], [0.6, 0.9, 0.0]])},
          lambda a: cumprod_ref(a, 0, False, True))

# cross_entropy: the loss itself, times a constant
grad_case("cross_entropy_2d", ["cross_entropy"], "r = cross_entropy(l, y)", {"l": u(6, 5, lo=-3, hi=3)},
          lambda l, y: cross_entropy(l, y) * 1.75, inputs={"y": np.array([0, 4, 2, 2, 1, 4], dtype=np.int64)},
          loss_expr="r * 1.75")
grad_case("cross_entropy_3d", ["cross_entropy"], "r = cross_entropy(l, y)", {"l": u(2, 3, 7, lo=-3, hi=3)},
          lambda l, y: cross_entropy(l, y) * -0.6,
          inputs={"y": np.array([[6, 0, 3], [3, 1, 5]], dtype=np.int64)}, loss_expr="r * -0.6")

# fan-out: one param used three times (gradients accumulate)
grad_case("fan_out", ["mul", "tanh", "add", "exp"], "r = tanh(w) * w + exp(w)", {"w": u(3, 4)},
          lambda w: np.tanh(w) * w + np.exp(w))
grad_case("fan_out_matmul", ["matmul", "transpose", "add"], "r = w @ transpose(w) + reduce_sum(w)", {"w": u(3, 4)},
          lambda w: w @ w.T + w.sum())


# the MLP of examples/mlp.nova, in f64 with file params and tanh: all grads at once
def _mlp():
    x = u(5, 6)
    y = np.array([0, 2, 1, 2, 0], dtype=np.int64)
    P = {"w1": u(6, 4, lo=-0.8, hi=0.8), "b1": u(4, lo=-0.5, hi=0.5), "w2": u(4, 3), "b2": u(3, lo=-0.5, hi=0.5)}

    def run():
        text = decl("input", "x", x) + decl("label", "y", y)
        text += "".join(decl("param", k, v, 'file("%s.bin")' % k) for k, v in P.items())
        text += "h = tanh(x @ w1 + b1)\nlogits = h @ w2 + b2\noutput logits\noutput loss = cross_entropy(logits, y)\n"
        grads, _, loss = compile_and_train(text, {"x": x, "y": y}, files={k + ".bin": v for k, v in P.items()},
                                           flags=FLAGS)
        Q = {k: v.copy() for k, v in P.items()}

        def f():
            h = np.tanh(x @ Q["w1"] + Q["b1"])
            return cross_entropy(h @ Q["w2"] + Q["b2"], y)
        if loss is None or not abs(float(loss) - f()) <= 1e-12:
            raise Failure("loss %r, numpy reference %r" % (loss, f()))
        return [check(grads[k], fd_grad(f, Q, k), k, TOL) for k in P]
    CASES.append(("mlp_f64_tanh", ["matmul", "add", "tanh", "cross_entropy"], run))


_mlp()


grad_case("conv2d_strided_padded_dilated", ["conv"],
          "r = conv(x, w, strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2])",
          {"x": u(2, 3, 7, 6), "w": u(4, 3, 3, 2)}, lambda x, w: conv_ref(x, w, (2, 1), (1, 0, 1, 1), (1, 2), 1))
grad_case("conv2d_groups", ["conv"], "r = conv(x, w, groups=2, pads=[1, 1, 1, 1])",
          {"x": u(1, 4, 5, 5), "w": u(6, 2, 3, 3)}, lambda x, w: conv_ref(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 2))
grad_case("conv1d_strided", ["conv"], "r = conv(x, w, strides=[2])",
          {"x": u(2, 2, 9), "w": u(3, 2, 3)}, lambda x, w: conv_ref(x, w, (2,), (0, 0), (1,), 1))
# distinct values keep every window's maximum unique (no ties: the gradient is defined)
grad_case("max_pool_padded", ["max_pool"], "r = max_pool(x, kernel=[3, 2], strides=[2, 2], pads=[1, 1, 1, 0])",
          {"x": distinct(2, 2, 7, 6)}, lambda x: pool_ref(x, (3, 2), (2, 2), (1, 1, 1, 0), False, "max", False))
grad_case("avg_pool_exclude_pad", ["avg_pool"], "r = avg_pool(x, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])",
          {"x": u(1, 2, 7, 6)}, lambda x: pool_ref(x, (3, 3), (2, 2), (1, 1, 1, 1), False, "avg", False))
grad_case("avg_pool_include_pad", ["avg_pool"],
          "r = avg_pool(x, kernel=[2, 3], strides=[1, 2], pads=[0, 1, 1, 1], count_include_pad=1)",
          {"x": u(1, 2, 5, 6)}, lambda x: pool_ref(x, (2, 3), (1, 2), (0, 1, 1, 1), False, "avg", True))


# ---- ops without a backward rule --------------------------------------------------

def refused(model, message):
    def check():
        d = tempfile.mkdtemp(prefix="nova-grad-")
        try:
            path = os.path.join(d, "model.nova")
            with open(path, "w") as f:
                f.write(model)
            p = run([NOVAC, path, "--train", "-o", os.path.join(d, "s.so")] + FLAGS, expect_rc=None)
            if p.returncode != 1 or message not in p.stderr:
                raise Failure("novac --train exited %d (expected 1, with '%s'); if the op has a backward rule now, "
                              "give it a gradient case\n%s%s" % (p.returncode, message, p.stdout, p.stderr))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return check


for _op, _model in NO_RULE.items():
    CASES.append(("no_rule_" + _op, [], refused(_model, "%s has no backward rule" % _op)))
for _name, (_model, _msg) in NO_RULE_FORMS.items():
    CASES.append(("no_rule_" + _name, [], refused(_model, _msg)))


# ---- coverage -------------------------------------------------------------------------

def coverage():
    with open(os.path.join(ROOT, "frontend", "graph.h")) as f:
        src = f.read()
    m = re.search(r"#define NV_OPS\(X\)(.*?)\n\s*\n", src, re.S)
    if not m:
        raise Failure("no NV_OPS X-macro in frontend/graph.h")
    ops = re.findall(r'X\(\s*\w+\s*,\s*"(\w+)"', m.group(1))
    if len(ops) < 10:
        raise Failure("read only %d ops from NV_OPS: %s" % (len(ops), ops))
    covered = {op for _, cov, _ in CASES for op in cov}
    missing = [op for op in ops if op not in covered and op not in NOT_DIFFERENTIABLE and op not in NO_RULE]
    stale = [op for op in list(NOT_DIFFERENTIABLE) + list(NO_RULE) + sorted(covered) if op not in ops]
    both = [op for op in NO_RULE if op in covered]
    msg = []
    if missing:
        msg.append("ops with neither a gradient case nor an entry in NOT_DIFFERENTIABLE or NO_RULE: %s" % missing)
    if stale:
        msg.append("names that are not ops of NV_OPS: %s" % stale)
    if both:
        msg.append("ops in NO_RULE that also have a gradient case: %s" % both)
    if msg:
        raise Failure("\n".join(msg))


def main():
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futs = [(name, pool.submit(fn)) for name, _, fn in CASES]
        for name, fut in futs:
            notes = []
            case(name, lambda: notes.extend(fut.result() or []), suite="grad")
            for n in notes if VERBOSE else []:
                print("    " + n, flush=True)
    case("coverage", coverage, suite="grad")
    print("# grad: %d passed, %d failed in %.1f s" % (results["pass"], results["fail"], time.time() - t0), flush=True)
    return 1 if results["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
