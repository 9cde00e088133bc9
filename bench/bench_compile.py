"""Compile time and peak memory of novac against the size of the model,
with the growth exponent fitted (time ~ N^k, least squares on log-log).

Models, generated here:
  chain      N statements `h_i = tanh(h_{i-1} @ w)` (.nova, one shared weight)
  chain-p    the same with a weight per statement (N params)
  onnx       an ONNX graph of N MatMul+Tanh node pairs, a weight per pair
  sum        one flat sum of N terms (.nova)
  gpt        GPT-style .nova models of L pre-norm blocks (d 64, 4 heads, T 32)
  gpt2s      the same at GPT-2 small's size (d 768, 12 heads, T 256, vocab 50257;
             12 layers: 162M parameters)
each compiled for inference and, with --train, as a training step.

  python3 bench/bench_compile.py [--build DIR] [--sizes 1000,2000,4000]
      [--layers 2,4,8,16] [--only chain,onnx,...] [--train] [--timeout S]

Prints a markdown table (wall seconds, CPU seconds of novac and its code
generators, peak RSS MiB per size; the exponents fitted to wall and to CPU
time: CPU time is the steadier on a busy machine); bench/RESULTS.md keeps
the runs."""
import argparse
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def chain(n, per_param):
    s = ["input x: f32[8, 16]"]
    if not per_param:
        s.append("param w: f32[16, 16] = normal(0.1)")
    prev = "x"
    for i in range(n):
        w = "w"
        if per_param:
            w = "w%d" % i
            s.append("param %s: f32[16, 16] = normal(0.1)" % w)
        s.append("h%d = tanh(%s @ %s)" % (i, prev, w))
        prev = "h%d" % i
    s.append("output loss = reduce_sum(%s * %s)" % (prev, prev))
    return "\n".join(s) + "\n", ".nova"


def flat_sum(n):
    s = ["input x: f32[8, 16]", "param w: f32[16] = normal(0.1)"]
    terms = " + ".join("x * %g" % (1 + i / n) for i in range(n))
    s.append("y = (%s) * w" % terms)
    s.append("output loss = reduce_sum(y * y)")
    return "\n".join(s) + "\n", ".nova"


def onnx_chain(n):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        inits.append(numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.1).astype(np.float32), "w%d" % i))
        nodes.append(helper.make_node("MatMul", [prev, "w%d" % i], ["m%d" % i]))
        nodes.append(helper.make_node("Tanh", ["m%d" % i], ["h%d" % i]))
        prev = "h%d" % i
    nodes += [helper.make_node("Mul", [prev, prev], ["sq"]), helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), ".onnx"


def gpt(layers, d=64, heads=4, T=32, vocab=128, batch=4):
    hd = d // heads
    s = ["input tokens: i64[%d, %d]" % (batch, T), "label targets: i64[%d, %d]" % (batch, T),
         "param wte: f32[%d, %d] = normal(0.02)" % (vocab, d), "param wpe: f32[%d, %d] = normal(0.02)" % (T, d),
         "const mask: f32[%d, %d] = causal_mask(-1e9)" % (T, T), "h0 = gather(wte, tokens) + wpe"]
    for i in range(layers):
        for n, shape, init in (("ln1_g", [d], "ones"), ("ln1_b", [d], "zeros"), ("w_qkv", [d, 3 * d], "normal(0.02)"),
                               ("w_proj", [d, d], "normal(0.02)"), ("ln2_g", [d], "ones"), ("ln2_b", [d], "zeros"),
                               ("w_fc", [d, 4 * d], "normal(0.02)"), ("w_out", [4 * d, d], "normal(0.02)")):
            s.append("param %s%d: f32[%s] = %s" % (n, i, ", ".join(map(str, shape)), init))
        h = "h%d" % i
        s += ["a%d = layer_norm(%s, ln1_g%d, ln1_b%d)" % (i, h, i, i), "qkv%d = a%d @ w_qkv%d" % (i, i, i)]
        for j, (nm, perm) in enumerate((("q", "0, 2, 1, 3"), ("k", "0, 2, 3, 1"), ("v", "0, 2, 1, 3"))):
            s.append("%s%d = transpose(reshape(slice(qkv%d, axis=2, start=%d, end=%d), shape=[%d, %d, %d, %d]), perm=[%s])"
                     % (nm, i, i, j * d, (j + 1) * d, batch, T, heads, hd, perm))
        s += ["att%d = softmax((q%d @ k%d) * %r + mask, axis=-1)" % (i, i, i, 1 / math.sqrt(hd)),
              "y%d = reshape(transpose(att%d @ v%d, perm=[0, 2, 1, 3]), shape=[%d, %d, %d])" % (i, i, i, batch, T, d),
              "r%d = %s + y%d @ w_proj%d" % (i, h, i, i),
              "m%d = layer_norm(r%d, ln2_g%d, ln2_b%d)" % (i, i, i, i),
              "h%d = r%d + gelu(m%d @ w_fc%d) @ w_out%d" % (i + 1, i, i, i, i)]
    s += ["param lnf_g: f32[%d] = ones" % d, "param lnf_b: f32[%d] = zeros" % d,
          "param w_head: f32[%d, %d] = normal(0.02)" % (d, vocab),
          "logits = layer_norm(h%d, lnf_g, lnf_b) @ w_head" % layers, "output loss = cross_entropy(logits, targets)"]
    return "\n".join(s) + "\n", ".nova"


