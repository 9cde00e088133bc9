"""Which ONNX initializers --train trains (novac(1), TRAINING): parameters,
buffers and constants, decided by BatchNormalization's running-statistic
inputs, training_info, the dynamo exporter's InputSpec.kind metadata,
PyTorch buffer names, differentiable paths to the loss, --freeze and
--train-only; the manifest's "initializers" list; the warning for a
buffer-like name on a gradient path; bad patterns.

Models are built here with the onnx helper; gradients and updated
parameters are checked against numpy."""
import json
import os
import shutil
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness import NOVAC, NOVARUN, Failure, case, check_close, read_pb, run, write_pb

F = TensorProto.FLOAT
KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 3)).astype(np.float32)
W = RNG.standard_normal((5, 3)).astype(np.float32)
B = RNG.standard_normal(5).astype(np.float32)
S = (1 + 0.1 * RNG.standard_normal(5)).astype(np.float32)
BB = (0.1 * RNG.standard_normal(5)).astype(np.float32)
MEAN = (0.2 * RNG.standard_normal(5)).astype(np.float32)
VAR = (1 + 0.2 * RNG.random(5)).astype(np.float32)


def init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def save(nodes, inits, loss_shape=(), value_info=(), training_info=None, path=None):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", F, [4, 3])],
                          [helper.make_tensor_value_info("loss", F, list(loss_shape))], initializer=inits,
                          value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="novac-testsuite")
    m.ir_version = 8
    if training_info is not None:
        m.training_info.append(training_info)
    onnx.save(m, path)


class Step:
    """A model compiled with --train and trained on X."""

    def __init__(self, nodes, inits, flags=(), value_info=(), training_info=None, steps=1):
        self.d = tempfile.mkdtemp(prefix="nova-roles-")
        try:
            model = os.path.join(self.d, "m.onnx")
            save(nodes, inits, value_info=value_info, training_info=training_info, path=model)
            so = os.path.join(self.d, "m.so")
            self.compile = run([NOVAC, model, "--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1", "-o", so] + list(flags))
            self.manifest = json.load(open(os.path.join(self.d, "m.json")))
            ind = os.path.join(self.d, "in")
            os.mkdir(ind)
            write_pb(os.path.join(ind, "x.pb"), X, "x")
            dump = os.path.join(self.d, "dump")
            run([NOVARUN, so, "--inputs", ind, "--steps", str(steps), "--dump", dump, "-q"])
            self.dump = {fn[:-3]: read_pb(os.path.join(dump, fn)) for fn in os.listdir(dump)}
        finally:
            shutil.rmtree(self.d, ignore_errors=True)

    def role(self, name):
        for e in self.manifest["initializers"]:
            if e["name"] == name:
                return e["role"], e["storage"], e["reason"]
        raise Failure("initializer '%s' is not in the manifest's initializers" % name)

    def expect(self, name, role, storage, reason):
        got = self.role(name)
        if got[0] != role or got[1] != storage or reason not in got[2]:
            raise Failure("initializer '%s': %s, expected role %s, storage %s, reason with '%s'" %
                          (name, got, role, storage, reason))

    def trained(self):
        return sorted(k[5:] for k in self.dump if k.startswith("grad."))

    def tensors(self):
        return {t["name"]: t["role"] for t in self.manifest["tensors"]}


def gemm_bn_nodes():
    """loss = mean(BN(x W^T + b)^2), BatchNormalization in inference mode."""
    return [helper.make_node("Gemm", ["x", "W", "b"], ["z"], transB=1),
            helper.make_node("BatchNormalization", ["z", "s", "bb", "bn.running_mean", "bn.running_var"], ["y"],
                             name="bn", epsilon=1e-5),
            helper.make_node("Mul", ["y", "y"], ["y2"]),
            helper.make_node("ReduceMean", ["y2"], ["loss"], keepdims=0)]


def gemm_bn_inits():
    return [init("W", W), init("b", B), init("s", S), init("bb", BB), init("bn.running_mean", MEAN),
            init("bn.running_var", VAR)]


