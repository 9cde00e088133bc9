"""Writes a linear classifier trained with SoftmaxCrossEntropyLoss as the
torch exporters write F.cross_entropy(logits.view(-1, V), y.view(-1)):
logits = x W of 4 x 16 positions, 40 classes, ignore_index -100 (its
default); argv[1] the path."""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 40)).astype(np.float32) * 0.1, "w")
nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]),
         helper.make_node("Constant", [], ["s2"], value=numpy_helper.from_array(np.array([64, 40], np.int64))),
         helper.make_node("Constant", [], ["s1"], value=numpy_helper.from_array(np.array([64], np.int64))),
         helper.make_node("Reshape", ["logits", "s2"], ["l2"]),
         helper.make_node("Reshape", ["y", "s1"], ["y1"]),
         helper.make_node("SoftmaxCrossEntropyLoss", ["l2", "y1"], ["loss"], reduction="mean", ignore_index=-100)]
g = helper.make_graph(nodes, "xent",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, 16]),
                       helper.make_tensor_value_info("y", TensorProto.INT64, [4, 16])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 16, 40]),
                       helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
