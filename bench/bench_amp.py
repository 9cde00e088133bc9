#!/usr/bin/env python3
"""Mixed precision on the CPU, one run on one machine: the same AdamW
training (same weights, same data, lr 1e-3, 300 steps) in novac at
--precision=fp32, bf16 and fp16 (and bf16 with --bf16-master=none: parameters
only in bf16, stochastically rounded updates) and in PyTorch eager at fp32
and under torch.autocast("cpu", bfloat16), side by side.

    python3 bench/bench_amp.py [--steps N] [--threads N] [--only gpt_block,gpt4] [--build DIR]

Models: the GPT block of testsuite/onnx/models/export.py (d 32, T 8, vocab
50, batch 8) and the 4-layer GPT of bench/bench_cpu.py (d 256, 4 heads, T 128,
vocab 512, batch 8), both exported to ONNX as bench_cpu.py does; novac
starts from the initializers, PyTorch from the same module.  The data is a
fixed set of 64 random sequences with the next token as the target, cycled
batch by batch, so that the loss falls (the model memorizes them).

Reported per model: the final loss (mean of the last 10 steps) of each run
and its ratio to novac's fp32 run and to PyTorch autocast bf16; ms per step
(median of novarun's whole-run time over --repeat runs, default 3, PyTorch's the same way) and
the speed ratios; novac's planned peak memory from the manifest.  Every
system runs with N threads (default 1), pinned by taskset to CPUs 0..N-1.
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "testsuite", "onnx", "models"))
NSEQ = 64


def write_safetensors(path, arrays):
    header, off, blobs = {}, 0, []
    for k, v in arrays.items():
        b = np.ascontiguousarray(v).tobytes()
        header[k] = {"dtype": "I64", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def export(model, names, example, path):
    import warnings

    import torch
    dyn = {n: {0: "batch"} for n in names}
    dyn["logits"] = {0: "batch"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, path, dynamo=False, opset_version=17, input_names=list(names),
                          output_names=["logits", "loss"], dynamic_axes=dyn, do_constant_folding=True)


def workloads():
    import torch
    import bench_cpu
    import export as ex
    torch.manual_seed(3)
    g4 = bench_cpu.torch_models()["gpt4"]()
    torch.manual_seed(3)
    blk = ex.GPTBlock()
    return {"gpt_block": dict(model=blk, T=ex.T, V=ex.VOCAB, B=8, names=("idx", "targets"),
                              title="GPT block (d %d, T %d, vocab %d), batch 8" % (ex.D, ex.T, ex.VOCAB)),
            "gpt4": dict(model=g4, T=128, V=512, B=8, names=("idx", "targets"),
                         title="4-layer GPT (d 256, 4 heads, T 128, vocab 512), batch 8")}


def data(T, V):
    rng = np.random.default_rng(7)
    seq = rng.integers(0, V, (NSEQ, T + 1)).astype(np.int64)
    return seq[:, :T].copy(), seq[:, 1:].copy()


def taskset(n):
    return ["taskset", "-c", "0-%d" % (n - 1)] if shutil.which("taskset") else []


def novac_run(a, w, d, prec, idx, tgt, extra=()):
    tag = prec + "".join(extra).replace("-", "").replace("=", "")
    so = os.path.join(d, "s_%s.so" % tag)
    novac, novarun = (os.path.join(a.build, "bin", x) for x in ("novac", "novarun"))
    t0 = time.perf_counter()
    subprocess.run([novac, w["onnx"], "--train", "--optimizer=adamw", "--lr=1e-3", "--precision=" + prec,
                    "--dim=batch=%d" % w["B"], "-o", so] + list(extra), check=True)
    compile_s = time.perf_counter() - t0
    man = json.load(open(so[:-3] + ".json"))
    ds = os.path.join(d, "data.st")
    write_safetensors(ds, {"idx": idx, "targets": tgt})
    env = dict(os.environ, NOVA_NUM_THREADS=str(a.threads))
    times, losses = [], None
    for r in range(a.repeat):
        log = os.path.join(d, "loss_%s.txt" % tag)
        p = subprocess.run(taskset(a.threads) + [novarun, so, "--data", ds, "--steps", str(a.steps), "--loss-log", log],
                           capture_output=True, text=True, env=env)
        if p.returncode:
            raise SystemExit("novarun %s failed:\n%s" % (prec, p.stderr))
        times.append(float(re.search(r"\(([0-9.]+) ms/step\)", p.stderr).group(1)))
        losses = [float(l.split()[1]) for l in open(log)]
    return dict(ms=statistics.median(times), losses=losses, compile_s=compile_s,
                peak=man["memory"]["planned_peak_bytes"], arena=man["memory"]["arena_bytes"])


def torch_run(a, w, state, prec, idx, tgt):
    import copy

    import torch
    torch.set_num_threads(a.threads)
    B = w["B"]
    times, losses = [], None
    for r in range(a.repeat):
        m = copy.deepcopy(w["model"])
        m.load_state_dict(state)
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        ls = []
        t0 = time.perf_counter()
        for k in range(a.steps):
            i = np.arange(k * B, (k + 1) * B) % NSEQ
            x, y = torch.from_numpy(idx[i]), torch.from_numpy(tgt[i])
            opt.zero_grad()
            if prec == "bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = m(x, y)[1]
            else:
                loss = m(x, y)[1]
            loss.backward()
            opt.step()
            ls.append(float(loss.detach()))
        times.append((time.perf_counter() - t0) * 1e3 / a.steps)
        losses = ls
    return dict(ms=statistics.median(times), losses=losses)


def final(losses):
    return sum(losses[-10:]) / len(losses[-10:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="gpt_block,gpt4")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of each training, the median time reported")
    a = ap.parse_args()
    import torch
    cpu = platform.processor() or "?"
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    flags = open("/proc/cpuinfo").read()
    isa = " ".join(f for f in ("avx512_bf16", "avx512fp16", "avx512f", "avx2", "f16c") if " " + f in flags)
    print("# bench_amp.py, %s\n\nmachine: %s (%s), %d thread(s); torch %s; %d AdamW steps, lr 1e-3\n" %
          (time.strftime("%Y-%m-%d"), cpu, isa, a.threads, torch.__version__, a.steps))
    ws = workloads()
    for name in a.only.split(","):
        w = ws[name]
        d = tempfile.mkdtemp(prefix="nova-amp-bench-")
        try:
            w["onnx"] = os.path.join(d, "model.onnx")
            idx, tgt = data(w["T"], w["V"])
            ex = (torch.from_numpy(idx[:2]), torch.from_numpy(tgt[:2]))
            state = {k: v.clone() for k, v in w["model"].state_dict().items()}
            export(w["model"].eval(), w["names"], ex, w["onnx"])
            runs = {}
            for prec in ("fp32", "bf16", "fp16"):
                runs["novac " + prec] = novac_run(a, w, d, prec, idx, tgt)
            runs["novac bf16, --bf16-master=none"] = novac_run(a, w, d, "bf16", idx, tgt, ["--bf16-master=none"])
            for prec in ("fp32", "bf16"):
                runs["PyTorch " + ("autocast bf16" if prec == "bf16" else "fp32")] = torch_run(a, w, state, prec, idx, tgt)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        base, ac = runs["novac fp32"], runs["PyTorch autocast bf16"]
        print("## %s\n" % w["title"])
        print("| run | first loss | final loss (last 10) | / novac fp32 | / PyTorch autocast bf16 | ms/step | "
              "novac fp32 / this | PyTorch autocast / this | planned peak MiB |")
        print("|---|---|---|---|---|---|---|---|---|")
        for k, r in runs.items():
            fl = final(r["losses"])
            peak = "%.2f (%.2fx fp32)" % (r["peak"] / 2**20, r["peak"] / base["peak"]) if "peak" in r else "-"
            print("| %s | %.4f | %.4f | %.4f | %.4f | %.2f | %.2f | %.2f | %s |" %
                  (k, r["losses"][0], fl, fl / final(base["losses"]), fl / final(ac["losses"]), r["ms"],
                   base["ms"] / r["ms"], ac["ms"] / r["ms"], peak))
        print()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