def bn_eval_reference():
    """(loss, dict of gradients) in float64."""
    x, w = X.astype(np.float64), W.astype(np.float64)
    z = x @ w.T + B
    r = S / np.sqrt(VAR.astype(np.float64) + 1e-5)
    y = (z - MEAN) * r + BB
    gy = 2 * y / y.size
    gz = gy * r
    return (y * y).mean(), {"W": gz.T @ x, "b": gz.sum(0), "s": (gy * (z - MEAN) / np.sqrt(VAR + 1e-5)).sum(0),
                            "bb": gy.sum(0)}


def bn_eval_stats_are_buffers():
    st = Step(gemm_bn_nodes(), gemm_bn_inits(), steps=2)
    for n in ("bn.running_mean", "bn.running_var"):
        st.expect(n, "buffer", "folded", "BatchNormalization 'bn' (inference mode)")
        if n in st.tensors():
            raise Failure("the running statistic '%s' is a tensor of the step: %s" % (n, st.tensors()[n]))
    for n in ("W", "b", "s", "bb"):
        st.expect(n, "param", "tensor", "differentiable path")
    if st.trained() != ["W", "b", "bb", "s"]:
        raise Failure("trained %s, expected W, b, bb, s" % st.trained())
    # two SGD steps with the statistics unchanged: the second step's gradient from the updated params
    _, g0 = bn_eval_reference()
    global W, B, S, BB
    saved = (W, B, S, BB)
    try:
        W, B, S, BB = (W - 0.1 * g0["W"]).astype(np.float32), (B - 0.1 * g0["b"]).astype(np.float32), \
            (S - 0.1 * g0["s"]).astype(np.float32), (BB - 0.1 * g0["bb"]).astype(np.float32)
        loss, g1 = bn_eval_reference()
    finally:
        W, B, S, BB = saved
    check_close(st.dump["loss"], loss, 1e-5, "loss of step 2")
    for k in g1:
        check_close(st.dump["grad." + k], g1[k], 1e-4, "gradient of %s in step 2" % k)


def training_info_names_the_params():
    ti = onnx.TrainingInfoProto()
    ti.algorithm.CopyFrom(helper.make_graph([], "algorithm", [], []))
    ti.update_binding.add(key="W", value="W_new")
    ti.update_binding.add(key="bb", value="bb_new")
    st = Step(gemm_bn_nodes(), gemm_bn_inits(), training_info=ti)
    st.expect("W", "param", "tensor", "training_info: named in an update_binding")
    st.expect("bb", "param", "tensor", "training_info")
    st.expect("b", "constant", "folded", "training_info: not named in any update_binding")
    st.expect("s", "constant", "folded", "not named")
    st.expect("bn.running_mean", "buffer", "folded", "BatchNormalization")
    if st.trained() != ["W", "bb"]:
        raise Failure("trained %s, expected W and bb" % st.trained())
    _, g = bn_eval_reference()
    check_close(st.dump["grad.W"], g["W"], 1e-4, "gradient of W")
    check_close(st.dump["param.W"], W - 0.1 * g["W"], 1e-5, "W after the step")


def dynamo_metadata_decides():
    """As torch.onnx.export(dynamo=True, optimize=False) writes it: value_info entries of the
    initializers carrying InputSpec.kind."""
    vis = []
    for name, kind in (("W", "PARAMETER"), ("b", "BUFFER"), ("s", "CONSTANT_TENSOR"), ("bb", "PARAMETER")):
        v = helper.make_tensor_value_info(name, F, None)
        v.metadata_props.add(key=KIND, value=kind)
        v.metadata_props.add(key="pkg.torch.export.graph_signature.InputSpec.persistent", value="None")
        vis.append(v)
    st = Step(gemm_bn_nodes(), gemm_bn_inits(), value_info=vis)
    st.expect("W", "param", "tensor", "InputSpec.kind PARAMETER")
    st.expect("b", "buffer", "folded", "InputSpec.kind BUFFER")
    st.expect("s", "constant", "folded", "InputSpec.kind CONSTANT_TENSOR")
    if st.trained() != ["W", "bb"]:
        raise Failure("trained %s, expected W and bb" % st.trained())


