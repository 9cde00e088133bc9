"""Gradient check of ONNX operators that novac writes as compositions
(frontend/onnx_math.c, onnx_index.c, onnx_nn.c), in float64.

Each case is a one-node ONNX model whose float operands are float64
initializers (the trained params), loss = ReduceSum(Y * W) with a random
constant W.  novac --train runs one SGD step with lr 0 (novarun --dump);
every gradient is compared with central finite differences of the onnx
package's reference implementation (onnx.reference.ReferenceEvaluator), an
independent implementation: relative error (max-norm) at most 1e-6.
Values are drawn away from the kinks of the op under test.

Prints 'PASS: grad-onnx :: NAME' or 'FAIL: grad-onnx :: NAME'.
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

from harness import NOVAC, NOVARUN, Failure, case, read_pb, rel_err, run

TOL = 1e-6
rng = np.random.default_rng(11)


def u(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape)


def away(*shape, gap=0.2, hi=2.0):
    x = rng.uniform(gap, hi, size=shape)
    return np.where(rng.random(shape) < 0.5, -x, x)


def grad_case(name, op, params, consts=None, attrs=None, opset=23, outputs=1, inputs_order=None, ref=None):
    """op applied to params (trained, float64) and consts (other inputs,
    any dtype; None = an omitted optional input), in inputs_order; ref:
    a numpy forward of the params instead of the onnx reference."""
    consts = consts or {}
    order = inputs_order or list(params) + list(consts)

    def model(P):
        inits = [nh.from_array(np.asarray(v), k) for k, v in list(P.items()) + list(consts.items()) if v is not None]
        outs = ["y"] + ["y%d" % i for i in range(1, outputs)]
        node = h.make_node(op, [k if (k in P or consts.get(k) is not None) else "" for k in order], outs, **(attrs or {}))
        return h.make_model(h.make_graph([node], name, [], [h.make_tensor_value_info("y", T.DOUBLE, None)], inits),
                            opset_imports=[h.make_opsetid("", opset)])

    def forward(P):
        if ref:
            return ref(**P)
        return np.asarray(ReferenceEvaluator(model(P)).run(None, {})[0], dtype=np.float64)

    def go():
        P0 = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
        y0 = forward(P0)
        W = rng.uniform(-1, 1, size=y0.shape)
        m = model(P0)
        g = m.graph
        g.initializer.append(nh.from_array(W, "W"))
        g.node.extend([h.make_node("Mul", ["y", "W"], ["yw"]), h.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0)])
        del g.output[:]
        g.output.extend([h.make_tensor_value_info("loss", T.DOUBLE, [])])
        d = tempfile.mkdtemp(prefix="nova-gonnx-")
        try:
            path = os.path.join(d, "m.onnx")
            onnx.save(m, path)
            so = os.path.join(d, "m.so")
            run([NOVAC, path, "--train", "--keep-grads", "--optimizer=sgd", "--lr=0", "-o", so])
            run([NOVARUN, so, "--steps", "1", "--dump", os.path.join(d, "dump"), "-q"])
            for k, v in P0.items():
                got = read_pb(os.path.join(d, "dump", "grad.%s.pb" % k)).astype(np.float64)
                want = np.zeros_like(v)
                for i in np.ndindex(*v.shape):
                    hh = 1e-6 * max(1.0, abs(v[i]))
                    Pp = {kk: vv.copy() for kk, vv in P0.items()}
                    Pm = {kk: vv.copy() for kk, vv in P0.items()}
                    Pp[k][i] += hh
                    Pm[k][i] -= hh
                    want[i] = (np.sum(forward(Pp) * W) - np.sum(forward(Pm) * W)) / (2 * hh)
                e = rel_err(got, want)
                if not e <= TOL:
                    raise Failure("grad of %s: relative error %.3g > %g\n got %s\n ref %s" % (k, e, TOL, got, want))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("grad_onnx.%s" % name, go, suite="grad-onnx")


# activations written as compositions
grad_case("softplus", "Softplus", {"x": u(3, 4)})
grad_case("softsign", "Softsign", {"x": away(3, 4)})
grad_case("mish", "Mish", {"x": u(3, 4)})
grad_case("elu", "Elu", {"x": away(3, 4)}, attrs={"alpha": 0.7})
grad_case("selu", "Selu", {"x": away(3, 4)})
grad_case("celu", "Celu", {"x": away(3, 4)}, attrs={"alpha": 1.3})
grad_case("hard_sigmoid", "HardSigmoid", {"x": u(3, 4, lo=-2, hi=2)}, attrs={"alpha": 0.2, "beta": 0.5})
grad_case("hard_swish", "HardSwish", {"x": u(3, 4, lo=-2.5, hi=2.5)})
grad_case("prelu", "PRelu", {"x": away(2, 3, 4), "slope": u(3, 1)})
grad_case("reduce_log_sum_exp", "ReduceLogSumExp", {"x": u(3, 4)}, consts={"axes": np.array([1])}, attrs={"keepdims": 0})
grad_case("reduce_l2", "ReduceL2", {"x": away(3, 4)}, consts={"axes": np.array([0])})
# indexing, padding, tiling
grad_case("pad_reflect", "Pad", {"x": u(3, 4)}, consts={"pads": np.array([1, 2, 0, 3])}, attrs={"mode": "reflect"})
grad_case("pad_edge", "Pad", {"x": u(3, 4)}, consts={"pads": np.array([0, 1, 2, 1])}, attrs={"mode": "edge"})
grad_case("pad_wrap", "Pad", {"x": u(3, 4)}, consts={"pads": np.array([1, 2, 2, 5])}, attrs={"mode": "wrap"})
grad_case("pad_crop", "Pad", {"x": u(3, 4)}, consts={"pads": np.array([-1, 2, 1, -2])},  # (the reference refuses < 0)
          ref=lambda x: np.pad(x[1:, :-2], ((0, 1), (2, 0))))
grad_case("pad_constant", "Pad", {"x": u(2, 3), "v": np.array(0.5)}, consts={"pads": np.array([1, 0, 0, 2])},
          inputs_order=["x", "pads", "v"])
grad_case("tile", "Tile", {"x": u(2, 3)}, consts={"r": np.array([2, 3])})
# normalizations and attention
grad_case("rms_norm", "RMSNormalization", {"x": u(2, 3, 4), "s": u(4)}, attrs={"axis": -1})
# (GroupNormalization: the onnx reference computes in float32, too coarse for differences; numpy instead)
def group_norm_ref(x, s, b, G=2, eps=1e-5):
    n = x.reshape(x.shape[0], G, -1)
    n = (n - n.mean(-1, keepdims=True)) / np.sqrt(n.var(-1, keepdims=True) + eps)
    return n.reshape(x.shape) * s.reshape(1, -1, 1) + b.reshape(1, -1, 1)


grad_case("group_norm", "GroupNormalization", {"x": u(2, 4, 3), "s": u(4), "b": u(4)}, attrs={"num_groups": 2},
          opset=21, ref=group_norm_ref)
grad_case("instance_norm", "InstanceNormalization", {"x": u(2, 3, 4), "s": u(3), "b": u(3)})
grad_case("lp_norm", "LpNormalization", {"x": away(3, 4)}, attrs={"axis": 1, "p": 2}, opset=22)
grad_case("rotary", "RotaryEmbedding", {"x": u(2, 3, 4, 4), "cos": u(2, 4, 2), "sin": u(2, 4, 2)})
grad_case("rotary_interleaved_pos", "RotaryEmbedding", {"x": u(1, 3, 8)},
          consts={"cos": u(5, 2), "sin": u(5, 2), "pos": np.array([[4, 0, 2]])},
          attrs={"interleaved": 1, "num_heads": 2}, inputs_order=["x", "cos", "sin", "pos"])
grad_case("attention_4d_causal", "Attention", {"q": u(1, 2, 3, 4), "k": u(1, 2, 3, 4), "v": u(1, 2, 3, 4)},
          attrs={"is_causal": 1})
grad_case("attention_3d_gqa_mask_softcap", "Attention", {"q": u(2, 3, 8), "k": u(2, 4, 4), "v": u(2, 4, 6)},
          consts={"mask": rng.random((3, 4)) < 0.7},
          attrs={"q_num_heads": 4, "kv_num_heads": 2, "softcap": 2.0}, inputs_order=["q", "k", "v", "mask"])
grad_case("attention_past", "Attention", {"q": u(1, 2, 2, 3), "k": u(1, 2, 2, 3), "v": u(1, 2, 2, 3),
                                          "pk": u(1, 2, 3, 3), "pv": u(1, 2, 3, 3)},
          attrs={"is_causal": 1, "scale": 0.4}, consts={"mask": None},
          inputs_order=["q", "k", "v", "mask", "pk", "pv"])
# resizing: one interpolation matrix per axis (a gather for nearest)
grad_case("resize_linear", "Resize", {"x": u(1, 2, 3, 4)},
          consts={"roi": None, "scales": np.array([1, 1, 1.5, 0.75], dtype=np.float32)},
          attrs={"mode": "linear"}, opset=19, inputs_order=["x", "roi", "scales"])
grad_case("resize_cubic_sizes_antialias", "Resize", {"x": u(1, 1, 6, 5)},
          consts={"roi": None, "scales": None, "sizes": np.array([1, 1, 3, 7])},
          attrs={"mode": "cubic", "antialias": 1}, opset=19, inputs_order=["x", "roi", "scales", "sizes"])
grad_case("resize_nearest_axes", "Resize", {"x": u(2, 3, 4)},
          consts={"roi": None, "scales": np.array([2.0, 0.5], dtype=np.float32)},
          attrs={"mode": "nearest", "axes": [2, 1]}, opset=19, inputs_order=["x", "roi", "scales"])
# ConvTranspose: the transposed convolution's input gradient (conv) and weight gradient
grad_case("conv_transpose_stride_pad", "ConvTranspose", {"x": u(2, 3, 3, 4), "w": u(3, 2, 3, 2), "b": u(2)},
          attrs={"strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}, opset=17)
def conv_transpose_1d_ref(x, w, G=2, s=3):
    """(the onnx reference fails on groups in 1-D): y[n, g M + m, o s + k] += x[n, g C + c, o] w[g C + c, m, k]"""
    N, C, O = x.shape
    M, K = w.shape[1], w.shape[2]
    y = np.zeros((N, M * G, s * (O - 1) + K))
    for g in range(G):
        for c in range(C // G):
            for m in range(M):
                for o in range(O):
                    for k in range(K):
                        y[:, g * M + m, o * s + k] += x[:, g * (C // G) + c, o] * w[g * (C // G) + c, m, k]
    return y


grad_case("conv_transpose_group", "ConvTranspose", {"x": u(1, 4, 5), "w": u(4, 3, 2)},
          attrs={"group": 2, "strides": [3]}, opset=17, ref=conv_transpose_1d_ref)
grad_case("conv_transpose_dilation", "ConvTranspose", {"x": u(1, 2, 5), "w": u(2, 3, 2)},
          attrs={"dilations": [2], "strides": [2]}, opset=17)
grad_case("conv_transpose_output_shape", "ConvTranspose", {"x": u(1, 2, 3, 3), "w": u(2, 1, 3, 3)},
          attrs={"strides": [2, 2], "output_shape": [8, 7]}, opset=17)
# TopK (values; distinct inputs, so the order is stable under +-h) and Compress
grad_case("topk_axis1", "TopK", {"x": rng.permutation(np.linspace(-2, 2, 24)).reshape(2, 4, 3)},
          consts={"k": np.array([2])}, attrs={"axis": 1}, outputs=2, opset=17)
grad_case("topk_smallest_last", "TopK", {"x": rng.permutation(np.linspace(-2, 2, 15)).reshape(3, 5)},
          consts={"k": np.array([3])}, attrs={"largest": 0}, outputs=2, opset=17)
grad_case("compress_axis0", "Compress", {"x": u(4, 3)}, consts={"c": np.array([True, False, True, True])},
          attrs={"axis": 0}, opset=17)
grad_case("lp_pool_p2_pads", "LpPool", {"x": u(1, 2, 4, 5)}, attrs={"kernel_shape": [2, 3], "pads": [1, 0, 0, 1], "p": 2},
          opset=18)
grad_case("lp_pool_p3", "LpPool", {"x": away(1, 1, 6)}, attrs={"kernel_shape": [3], "strides": [2], "p": 3}, opset=18)
# Einsum: the batched-matmul path, the general product path, diagonals, ellipses
grad_case("einsum_bmm_transposed", "Einsum", {"a": u(2, 3, 4), "b": u(2, 5, 4)}, attrs={"equation": "bik,bjk->bji"})
grad_case("einsum_three_operands", "Einsum", {"a": u(3, 4), "b": u(4, 2), "c": u(2)}, attrs={"equation": "ij,jk,k->i"})
grad_case("einsum_diagonal_ellipsis", "Einsum", {"a": u(2, 3, 3), "b": u(2, 3)}, attrs={"equation": "...ii,...i->...i"})
grad_case("einsum_implicit_sum", "Einsum", {"a": u(3, 4, 2)}, attrs={"equation": "ijk"})
# recurrent cells, unrolled: every weight's gradient through time
grad_case("lstm_bidirectional_peepholes", "LSTM",
          {"x": u(3, 2, 4, lo=-1, hi=1), "w": u(2, 12, 4, lo=-1, hi=1), "r": u(2, 12, 3, lo=-1, hi=1),
           "b": u(2, 24, lo=-1, hi=1), "h0": u(2, 2, 3, lo=-1, hi=1), "c0": u(2, 2, 3, lo=-1, hi=1),
           "p": u(2, 9, lo=-1, hi=1)},
          consts={"lens": None}, attrs={"hidden_size": 3, "direction": "bidirectional"}, opset=14,
          inputs_order=["x", "w", "r", "b", "lens", "h0", "c0", "p"])
grad_case("gru_linear_before_reset_layout1", "GRU",
          {"x": u(2, 3, 4, lo=-1, hi=1), "w": u(1, 9, 4, lo=-1, hi=1), "r": u(1, 9, 3, lo=-1, hi=1), "b": u(1, 18, lo=-1, hi=1)},
          attrs={"hidden_size": 3, "linear_before_reset": 1, "layout": 1}, opset=14)
grad_case("rnn_reverse", "RNN", {"x": u(4, 2, 3, lo=-1, hi=1), "w": u(1, 5, 3, lo=-1, hi=1), "r": u(1, 5, 5, lo=-1, hi=1)},
          attrs={"hidden_size": 5, "direction": "reverse"}, opset=14)


def rnn_lens_ref(x, w, r, lens=np.array([3, 1], dtype=np.int32), alpha=0.3):
    """(the onnx reference ignores sequence_lens and activations) LeakyRelu cell; past a batch's
    length the state stays and Y is 0"""
    h = np.zeros((x.shape[1], w.shape[1]))
    ys = []
    for t in range(x.shape[0]):
        a = x[t] @ w[0].T + h @ r[0].T
        hn = np.where(a < 0, alpha * a, a)
        live = (t < lens)[:, None]
        ys.append(np.where(live, hn, 0))
        h = np.where(live, hn, h)
    return np.stack(ys)[:, None]


grad_case("rnn_sequence_lens_leaky", "RNN", {"x": u(3, 2, 3, lo=-1, hi=1), "w": u(1, 4, 3, lo=-1, hi=1), "r": u(1, 4, 4, lo=-1, hi=1)},
          consts={"b": None, "lens": np.array([3, 1], dtype=np.int32)},
          attrs={"hidden_size": 4, "activations": ["LeakyRelu"], "activation_alpha": [0.3]}, opset=14,
          inputs_order=["x", "w", "r", "b", "lens"], ref=rnn_lens_ref)
def lrn_ref(x, size=3, alpha=0.3, beta=0.75, bias=1.5):
    """(the onnx reference loops over the batch axis instead of the channels)"""
    C, lo = x.shape[1], (size - 1) // 2
    sq = np.zeros_like(x)
    for c in range(C):
        sq[:, c] = (x[:, max(0, c - lo):min(C, c + size - lo)] ** 2).sum(1)
    return x / (bias + alpha / size * sq) ** beta


grad_case("lrn", "LRN", {"x": u(2, 5, 2, 2)}, attrs={"size": 3, "alpha": 0.3, "beta": 0.75, "bias": 1.5}, opset=13,
          ref=lrn_ref)
grad_case("center_crop_pad", "CenterCropPad", {"x": u(4, 3)}, consts={"s": np.array([3, 6])}, opset=18)
grad_case("reverse_sequence", "ReverseSequence", {"x": u(4, 3, 2)}, consts={"l": np.array([4, 1, 2])},
          attrs={"batch_axis": 1, "time_axis": 0}, opset=13)
def affine_grid_ref(theta, H=3, W=4):
    """(the onnx reference rounds to float32) the base grid's x, y, 1 at pixel centres"""
    ys, xs = (np.arange(H) * 2 + 1) / H - 1, (np.arange(W) * 2 + 1) / W - 1
    base = np.stack([np.tile(xs, H), np.repeat(ys, W), np.ones(H * W)])
    return (theta @ base).transpose(0, 2, 1).reshape(theta.shape[0], H, W, 2)


