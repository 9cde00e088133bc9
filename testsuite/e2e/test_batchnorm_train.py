"""BatchNormalization in training mode (training_mode=1) under --train:

- the forward normalizes with the batch statistics, and the gradient flows
  through them: every gradient of an f64 model against central finite
  differences of an independent numpy float64 forward (relative error
  <= 1e-6);
- the running mean and variance are buffers of the step, updated by every
  step (running = momentum running + (1 - momentum) batch statistic, with
  PyTorch's unbiased variance n/(n-1) for the running variance, where the
  ONNX operator's reference takes the population variance), kept across
  steps (numpy reference over 3 steps), saved and restored by novarun
  --save/--load, and equal to the node's running_mean/running_var outputs
  when the model asks for them;
- against PyTorch itself: the running statistics of testsuite/zoo's
  dropbn_train.ts after one step (its Dropout made an Identity: the
  statistics precede it);
- a batch with a NaN: the step is skipped (novarun --skip-nonfinite) and
  leaves the running statistics as they were, bit for bit: training on
  batches 1, NaN, 3 ends where training on batches 1, 3 does.

Models are built here with the onnx helper."""
import json
import os
import shutil
import struct
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness import NOVAC, NOVARUN, Failure, case, check_close, read_pb, rel_err, run, write_pb

MOM, EPS = 0.9, 1e-5
RNG = np.random.default_rng(11)
X = RNG.standard_normal((4, 2, 3))                 # (N, L, K)
W = RNG.standard_normal((3, 3))                    # (K, C)
S = 1 + 0.2 * RNG.standard_normal(3)
BB = 0.1 * RNG.standard_normal(3)
RM = 0.3 * RNG.standard_normal(3)
RV = 1 + 0.3 * RNG.random(3)
WGT = RNG.standard_normal((4, 3, 2))               # loss = sum(y * WGT)


def forward(x, w, s, bb, unbiased=False):
    """(loss, batch mean, batch variance) in float64: the population variance normalizes, the
    unbiased one (n/(n-1), as PyTorch) updates the running variance."""
    z = np.transpose(x @ w, (0, 2, 1))            # (N, C, L)
    mu = z.mean(axis=(0, 2))
    var = z.var(axis=(0, 2))
    y = (z - mu[None, :, None]) / np.sqrt(var[None, :, None] + EPS) * s[None, :, None] + bb[None, :, None]
    return (y * WGT).sum(), mu, z.var(axis=(0, 2), ddof=1) if unbiased else var


def model(path, dtype, stats_out=False):
    T = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    bn_out = ["y", "rm_out", "rv_out"] if stats_out else ["y"]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Transpose", ["xw"], ["z"], perm=[0, 2, 1]),
             helper.make_node("BatchNormalization", ["z", "s", "bb", "bn.running_mean", "bn.running_var"], bn_out,
                              name="bn", epsilon=EPS, momentum=MOM, training_mode=1),
             helper.make_node("Constant", [], ["wgt"], value=numpy_helper.from_array(WGT.astype(dtype))),
             helper.make_node("Mul", ["y", "wgt"], ["yw"]),
             helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0)]
    inits = [numpy_helper.from_array(a.astype(dtype), n) for n, a in
             (("W", W), ("s", S), ("bb", BB), ("bn.running_mean", RM), ("bn.running_var", RV))]
    outs = [helper.make_tensor_value_info("loss", T, [])]
    if stats_out:
        outs += [helper.make_tensor_value_info("rm_out", T, [3]), helper.make_tensor_value_info("rv_out", T, [3])]
    g = helper.make_graph(nodes, "bn_train", [helper.make_tensor_value_info("x", T, [4, 2, 3])], outs,
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)], producer_name="novac-testsuite")
    m.ir_version = 8
    onnx.save(m, path)


def st_write(path, tensors):
    """A safetensors file of float32 TENSORS (a dict), for novarun --data."""
    header, data = {}, b""
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


