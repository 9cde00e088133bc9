"""One step for several sizes of a dimension (novac --dim=NAME=LO..HI, or a
list of buckets): a run of any size in the range takes the smallest bucket
that holds it, and its loss, gradients and outputs equal those of a step
compiled for exactly that size (within 1e-6 relative to each tensor's
largest element), through the step's C ABI (stepapi.py):

- examples/mlp.nova over batch 1..64 at batches 1, 7, 33 and 64, then a
  sequence of different batches on one step (lr 0: each run compares);
- the transformer block over batch 1..4 at batch 3, its evaluation entry too;
- a transformer over a sequence-length dimension (causal attention whose
  softmax and contraction run along it, a loss over batch x sequence);
- an ONNX convolution with BatchNormalization in training mode (its batch
  statistics and running variance count only the real rows);
- a model reducing with mean, max and sum along the batch;
- torchvision's resnet18 and a Dropout + BatchNorm net from the zoo (their
  batch axis renamed symbolic);
- bad input: a batch outside the range (named in the message), inputs of
  different sizes in one run, binding NAME.size, a malformed range, an op
  that cannot be masked (the node named), and the targets not supported."""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness import NOVAC, NOVARUN, Failure, case, run
from stepapi import Step, StepError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MLP = os.path.join(ROOT, "examples", "mlp.nova")
BLOCK = os.path.join(ROOT, "examples", "transformer_block.nova")
RNG = np.random.default_rng(11)
TOL = 1e-6


class Work:
    def __enter__(self):
        self.d = tempfile.mkdtemp(prefix="nova-sizes-")
        return self

    def __exit__(self, *a):
        shutil.rmtree(self.d, ignore_errors=True)

    def p(self, name):
        return os.path.join(self.d, name)


def compare(exact, bucketed, what, names=None):
    """Every loss, output, gradient and parameter of EXACT equals BUCKETED's."""
    for name, role, _ in exact.tensors():
        if names is None and role not in (2, 3, 4, 5, 6, 8):   # params, opt_state, outputs, loss, grads, buffers
            continue
        if names is not None and name not in names:
            continue
        a, b = exact.get(name).astype(np.float64), bucketed.get(name).astype(np.float64)
        if a.shape != b.shape:
            raise Failure("%s: '%s' has shape %s, the exact step's %s" % (what, name, b.shape, a.shape))
        err = np.abs(a - b).max() / max(np.abs(a).max(), 1e-30) if a.size else 0
        if not err <= TOL:
            raise Failure("%s: '%s' differs from the exact step's by %.3g (relative to its largest element)"
                          % (what, name, err))


def feed(steps, data):
    for s in steps:
        for k, v in data.items():
            s.bind(k, v)


def against_exact(w, model, dim, sizes, flags, make, what, runs=1, bucketed=None, check=None):
    """For each size n of SIZES: a step compiled with --dim=DIM=n against the step for several sizes
    (BUCKETED, kept across the sizes, or a fresh one of w's b.so for each), both fed MAKE(n) and run RUNS
    times, then compared (CHECK(n, bucketed) too, when given)."""
    for n in sizes:
        exact = w.p("e%d.so" % n)  # (a name per size: a step.so is loaded once per path)
        run([NOVAC, model, "--dim=%s=%d" % (dim, n), "-o", exact] + flags)
        e, b = Step(exact), bucketed or Step(w.p("b.so"))
        data = make(n)
        for _ in range(runs):
            feed((e, b), data)
            e.run()
            b.run()
        compare(e, b, what % n)
        if check:
            check(n, b)
        e.close()
        if not bucketed:
            b.close()


def mlp_batch(n):
    return {"x": RNG.standard_normal((n, 784)).astype(np.float32), "y": RNG.integers(0, 10, n).astype(np.int64)}


def mlp_batches():
    with Work() as w:
        flags = ["--train", "--keep-grads", "--optimizer=momentum", "--lr=0.05"]
        run([NOVAC, MLP, "--dim=batch=1..64", "-o", w.p("b.so")] + flags)
        man = json.load(open(w.p("b.json")))["sizes"]
        if [b["size"] for b in man["buckets"]] != [1, 2, 4, 8, 16, 32, 64] or man["size_input"] != "batch.size":
            raise Failure("manifest sizes: %s" % man)

        def check(n, b):
            if b.sizes() != ("batch", 1, 64, [1, 2, 4, 8, 16, 32, 64]):
                raise Failure("nova_step_sizes: %s" % (b.sizes(),))
            shapes = dict((t[0], t[2]) for t in b.tensors())
            if shapes["logits"] != (n, 10) or shapes["x"] != (n, 784):
                raise Failure("batch %d: nova_step_tensor gives %s" % (n, shapes))
        against_exact(w, MLP, "batch", (1, 7, 33, 64), flags, mlp_batch, "batch %d", check=check)


