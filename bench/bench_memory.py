#!/usr/bin/env python3
"""Peak memory of one AdamW training step, side by side: novac's planned
peak (the manifest: parameters, optimizer state, inputs, outputs and
gradients, plus the arena of intermediates) with the forward values the
backward reads chosen by recomputation (the default) and without it
(--recompute=none), against PyTorch eager's measured peak (the tensors
alive before a steady step plus the highest point of its allocations,
torch.profiler) and XLA's memory_analysis() (arguments + outputs + temp -
aliased) of the same step; and the smallest plan novac's --memory-limit
search reaches (a limit just above the parameters and optimizer state).

    python3 bench/bench_memory.py [--only mlp,gpt_block,gpt4,resnet18] [--build DIR] [--out FILE]

The MLP, the GPT block and the 4-layer GPT are bench/bench_cpu.py's
workloads (same shapes, weights and batches); resnet18 is torchvision's
(10 classes, 64x64 images, batch 8), exported with the TorchScript
exporter in training mode (batch statistics).  Also reported: the arena
against its lower bound (the most bytes live at once in the step's op
order) and the values recomputed.  Prints a Markdown table.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_cpu  # noqa: E402

RESNET_BATCH = 8


def mib(b):
    return "%.1f" % (b / 2**20) if b is not None else "-"


def novac_memory(build, model, batch, extra, d, tag):
    so = os.path.join(d, tag + ".so")
    cmd = [os.path.join(build, "bin", "novac"), model, "--train", "--optimizer=adamw",
           "--dim=batch=%d" % batch, "-o", so] + extra
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "exit %d" % p.returncode}
    with open(so[:-3] + ".json") as f:
        mem = json.load(f)["memory"]
    mem.pop("plan", None)
    mem["compile_s"] = time.perf_counter() - t0
    return mem


def novac_smallest(build, model, batch, d, tag):
    """The smallest peak --memory-limit reaches (bytes; its message when a
    limit just above the parameters and optimizer state does not fit), or
    an error string."""
    def attempt(limit):
        r = novac_memory(build, model, batch, ["--memory-limit=%d" % limit], d, tag)
        return r.get("planned_peak_bytes"), r.get("error", "")
    _, err = attempt(1)
    m = re.search(r"alone take (\d+) bytes", err)
    if not m:
        return "no floor in: " + err
    peak, err = attempt(int(m.group(1)) + 1)
    m = re.search(r"smallest peak reached is (\d+) bytes", err)
    return peak or (int(m.group(1)) if m else err)


def resnet_spec(d):
    """torchvision's resnet18 with a cross-entropy loss, its weights and a
    batch, exported for training (ONNX, TorchScript exporter, opset 17)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchvision

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18(num_classes=10)

        def forward(self, x, y):
            logits = self.net(x)
            return logits, F.cross_entropy(logits, y)

    torch.manual_seed(4)
    model = Classifier()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((RESNET_BATCH, 3, 64, 64)).astype(np.float32)
    y = rng.integers(0, 10, RESNET_BATCH).astype(np.int64)
    path = os.path.join(d, "resnet18.onnx")
    model.train()
    torch.onnx.export(model, (torch.from_numpy(x), torch.from_numpy(y)), path, dynamo=False, opset_version=17,
                      input_names=["x", "y"], output_names=["logits", "loss"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}, "logits": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    return model, (x, y), path


def torch_resnet_peak(model, batch):
    import torch
    torch.set_num_threads(1)
    model.train()
    inputs = [torch.from_numpy(batch[0]), torch.from_numpy(batch[1])]
    opt = torch.optim.AdamW(model.parameters(), **bench_cpu.ADAMW)

    def fwd_bwd_step():
        _, loss = model(*inputs)
        loss.backward()
        opt.step()
    for _ in range(2):   # the optimizer state exists before the measured step
        opt.zero_grad(set_to_none=True)
        fwd_bwd_step()
    return bench_cpu.torch_peak_bytes(torch, model, opt, inputs, fwd_bwd_step)


def run_workload(bench, wl, build, d):
    """{system: peak bytes or error} for one of bench_cpu's workloads."""
    spec = bench.prepare(wl)
    job = dict(workload=wl, weights=spec["weights"], data=spec["data"], inputs=spec["inputs"], threads=1,
               warmup=1, budget=0.1, min_steps=2, max_steps=3)
    rows = {}
    for system, worker in (("eager", bench_cpu.worker_torch), ("xla", bench_cpu.worker_xla)):
        try:
            rows[system] = worker(dict(job, system=system)).get("peak_bytes")
        except ImportError as e:
            rows[system] = "not installed (%s)" % e.name
    batch = bench_cpu.WORKLOADS[wl]["batch"]
    rows["novac"] = novac_memory(build, spec["novac_model"], batch, [], d, wl)
    rows["novac_none"] = novac_memory(build, spec["novac_model"], batch, ["--recompute=none"], d, wl + "_none")
    rows["novac_min"] = novac_smallest(build, spec["novac_model"], batch, d, wl + "_min")
    return bench_cpu.WORKLOADS[wl]["title"], rows


def run_resnet(build, d):
    try:
        model, batch, path = resnet_spec(d)
    except ImportError as e:
        return "resnet18", {"eager": "not installed (%s)" % e.name}
    rows = {"eager": torch_resnet_peak(model, batch), "xla": "no JAX model"}
    rows["novac"] = novac_memory(build, path, RESNET_BATCH, [], d, "resnet18")
    rows["novac_none"] = novac_memory(build, path, RESNET_BATCH, ["--recompute=none"], d, "resnet18_none")
    rows["novac_min"] = novac_smallest(build, path, RESNET_BATCH, d, "resnet18_min")
    return "torchvision resnet18 (10 classes, 64x64), batch %d" % RESNET_BATCH, rows


def cell(v):
    return mib(v) if isinstance(v, (int, float)) else str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="mlp,gpt_block,gpt4,resnet18")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="nova-bench-mem-")
    bench = bench_cpu.Bench(argparse.Namespace(quick=True, build=args.build, threads=1, systems=""))
    lines = ["Machine: %s; %s; %s." % (platform.processor() or platform.machine(), platform.platform(),
                                      time.strftime("%Y-%m-%d")),
             "Command: `python3 bench/bench_memory.py`. MiB; ratios are novac's planned peak over the peer's.",
             "",
             "| workload | novac planned peak | = tensors + arena | arena / lower bound | recomputed values "
             "| novac --recompute=none | PyTorch eager peak | XLA memory_analysis | novac / eager | novac / XLA "
             "| smallest --memory-limit plan | its / eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for wl in args.only.split(","):
        title, rows = run_resnet(args.build, d) if wl == "resnet18" else run_workload(bench, wl, args.build, d)
        nv, none = rows.get("novac") or {}, rows.get("novac_none") or {}
        peak = nv.get("planned_peak_bytes")
        eager, xla = rows.get("eager"), rows.get("xla")

        def ratio(b, top=None):
            top = top or peak
            return "%.2f" % (top / b) if top and isinstance(b, (int, float)) and b else "-"
        small = rows.get("novac_min")
        small = small if isinstance(small, int) else None
        lb = nv.get("lower_bound_bytes")
        rc = nv.get("recompute") or {}
        lines.append("| %s | %s | %s + %s | %s | %s (%s -> %s MiB kept) | %s | %s | %s | %s | %s | %s | %s |" % (
            title, mib(peak) if peak else nv.get("error", "-"), mib(nv.get("tensor_bytes")),
            mib(nv.get("arena_bytes")), "%.3f" % (nv["arena_bytes"] / lb) if lb else "-",
            rc.get("values", "-"), mib(rc.get("kept_bytes_without")), mib(rc.get("kept_bytes")),
            mib(none.get("planned_peak_bytes")) if none.get("planned_peak_bytes") else none.get("error", "-"),
            cell(eager), cell(xla), ratio(eager), ratio(xla), mib(small) if small else cell(rows.get("novac_min")),
            ratio(eager, small) if small else "-"))
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
