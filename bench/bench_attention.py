"""Training-step time of one attention layer (ONNX opset-23 Attention,
grouped-query, causal): novac against PyTorch eager
(F.scaled_dot_product_attention) on the same weights, batch and optimizer
(SGD), and optionally against another novac build (e.g. one that wrote
Attention as its composition of matmul, softmax and masks).

  python3 bench/bench_attention.py [--build DIR] [--base DIR] [--threads N]

Prints the machine, the first-step losses (they must agree) and a table;
bench/RESULTS.md keeps the runs."""
import argparse
import os
import platform
import re
import subprocess
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STEPS = 20
LR = 1e-3
# (name, batch, sequence, model width, query heads, KV heads)
CONFIGS = [("S 128, d 256, 8/2 heads, batch 8", 8, 128, 256, 8, 2),
           ("S 512, d 256, 8/8 heads, batch 2", 2, 512, 256, 8, 8)]


def weights(E, hq, hk, D, rng):
    s = E ** -0.5
    return {"wq": rng.standard_normal((E, hq * D)) * s, "wk": rng.standard_normal((E, hk * D)) * s,
            "wv": rng.standard_normal((E, hk * D)) * s, "wo": rng.standard_normal((hq * D, E)) * s}


def model(path, B, S, E, hq, hk, W):
    """loss = mean((Attention(x Wq, x Wk, x Wv) Wo)^2)"""
    nodes = [helper.make_node("MatMul", ["x", "w" + c], [c]) for c in "qkv"]
    nodes += [helper.make_node("Attention", ["q", "k", "v"], ["a"], q_num_heads=hq, kv_num_heads=hk, is_causal=1),
              helper.make_node("MatMul", ["a", "wo"], ["o"]), helper.make_node("Mul", ["o", "o"], ["o2"]),
              helper.make_node("ReduceMean", ["o2"], ["loss"], keepdims=0)]
    g = helper.make_graph(nodes, "attention_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                          [numpy_helper.from_array(w.astype(np.float32), n) for n, w in W.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]), path)


def novac_ms(build, onnx_path, x, threads):
    d = tempfile.mkdtemp(prefix="nova-bench-attn-")
    so = os.path.join(d, "s.so")
    t0 = time.perf_counter()
    subprocess.run([os.path.join(build, "bin", "novac"), onnx_path, "--train", "--optimizer=sgd", "--lr=%g" % LR,
                    "-o", so], check=True)
    compile_s = time.perf_counter() - t0
    os.mkdir(os.path.join(d, "in"))
    with open(os.path.join(d, "in", "x.pb"), "wb") as f:
        f.write(numpy_helper.from_array(x, "x").SerializeToString())
    env = dict(os.environ, NOVA_NUM_THREADS=str(threads))
    run = [os.path.join(build, "bin", "novarun"), so, "--inputs", os.path.join(d, "in")]
    first = subprocess.run(run + ["--steps", "1"], capture_output=True, text=True, check=True, env=env)
    loss = float(re.search(r"loss[ =:]+([-0-9.e+]+)", first.stdout + first.stderr).group(1))
    times = []
    for _ in range(3):
        p = subprocess.run(run + ["--steps", str(STEPS)], capture_output=True, text=True, check=True, env=env)
        times.append(float(re.search(r"\(([0-9.]+) ms/step\)", p.stderr).group(1)))
    return sorted(times)[1], compile_s, loss


def torch_ms(B, S, E, hq, hk, W, x, threads):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    P = {n: torch.tensor(w, dtype=torch.float32, requires_grad=True) for n, w in W.items()}
    xt = torch.from_numpy(x)
    D = W["wq"].shape[1] // hq
    opt = torch.optim.SGD(P.values(), lr=LR)

    def step():
        opt.zero_grad()
        q = (xt @ P["wq"]).view(B, S, hq, D).transpose(1, 2)
        k = (xt @ P["wk"]).view(B, S, hk, D).transpose(1, 2)
        v = (xt @ P["wv"]).view(B, S, hk, D).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hk)
        loss = ((a.transpose(1, 2).reshape(B, S, hq * D) @ P["wo"]) ** 2).mean()
        loss.backward()
        opt.step()
        return float(loss)
    first = step()
    for _ in range(3):
        step()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(STEPS):
            step()
        times.append((time.perf_counter() - t0) * 1e3 / STEPS)
    return sorted(times)[1], first, torch.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--base", help="another novac build to compare (its column is left out without it)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    rows, tv = [], "?"
    for name, B, S, E, hq, hk in CONFIGS:
        D = E // hq
        W = weights(E, hq, hk, D, rng)
        x = rng.standard_normal((B, S, E)).astype(np.float32)
        path = os.path.join(tempfile.mkdtemp(prefix="nova-bench-attn-"), "m.onnx")
        model(path, B, S, E, hq, hk, W)
        nv, cs, l_nv = novac_ms(a.build, path, x, a.threads)
        base = novac_ms(a.base, path, x, a.threads) if a.base else None
        pt, l_pt, tv = torch_ms(B, S, E, hq, hk, W, x, a.threads)
        rows.append((name, nv, cs, l_nv, base, pt, l_pt))
    print("machine: %s, %s, %d cores, %d threads each; torch %s; date %s" % (
        platform.machine(), platform.processor() or "?", os.cpu_count(), a.threads, tv, time.strftime("%Y-%m-%d")))
    print("| attention layer train step | novac ms | base novac ms | PyTorch eager ms | base / novac | eager / novac "
          "| novac compile s | first loss novac / eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, nv, cs, l_nv, base, pt, l_pt in rows:
        print("| %s | %.2f | %s | %.2f | %s | %.2f | %.2f | %.6g / %.6g |" % (
            name, nv, "%.2f" % base[0] if base else "-", pt, "%.2f" % (base[0] / nv) if base else "-", pt / nv, cs,
            l_nv, l_pt))


if __name__ == "__main__":
    main()
