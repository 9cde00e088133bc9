"""Class labels of ONNX losses (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss
with ignore_index and class weights, which novac writes as a one-hot
selection): a label outside [0, C) that is not the ignore_index is a run-time
error naming the tensor; ignore_index passes; constant labels are checked when
compiling; novarun --seed synthesizes labels in range."""
import os
import shutil
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from harness import NOVAC, NOVARUN, Failure, case, run, write_pb


def model(op, labels_const=None, **attrs):
    nodes = [h.make_node("Mul", ["x0", "w"], ["x"])]
    if op == "NegativeLogLikelihoodLoss":
        nodes.append(h.make_node("LogSoftmax", ["x"], ["lp"], axis=1))
        nodes.append(h.make_node(op, ["lp", "y"], ["loss"], **attrs))
    else:
        nodes.append(h.make_node(op, ["x", "y"], ["loss"], **attrs))
    inputs = [h.make_tensor_value_info("x0", T.FLOAT, [3, 4])]
    inits = [nh.from_array(np.linspace(0.5, 1.5, 12, dtype=np.float32).reshape(3, 4), "w")]
    if labels_const is None:
        inputs.append(h.make_tensor_value_info("y", T.INT64, [3]))
    else:
        nodes.insert(0, h.make_node("Constant", [], ["y"], value=nh.from_array(np.array(labels_const, np.int64))))
    g = h.make_graph(nodes, "labels", inputs, [h.make_tensor_value_info("loss", T.FLOAT, [])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def labels_case(name, op, labels, expect_error, **attrs):
    def go():
        d = tempfile.mkdtemp(prefix="nova-labels-")
        try:
            path, so, ind = os.path.join(d, "m.onnx"), os.path.join(d, "m.so"), os.path.join(d, "in")
            onnx.save(model(op, **attrs), path)
            run([NOVAC, path, "--train", "-o", so])
            os.mkdir(ind)
            write_pb(os.path.join(ind, "x0.pb"), np.ones((3, 4), np.float32), "x0")
            write_pb(os.path.join(ind, "y.pb"), np.array(labels, np.int64), "y")
            p = run([NOVARUN, so, "--inputs", ind, "--steps", "1", "-q"], expect_rc=None)
            if expect_error:
                if p.returncode == 0 or "tensor 'y'" not in p.stderr or "outside [0, 4)" not in p.stderr:
                    raise Failure("expected a run-time error naming 'y', got exit %d:\n%s" % (p.returncode, p.stderr))
            elif p.returncode != 0:
                raise Failure("novarun failed:\n%s" % p.stderr)
            # synthetic labels (--seed) lie in range
            run([NOVARUN, so, "--seed", "3", "--steps", "2", "-q"])
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("labels.%s" % name, go)


labels_case("sce_ignore_index_passes", "SoftmaxCrossEntropyLoss", [1, -100, 3], False, ignore_index=-100)
labels_case("sce_out_of_range", "SoftmaxCrossEntropyLoss", [1, 4, 3], True, ignore_index=-100)
labels_case("sce_negative", "SoftmaxCrossEntropyLoss", [1, -1, 3], True, ignore_index=-100)
labels_case("sce_fused_out_of_range", "SoftmaxCrossEntropyLoss", [0, 7, 2], True)
labels_case("nll_sum_out_of_range", "NegativeLogLikelihoodLoss", [3, 0, 9], True, reduction="sum")
labels_case("nll_ignore_index", "NegativeLogLikelihoodLoss", [2, 5, 0], False, ignore_index=5)


def constant_labels():
    d = tempfile.mkdtemp(prefix="nova-labels-")
    try:
        path = os.path.join(d, "m.onnx")
        onnx.save(model("SoftmaxCrossEntropyLoss", labels_const=[0, 6, 1], ignore_index=-1), path)
        p = run([NOVAC, path, "--train", "-o", os.path.join(d, "m.so")], expect_rc=1)
        if "constant class label 6 is outside [0, 4)" not in p.stderr:
            raise Failure("expected the constant label to be named:\n%s" % p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("labels.constant_out_of_range", constant_labels)
