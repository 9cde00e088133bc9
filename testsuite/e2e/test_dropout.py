"""Dropout in training mode under --train (frontend ox_dropout, codegen/lower_rng.c):

- the generator: a numpy Philox4x32-10, checked here against Random123's
  known-answer vectors, reproduces novac's mask exactly (element i kept
  when (w0 >> 8) 2^-24 >= ratio, w = philox((i, stream, step lo, step hi),
  (seed lo, seed hi))), for the seed bound as the input rng.seed (the
  ABI), for novarun --seed, and for the step counter rng.step of each step;
- the loss and the gradient against numpy with that mask (the backward
  pass recomputes it), the update of W;
- statistics on 65536 elements: the kept fraction within 5 sigma of
  1 - ratio, kept values scaled by 1 / (1 - ratio) exactly, masks of
  consecutive steps different;
- the GPU kernels' indexing (--target=cuda --gpu-sim) draws the same masks;
- the evaluation entry has dropout off; rng.step is saved by --save and
  restored by --load, so a resumed run draws the masks of an
  uninterrupted one;
- a step skipped for a NaN in its batch (novarun --skip-nonfinite) does
  not advance rng.step: the next good step draws the mask it would have."""
import json
import os
import shutil
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness import NOVAC, NOVARUN, Failure, case, check_close, read_pb, run, write_pb

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF
RATIO = 0.3


def philox(c, k, rounds=10):
    """Philox4x32 of counters c (4 uint64 arrays of 32-bit values) and key k (2 ints)."""
    c = [np.asarray(v, np.uint64) for v in c]
    k0, k1 = np.uint64(k[0]), np.uint64(k[1])
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + np.uint64(W0)) & np.uint64(MASK32), (k1 + np.uint64(W1)) & np.uint64(MASK32)
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & np.uint64(MASK32), (p0 >> np.uint64(32)) ^ c[3] ^ k1,
             p0 & np.uint64(MASK32)]
    return [int(v) if np.ndim(v) == 0 else v for v in c]


