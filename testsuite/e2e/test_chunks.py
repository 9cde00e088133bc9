"""Long steps compiled in pieces, checked bit for bit against the step
compiled whole:
- bufferization in pieces (codegen/chunk.c): a step longer than the piece
  size is cut into private functions for one-shot bufferization and put
  back together after it (reference: NOVAC_NO_CHUNKS=1);
- the entry in pieces (codegen/split_entry.c): after outlining, the
  entry's straight-line body is cut into private functions called in turn
  (reference: NOVAC_NO_SPLIT_ENTRY=1);
- kernels called rather than copied (codegen/kernel_once.c): each distinct
  tiled kernel a function that every op of it calls, through bufferization
  and the memory plan (reference: NOVAC_KERNEL_CALLS=0).
Each on the outputs of a long chain sharing one weight (the case that
made bufferization quadratic), and the loss, gradients and updated
parameters of a multi-layer GPT training step.
Also the cap on elementwise fusion (codegen/fusion_cap.c), on a flat sum
of 1,500 terms against numpy."""
import bisect
import heapq
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from harness import NOVAC, NOVARUN, Failure, case, read_pb, run, write_pb

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_compile  # noqa: E402  (the generated models of the compile-time benchmark)


def chain(n):
    s = ["input x: f32[8, 16]", "param w: f32[16, 16] = normal(0.3)", "param b: f32[16] = normal(0.1)"]
    prev = "x"
    for i in range(n):
        s.append("h%d = tanh(%s @ w + b) * 1.5" % (i, prev))
        prev = "h%d" % i
    s.append("output y = %s" % prev)
    s.append("output loss = reduce_sum(%s * %s)" % (prev, prev))
    return "\n".join(s) + "\n"


manifests = []  # (knob on, manifest) of the steps compiled


# what each check turns off for its reference, and what novac says when it is on
# (the variable, its value for the reference, its value for the check or None: unset)
KNOBS = {"chunks": ("NOVAC_NO_CHUNKS", "1", None, r"bufferized in (\d+) pieces"),
         "sweep": ("NOVAC_PLAN_FIRST_FIT", "1", None, r"memory plan: (\d+) buffers in time order"),
         "entry": ("NOVAC_NO_SPLIT_ENTRY", "1", None, r"the entry in ([1-9]\d*) pieces"),
         # kernels called, not copied (kernel_once.c: by default in steps of 2,048 kernel ops and more)
         "calls": ("NOVAC_KERNEL_CALLS", "0", "1", r"tiling: \d+ ops, \d+ distinct kernels, ([1-9]\d*) called")}


def compile_run(text, inputs, flags, knob, on):
    d = tempfile.mkdtemp(prefix="nova-chunks-")
    env = dict(os.environ)
    off, ref_value, on_value, said = KNOBS[knob]
    if not on:
        env[off] = ref_value
    elif on_value is not None:
        env[off] = on_value
    env["NOVAC_DEBUG_PIPELINES"] = "1"
    try:
        with open(os.path.join(d, "m.nova"), "w") as f:
            f.write(text)
        so = os.path.join(d, "m.so")
        # novac itself, not harness.run: its step cache keys on the command, not on the environment
        p = subprocess.run([NOVAC, os.path.join(d, "m.nova"), "-o", so] + flags, env=env, capture_output=True,
                           text=True, timeout=600)
        if p.returncode:
            raise Failure("novac exited %d%s\n%s" % (p.returncode, "" if on else " (%s=%s)" % (off, ref_value), p.stderr))
        pieces = re.findall(said, p.stderr)
        if on and not pieces:
            raise Failure("the step was not cut into pieces: the test checks nothing")
        with open(so[:-3] + ".json") as f:
            manifests.append((on, json.load(f)))
        os.mkdir(os.path.join(d, "in"))
        for k, v in inputs.items():
            write_pb(os.path.join(d, "in", k + ".pb"), v, k)
        cmd = [NOVARUN, so, "--inputs", os.path.join(d, "in"), "--outputs", os.path.join(d, "out"),
               "--dump", os.path.join(d, "dump"), "-q"]
        if "--train" in flags:
            cmd += ["--steps", "2"]
        run(cmd)
        got = {}
        for sub in ("out", "dump"):
            for fn in sorted(os.listdir(os.path.join(d, sub))):
                got[sub + "/" + fn] = read_pb(os.path.join(d, sub, fn))
        return got
    finally:
        shutil.rmtree(d, ignore_errors=True)