def train_only():
    st = Step(gemm_bn_nodes(), gemm_bn_inits(), flags=["--train-only=W,s"])
    st.expect("W", "param", "tensor", "--train-only")
    st.expect("b", "constant", "folded", "not matched by --train-only")
    st.expect("bb", "constant", "folded", "not matched by --train-only")
    if st.trained() != ["W", "s"]:
        raise Failure("trained %s, expected W and s" % st.trained())
    _, g = bn_eval_reference()
    check_close(st.dump["grad.s"], g["s"], 1e-4, "gradient of s")
    st = Step(gemm_bn_nodes(), gemm_bn_inits(), flags=["--freeze=b*"])
    st.expect("b", "constant", "folded", "--freeze")
    st.expect("bb", "constant", "folded", "--freeze")
    if st.trained() != ["W", "s"]:
        raise Failure("--freeze=b*: trained %s, expected W and s" % st.trained())


def no_differentiable_path():
    """thr only feeds a comparison (a mask): a constant, folded; W is trained."""
    nodes = [helper.make_node("MatMul", ["x", "Wt"], ["z"]),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0))),
             helper.make_node("Greater", ["z", "thr"], ["m"]),
             helper.make_node("Where", ["m", "z", "zero"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0)]
    inits = [init("Wt", W.T.copy()), init("thr", np.float32(0.1))]
    st = Step(nodes, inits)
    st.expect("thr", "constant", "folded", "no differentiable path to the loss")
    st.expect("Wt", "param", "tensor", "differentiable path")
    if "thr" in st.tensors() or st.trained() != ["Wt"]:
        raise Failure("thr is a tensor (%s) or the trained set is %s" % (st.tensors(), st.trained()))
    z = X.astype(np.float64) @ W.T
    check_close(st.dump["grad.Wt"], X.T.astype(np.float64) @ (z > 0.1), 1e-5, "gradient of Wt")


def no_path_with_dropout():
    """The same with a training-mode Dropout before the mask: the first import (which finds the
    differentiable paths) builds the dropout too."""
    nodes = [helper.make_node("MatMul", ["x", "Wt"], ["z"]),
             helper.make_node("Constant", [], ["p"], value=numpy_helper.from_array(np.float32(0.25))),
             helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.bool_(True))),
             helper.make_node("Dropout", ["z", "p", "t"], ["d"]),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0))),
             helper.make_node("Greater", ["d", "thr"], ["m"]),
             helper.make_node("Where", ["m", "d", "zero"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0)]
    st = Step(nodes, [init("Wt", W.T.copy()), init("thr", np.float32(0.1))])
    st.expect("thr", "constant", "folded", "no differentiable path to the loss")
    if st.trained() != ["Wt"]:
        raise Failure("trained %s, expected Wt" % st.trained())