class Work:
    def __init__(self):
        self.d = tempfile.mkdtemp(prefix="nova-bn-")

    def __enter__(self):
        return self

    def __exit__(self, *a):
        shutil.rmtree(self.d, ignore_errors=True)

    def p(self, name):
        return os.path.join(self.d, name)

    def compile(self, dtype, lr, stats_out=False):
        model(self.p("m.onnx"), dtype, stats_out)
        run([NOVAC, self.p("m.onnx"), "--train", "--keep-grads", "--optimizer=sgd", "--lr=%g" % lr, "-o", self.p("m.so")])
        os.makedirs(self.p("in"), exist_ok=True)
        write_pb(self.p("in/x.pb"), X.astype(dtype), "x")
        return json.load(open(self.p("m.json")))

    def train(self, steps, tag, extra=()):
        dump = self.p("dump-" + tag)
        run([NOVARUN, self.p("m.so"), "--inputs", self.p("in"), "--steps", str(steps), "--dump", dump,
             "--outputs", self.p("out-" + tag), "-q"] + list(extra))
        return {fn[:-3]: read_pb(os.path.join(dump, fn)) for fn in os.listdir(dump)}


def fd_grad(name, h0=1e-6):
    P = {"W": W, "s": S, "bb": BB}
    g = np.zeros_like(P[name])
    for i in np.ndindex(*P[name].shape):
        h = h0 * max(1.0, abs(P[name][i]))
        v = {k: a.copy() for k, a in P.items()}
        v[name][i] += h
        lp = forward(X, v["W"], v["s"], v["bb"])[0]
        v[name][i] -= 2 * h
        lm = forward(X, v["W"], v["s"], v["bb"])[0]
        g[i] = (lp - lm) / (2 * h)
    return g


def gradients_through_batch_statistics():
    with Work() as w:
        w.compile(np.float64, 0)
        got = w.train(1, "g")
        check_close(got["loss"], forward(X, W, S, BB)[0], 1e-12, "loss (batch statistics)")
        for n in ("W", "s", "bb"):
            e = rel_err(got["grad." + n], fd_grad(n))
            if not e <= 1e-6:
                raise Failure("gradient of %s: relative error %.3g against finite differences > 1e-6" % (n, e))
        # the batch statistics matter: with the running ones the W gradient would differ
        if rel_err(got["grad.W"], np.zeros_like(W)) < 1e-3:
            raise Failure("the gradient of W vanishes: the test does not exercise the batch statistics")


def running_statistics_updated():
    with Work() as w:
        man = w.compile(np.float32, 0)
        roles = {t["name"]: (t["role"], t.get("updates")) for t in man["tensors"]}
        if roles.get("bn.running_mean") != ("buffer", None) or roles.get("bn.running_var.next") != \
                ("update", "bn.running_var"):
            raise Failure("tensors: %s" % roles)
        inits = {e["name"]: (e["role"], e["storage"]) for e in man["initializers"]}
        if inits["bn.running_mean"] != ("buffer", "tensor") or "grad.bn.running_mean" in roles:
            raise Failure("initializers: %s" % inits)
        _, mu, var = forward(X, W, S, BB, unbiased=True)
        rm, rv = RM.copy(), RV.copy()
        for k in (1, 3):
            got = w.train(k, "s%d" % k)
            rm_k = MOM ** k * RM + (1 - MOM ** k) * mu
            rv_k = MOM ** k * RV + (1 - MOM ** k) * var
            check_close(got["buffer.bn.running_mean"], rm_k, 1e-6, "running mean after %d steps" % k)
            check_close(got["buffer.bn.running_var"], rv_k, 1e-6, "running variance after %d steps" % k)
            if "grad.bn.running_mean" in got or "param.bn.running_mean" in got:
                raise Failure("the running mean is trained")
        del rm, rv


def running_statistics_checkpointed():
    with Work() as w:
        w.compile(np.float32, 0.05)
        whole = w.train(3, "whole")
        if rel_err(whole["buffer.bn.running_mean"], RM) < 1e-3:
            raise Failure("the running mean did not change in 3 steps")
        w.train(2, "first", ["--save", w.p("ck.safetensors")])
        blob = open(w.p("ck.safetensors"), "rb").read()
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
        if "bn.running_mean" not in header or "bn.running_var" not in header:
            raise Failure("the checkpoint lacks the running statistics: %s" % sorted(header))
        rest = w.train(1, "rest", ["--load", w.p("ck.safetensors")])
        for k in ("buffer.bn.running_mean", "buffer.bn.running_var", "param.W"):
            if not np.array_equal(rest[k], whole[k]):
                raise Failure("%s: 2 steps + --save/--load + 1 step differs from 3 steps\n %s\n %s" %
                              (k, rest[k], whole[k]))