grad_case("affine_grid", "AffineGrid", {"theta": u(2, 2, 3)}, consts={"size": np.array([2, 1, 3, 4])},
          attrs={"align_corners": 0}, opset=20, ref=affine_grid_ref)
# Scan, unrolled (the body reads the outer W), LinearAttention and CausalConvWithState
_body = h.make_graph([h.make_node("Mul", ["xt", "Wb"], ["xw"]), h.make_node("Add", ["s", "xw"], ["sx"]),
                      h.make_node("Tanh", ["sx"], ["s2"]), h.make_node("Identity", ["s2"], ["yt"])], "body",
                     [h.make_tensor_value_info("s", T.DOUBLE, [2]), h.make_tensor_value_info("xt", T.DOUBLE, [2])],
                     [h.make_tensor_value_info("s2", T.DOUBLE, [2]), h.make_tensor_value_info("yt", T.DOUBLE, [2])])
grad_case("scan_tanh_recurrence", "Scan", {"s0": u(2), "x": u(4, 2), "Wb": u(2)}, attrs={"body": _body, "num_scan_inputs": 1},
          outputs=2, opset=16, inputs_order=["s0", "x"])
def linear_attention_ref(q, k, v, st, g, b):
    """(the onnx reference computes in float32) one head, gated delta rule, default scale"""
    S, ys = st[0, 0].copy(), []
    for t in range(q.shape[1]):
        S = S * np.exp(g[0, t, 0])
        vt = b[0, t, 0] * (v[0, t] - k[0, t] @ S)
        S = S + np.outer(k[0, t], vt)
        ys.append(q[0, t] @ S / np.sqrt(q.shape[2]))
    return np.array(ys)[None]


