"""Writes into DIR the opset-23 models of onnx_norm_rotary.test: one
RMSNormalization or RotaryEmbedding node each."""
import os
import sys

from onnx import TensorProto, helper

d = sys.argv[1]
F = TensorProto.FLOAT


def save(name, node, inputs, out_shape):
    g = helper.make_graph([node], name, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info("y", F, out_shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    with open(os.path.join(d, name + ".onnx"), "wb") as f:
        f.write(m.SerializeToString())


# the normalised axes [1, 3) of [2, 3, 4] flattened into one of 12
save("rms", helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=1, epsilon=0.25),
     [("x", F, [2, 3, 4]), ("w", F, [3, 4])], [2, 3, 4])
# [B, H, S, D] with position ids: the caches gathered, no transposes
save("rotary4d", helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"]),
     [("x", F, [2, 4, 3, 8]), ("c", F, [16, 4]), ("s", F, [16, 4]), ("p", TensorProto.INT64, [2, 3])], [2, 4, 3, 8])
# [B, S, hidden] with 2 heads, interleaved, half of each head rotated
save("rotary3d", helper.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"], interleaved=1, num_heads=2,
                                  rotary_embedding_dim=4),
     [("x", F, [2, 3, 16]), ("c", F, [2, 3, 2]), ("s", F, [2, 3, 2])], [2, 3, 16])