def running_statistics_as_outputs():
    with Work() as w:
        w.compile(np.float32, 0, stats_out=True)
        got = w.train(1, "o")
        _, mu, var = forward(X, W, S, BB, unbiased=True)
        check_close(read_pb(w.p("out-o/output_1.pb")), MOM * RM + (1 - MOM) * mu, 1e-6, "running_mean output")
        check_close(read_pb(w.p("out-o/output_2.pb")), MOM * RV + (1 - MOM) * var, 1e-6, "running_var output")
        check_close(got["buffer.bn.running_var"], MOM * RV + (1 - MOM) * var, 1e-6, "running variance buffer")


def running_statistics_match_pytorch():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "zoo", "dropbn_train.ts")
    data = os.path.join(src, "test_data_set_0")
    m = onnx.load(os.path.join(src, "model.onnx"))
    for i, n in enumerate(m.graph.node):
        if n.op_type == "Dropout":  # after both BatchNormalizations: the statistics do not depend on it
            m.graph.node[i].CopyFrom(helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name))
    with Work() as w:
        onnx.save(m, w.p("m.onnx"))
        run([NOVAC, w.p("m.onnx"), "--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1", "-o", w.p("m.so")])
        dump = w.p("dump")
        run([NOVARUN, w.p("m.so"), "--inputs", data, "--steps", "1", "--dump", dump, "-q"])
        n = 0
        for fn in sorted(os.listdir(os.path.join(data, "running_stats"))):
            name = fn[len("param."):-len(".pb")]
            got = read_pb(os.path.join(dump, "buffer.%s.pb" % name))
            check_close(got, read_pb(os.path.join(data, "running_stats", fn)), 1e-5,
                        "%s after one step (PyTorch's)" % name)
            n += 1
        if n != 4:
            raise Failure("%d running statistics checked, expected 4" % n)


def running_statistics_kept_on_nonfinite():
    with Work() as w:
        w.compile(np.float32, 0.05)
        x3 = 0.5 * X[::-1]
        bad = X.copy()
        bad[1, 0, 2] = np.nan
        st_write(w.p("bad.st"), {"x": np.concatenate([X, bad, x3])})
        st_write(w.p("good.st"), {"x": np.concatenate([X, x3])})
        got = {}
        for tag, data, steps, extra in (("bad", "bad.st", 3, ["--skip-nonfinite"]), ("good", "good.st", 2, [])):
            dump = w.p("dump-" + tag)
            out = run([NOVARUN, w.p("m.so"), "--data", w.p(data), "--steps", str(steps), "--dump", dump] + extra)
            got[tag] = {fn[:-3]: read_pb(os.path.join(dump, fn)) for fn in os.listdir(dump)}
            if tag == "bad" and "1 of 3 steps skipped" not in out.stderr:
                raise Failure("novarun did not report the skipped step: %s" % out.stderr)
        for k in ("buffer.bn.running_mean", "buffer.bn.running_var", "param.W", "param.s", "param.bb"):
            if got["bad"][k].tobytes() != got["good"][k].tobytes():
                raise Failure("%s: batches 1, NaN, 3 (skipped) differ from batches 1, 3\n %s\n %s" %
                              (k, got["bad"][k], got["good"][k]))


case("batchnorm_train.gradients_through_batch_statistics", gradients_through_batch_statistics)
case("batchnorm_train.running_statistics_updated", running_statistics_updated)
case("batchnorm_train.running_statistics_checkpointed", running_statistics_checkpointed)
case("batchnorm_train.running_statistics_as_outputs", running_statistics_as_outputs)
case("batchnorm_train.running_statistics_match_pytorch", running_statistics_match_pytorch)
case("batchnorm_train.running_statistics_kept_on_nonfinite", running_statistics_kept_on_nonfinite)
