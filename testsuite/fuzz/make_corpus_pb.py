"""make_corpus_pb.py DIR: TensorProto seeds of fuzz_pb.c that the ONNX backend
tests' .pb files (all raw_data) do not cover: values in the typed fields of
every dtype novarun reads, and protos its reader refuses."""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

T = TensorProto


def cases():
    yield "float_data", helper.make_tensor("x", T.FLOAT, [2, 3], [1, 2, 3, 4, 5, 6])
    yield "double_data", helper.make_tensor("x", T.DOUBLE, [3], [0.5, -1, 2])
    yield "int64_data", helper.make_tensor("idx", T.INT64, [4], [4, 0, 2, 1])
    yield "int32_data", helper.make_tensor("lbl", T.INT32, [2], [1, -2])
    for name, dt in [("int16", T.INT16), ("int8", T.INT8), ("uint8", T.UINT8), ("uint16", T.UINT16),
                     ("bool", T.BOOL)]:
        yield name + "_typed", helper.make_tensor("t", dt, [2, 2], [1, 0, 1, 1])
    yield "uint32_typed", helper.make_tensor("t", T.UINT32, [2], [1, 7])
    yield "uint64_typed", helper.make_tensor("t", T.UINT64, [2], [1, 7])
    yield "float16_typed", helper.make_tensor("h", T.FLOAT16, [3], np.array([1, -2, 0.5], np.float16))
    yield "bfloat16_typed", helper.make_tensor("b", T.BFLOAT16, [2], [1.0, -3.0])
    yield "bfloat16_raw", helper.make_tensor("b", T.BFLOAT16, [2], b"\x80\x3f\x40\xc0", raw=True)
    yield "scalar", helper.make_tensor("s", T.FLOAT, [], [3.5])
    yield "empty", helper.make_tensor("e", T.FLOAT, [0, 3], [])
    yield "rank_8", numpy_helper.from_array(np.zeros((1,) * 8, np.float32), "r")
    yield "rank_9", numpy_helper.from_array(np.zeros((1,) * 9, np.float32), "r")
    yield "string", helper.make_tensor("s", T.STRING, [1], [b"abc"])
    yield "complex64", helper.make_tensor("c", T.COMPLEX64, [1], [1 + 2j])
    p = helper.make_tensor("x", T.FLOAT, [2], [1, 2])
    p.raw_data = b"\0" * 8
    yield "raw_and_typed", p
    yield "raw_short", T(name="x", data_type=T.FLOAT, dims=[2, 2], raw_data=b"\0" * 12)
    yield "negative_dim", T(name="x", data_type=T.FLOAT, dims=[-1])
    yield "huge_dims", T(name="x", data_type=T.UINT8, dims=[1 << 40, 1 << 40], raw_data=b"")
    yield "typed_wrong_field", T(name="x", data_type=T.INT64, dims=[2], int32_data=[1, 2])
    p = helper.make_tensor("x", T.FLOAT, [1], [1.0])
    p.data_location = T.EXTERNAL
    yield "external", p
    p = helper.make_tensor("x", T.FLOAT, [1], [1.0])
    p.segment.begin, p.segment.end = 0, 1
    yield "segment", p
    yield "no_data_type", T(name="x", dims=[1], float_data=[1.0])


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, proto in cases():
        with open(os.path.join(out, name + ".pb"), "wb") as f:
            f.write(proto.SerializeToString())


if __name__ == "__main__":
    main()
