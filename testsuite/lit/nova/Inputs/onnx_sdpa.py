"""Writes attention as exported op by op (MatMul with K transposed, a
scale, a mask, Softmax, MatMul with V): argv[1] the path, argv[2] the
variant:
  causal     Div by sqrt(8), Where(mask, -inf, scores) as masked_fill exports it
  finfo      the fill is finfo(float32).min and the mask an additive bias after it
  probs_out  causal, with the probabilities also an output (kept: not fused)
  fill_small the fill is -1e4 (not a mask that rounds every score away: not fused)
  rank3      heads merged into the batch ([B*H, T, D]), Mul by the scale
  div_zero   causal, but the scores divided by 0 (no finite scale: not fused)
and two helpers: `onnx_sdpa.py DIR causal_inputs` writes q, k, v (.pb) into
DIR; `onnx_sdpa.py A.pb compare B.pb` fails unless the tensors agree within
1e-5 of the largest magnitude."""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

path, variant = sys.argv[1], sys.argv[2]
B, H, T, D = 2, 4, 6, 8
if variant == "causal_inputs":
    import os
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(1)
    for n in "qkv":
        with open(os.path.join(path, n + ".pb"), "wb") as f:
            f.write(numpy_helper.from_array((3 * rng.standard_normal((B, H, T, D))).astype(np.float32), n)
                    .SerializeToString())
    sys.exit(0)
if variant == "compare":
    a, b = (numpy_helper.to_array(onnx.load_tensor(f)).astype(np.float64) for f in (path, sys.argv[3]))
    err = np.max(np.abs(a - b))
    print("max |difference| %g of %g" % (err, np.max(np.abs(a))))
    sys.exit(0 if a.shape == b.shape and err <= 1e-5 * np.max(np.abs(a)) else 1)
shape = [B * H, T, D] if variant == "rank3" else [B, H, T, D]
perm = [0, 2, 1] if variant == "rank3" else [0, 1, 3, 2]
inits = [numpy_helper.from_array(~np.tril(np.ones((T, T), bool)), "above")]  # (a buffer: an initializer)
consts = {"sqrt_d": np.array(0 if variant == "div_zero" else 8 ** 0.5, np.float32), "inv_sqrt_d": np.array(8 ** -0.5, np.float32),
          "ninf": np.array(-np.inf, np.float32), "fmin": np.array(np.finfo(np.float32).min, np.float32),
          "small": np.array(-1e4, np.float32),
          "pad_bias": np.where(np.arange(T) < T - 1, 0, np.finfo(np.float32).min).astype(np.float32).reshape(1, 1, 1, T)}
# scalars as the torch exporters write them: Constant nodes
nodes = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(a, n)) for n, a in consts.items()]
nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=perm))
nodes.append(helper.make_node("MatMul", ["q", "kt"], ["s"]))
if variant == "rank3":
    nodes.append(helper.make_node("Mul", ["s", "inv_sqrt_d"], ["z"]))
else:
    nodes.append(helper.make_node("Div", ["s", "sqrt_d"], ["s1"]))
    fill = {"finfo": "fmin", "fill_small": "small"}.get(variant, "ninf")
    nodes.append(helper.make_node("Where", ["above", fill, "s1"], ["s2" if variant == "finfo" else "z"]))
    if variant == "finfo":
        nodes.append(helper.make_node("Add", ["s2", "pad_bias"], ["z"]))
nodes.append(helper.make_node("Softmax", ["z"], ["p"], axis=-1))
nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
if variant == "probs_out":
    outs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
g = helper.make_graph(nodes, "sdpa", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
                      outs, inits)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