def mlp_sequence():
    """One step, runs of different sizes in turn (lr 0: the parameters stay)."""
    with Work() as w:
        flags = ["--train", "--keep-grads", "--optimizer=sgd", "--lr=0"]
        run([NOVAC, MLP, "--dim=batch=4,16,32", "-o", w.p("b.so")] + flags)
        b = Step(w.p("b.so"))
        if b.sizes() != ("batch", 1, 32, [4, 16, 32]):
            raise Failure("nova_step_sizes: %s" % (b.sizes(),))
        against_exact(w, MLP, "batch", (9, 2, 32, 5, 16), flags, mlp_batch, "batch %d after other sizes", bucketed=b)


def block_tokens(n, t=16):
    return {"tokens": RNG.integers(0, 64, (n, t)).astype(np.int64),
            "targets": RNG.integers(0, 64, (n, t)).astype(np.int64)}


def transformer_batch():
    with Work() as w:
        flags = ["--train", "--keep-grads", "--optimizer=adamw", "--lr=0.01"]
        run([NOVAC, BLOCK, "--dim=batch=1..4", "-o", w.p("b.so")] + flags)
        run([NOVAC, BLOCK, "--dim=batch=3", "-o", w.p("e.so")] + flags)
        e, b = Step(w.p("e.so")), Step(w.p("b.so"))
        feed((e, b), block_tokens(3))
        e.eval()
        b.eval()
        compare(e, b, "evaluation at batch 3", names={"loss", "logits"})
        e.run()
        b.run()
        compare(e, b, "batch 3", names={"loss", "logits"} | {n for n, r, _ in e.tensors() if r == 6})


SEQ_MODEL = open(BLOCK).read()


def seq_model():
    """The transformer block with its context a dimension 'seq' (positions an input)."""
    t = SEQ_MODEL.replace("input tokens: i64[batch, 16]", "input tokens: i64[batch, seq]\ninput pos: i64[seq]")
    t = t.replace("label targets: i64[batch, 16]", "label targets: i64[batch, seq]")
    t = t.replace("const mask: f32[16, 16]", "const mask: f32[seq, seq]")
    t = t.replace("gather(wte, tokens) + wpe", "gather(wte, tokens) + gather(wpe, pos)")
    t = t.replace("shape=[batch, 16, 4, 8]", "shape=[batch, seq, 4, 8]").replace("shape=[batch, 16, 32]",
                                                                                "shape=[batch, seq, 32]")
    if t.count("seq") < 8:
        raise Failure("examples/transformer_block.nova changed: the sequence variant could not be made")
    return t


def transformer_sequence():
    with Work() as w:
        open(w.p("seq.nova"), "w").write(seq_model())
        flags = ["--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1", "--dim=batch=2"]
        run([NOVAC, w.p("seq.nova"), "--dim=seq=1..16", "-o", w.p("b.so")] + flags)

        def tokens(t):
            return dict(block_tokens(2, t), pos=np.arange(t, dtype=np.int64))
        against_exact(w, w.p("seq.nova"), "seq", (5, 16, 1), flags, tokens, "sequence %d")


def bn_onnx(path, n):
    """Conv -> BatchNormalization (training) -> Relu -> GlobalAveragePool -> Gemm -> SoftmaxCrossEntropyLoss."""
    r = np.random.default_rng(3)
    inits = [numpy_helper.from_array((0.3 * r.standard_normal((4, 2, 3, 3))).astype(np.float32), "conv.w"),
             numpy_helper.from_array(np.ones(4, np.float32), "bn.weight"),
             numpy_helper.from_array(np.zeros(4, np.float32), "bn.bias"),
             numpy_helper.from_array(np.zeros(4, np.float32), "bn.running_mean"),
             numpy_helper.from_array(np.ones(4, np.float32), "bn.running_var"),
             numpy_helper.from_array((0.3 * r.standard_normal((3, 4))).astype(np.float32), "fc.w"),
             numpy_helper.from_array(np.zeros(3, np.float32), "fc.b"),
             numpy_helper.from_array(np.array([-1, 4], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["x", "conv.w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn.weight", "bn.bias", "bn.running_mean",
                                                     "bn.running_var"], ["bnout", "rm", "rv"], training_mode=1,
                              momentum=0.9),
             helper.make_node("Relu", ["bnout"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Reshape", ["p", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], transB=1),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"])]
    g = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 2, 5, 5]),
                                        helper.make_tensor_value_info("y", TensorProto.INT64, [n])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)], producer_name="novac-testsuite")
    m.ir_version = 8
    onnx.save(m, path)


