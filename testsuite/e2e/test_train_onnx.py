"""Training steps of the PyTorch-exported models against PyTorch
(testsuite/onnx/models/*/: export.py recorded the loss, every parameter's
gradient, the parameters after one SGD(lr=0.1) step and the losses of 20
AdamW steps): loss <= 1e-5, gradients <= 1e-4, SGD parameters <= 1e-5,
AdamW losses <= 1e-4 relative error."""
import json
import os
import shutil
import tempfile

from harness import NOVAC, NOVARUN, Failure, case, check_close, read_pb, run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "testsuite", "onnx", "models")


def sgd_step(name):
    def go():
        src = os.path.join(MODELS, name)
        data = os.path.join(src, "test_data_set_0")
        d = tempfile.mkdtemp(prefix="nova-train-")
        try:
            so = os.path.join(d, "s.so")
            run([NOVAC, os.path.join(src, "model.onnx"), "--dim=batch=4", "--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1",
                 "-o", so])
            run([NOVARUN, so, "--inputs", data, "--steps", "1", "--dump", os.path.join(d, "dump"), "-q"])
            check_close(read_pb(os.path.join(d, "dump", "loss.pb")), read_pb(os.path.join(data, "output_1.pb")), 1e-5,
                        "loss")
            ngrad = 0
            for fn in sorted(os.listdir(data)):
                if fn.startswith("grad.") and fn.endswith(".pb"):
                    p = fn[5:-3]
                    got = os.path.join(d, "dump", "grad.%s.pb" % p)
                    if not os.path.exists(got):
                        raise Failure("no gradient for parameter '%s'" % p)
                    # gradients that are zero in exact arithmetic (a key bias under softmax) are
                    # float32 noise on both sides: measured against a floor of 1e-5
                    g, r = read_pb(got), read_pb(os.path.join(data, fn))
                    err = abs(g.astype("float64") - r).max() / max(abs(r).max(), 1e-5)
                    if not err <= 1e-4:
                        raise Failure("grad of %s: relative error %.3g > 1e-4" % (p, err))
                    ngrad += 1
            for fn in sorted(os.listdir(os.path.join(data, "sgd_step"))):
                if fn.startswith("param.") and fn.endswith(".pb"):
                    check_close(read_pb(os.path.join(d, "dump", fn)), read_pb(os.path.join(data, "sgd_step", fn)), 1e-5,
                                "SGD-updated " + fn[6:-3])
            if ngrad == 0:
                raise Failure("no reference gradients found")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("train_onnx.%s.sgd_step" % name, go)


def adamw_trajectory(name):
    def go():
        src = os.path.join(MODELS, name)
        data = os.path.join(src, "test_data_set_0")
        ref = json.load(open(os.path.join(data, "adamw_losses.json")))
        losses = ref["losses"] if isinstance(ref, dict) else ref
        d = tempfile.mkdtemp(prefix="nova-train-")
        try:
            so = os.path.join(d, "s.so")
            run([NOVAC, os.path.join(src, "model.onnx"), "--dim=batch=4", "--train", "--keep-grads", "--optimizer=adamw", "--lr=1e-3",
                 "--beta1=0.9", "--beta2=0.999", "--eps=1e-8", "--weight-decay=0.01",
                 "--no-decay=none", "-o", so])  # torch.optim.AdamW: one group, every param decays
            log = os.path.join(d, "loss.log")
            run([NOVARUN, so, "--inputs", data, "--steps", str(len(losses)), "--loss-log", log, "-q"])
            got = [float(line.split()[1]) for line in open(log)]
            for k, (a, b) in enumerate(zip(got, losses)):
                if abs(a - b) > 1e-4 * abs(b):
                    raise Failure("AdamW step %d: loss %.7g, PyTorch %.7g" % (k + 1, a, b))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("train_onnx.%s.adamw_20_steps" % name, go)


for m in ("mlp", "cnn", "gpt_block"):
    sgd_step(m)
    adamw_trajectory(m)
