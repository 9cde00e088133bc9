#!/usr/bin/env python3
"""Weak scaling of data-parallel training on the CPU: novac --data-parallel
under mpirun against PyTorch DistributedDataParallel (gloo) under torchrun,
in one run, side by side.

The 4-layer GPT of bench_cpu.py (d 256, 4 heads, T 128, vocab 512; AdamW),
batch 8 per process, 1 thread per process:
  novac   1 process            novarun one.so  (compiled without the flag)
  novac   2 ranks              mpirun -np 2 novarun dp.so --trace (novac --data-parallel),
                               default buckets (25 MiB, the first 1 MiB) and --bucket-size=2M,
                               and --world-size=2 --shard-optimizer (ZeRO-1)
  PyTorch 1 process            plain training loop
  PyTorch 2 ranks              torchrun --nproc-per-node 2, DDP(gloo)
Rounds are interleaved; each figure is the median over rounds of the
steady-state samples/s (all ranks together).  Memory per process: the
manifest's (parameters, optimizer state, planned intermediates, the
runtime's bucket buffers) and the peak RSS (/usr/bin/time) of rank 0.  The trace of the novac runs
gives the share of the all-reduce time hidden behind the backward.

  python3 bench/bench_dp.py [--rounds 3] [--steps 12] [--out bench/dp_results.md]
Needs: build/ (make), mpirun (Open MPI), torch, onnx.
"""
import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_cpu  # noqa: E402  (the GPT, its export, machine information)