def batchnorm_statistics():
    with Work() as w:
        bn_onnx(w.p("m.onnx"), "N")
        flags = ["--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1"]
        run([NOVAC, w.p("m.onnx"), "--dim=N=1..8", "-o", w.p("b.so")] + flags)
        against_exact(w, w.p("m.onnx"), "N", (3, 8, 1), flags,
                      lambda n: {"x": RNG.standard_normal((n, 2, 5, 5)).astype(np.float32),
                                 "y": RNG.integers(0, 3, n).astype(np.int64)},
                      "batch %d (two steps; running statistics included)", runs=2)


REDUCE_MODEL = """input x: f32[batch, 6]
param w: f32[6, 6] = normal(0.5)
h = tanh(x @ w)
output m = reduce_max(h, axes=[0])
output s = reduce_sum(h * h, axes=[0, 1])
output loss = reduce_mean(h * h) + reduce_mean(softmax(h, axis=0) * h)
"""


def batch_reductions():
    with Work() as w:
        open(w.p("r.nova"), "w").write(REDUCE_MODEL)
        flags = ["--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1", "--loss=loss"]
        run([NOVAC, w.p("r.nova"), "--dim=batch=2..16", "-o", w.p("b.so")] + flags)

        def rows(n):
            x = RNG.standard_normal((n, 6)).astype(np.float32)
            x[-1] = 40  # the padded rows copy it: a max over them would see it, a sum would grow
            return {"x": x}
        against_exact(w, w.p("r.nova"), "batch", (2, 3, 13), flags, rows, "batch %d")


def novarun_size():
    """novarun --dim=batch=N: synthetic batches of N, the losses of the exact step's."""
    with Work() as w:
        run([NOVAC, MLP, "--dim=batch=1..64", "--train", "-o", w.p("b.so")])
        run([NOVAC, MLP, "--dim=batch=5", "--train", "-o", w.p("e.so")])
        run([NOVARUN, w.p("b.so"), "--dim=batch=5", "--seed", "3", "--steps", "3", "--loss-log", w.p("lb"), "-q"])
        run([NOVARUN, w.p("e.so"), "--seed", "3", "--steps", "3", "--loss-log", w.p("le"), "-q"])
        lb = [float(l.split()[1]) for l in open(w.p("lb"))]
        le = [float(l.split()[1]) for l in open(w.p("le"))]
        if len(lb) != 3 or any(abs(a - b) > TOL * abs(b) for a, b in zip(lb, le)):
            raise Failure("losses %s, the exact step's %s" % (lb, le))
        for args, words in (([w.p("b.so"), "--dim=batch=65"], ["batch=65", "1 to 64"]),
                            ([w.p("b.so"), "--dim=seq=5"], ["'batch'"]),
                            ([w.p("e.so"), "--dim=batch=5"], ["one size"])):
            p = run([NOVARUN] + args + ["--seed", "1", "-q"], expect_rc=1)
            if any(wd not in p.stderr for wd in words):
                raise Failure("novarun %s: expected %s in:\n%s" % (" ".join(args), words, p.stderr))


def zoo_batch(case_name, dst):
    """A zoo export (testsuite/zoo, batch 2) with its batch axis named 'batch': the torchscript exports of
    these models compute every shape from the input, so any batch builds."""
    m = onnx.load(os.path.join(ROOT, "testsuite", "zoo", case_name, "model.onnx"))
    for v in list(m.graph.input) + list(m.graph.output):
        dims = v.type.tensor_type.shape.dim
        if len(dims) and dims[0].dim_value == 2:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "batch"
    del m.graph.value_info[:]
    onnx.save(m, dst)


def zoo_models():
    """torchvision's resnet18 and a Dropout + BatchNorm net (training-mode export), batch 3 of 1..4."""
    for name in ("resnet18.ts", "dropbn_train.ts"):
        with Work() as w:
            zoo_batch(name, w.p("m.onnx"))
            flags = ["--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1"]
            run([NOVAC, w.p("m.onnx"), "--dim=batch=1..4", "-o", w.p("b.so")] + flags)

            def data(n):
                e = Step(w.p("e%d.so" % n))  # (compiled by against_exact before it asks)
                out = {}
                for t, role, shape in e.tensors():
                    if role == 1:
                        out[t] = RNG.integers(0, 10, shape).astype(np.int64)
                    elif role == 0 and t not in ("lr", "rng.seed"):
                        out[t] = RNG.standard_normal(shape).astype(np.float32)
                e.close()
                return out
            against_exact(w, w.p("m.onnx"), "batch", (3,), flags, data, name + " at batch %d")


