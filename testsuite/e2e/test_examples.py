"""The bundled examples, compiled as shipped, against a numpy float64
reference computed from the parameters the step holds (novarun --dump):
outputs within 1e-5 relative error.  Also checks the initializers'
statistics (he, xavier, normal) and that a bad label is rejected at run time."""
import os
import sys

import numpy as np

from harness import Failure, case, check_close, compile_and_run, erf, run, NOVAC, NOVARUN, write_pb

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
rng = np.random.default_rng(7)


def load(name):
    with open(os.path.join(ROOT, "examples", name)) as f:
        return f.read()


def cross_entropy(logits, labels):
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
    return np.mean(lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0])


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def test_mlp():
    B = 8
    x = rng.standard_normal((B, 784)).astype(np.float32)
    y = rng.integers(0, 10, B).astype(np.int64)
    (logits, loss), p = compile_and_run(load("mlp.nova"), {"x": x, "y": y}, flags=["--dim=batch=%d" % B], dump=True)
    P = {k: v.astype(np.float64) for k, v in p.items()}
    h = np.maximum(x.astype(np.float64) @ P["w1"] + P["b1"], 0)
    ref = h @ P["w2"] + P["b2"]
    check_close(logits, ref, 1e-5, "logits")
    check_close(loss, cross_entropy(ref, y), 1e-5, "loss")
    # initializers: he for w1 (std sqrt(2/784)), xavier for w2 (uniform +-sqrt(6/138)), zeros for biases
    std = P["w1"].std()
    if abs(std / np.sqrt(2 / 784) - 1) > 0.02 or abs(P["w1"].mean()) > 2e-3:
        raise Failure("w1 (he): std %.5f mean %.5f" % (std, P["w1"].mean()))
    lim = np.sqrt(6 / 138)
    if P["w2"].max() > lim or P["w2"].min() < -lim or abs(P["w2"].std() / (lim / np.sqrt(3)) - 1) > 0.05:
        raise Failure("w2 (xavier): range [%g, %g] std %g" % (P["w2"].min(), P["w2"].max(), P["w2"].std()))
    if np.any(P["b1"]) or np.any(P["b2"]):
        raise Failure("biases are not zero")


def transformer_ref(P, tokens):
    B, T = tokens.shape
    h = P["wte"][tokens] + P["wpe"]
    a = layer_norm(h, P["ln1_g"], P["ln1_b"])
    qkv = a @ P["w_qkv"] + P["b_qkv"]
    q, k, v = (qkv[..., i * 32:(i + 1) * 32].reshape(B, T, 4, 8).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8) + np.triu(np.full((T, T), -1e9), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    att = s / s.sum(-1, keepdims=True)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, 32)
    h2 = h + y @ P["w_proj"] + P["b_proj"]
    m = layer_norm(h2, P["ln2_g"], P["ln2_b"])
    f = m @ P["w_fc"] + P["b_fc"]
    h3 = h2 + (0.5 * f * (1 + erf(f / np.sqrt(2)))) @ P["w_out"] + P["b_out"]
    return layer_norm(h3, P["lnf_g"], P["lnf_b"]) @ P["w_head"]


def test_transformer_block():
    B = 3
    tokens = rng.integers(0, 64, (B, 16)).astype(np.int64)
    targets = rng.integers(0, 64, (B, 16)).astype(np.int64)
    (logits, loss), p = compile_and_run(load("transformer_block.nova"), {"tokens": tokens, "targets": targets},
                                        flags=["--dim=batch=%d" % B], dump=True)
    P = {k: v.astype(np.float64) for k, v in p.items()}
    if abs(P["wte"].std() / 0.02 - 1) > 0.05:
        raise Failure("wte normal(0.02): std %g" % P["wte"].std())
    ref = transformer_ref(P, tokens)
    check_close(logits, ref, 1e-5, "logits")
    check_close(loss, cross_entropy(ref, targets), 1e-5, "loss")


