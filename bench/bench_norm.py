"""Training-step time of models dominated by RMSNormalization and by
RotaryEmbedding (ONNX opset 23), compiled by two novac builds side by side:
BEFORE (e.g. one where these ops were compositions of elementwise ops and
reductions) and AFTER (default: build/).  Same model, batch, float32, SGD,
one thread (NOVA_NUM_THREADS, default 1); the time is novarun's (--steps
100), the minimum of 5 runs of each, the builds alternating.
Writes a table to stdout; bench/RESULTS.md keeps the runs.
Usage: python3 bench/bench_norm.py BEFORE_BUILD [AFTER_BUILD]"""
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STEPS = 100
ROUNDS = 5
THREADS = os.environ.get("NOVA_NUM_THREADS", "1")
F = TensorProto.FLOAT


def model_rmsnorm(rng, rows=64, width=4096, layers=4):
    """x [rows, width] through `layers` RMSNormalization nodes (each its own
    trained scale), loss = mean(y^2 * t)."""
    nodes, inits, h = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), "w%d" % i))
        nodes.append(helper.make_node("RMSNormalization", [h, "w%d" % i], ["h%d" % i], epsilon=1e-6))
        h = "h%d" % i
    nodes += [helper.make_node("Mul", [h, h], ["sq"]), helper.make_node("Mul", ["sq", "t"], ["st"]),
              helper.make_node("ReduceMean", ["st"], ["loss"], keepdims=0)]
    ins = [helper.make_tensor_value_info("x", F, [rows, width]), helper.make_tensor_value_info("t", F, [rows, width])]
    feed = {"x": rng.standard_normal((rows, width)).astype(np.float32),
            "t": rng.uniform(-1, 1, (rows, width)).astype(np.float32)}
    return ins, nodes, inits, feed, []


def model_rotary(rng, B=4, H=16, S=128, D=64, layers=4):
    """q [B, H, S, D] (an input plus a trained bias) through `layers`
    RotaryEmbedding nodes with position ids, the caches constant (frozen),
    loss = mean(y * t)."""
    pos = np.arange(S, dtype=np.float32)[:, None] / (10000.0 ** (np.arange(D // 2, dtype=np.float32) * 2 / D))
    inits = [numpy_helper.from_array(np.cos(pos).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(pos).astype(np.float32), "sin"),
             numpy_helper.from_array(np.tile(np.arange(S, dtype=np.int64), (B, 1)), "pos"),
             numpy_helper.from_array(rng.uniform(-0.1, 0.1, (1, H, S, D)).astype(np.float32), "bias")]
    nodes, h = [helper.make_node("Add", ["q", "bias"], ["h"])], "h"
    for i in range(layers):
        nodes.append(helper.make_node("RotaryEmbedding", [h, "cos", "sin", "pos"], ["r%d" % i], interleaved=i % 2))
        h = "r%d" % i
    nodes += [helper.make_node("Mul", [h, "t"], ["ht"]), helper.make_node("ReduceMean", ["ht"], ["loss"], keepdims=0)]
    ins = [helper.make_tensor_value_info("q", F, [B, H, S, D]), helper.make_tensor_value_info("t", F, [B, H, S, D])]
    feed = {"q": rng.standard_normal((B, H, S, D)).astype(np.float32),
            "t": rng.uniform(-1, 1, (B, H, S, D)).astype(np.float32)}
    return ins, nodes, inits, feed, ["--freeze=cos,sin"]


def write_model(path, ins, nodes, inits):
    g = helper.make_graph(nodes, "bench", ins, [helper.make_tensor_value_info("loss", F, [])], initializer=inits)
    with open(path, "wb") as f:
        f.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]).SerializeToString())


def compile_step(build, model, flags, so):
    t0 = time.perf_counter()
    subprocess.run([os.path.join(build, "bin", "novac"), model, "--train", "--optimizer=sgd", "--lr=1e-3", "-o", so] + flags,
                   check=True)
    return time.perf_counter() - t0


def run_ms(build, so, ind):
    p = subprocess.run([os.path.join(build, "bin", "novarun"), so, "--inputs", ind, "--steps", str(STEPS)],
                       capture_output=True, text=True, check=True, env=dict(os.environ, NOVA_NUM_THREADS=THREADS))
    return float(re.search(r"\(([0-9.]+) ms/step\)", p.stderr).group(1))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    before = os.path.abspath(sys.argv[1])
    after = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "build"))
    rng = np.random.default_rng(0)
    work = [("RMSNormalization x4, [64, 4096] rows", model_rmsnorm(rng)),
            ("RotaryEmbedding x4, [4, 16, 128, 64] (B, H, S, D), position ids", model_rotary(rng))]
    print("machine: %s, %s, %d cores; %s thread(s); date %s" % (platform.machine(), platform.processor() or "?",
                                                                os.cpu_count(), THREADS, time.strftime("%Y-%m-%d")))
    print("before: %s\nafter: %s" % (before, after))
    print("| workload | before ms/step | after ms/step | before / after | compile s (before, after) |")
    print("|---|---:|---:|---:|---:|")
    for name, (ins, nodes, inits, feed, flags) in work:
        d = tempfile.mkdtemp(prefix="nova-bench-")
        model, ind = os.path.join(d, "m.onnx"), os.path.join(d, "in")
        write_model(model, ins, nodes, inits)
        os.mkdir(ind)
        for k, arr in feed.items():
            with open(os.path.join(ind, k + ".pb"), "wb") as f:
                f.write(numpy_helper.from_array(arr, k).SerializeToString())
        sos = [os.path.join(d, "before.so"), os.path.join(d, "after.so")]
        cs = [compile_step(b, model, flags, so) for b, so in zip((before, after), sos)]
        t = [[], []]
        for _ in range(ROUNDS):  # alternating, so that other load on the machine hits both alike
            for i, b in enumerate((before, after)):
                t[i].append(run_ms(b, sos[i], ind))
        tb, ta = min(t[0]), min(t[1])
        print("| %s | %.3f | %.3f | %.2f | %.2f, %.2f |" % (name, tb, ta, tb / ta, cs[0], cs[1]), flush=True)

if __name__ == "__main__":
    main()
