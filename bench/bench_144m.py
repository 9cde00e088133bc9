#!/usr/bin/env python3
"""The 144M-parameter model: a GPT-2-class model (d 768, 12 heads, 12
layers, T 1024, vocabulary 38,000, untied head: 144.2M parameters) that
PyTorch eager cannot train in 12 GiB at a batch where novac's plan fits.

    python3 bench/bench_144m.py [--layers N] [--vocab V] [--batches 1,2] [--build DIR] [--skip-train]

1. Exports the model from PyTorch (TorchScript exporter, opset 17,
   symbolic batch; random initialization, no download).
2. PyTorch eager: the measured peak of one AdamW step (torch.profiler, as
   bench/bench_cpu.py measures it) at each batch of --batches (default 1
   and 2), then, from the line through them, at the smallest batch whose
   peak passes 12 GiB.
3. novac at that batch: the planned peak for --target=cuda
   --device=rtx3060 (12 GiB: novac's compile-time check passes or says by
   how much it does not), and for the cpu, where novarun then trains two
   steps under /usr/bin/time: its peak RSS against 12 GiB and against the
   plan.
Prints a Markdown table (MiB).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_cpu  # noqa: E402

GIB12 = 12 << 30


def build_model(args):
    import torch
    bench_cpu.G4.update(D=768, HEADS=12, T=1024, VOCAB=args.vocab, LAYERS=args.layers)
    torch.manual_seed(5)
    model = bench_cpu.torch_models()["gpt4"](d=768, heads=12, t=1024, vocab=args.vocab, layers=args.layers)
    return model


def export(model, vocab, path):
    import torch
    import warnings
    idx = torch.randint(0, vocab, (1, 1024))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (idx, idx), path, dynamo=False, opset_version=17, input_names=["idx", "targets"],
                          output_names=["logits", "loss"],
                          dynamic_axes={"idx": {0: "batch"}, "targets": {0: "batch"}, "logits": {0: "batch"}},
                          do_constant_folding=True, export_params=True)


def torch_peak(model, vocab, batch):
    """Peak bytes of one steady AdamW step at BATCH (a warm-up step first)."""
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    model.train()
    idx = torch.randint(0, vocab, (batch, 1024))
    opt = torch.optim.AdamW(model.parameters(), **bench_cpu.ADAMW)

    def fwd_bwd_step():
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    fwd_bwd_step()
    peak = bench_cpu.torch_peak_bytes(torch, model, opt, [idx], fwd_bwd_step)
    del opt
    return peak


def novac(build, model, batch, extra, out):
    cmd = [os.path.join(build, "bin", "novac"), model, "--train", "--optimizer=adamw", "--dim=batch=%d" % batch,
           "-o", out] + extra
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    res = {"compile_s": time.perf_counter() - t0, "rc": p.returncode, "stderr": p.stderr.strip()[-600:]}
    if p.returncode == 0:
        with open(out[:-3] + ".json") as f:
            mem = json.load(f)["memory"]
        mem.pop("plan", None)
        res["memory"] = mem
    return res


def novarun_rss(build, so, steps):
    cmd = ["/usr/bin/time", "-v", os.path.join(build, "bin", "novarun"), so, "--seed", "1", "--steps", str(steps)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return {"rc": p.returncode, "rss": int(m.group(1)) * 1024 if m else None, "s": time.perf_counter() - t0,
            "tail": p.stderr.strip().splitlines()[-25:-20] if p.returncode else p.stderr.strip().splitlines()[:3]}


def mib(b):
    return "%.0f" % (b / 2**20) if isinstance(b, (int, float)) else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=38000)
    ap.add_argument("--batches", default="1,2", help="batches PyTorch is measured at before the line's")
    ap.add_argument("--batch", type=int, help="novac's batch (default: PyTorch's first above 12 GiB)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--skip-train", action="store_true", help="no novarun run on the cpu")
    ap.add_argument("--dir", help="keep the model and steps here (default: a temporary folder)")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="nova-144m-")
    os.makedirs(d, exist_ok=True)
    model = build_model(args)
    nparams = sum(p.numel() for p in model.parameters())
    print("model: %.1fM parameters (d 768, 12 heads, %d layers, T 1024, vocabulary %d)" %
          (nparams / 1e6, args.layers, args.vocab), flush=True)
    onnx_path = os.path.join(d, "model.onnx")
    if not os.path.exists(onnx_path):
        export(model, args.vocab, onnx_path)
    rows = []
    peaks = {}
    for b in [int(x) for x in args.batches.split(",") if x]:
        peaks[b] = torch_peak(model, args.vocab, b)
        print("PyTorch eager, batch %d: %s MiB" % (b, mib(peaks[b])), flush=True)
    batch = args.batch
    if batch is None and len(peaks) >= 2:
        (b0, p0), (b1, p1) = sorted(peaks.items())[:2]
        slope = (p1 - p0) / (b1 - b0)
        batch = max(b1, int((GIB12 - p0) / slope) + b0 + 1) if slope > 0 else b1
        while p0 + slope * (batch - b0) <= GIB12:
            batch += 1
    if batch not in peaks and batch is not None:
        peaks[batch] = torch_peak(model, args.vocab, batch)
        print("PyTorch eager, batch %d: %s MiB" % (batch, mib(peaks[batch])), flush=True)
    gpu = novac(args.build, onnx_path, batch, ["--target=cuda", "--device=rtx3060"], os.path.join(d, "gpu.so"))
    print("novac --target=cuda --device=rtx3060, batch %d: rc %d, %.1f s%s" %
          (batch, gpu["rc"], gpu["compile_s"], "" if gpu["rc"] == 0 else ": " + gpu["stderr"]), flush=True)
    cpu = novac(args.build, onnx_path, batch, [], os.path.join(d, "cpu.so"))
    print("novac cpu, batch %d: rc %d, %.1f s" % (batch, cpu["rc"], cpu["compile_s"]), flush=True)
    run = novarun_rss(args.build, os.path.join(d, "cpu.so"), 2) if cpu["rc"] == 0 and not args.skip_train else {}
    if run:
        print("novarun 2 steps: rc %d, %.0f s, peak RSS %s MiB" % (run["rc"], run["s"], mib(run.get("rss"))),
              flush=True)
    for b, p in sorted(peaks.items()):
        rows.append("| PyTorch eager, batch %d | %s | %s |" % (b, mib(p), "yes" if p > GIB12 else "no"))
    for name, r in (("novac plan, --target=cuda --device=rtx3060", gpu), ("novac plan, cpu", cpu)):
        m = r.get("memory", {})
        rows.append("| %s, batch %d | %s | %s |" % (name, batch, mib(m.get("planned_peak_bytes")),
                                                    "compile failed: " + r["stderr"][-200:] if r["rc"] else
                                                    ("yes" if m.get("planned_peak_bytes", 0) > GIB12 else "no")))
    if run:
        rows.append("| novarun peak RSS, 2 cpu training steps, batch %d (%.0f s) | %s | %s |" % (
            batch, run["s"], mib(run.get("rss")), "yes" if (run.get("rss") or 0) > GIB12 else "no"))
    print()
    print("Model: %.1fM parameters (d 768, 12 heads, %d layers, T 1024, vocabulary %d), AdamW." %
          (nparams / 1e6, args.layers, args.vocab))
    print()
    print("| run | peak MiB | above 12 GiB |")
    print("|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