def expect_status(fn, status, words):
    try:
        fn()
    except StepError as ex:
        if ex.status != status or any(wd not in ex.message for wd in words):
            raise Failure("expected status %d naming %s, got %s" % (status, words, ex))
        return
    raise Failure("expected status %d, the call succeeded" % status)


def expect_novac(args, words, rc=1):
    p = run([NOVAC] + args, expect_rc=rc)
    for wd in words:
        if wd not in p.stderr:
            raise Failure("novac %s: expected '%s' in:\n%s" % (" ".join(args), wd, p.stderr))


def bad_input():
    with Work() as w:
        run([NOVAC, MLP, "--dim=batch=1..64", "--train", "-o", w.p("b.so")])
        b = Step(w.p("b.so"))
        expect_status(lambda: b.bind("x", np.zeros((65, 784), np.float32)), 4, ["batch", "1 to 64", "[65,784]"])
        expect_status(lambda: b.bind("x", np.zeros((3, 785), np.float32)), 4, ["[3,785]"])
        expect_status(lambda: b.bind("batch.size", np.array(3, np.int64)), 8, ["size of each run"])
        b.bind("x", np.zeros((7, 784), np.float32))
        b.bind("y", np.zeros(9, np.int64))
        expect_status(b.run, 4, ["'x'", "'y'", "7", "9"])
        b.close()
        for bad in ("batch=8..4", "batch=0..4", "batch=1..x", "batch=3,3", "batch=4,", "batch=1..2000000000000000"):
            expect_novac([MLP, "--dim=" + bad, "-o", w.p("x.so")], ["--dim"], rc=2)
        expect_novac([MLP, "--dim=batch=1..4", "--dim=other=1..4", "-o", w.p("x.so")], ["only one dimension"], rc=2)
        expect_novac([MLP, "--dim=batch=1..4", "--target=cuda", "--device=h100", "-o", w.p("x.so")],
                     ["--target=cuda", "--dim=batch=N"])
        expect_novac([MLP, "--dim=batch=1..4", "--emit=linalg", "-o", w.p("x.mlir")], ["--emit"])
        open(w.p("cat.nova"), "w").write("input x: f32[batch, 4]\noutput y = concat(x, x, axis=0)\n")
        expect_novac([w.p("cat.nova"), "--dim=batch=1..4", "-o", w.p("x.so")],
                     ["cat.nova:2:", "concat", "joins along an axis of the dimension"])
        open(w.p("sl.nova"), "w").write("input x: f32[batch, 4]\noutput y = slice(x, axis=0, start=-2, end=-1)\n")
        expect_novac([w.p("sl.nova"), "--dim=batch=2..4", "-o", w.p("x.so")], ["sl.nova:2:", "slice"])
        open(w.p("fx.nova"), "w").write("input x: f32[batch, 4]\noutput y = slice(x, axis=0, start=0, end=4)\n")
        expect_novac([w.p("fx.nova"), "--dim=batch=3..8", "-o", w.p("x.so")], ["fx.nova:2:", "fixed length"])
        open(w.p("st.nova"), "w").write("input x: f32[batch, 4]\noutput y = slice(x, axis=0, start=0, end=8, step=2)\n")
        expect_novac([w.p("st.nova"), "--dim=batch=8..16", "-o", w.p("x.so")], ["st.nova:2:", "every k-th"])


def main():
    case("sizes :: mlp, batches 1 7 33 64 of 1..64", mlp_batches)
    case("sizes :: mlp, one step, batches in turn", mlp_sequence)
    case("sizes :: transformer block, batch 3 of 1..4 (and evaluation)", transformer_batch)
    case("sizes :: transformer, sequence lengths 5 16 1 of 1..16", transformer_sequence)
    case("sizes :: onnx conv + batchnorm, statistics of the real rows", batchnorm_statistics)
    case("sizes :: max, sum, mean, softmax along the batch", batch_reductions)
    case("sizes :: torchvision resnet18 and dropout + batchnorm exports, batch 3 of 1..4", zoo_models)
    case("sizes :: novarun --dim=batch=5", novarun_size)
    case("sizes :: bad input", bad_input)


if __name__ == "__main__":
    main()