def test_bad_label_rejected():
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="nova-e2e-")
    try:
        so = os.path.join(d, "m.so")
        run([NOVAC, os.path.join(ROOT, "examples", "mlp.nova"), "--dim=batch=2", "-o", so])
        os.mkdir(os.path.join(d, "in"))
        write_pb(os.path.join(d, "in", "x.pb"), np.zeros((2, 784), np.float32), "x")
        write_pb(os.path.join(d, "in", "y.pb"), np.array([3, 10], np.int64), "y")
        p = run([NOVARUN, so, "--inputs", os.path.join(d, "in")], expect_rc=1)
        if "y" not in p.stderr or "10" not in p.stderr:
            raise Failure("the diagnostic does not name the tensor and value:\n" + p.stderr)
        write_pb(os.path.join(d, "in", "x.pb"), np.zeros((3, 784), np.float32), "x")
        write_pb(os.path.join(d, "in", "y.pb"), np.array([3, 1], np.int64), "y")
        p = run([NOVARUN, so, "--inputs", os.path.join(d, "in")], expect_rc=1)
        if "[3,784]" not in p.stderr.replace(" ", "") or "[2,784]" not in p.stderr.replace(" ", ""):
            raise Failure("a shape mismatch should name both shapes:\n" + p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("examples.mlp", test_mlp)
case("examples.transformer_block", test_transformer_block)
case("examples.bad_input_rejected_at_run_time", test_bad_label_rejected)


def test_index_bounds_through_data_movement():
    """An index input reaching gather through reshape/transpose, and used by
    two tables, is checked against the smallest table at run time."""
    import shutil
    import tempfile
    model = ("input ids: i64[2, 2]\nparam a: f32[50, 3] = normal(1)\nparam b: f32[100, 3] = normal(1)\n"
             "output r = gather(a, reshape(transpose(ids), shape=[4])) + gather(b, reshape(ids, shape=[4]))\n")
    d = tempfile.mkdtemp(prefix="nova-e2e-")
    try:
        with open(os.path.join(d, "m.nova"), "w") as f:
            f.write(model)
        so = os.path.join(d, "m.so")
        run([NOVAC, os.path.join(d, "m.nova"), "-o", so])
        os.mkdir(os.path.join(d, "in"))
        write_pb(os.path.join(d, "in", "ids.pb"), np.array([[1, 2], [60, 3]], np.int64), "ids")
        p = run([NOVARUN, so, "--inputs", os.path.join(d, "in")], expect_rc=1)
        if "ids" not in p.stderr or "60" not in p.stderr:
            raise Failure("index 60 >= 50 rows was not reported:\n" + p.stderr)
        write_pb(os.path.join(d, "in", "ids.pb"), np.array([[1, 2], [49, 3]], np.int64), "ids")
        run([NOVARUN, so, "--inputs", os.path.join(d, "in"), "-q"])
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("examples.index_bounds_through_data_movement", test_index_bounds_through_data_movement)


def test_training_lowers_the_loss():
    """The bundled MLP trained for 100 AdamW steps on the bundled batch (what make demo shows)."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="nova-e2e-")
    try:
        so = os.path.join(d, "t.so")
        run([NOVAC, os.path.join(ROOT, "examples", "mlp.nova"), "--dim=batch=8", "--train", "--optimizer=adamw",
             "--lr=0.001", "-o", so])
        log = os.path.join(d, "loss.log")
        run([NOVARUN, so, "--inputs", os.path.join(ROOT, "examples", "data", "mlp"), "--steps", "100", "--loss-log",
             log, "-q"])
        losses = [float(l.split()[1]) for l in open(log)]
        if len(losses) != 100 or not losses[-1] < 0.1 * losses[0]:
            raise Failure("loss %g -> %g after %d steps" % (losses[0], losses[-1], len(losses)))
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("examples.training_lowers_the_loss", test_training_lowers_the_loss)
