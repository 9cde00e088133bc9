"""The evaluation entry of a training step (nova_step_eval, novarun --eval):

- examples/mlp.nova: after 3 SGD steps, the evaluation's loss is the loss
  step 4 reports (the forward with the current parameters), and evaluating
  changes no parameter (--dump after --steps 3 --eval equals --dump after
  --steps 3);
- a BatchNormalization in training mode: the evaluation normalizes with
  the running statistics (numpy reference after 2 steps), leaves them as
  they are, and its running_mean/var outputs are the running statistics;
- a forward step has none: novarun --eval fails naming it, nova_step_eval
  returns NOVA_ERR_NO_ENTRY (11) through ctypes."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness import BUILD, NOVAC, NOVARUN, Failure, case, check_close, read_pb, run, write_pb

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MLP = os.path.join(ROOT, "examples", "mlp.nova")
MLP_DATA = os.path.join(ROOT, "examples", "data", "mlp")
MOM, EPS = 0.9, 1e-5
RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 3, 2)).astype(np.float32)   # (N, C, L)
S = (1 + 0.2 * RNG.standard_normal(3)).astype(np.float32)
BB = (0.1 * RNG.standard_normal(3)).astype(np.float32)
RM = (0.3 * RNG.standard_normal(3)).astype(np.float32)
RV = (1 + 0.3 * RNG.random(3)).astype(np.float32)
WGT = RNG.standard_normal((4, 3, 2)).astype(np.float32)


class Work:
    def __enter__(self):
        self.d = tempfile.mkdtemp(prefix="nova-eval-")
        return self

    def __exit__(self, *a):
        shutil.rmtree(self.d, ignore_errors=True)

    def p(self, name):
        return os.path.join(self.d, name)


def load_dir(d):
    return {fn[:-3]: read_pb(os.path.join(d, fn)) for fn in os.listdir(d)}


def mlp_eval_is_the_next_forward():
    with Work() as w:
        so = w.p("mlp.so")
        run([NOVAC, MLP, "--dim=batch=8", "--train", "--optimizer=momentum", "--lr=0.05", "-o", so])
        run([NOVARUN, so, "--inputs", MLP_DATA, "--steps", "4", "--loss-log", w.p("log"), "-q"])
        step4 = float(open(w.p("log")).read().split("\n")[3].split()[1])
        run([NOVARUN, so, "--inputs", MLP_DATA, "--steps", "3", "--eval", "--outputs", w.p("out"), "--dump",
             w.p("a"), "-q"])
        run([NOVARUN, so, "--inputs", MLP_DATA, "--steps", "3", "--dump", w.p("b"), "-q"])
        got = float(read_pb(w.p("out/output_1.pb")))
        if abs(got - step4) > 1e-6 * abs(step4):
            raise Failure("the evaluation's loss %.9g, the loss of step 4 %.9g" % (got, step4))
        a, b = load_dir(w.p("a")), load_dir(w.p("b"))
        for k in b:
            if k.startswith("param.") and not np.array_equal(a[k], b[k]):
                raise Failure("%s changed in the evaluation" % k)
        if abs(float(a["loss"]) - step4) > 1e-6 * abs(step4):
            raise Failure("--dump's loss.pb is not the evaluation's loss")


def bn_model(path, stats_out):
    outs = ["y", "rm_out", "rv_out"] if stats_out else ["y"]
    nodes = [helper.make_node("Mul", ["x", "g"], ["z"]),
             helper.make_node("BatchNormalization", ["z", "s", "bb", "bn.running_mean", "bn.running_var"], outs,
                              name="bn", epsilon=EPS, momentum=MOM, training_mode=1),
             helper.make_node("Constant", [], ["wgt"], value=numpy_helper.from_array(WGT)),
             helper.make_node("Mul", ["y", "wgt"], ["yw"]),
             helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0)]
    inits = [numpy_helper.from_array(a, n) for n, a in (("g", np.full((1, 3, 1), 1.5, np.float32)), ("s", S),
                                                         ("bb", BB), ("bn.running_mean", RM), ("bn.running_var", RV))]
    o = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    if stats_out:
        o += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("rm_out", "rv_out")]
    g = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 2])], o,
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)], producer_name="novac-testsuite")
    m.ir_version = 8
    onnx.save(m, path)


def bn_eval_uses_running_statistics():
    for stats_out in (False, True):
        with Work() as w:
            bn_model(w.p("m.onnx"), stats_out)
            so = w.p("m.so")
            run([NOVAC, w.p("m.onnx"), "--train", "--optimizer=sgd", "--lr=0", "-o", so])
            os.mkdir(w.p("in"))
            write_pb(w.p("in/x.pb"), X, "x")
            run([NOVARUN, so, "--inputs", w.p("in"), "--steps", "2", "--eval", "--outputs", w.p("out"), "--dump",
                 w.p("a"), "-q"])
            z = X.astype(np.float64) * 1.5
            mu, var = z.mean(axis=(0, 2)), z.var(axis=(0, 2), ddof=1)  # PyTorch's running variance
            rm, rv = MOM ** 2 * RM + (1 - MOM ** 2) * mu, MOM ** 2 * RV + (1 - MOM ** 2) * var
            y = (z - rm[None, :, None]) / np.sqrt(rv[None, :, None] + EPS) * S[None, :, None] + BB[None, :, None]
            check_close(read_pb(w.p("out/output_0.pb")), (y * WGT).sum(), 1e-5, "evaluation loss")
            a = load_dir(w.p("a"))
            check_close(a["buffer.bn.running_mean"], rm, 1e-6, "running mean after 2 steps and the evaluation")
            check_close(a["buffer.bn.running_var"], rv, 1e-6, "running variance after 2 steps and the evaluation")
            if stats_out:
                check_close(read_pb(w.p("out/output_1.pb")), rm, 1e-6, "running_mean output of the evaluation")
                check_close(read_pb(w.p("out/output_2.pb")), rv, 1e-6, "running_var output of the evaluation")


def forward_step_has_none():
    with Work() as w:
        so = w.p("fwd.so")
        run([NOVAC, MLP, "--dim=batch=8", "-o", so])
        p = run([NOVARUN, so, "--inputs", MLP_DATA, "--eval", "-q"], expect_rc=1)
        if "has no evaluation entry" not in p.stderr:
            raise Failure("novarun --eval on a forward step:\n" + p.stderr)
        rc, msg = eval_through_ctypes(so)
        if rc != 11 or "no evaluation entry" not in msg:
            raise Failure("nova_step_eval on a forward step: %d, '%s'" % (rc, msg))


EVAL_CTYPES = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
step = ctypes.c_void_p()
if lib.nova_step_open(ctypes.byref(step)) != 0:
    sys.exit("nova_step_open failed")
rc = lib.nova_step_eval(step)
lib.nova_step_error.restype = ctypes.c_char_p
print(rc, lib.nova_step_error(step).decode())
lib.nova_step_close(step)
"""


def eval_through_ctypes(so):
    """nova_step_eval's status and message, from a Python process of its own:
    a step of a sanitized build needs the sanitizer runtimes loaded first."""
    env = dict(os.environ)
    if "asan" in os.path.basename(os.path.normpath(BUILD)):
        libs = [subprocess.run(["cc", "-print-file-name=" + n], capture_output=True, text=True).stdout.strip()
                for n in ("libasan.so", "libubsan.so")]
        env["LD_PRELOAD"] = " ".join(libs)
        env["ASAN_OPTIONS"] = "detect_leaks=0"   # the interpreter's own allocations
    p = subprocess.run([sys.executable, "-c", EVAL_CTYPES, so], capture_output=True, text=True, env=env, timeout=120)
    if p.returncode != 0 or not p.stdout.strip():
        raise Failure("ctypes on %s: exit %d\n%s" % (so, p.returncode, p.stderr[-2000:]))
    rc, _, msg = p.stdout.strip().partition(" ")
    return int(rc), msg

case("eval.mlp_eval_is_the_next_forward", mlp_eval_is_the_next_forward)
case("eval.batchnorm_running_statistics", bn_eval_uses_running_statistics)
case("eval.forward_step_has_none", forward_step_has_none)