def same(text, inputs, flags, knob="chunks"):
    a = compile_run(text, inputs, flags, knob, True)
    b = compile_run(text, inputs, flags, knob, False)
    if sorted(a) != sorted(b):
        raise Failure("different files: %s vs %s" % (sorted(a), sorted(b)))
    for k in a:
        if not np.array_equal(a[k], b[k]):
            raise Failure("%s differs from the step compiled whole (%s, max |diff| %g)"
                          % (k, knob, np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))))
    if not any(np.any(v != 0) for v in a.values()):
        raise Failure("every value is zero: the check cannot tell")


rng = np.random.default_rng(3)


def chain_forward():
    same(chain(300), {"x": rng.standard_normal((8, 16)).astype(np.float32)}, [])


def chain_train():
    same(chain(200), {"x": rng.standard_normal((8, 16)).astype(np.float32)}, ["--train"])


def gpt_train(knob="chunks"):
    text, _ = bench_compile.gpt(3)
    tokens = rng.integers(0, 128, (4, 32)).astype(np.int64)
    same(text, {"tokens": tokens, "targets": rng.integers(0, 128, (4, 32)).astype(np.int64)},
         ["--train", "--optimizer=adamw"], knob)


case("chunks.chain_forward", chain_forward)
case("chunks.chain_train", chain_train)
case("chunks.gpt_train", gpt_train)
case("entry.chain_forward", lambda: same(chain(300), {"x": rng.standard_normal((8, 16)).astype(np.float32)}, [],
                                         "entry"))
case("entry.chain_train", lambda: same(chain(200), {"x": rng.standard_normal((8, 16)).astype(np.float32)},
                                       ["--train"], "entry"))
case("entry.gpt_train", lambda: gpt_train("entry"))
case("calls.chain_forward", lambda: same(chain(300), {"x": rng.standard_normal((8, 16)).astype(np.float32)}, [],
                                         "calls"))
case("calls.chain_train", lambda: same(chain(200), {"x": rng.standard_normal((8, 16)).astype(np.float32)},
                                       ["--train"], "calls"))
# a weight per statement: every kernel call reads a buffer of its own
case("calls.weights_train", lambda: same(bench_compile.chain(150, True)[0],
                                         {"x": rng.standard_normal((8, 16)).astype(np.float32)},
                                         ["--train", "--optimizer=momentum"], "calls"))
case("calls.gpt_train", lambda: gpt_train("calls"))


def deterministic():
    """Two compiles of one step cut into pieces give the same step.so, byte
    for byte (bufferization visits the pieces in no fixed order; the
    constants' globals must not depend on it)."""
    text, _ = bench_compile.gpt(3)
    d = tempfile.mkdtemp(prefix="nova-chunks-")
    try:
        src = os.path.join(d, "m.nova")
        with open(src, "w") as f:
            f.write(text)
        got = []
        for k in range(3):
            so = os.path.join(d, "m%d.so" % k)
            p = subprocess.run([NOVAC, src, "-o", so, "--train"], capture_output=True, text=True, timeout=600,
                               env=dict(os.environ, NOVAC_DEBUG_PIPELINES="1"))
            if p.returncode:
                raise Failure("novac exited %d\n%s" % (p.returncode, p.stderr))
            if not re.search(r"bufferized in (\d+) pieces", p.stderr):
                raise Failure("the step was not cut into pieces: the test checks nothing")
            with open(so, "rb") as f:
                got.append(f.read())
        if got[0] != got[1] or got[0] != got[2]:
            raise Failure("three compiles of one model made different step.so files")
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("chunks.deterministic", deterministic)