grad_case("linear_attention_gated_delta", "LinearAttention",
          {"q": u(1, 3, 4, lo=-1, hi=1), "k": u(1, 3, 4, lo=-1, hi=1), "v": u(1, 3, 2, lo=-1, hi=1),
           "st": u(1, 1, 4, 2, lo=-1, hi=1), "g": u(1, 3, 1, lo=-1, hi=0), "b": u(1, 3, 1, lo=0, hi=1)},
          attrs={"q_num_heads": 1, "kv_num_heads": 1}, outputs=2, opset=27, ref=linear_attention_ref)
def causal_conv_ref(x, w, b, st):
    """(the onnx reference takes SiLU in float32) depthwise conv of [st, x], then SiLU"""
    p = np.concatenate([st, x], 2)
    k = w.shape[2]
    y = np.stack([sum(p[:, :, j + i] * w[:, 0, i] for i in range(k)) for j in range(x.shape[2])], 2) + b[None, :, None]
    return y / (1 + np.exp(-y))


grad_case("causal_conv_silu", "CausalConvWithState",
          {"x": u(2, 3, 5), "w": u(3, 1, 3), "b": u(3), "st": u(2, 3, 2)}, attrs={"activation": "silu"}, outputs=2, opset=27,
          ref=causal_conv_ref)