def compile_once(novac, text, ext, train, timeout, tmp):
    """(wall s, CPU s (user + system, novac and its code generators), peak RSS MiB, error or None)."""
    path = os.path.join(tmp, "m" + ext)
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    cmd = [novac, path, "-o", os.path.join(tmp, "m.so")] + (["--train"] if train else [])
    with open(os.path.join(tmp, "stderr"), "w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = t0 + timeout
        while True:  # wait4: this child's own resource use (and its waited-for children's)
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                return None, None, None, "timeout"
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        err.seek(0)
        msg = err.read().strip()
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        return None, None, None, msg.splitlines()[-1] if msg else "exit %d" % rc
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, None


def exponent(points):
    pts = [(math.log(n), math.log(t)) for n, t in points if t and t > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sizes", default="1000,2000,4000,8000")
    ap.add_argument("--layers", default="2,4,8,16")
    ap.add_argument("--only", default="chain,chain-p,onnx,sum,gpt")
    ap.add_argument("--train", action="store_true", help="also compile each model as a training step")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    novac = os.path.join(a.build, "bin", "novac")
    sizes = [int(s) for s in a.sizes.split(",") if s]
    layers = [int(s) for s in a.layers.split(",") if s]
    gens = {"chain": lambda n: chain(n, False), "chain-p": lambda n: chain(n, True), "onnx": onnx_chain,
            "sum": flat_sum, "gpt": gpt,
            # GPT-2 small's shape, untied head (162M parameters): d 768, 12 heads, T 256, vocab 50257, batch 4
            "gpt2s": lambda n: gpt(n, d=768, heads=12, T=256, vocab=50257)}
    rows = []
    for name in a.only.split(","):
        for train in ([False, True] if a.train else [False]):
            ns = layers if name.startswith("gpt") else sizes
            pts, cpts, cells = [], [], []
            for n in ns:
                with tempfile.TemporaryDirectory(prefix="nova-bench-compile-") as tmp:
                    text, ext = gens[name](n)
                    wall, cpu, rss, err = compile_once(novac, text, ext, train, a.timeout, tmp)
                if err:
                    cells.append("%d: %s" % (n, err[:60]))
                    break
                pts.append((n, wall))
                cpts.append((n, cpu))
                cells.append("%d: %.2f s (%.2f s CPU, %.0f MiB)" % (n, wall, cpu, rss))
                print("%s%s %d: %.2f s wall, %.2f s CPU, %.0f MiB" % (name, " --train" if train else "", n, wall, cpu,
                                                                       rss), file=sys.stderr, flush=True)
            rows.append((name + (" --train" if train else ""), "layers" if name.startswith("gpt") else "statements",
                         cells, exponent(pts), exponent(cpts)))
    print("machine: %s, %d cores; date %s; command: %s" % (platform.machine(), os.cpu_count(), time.strftime("%Y-%m-%d"),
                                                          " ".join(sys.argv)))
    print("| model | N counts | compile wall time (CPU time, peak RSS) by N | exponent k, wall (time ~ N^k) "
          "| exponent k, CPU |")
    print("|---|---|---|---:|---:|")
    for name, unit, cells, k, kc in rows:
        print("| %s | %s | %s | %.2f | %.2f |" % (name, unit, "; ".join(cells), k, kc))


if __name__ == "__main__":
    main()