KAT = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
       ((MASK32,) * 4, (MASK32, MASK32), (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
       ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
        (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]


def expected_mask(shape, seed, step, stream=0, ratio=RATIO):
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.uint64)
    z = np.zeros(n, np.uint64)
    w = philox([i, z + stream, z + (step & MASK32), z + (step >> 32)], (seed & MASK32, seed >> 32))[0]
    u = (w >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
    return (u >= ratio).reshape(shape)


def model(path, xshape, wshape):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["z"]),
             helper.make_node("Constant", [], ["p"], value=numpy_helper.from_array(np.float32(RATIO))),
             helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.bool_(True))),
             helper.make_node("Dropout", ["z", "p", "t"], ["d", "mask"], name="drop"),
             helper.make_node("Constant", [], ["wgt"], value=numpy_helper.from_array(WGT[: xshape[0], : wshape[1]])),
             helper.make_node("Mul", ["d", "wgt"], ["dw"]),
             helper.make_node("ReduceSum", ["dw"], ["loss"], keepdims=0)]
    W = RNG.standard_normal(wshape).astype(np.float32)
    g = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("mask", TensorProto.BOOL, [xshape[0], wshape[1]])],
                          initializer=[numpy_helper.from_array(W, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="novac-testsuite")
    m.ir_version = 8
    onnx.save(m, path)
    return W


RNG = np.random.default_rng(3)
WGT = RNG.standard_normal((256, 256)).astype(np.float32)


class Work:
    def __enter__(self):
        self.d = tempfile.mkdtemp(prefix="nova-drop-")
        return self

    def __exit__(self, *a):
        shutil.rmtree(self.d, ignore_errors=True)

    def p(self, name):
        return os.path.join(self.d, name)

    def build(self, xshape, wshape, x, seed=None):
        self.W = model(self.p("m.onnx"), xshape, wshape)
        run([NOVAC, self.p("m.onnx"), "--train", "--keep-grads", "--optimizer=sgd", "--lr=0.1", "-o", self.p("m.so")])
        os.makedirs(self.p("in"), exist_ok=True)
        write_pb(self.p("in/x.pb"), x, "x")
        if seed is not None:
            write_pb(self.p("in/rng.seed.pb"), np.int64(seed), "rng.seed")

    def steps(self, n, tag, extra=()):
        run([NOVARUN, self.p("m.so"), "--inputs", self.p("in"), "--steps", str(n), "--outputs", self.p("o" + tag),
             "--dump", self.p("d" + tag), "-q"] + list(extra))
        dump = {fn[:-3]: read_pb(os.path.join(self.p("d" + tag), fn)) for fn in os.listdir(self.p("d" + tag))}
        return read_pb(self.p("o%s/output_0.pb" % tag)), read_pb(self.p("o%s/output_1.pb" % tag)), dump


def philox_known_answers():
    for c, k, want in KAT:
        got = tuple(philox(c, k))
        if got != want:
            raise Failure("numpy Philox4x32-10 of %s, %s: %s, Random123 %s" %
                          (c, k, ["%08x" % v for v in got], ["%08x" % v for v in want]))


def mask_loss_gradient():
    X = RNG.standard_normal((4, 8)).astype(np.float32)
    with Work() as w:
        w.build((4, 8), (8, 6), X, seed=0x123456789A)
        man = json.load(open(w.p("m.json")))
        roles = {t["name"]: t["role"] for t in man["tensors"]}
        if roles.get("rng.seed") != "input" or roles.get("rng.step") != "buffer":
            raise Failure("rng.seed / rng.step: %s" % roles)
        loss, mask, dump = w.steps(1, "1")
        want = expected_mask((4, 6), 0x123456789A, 0)
        if not np.array_equal(mask, want):
            raise Failure("step 1 mask differs from Philox in %d of %d elements" % ((mask != want).sum(), mask.size))
        z = X.astype(np.float64) @ w.W
        keep = want / (1 - RATIO)
        g = WGT[:4, :6].astype(np.float64)
        check_close(loss, (z * keep * g).sum(), 1e-5, "loss")
        check_close(dump["grad.W"], X.T.astype(np.float64) @ (g * keep), 1e-5, "gradient of W (the mask recomputed)")
        check_close(dump["param.W"], w.W - 0.1 * (X.T.astype(np.float64) @ (g * keep)), 1e-5, "W after the step")
        if int(dump["buffer.rng.step"]) != 1:
            raise Failure("rng.step after one step: %s" % dump["buffer.rng.step"])
        _, mask3, dump3 = w.steps(3, "3")
        if not np.array_equal(mask3, expected_mask((4, 6), 0x123456789A, 2)):
            raise Failure("the mask of step 3 is not Philox's with step counter 2")
        # resumed: 2 steps, --save, --load, 1 step = 3 steps
        w.steps(2, "a", ["--save", w.p("ck.st")])
        _, mask_r, dump_r = w.steps(1, "b", ["--load", w.p("ck.st")])
        if not np.array_equal(mask_r, mask3) or not np.array_equal(dump_r["param.W"], dump3["param.W"]):
            raise Failure("2 steps + --save/--load + 1 step differ from 3 steps")
        # the evaluation: no dropout
        run([NOVARUN, w.p("m.so"), "--inputs", w.p("in"), "--eval", "--outputs", w.p("oe"), "-q"])
        check_close(read_pb(w.p("oe/output_0.pb")), (z * g).sum(), 1e-5, "evaluation loss (dropout off)")


def seed_option_and_statistics():
    X = np.ones((256, 1), np.float32)
    with Work() as w:
        w.build((256, 1), (1, 256), X)
        os.remove(w.p("in/x.pb"))
        write_pb(w.p("in/x.pb"), X, "x")
        run([NOVARUN, w.p("m.so"), "--inputs", w.p("in"), "--seed", "77", "--steps", "1", "--outputs", w.p("o"),
             "-q"])
        mask = read_pb(w.p("o/output_1.pb"))
        if not np.array_equal(mask, expected_mask((256, 256), 77, 0)):
            raise Failure("novarun --seed 77 --inputs: the mask is not Philox's for seed 77")
        n, kept = mask.size, mask.sum()
        sigma = np.sqrt(n * RATIO * (1 - RATIO))
        if abs(kept - n * (1 - RATIO)) > 5 * sigma:
            raise Failure("kept %d of %d, expected %.0f +- %.0f" % (kept, n, n * (1 - RATIO), 5 * sigma))
        _, mask2, _ = w.steps(1, "s2", ["--seed", "78"])
        agree = (mask2 == mask).mean()
        if agree > 0.62 or agree < 0.54:  # independent masks agree on p^2 + (1-p)^2 = 0.58 of the elements
            raise Failure("masks for seeds 77 and 78 agree on %.3f of the elements" % agree)


def kept_values_scaled():
    """y = x / (1 - ratio) where kept, exactly 0 elsewhere: from the dump of a model whose output is y."""
    X = RNG.standard_normal((16, 1)).astype(np.float32)
    with Work() as w:
        w.build((16, 1), (1, 16), X, seed=5)
        loss, mask, dump = w.steps(1, "1")
        z = (X @ w.W).astype(np.float32)
        d = np.where(mask, z * np.float32(1 / (1 - RATIO)), 0)
        check_close(loss, (d.astype(np.float64) * WGT[:16, :16]).sum(), 1e-5, "loss of the scaled kept values")


def gpu_sim_mask():
    """--target=cuda --gpu-sim: the GPU kernels' indexing run as CPU loops draws the same masks."""
    X = RNG.standard_normal((4, 8)).astype(np.float32)
    with Work() as w:
        model(w.p("m.onnx"), (4, 8), (8, 6))
        run([NOVAC, w.p("m.onnx"), "--train", "--keep-grads", "--target=cuda", "--device=h100", "--gpu-sim", "-o", w.p("m.so")])
        os.mkdir(w.p("in"))
        write_pb(w.p("in/x.pb"), X, "x")
        run([NOVARUN, w.p("m.so"), "--inputs", w.p("in"), "--seed", "9", "--steps", "2", "--outputs", w.p("o"), "-q"])
        if not np.array_equal(read_pb(w.p("o/output_1.pb")), expected_mask((4, 6), 9, 1)):
            raise Failure("--gpu-sim: the mask of step 2 is not Philox's")


def rng_step_kept_on_nonfinite():
    X = RNG.standard_normal((4, 8)).astype(np.float32)
    bad = X.copy()
    bad[2, 3] = np.nan
    with Work() as w:
        w.build((4, 8), (8, 6), bad, seed=21)
        p = run([NOVARUN, w.p("m.so"), "--inputs", w.p("in"), "--steps", "2", "--skip-nonfinite", "--dump", w.p("d"),
                 "--save", w.p("ck.st"), "-q"])
        dump = {fn[:-3]: read_pb(os.path.join(w.p("d"), fn)) for fn in os.listdir(w.p("d"))}
        if "2 of 2 steps skipped" not in p.stderr:
            raise Failure("novarun did not skip the NaN steps: %s" % p.stderr)
        if int(dump["buffer.rng.step"]) != 0 or dump["param.W"].astype(np.float32).tobytes() != w.W.tobytes():
            raise Failure("skipped steps changed rng.step (%s) or W" % dump["buffer.rng.step"])
        # a good batch after them draws the mask of the first step (counter 0)
        write_pb(w.p("in/x.pb"), X, "x")
        _, mask, _ = w.steps(1, "g", ["--load", w.p("ck.st")])
        if not np.array_equal(mask, expected_mask((4, 6), 21, 0)):
            raise Failure("the first good step after two skipped ones does not draw the mask of counter 0")


case("dropout.philox_known_answers", philox_known_answers)
case("dropout.mask_loss_gradient_checkpoint_eval", mask_loss_gradient)
case("dropout.seed_option_and_statistics", seed_option_and_statistics)
case("dropout.kept_values_scaled", kept_values_scaled)
case("dropout.gpu_sim_mask", gpu_sim_mask)
case("dropout.rng_step_kept_on_nonfinite", rng_step_kept_on_nonfinite)
