"""Writes an opset-23 ONNX Attention model: argv[1] the path, argv[2] a variant
(gqa_causal: 3-D inputs, grouped heads, causal, softcap; scores: the same
with the qk_matmul_output requested)."""
import sys

import onnx
from onnx import TensorProto, helper

path, variant = sys.argv[1], sys.argv[2]
outs = ["y", "", "", "qk"] if variant == "scores" else ["y"]
node = helper.make_node("Attention", ["q", "k", "v"], outs, q_num_heads=4, kv_num_heads=2, is_causal=1, softcap=30.0)
g = helper.make_graph(
    [node], "attention",
    [helper.make_tensor_value_info("q", TensorProto.FLOAT, [2, 5, 32]),
     helper.make_tensor_value_info("k", TensorProto.FLOAT, [2, 5, 16]),
     helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 5, 16])],
    [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]), path)