def buffer_name_warning():
    """rope.inv_freq: a buffer by its name, on a gradient path: a warning, kept a buffer."""
    nodes = [helper.make_node("MatMul", ["x", "Wt"], ["z"]),
             helper.make_node("Mul", ["z", "rope.inv_freq"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0)]
    inits = [init("Wt", W.T.copy()), init("rope.inv_freq", np.linspace(1, 2, 5).astype(np.float32))]
    st = Step(nodes, inits)
    err = st.compile.stderr
    for want in ("warning: initializer 'rope.inv_freq' is named like a PyTorch buffer", "kept a buffer",
                 "--train-only", "--freeze"):
        if want not in err:
            raise Failure("the warning lacks '%s':\n%s" % (want, err))
    st.expect("rope.inv_freq", "buffer", "folded", "named like a PyTorch buffer")
    if st.trained() != ["Wt"]:
        raise Failure("trained %s, expected Wt" % st.trained())
    st = Step(nodes, inits, flags=["--train-only=Wt,rope.*"])
    if "warning" in st.compile.stderr or st.trained() != ["Wt", "rope.inv_freq"]:
        raise Failure("--train-only=Wt,rope.*: trained %s\n%s" % (st.trained(), st.compile.stderr))


def quantized_nodes(with_float_term):
    """z = x Wt; loss = sum(Dequantize(QLinearMatMul(Quantize(z), Wq))) (+ sum(z^2)): the quantized
    operators have integer results, no gradient flows through them."""
    u8 = lambda v: np.array(v, dtype=np.uint8)
    nodes = [helper.make_node("MatMul", ["x", "Wt"], ["z"]),
             helper.make_node("QuantizeLinear", ["z", "zs", "zzp"], ["zq"]),
             helper.make_node("QLinearMatMul", ["zq", "zs", "zzp", "Wq", "ws", "wzp", "ys", "yzp"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yzp"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["lq"], keepdims=0)]
    if with_float_term:
        nodes += [helper.make_node("Mul", ["z", "z"], ["z2"]), helper.make_node("ReduceSum", ["z2"], ["lz"], keepdims=0),
                  helper.make_node("Add", ["lq", "lz"], ["loss"])]
    else:
        nodes[-1].output[0] = "loss"
    inits = [init("Wt", W.T.copy()), init("zs", np.float32(0.05)), init("zzp", u8(128)),
             init("Wq", RNG.integers(0, 256, (5, 2)).astype(np.uint8)), init("ws", np.float32(0.02)), init("wzp", u8(120)),
             init("ys", np.float32(0.1)), init("yzp", u8(100))]
    return nodes, inits


def quantized_ops_are_constant():
    """QLinearMatMul between Quantize- and DequantizeLinear: Wt is trained through the float term
    only, the scales of Quantize and QLinearMatMul are constants (ys is DequantizeLinear's too:
    trained); without the float term, and ys frozen, nothing is trainable."""
    st = Step(*quantized_nodes(True))
    for n in ("zs", "ws"):
        st.expect(n, "constant", "folded", "no differentiable path to the loss")
    st.expect("Wq", "constant", "folded", "not floating-point")
    if st.trained() != ["Wt", "ys"]:
        raise Failure("trained %s, expected Wt and ys" % st.trained())
    z = X.astype(np.float64) @ W.T
    check_close(st.dump["grad.Wt"], 2 * X.T.astype(np.float64) @ z, 1e-5, "gradient of Wt")
    d = tempfile.mkdtemp(prefix="nova-roles-")
    try:
        model = os.path.join(d, "m.onnx")
        save(*quantized_nodes(False), path=model)
        p = run([NOVAC, model, "--train", "--freeze=ys", "-o", os.path.join(d, "m.so")], expect_rc=1)
        if "no trainable parameters" not in p.stderr:
            raise Failure("a loss reached only through quantized operators: %s" % p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bad_patterns():
    d = tempfile.mkdtemp(prefix="nova-roles-")
    try:
        model = os.path.join(d, "m.onnx")
        save(gemm_bn_nodes(), gemm_bn_inits(), path=model)
        so = os.path.join(d, "m.so")
        for flags, rc, want in ((["--train", "--train-only=W,nomatch"], 1,
                                 "--train-only: pattern 2 of 'W,nomatch' matches no initializer"),
                                (["--train", "--freeze=zz*"], 1, "--freeze: pattern 1 of 'zz*' matches no initializer"),
                                (["--train", "--train-only="], 2, "--train-only takes 1 to 64 non-empty patterns"),
                                (["--train", "--freeze=W,,b"], 2, "--freeze takes 1 to 64 non-empty patterns"),
                                (["--train-only=W"], 1, "--loss, --freeze and --train-only need --train"),
                                (["--train", "--train-only=s", "--freeze=s"], 1,
                                 "--train: the model has no trainable parameters")):
            p = run([NOVAC, model, "-o", so] + flags, expect_rc=rc)
            if want not in p.stderr or os.path.exists(so):
                raise Failure("%s: exit %d, stderr lacks '%s' (or a step was written):\n%s" %
                              (" ".join(flags), rc, want, p.stderr))
        if rc == 1 and not p.stderr.startswith("novac: error") and not p.stderr.startswith(model):
            raise Failure("diagnostic not at the model: " + p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("train_roles.bn_eval_stats_are_buffers", bn_eval_stats_are_buffers)
case("train_roles.training_info", training_info_names_the_params)
case("train_roles.dynamo_metadata", dynamo_metadata_decides)
case("train_roles.train_only_and_freeze", train_only)
case("train_roles.no_differentiable_path", no_differentiable_path)
case("train_roles.no_differentiable_path_with_dropout", no_path_with_dropout)
case("train_roles.buffer_name_warning", buffer_name_warning)
case("train_roles.bad_patterns", bad_patterns)
case("train_roles.quantized_ops_are_constant", quantized_ops_are_constant)