def flat_sum(train):
    """A flat sum of 1,500 terms (x * c_0 + x * c_1 + ...): elementwise fusion
    is capped (codegen/fusion_cap.c; merging the whole chain into one loop
    nest took time quadratic in it), and the sum, now in several loop nests,
    is still numpy's in float64: the loss, and with --train the updated
    weight (one SGD step)."""
    text, _ = bench_compile.flat_sum(1500)
    text = text.replace("normal(0.1)", "ones")
    cs = np.array([float(v) for v in re.findall(r"x \* ([0-9.e+-]+)", text)])
    if len(cs) != 1500:
        raise Failure("the generated sum has %d terms" % len(cs))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    lr = 1e-7
    d = tempfile.mkdtemp(prefix="nova-chunks-")
    try:
        src, so = os.path.join(d, "m.nova"), os.path.join(d, "m.so")
        with open(src, "w") as f:
            f.write(text)
        flags = ["--train", "--optimizer=sgd", "--lr=%g" % lr] if train else []
        p = subprocess.run([NOVAC, src, "-o", so] + flags, env=dict(os.environ, NOVAC_DEBUG_PIPELINES="1"),
                           capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise Failure("novac exited %d\n%s" % (p.returncode, p.stderr))
        if not re.search(r"novac: ([1-9]\d*) fusion barriers", p.stderr):
            raise Failure("fusion was not capped: the test checks nothing")
        os.mkdir(os.path.join(d, "in"))
        write_pb(os.path.join(d, "in", "x.pb"), x, "x")
        cmd = [NOVARUN, so, "--inputs", os.path.join(d, "in"), "--outputs", os.path.join(d, "out"),
               "--dump", os.path.join(d, "dump"), "-q"] + (["--steps", "1"] if train else [])
        run(cmd)
        s = x.astype(np.float64) * cs.sum()  # every term is x times a constant
        y = s * 1.0
        want = np.sum(y * y)
        got = float(read_pb(os.path.join(d, "dump", "loss.pb") if train else os.path.join(d, "out", "output_0.pb")))
        if abs(got - want) > 1e-3 * abs(want):
            raise Failure("loss %r, numpy (float64) %r" % (got, want))
        if train:
            w = read_pb(os.path.join(d, "dump", "param.w.pb")).astype(np.float64)
            w_want = 1.0 - lr * np.sum(2 * y * s, axis=0)
            if not np.allclose(w, w_want, rtol=1e-3, atol=1e-6):
                raise Failure("updated w %s, numpy %s" % (w[:4], w_want[:4]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sweep_plan():
    """A training chain of 2,500 statements: 20,000 intermediates, planned
    in time order (codegen/memplan.c's sweep; first fit largest first
    lists every buffer live with each new one, quadratic here).  The plan
    is checked from outside (no two buffers live at the same time share a
    byte: a sweep over time, each buffer against its neighbours by
    offset), and the trained values equal those with the largest-first
    plan, bit for bit."""
    del manifests[:]
    same(chain(2500), {"x": rng.standard_normal((8, 16)).astype(np.float32)}, ["--train"], "sweep")
    mem = [m for on, m in manifests if on][-1]["memory"]
    ref = [m for on, m in manifests if not on][-1]["memory"]
    plan, arena = mem["plan"], mem["arena_bytes"]
    if len(plan) <= 16384:
        raise Failure("only %d buffers planned" % len(plan))
    active, ends = [], []  # (offset, end, last) by offset, of the buffers live now; a heap by last
    for e in sorted(plan, key=lambda e: e["live"][0]):
        if e["offset"] % 64 or e["offset"] + e["bytes"] > arena:
            raise Failure("buffer %r misaligned or outside the %d-byte arena" % (e, arena))
        while ends and ends[0][0] < e["live"][0]:
            active.pop(bisect.bisect_left(active, heapq.heappop(ends)[1]))
        a = (e["offset"], e["offset"] + e["bytes"], e["live"][1])
        k = bisect.bisect_left(active, a)
        if (k > 0 and active[k - 1][1] > a[0]) or (k < len(active) and active[k][0] < a[1]):
            raise Failure("buffers live at the same time overlap: %r and its neighbour by offset" % e)
        active.insert(k, a)
        heapq.heappush(ends, (a[2], a))
    if arena > 1.02 * ref["arena_bytes"]:
        raise Failure("the arena takes %d bytes, the largest-first plan's %d" % (arena, ref["arena_bytes"]))


case("memplan.sweep_train_chain", sweep_plan)
case("fusion.flat_sum", lambda: flat_sum(False))
case("fusion.flat_sum_train", lambda: flat_sum(True))