grad_case("dft_complex_padded", "DFT", {"x": u(2, 5, 2)}, consts={"n": np.array(6), "axis": np.array(1)}, opset=20)
grad_case("dft_irfft", "DFT", {"x": u(1, 4, 2)}, consts={"n": None, "axis": np.array(1)}, attrs={"inverse": 1, "onesided": 1},
          opset=20, inputs_order=["x", "n", "axis"])
# GridSample: the gradient of X (the sampling weights are fixed by the constant grid)
for _m, _p in (("linear", "zeros"), ("cubic", "border"), ("nearest", "reflection")):
    grad_case("grid_sample_%s_%s" % (_m, _p), "GridSample", {"x": u(1, 2, 3, 4)},
              consts={"grid": rng.uniform(-1.2, 1.2, size=(1, 2, 3, 2))},
              attrs={"mode": _m, "padding_mode": _p}, opset=20)
# CumProd: every exclusive/reverse form, on lines with exact zeros (one, two in a row, first, last)
_cp = u(3, 5)
_cp[0, 2] = 0
_cp[1, 1:3] = 0
_cp[2, [0, 4]] = 0
for _e in (0, 1):
    for _r in (0, 1):
        grad_case("cumprod_zeros_exclusive%d_reverse%d" % (_e, _r), "CumProd", {"x": _cp.copy()},
                  consts={"axis": np.array(1)}, attrs={"exclusive": _e, "reverse": _r}, opset=26)
