"""Side-by-side training-step time: novac vs PyTorch eager, same model, batch,
dtype (float32) and optimizer (AdamW), one thread each (novac's code is
single-threaded today).  Writes a table to stdout; bench/RESULTS.md keeps
the runs.  Usage: python3 bench/bench_train.py [BUILD_DIR]"""
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
NOVAC, NOVARUN = os.path.join(BUILD, "bin", "novac"), os.path.join(BUILD, "bin", "novarun")
STEPS = 200
B = 64


def novac_step_ms(model, dims, inputs):
    from onnx import numpy_helper
    d = tempfile.mkdtemp(prefix="nova-bench-")
    so = os.path.join(d, "s.so")
    t0 = time.perf_counter()
    subprocess.run([NOVAC, model, "--train", "--optimizer=adamw", "--lr=1e-3", "-o", so] + dims, check=True)
    compile_s = time.perf_counter() - t0
    os.mkdir(os.path.join(d, "in"))
    for name, arr in inputs.items():
        with open(os.path.join(d, "in", name + ".pb"), "wb") as f:
            f.write(numpy_helper.from_array(arr, name).SerializeToString())
    times = []
    for _ in range(3):
        p = subprocess.run([NOVARUN, so, "--inputs", os.path.join(d, "in"), "--steps", str(STEPS)],
                           capture_output=True, text=True, check=True)
        times.append(float(re.search(r"\(([0-9.]+) ms/step\)", p.stderr).group(1)))
    return sorted(times)[1], compile_s


def torch_step_ms(model, inputs, loss_fn):
    import torch
    torch.set_num_threads(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(10):  # warm-up
        opt.zero_grad()
        loss_fn(model, *inputs).backward()
        opt.step()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(STEPS):
            opt.zero_grad()
            loss_fn(model, *inputs).backward()
            opt.step()
        times.append((time.perf_counter() - t0) * 1e3 / STEPS)
    return sorted(times)[1]


def main():
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    rows = []
    # the MLP of examples/mlp.nova: 784-128-10, relu, cross-entropy
    x = rng.standard_normal((B, 784)).astype(np.float32)
    y = rng.integers(0, 10, B).astype(np.int64)
    nv, cs = novac_step_ms(os.path.join(ROOT, "examples", "mlp.nova"), ["--dim=batch=%d" % B], {"x": x, "y": y})
    mlp = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    pt = torch_step_ms(mlp, (torch.from_numpy(x), torch.from_numpy(y)), lambda m, a, b: F.cross_entropy(m(a), b))
    rows.append(("MLP 784-128-10, batch %d" % B, nv, pt, cs))
    # the GPT block exported from PyTorch (testsuite/onnx/models/gpt_block), batch 8
    sys.path.insert(0, os.path.join(ROOT, "testsuite", "onnx", "models"))
    import export
    tok = rng.integers(0, 50, (8, 8)).astype(np.int64)
    tgt = rng.integers(0, 50, (8, 8)).astype(np.int64)
    nv, cs = novac_step_ms(os.path.join(ROOT, "testsuite", "onnx", "models", "gpt_block", "model.onnx"),
                           ["--dim=batch=8"], {"idx": tok, "targets": tgt})
    gpt = export.GPTBlock() if hasattr(export, "GPTBlock") else None
    if gpt is not None:
        pt = torch_step_ms(gpt, (torch.from_numpy(tok), torch.from_numpy(tgt)), lambda m, a, b: m(a, b)[1])
        rows.append(("GPT block (d 32, T 8, vocab 50), batch 8", nv, pt, cs))
    print("machine: %s, %s, %d cores; torch %s; date %s" % (platform.machine(), platform.processor() or "?",
                                                           os.cpu_count(), torch.__version__, time.strftime("%Y-%m-%d")))
    print("| workload | novac ms/step | PyTorch eager ms/step | eager / novac | novac compile s |")
    print("|---|---:|---:|---:|---:|")
    for name, nv, pt, cs in rows:
        print("| %s | %.3f | %.3f | %.2f | %.2f |" % (name, nv, pt, pt / nv, cs))


if __name__ == "__main__":
    main()