BATCH = 8
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", NOVA_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def torch_worker(args):
    """One process of the PyTorch side (alone, or a torchrun rank): prints 'MS <median step ms>'."""
    import numpy as np
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    model = bench_cpu.torch_models()["gpt4"]()
    state = {k: torch.from_numpy(v) for k, v in np.load(args.weights).items()}
    model.load_state_dict(state, strict=False)
    model.train()
    fwd = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), **bench_cpu.ADAMW)
    data = np.load(args.data)
    idx, tgt = torch.from_numpy(data["idx"]), torch.from_numpy(data["targets"])
    times = []
    for k in range(args.steps):
        rows = [(k * world * BATCH + rank + world * j) % idx.shape[0] for j in range(BATCH)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = fwd(idx[rows], tgt[rows])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print("MS %.3f" % (statistics.median(times[2:]) * 1e3))


TIME = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
RSS = {}


def novarun_ms(cmd, env, key=None):
    if TIME and key:  # each process's peak RSS: /usr/bin/time around novarun (under mpirun too)
        i = cmd.index([c for c in cmd if c.endswith("novarun")][0])
        cmd = cmd[:i] + [TIME, "-f", "maxrss %M KiB"] + cmd[i:]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode:
        raise SystemExit("%s failed:\n%s" % (" ".join(cmd), p.stderr[-3000:]))
    m = re.search(r"steps in [0-9.]+ s \(([0-9.]+) ms/step\)", p.stderr)
    h = re.search(r"all-reduce ([0-9.]+) ms per run, ([0-9]+)% hidden behind compute \(([0-9]+)% without", p.stderr)
    rss = [int(x) for x in re.findall(r"maxrss ([0-9]+) KiB", p.stderr)]
    if key and rss:
        RSS.setdefault(key, []).append(max(rss) / 1024)
    return float(m.group(1)), (float(h.group(1)), int(h.group(2)), int(h.group(3))) if h else None


def manifest_mib(so):
    """(tensors, arena, staging) of a step's manifest, in MiB."""
    import json
    with open(so[:-3] + ".json") as f:
        m = json.load(f)
    mem, dp = m["memory"], m.get("data_parallel", {})
    return mem["tensor_bytes"] / 2 ** 20, mem["arena_bytes"] / 2 ** 20, dp.get("staging_bytes", 0) / 2 ** 20


def torch_ms(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV1, timeout=3600)
    m = re.search(r"^MS ([0-9.]+)", p.stdout, re.M)
    if p.returncode or not m:
        raise SystemExit("%s failed:\n%s\n%s" % (" ".join(cmd), p.stdout[-1000:], p.stderr[-3000:]))
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", default=os.path.join(HERE, "dp_results.md"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args)
    import numpy as np
    build = os.path.join(bench_cpu.ROOT, "build", "bin")
    novac, novarun = os.path.join(build, "novac"), os.path.join(build, "novarun")
    d = tempfile.mkdtemp(prefix="nova-bench-dp-")
    try:
        weights, onnx_path = bench_cpu.Bench.export_gpt4(None, d)
        np.savez(os.path.join(d, "w.npz"), **weights)
        rng = np.random.default_rng(5)
        T, V = bench_cpu.G4["T"], bench_cpu.G4["VOCAB"]
        idx = rng.integers(0, V, (256, T)).astype(np.int64)
        tgt = rng.integers(0, V, (256, T)).astype(np.int64)
        np.savez(os.path.join(d, "data.npz"), idx=idx, targets=tgt)
        bench_cpu.write_safetensors(os.path.join(d, "data.st"), {"idx": idx, "targets": tgt}, {})
        flags = ["--train", "--optimizer=adamw", "--lr=0.001", "--weight-decay=0.01", "--dim=batch=%d" % BATCH]
        one, dp = os.path.join(d, "one.so"), os.path.join(d, "dp.so")
        subprocess.run([novac, onnx_path, "-o", one] + flags, check=True)
        subprocess.run([novac, onnx_path, "-o", dp, "--data-parallel"] + flags, check=True)
        dps = os.path.join(d, "dps.so")
        subprocess.run([novac, onnx_path, "-o", dps, "--data-parallel", "--bucket-size=2M"] + flags, check=True)
        dpz = os.path.join(d, "dpz.so")
        subprocess.run([novac, onnx_path, "-o", dpz, "--data-parallel", "--world-size=2", "--shard-optimizer"] + flags,
                       check=True)
        data = os.path.join(d, "data.st")
        steps = str(args.steps)
        me = [sys.executable, os.path.abspath(__file__), "--worker", "--weights", os.path.join(d, "w.npz"),
              "--data", os.path.join(d, "data.npz"), "--steps", steps]
        res = {k: [] for k in ("n1", "n2", "n2s", "n2z", "t1", "t2")}
        hidden = {"n2": [], "n2s": [], "n2z": []}
        for r in range(args.rounds):
            ms, _ = novarun_ms([novarun, one, "--data", data, "--steps", steps], ENV1, "n1")
            res["n1"].append(BATCH / ms * 1e3)
            for key, so in (("n2", dp), ("n2s", dps), ("n2z", dpz)):
                ms, h = novarun_ms(["mpirun", "-np", "2", "--bind-to", "core", novarun, so, "--data", data, "--steps",
                                    steps, "--trace", os.path.join(d, "trace.json")], ENV1, key)
                res[key].append(2 * BATCH / ms * 1e3)
                hidden[key].append(h)
            res["t1"].append(BATCH / torch_ms(me) * 1e3)
            res["t2"].append(2 * BATCH / torch_ms(["torchrun", "--standalone", "--nproc-per-node", "2"] + me[1:]) * 1e3)
            print("round %d: %s" % (r + 1, {k: round(v[-1], 1) for k, v in res.items()}), file=sys.stderr)
        med = {k: statistics.median(v) for k, v in res.items()}
        info = bench_cpu.machine_info(type("B", (), {"novac_bin": novac})())
        hid = {k: sorted(v, key=lambda h: h[1] if h else -1)[len(v) // 2] for k, v in hidden.items()}
        lines = [
            "## Data-parallel weak scaling, 4-layer GPT (bench/bench_dp.py)", "",
            "- date: %s" % datetime.date.today().isoformat(),
            "- machine: %s" % info["cpu"],
            "- versions: %s; %s" % (info["novac"], info["versions"]),
            "- command: `python3 bench/bench_dp.py --rounds %d --steps %d`" % (args.rounds, args.steps),
            "- workload: the 4-layer GPT of bench_cpu.py, AdamW, batch %d per process, 1 thread per process; "
            "medians over %d interleaved rounds of the median step (steps after the first 2)" % (BATCH, args.rounds),
            "",
            "| system | 1 process, samples/s | 2 ranks, samples/s | scaling (2 ranks / 1) |",
            "|---|---|---|---|",
            "| novac (mpirun, --data-parallel) | %.1f | %.1f | %.2fx |" % (med["n1"], med["n2"], med["n2"] / med["n1"]),
            "| novac (mpirun, --data-parallel --bucket-size=2M) | %.1f | %.1f | %.2fx |" % (
                med["n1"], med["n2s"], med["n2s"] / med["n1"]),
            "| novac (mpirun, --data-parallel --world-size=2 --shard-optimizer) | %.1f | %.1f | %.2fx |" % (
                med["n1"], med["n2z"], med["n2z"] / med["n1"]),
            "| PyTorch eager (torchrun, DDP gloo) | %.1f | %.1f | %.2fx |" % (med["t1"], med["t2"], med["t2"] / med["t1"]),
            "",
            "- novac 2 ranks / PyTorch DDP 2 ranks: **%.2fx** samples/s (--bucket-size=2M: **%.2fx**)" % (
                med["n2"] / med["t2"], med["n2s"] / med["t2"]),
        ]
        lines += ["", "Memory per process (MiB): the manifest's tensors (parameters, optimizer state, inputs), planned "
                  "intermediates (arena) and the runtime's bucket buffers; the peak RSS of the largest rank "
                  "(/usr/bin/time, median round).", "",
                  "| step | tensors | arena | bucket buffers | sum | peak RSS |", "|---|---|---|---|---|---|"]
        for key, so, what in (("n1", one, "1 process"), ("n2", dp, "--data-parallel"),
                              ("n2z", dpz, "--data-parallel --world-size=2 --shard-optimizer")):
            t, a, s = manifest_mib(so)
            rss = statistics.median(RSS[key]) if RSS.get(key) else float("nan")
            lines.append("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |" % (what, t, a, s, t + a + s, rss))
        lines.append("")
        for k, what in (("n2", "default buckets"), ("n2s", "--bucket-size=2M"), ("n2z", "--shard-optimizer")):
            if hid[k]:
                lines.append("- novac's all-reduces, %s (trace, rank-averaged, median round): %.2f ms per step, %d%% "
                             "hidden behind compute, %d%% without each step's last bucket" % ((what,) + hid[k]))
        text = "\n".join(lines) + "\n"
        print(text)
        with open(args.out, "w") as f:
            f.write(text)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
