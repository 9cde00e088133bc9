#!/usr/bin/env python3
"""--memory-limit on the 4-layer GPT (bench/bench_cpu.py's gpt4: d 256,
4 heads, T 128, vocab 512, batch 8; AdamW): the planned peak, what is
recomputed (segments, expensive values, flops) and the measured step time
at limits of 0.8x to 0.5x the unlimited plan, side by side with the
unlimited step in one run, as ratios.

    python3 bench/bench_remat.py [--build DIR] [--fractions 0.8,0.7,0.6,0.5] [--repeat N]

Each step is timed by novarun --repeat (the same batch, N runs after a
warm-up) in turn, twice, the faster of the two kept; the losses of two
steps are checked against the unlimited step's (1e-5).  A limit below
what recomputation reaches is reported with novac's message.  Prints a
Markdown table.
"""
import argparse
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
import bench_memory  # noqa: E402


def compile_step(build, model, extra, d, tag):
    """bench_memory's compile (AdamW, gpt4's batch), with the step's path."""
    r = bench_memory.novac_memory(build, model, bench_cpu.WORKLOADS["gpt4"]["batch"], ["--lr=1e-3"] + extra, d, tag)
    if "error" not in r:
        r.update(so=os.path.join(d, tag + ".so"), peak=r["planned_peak_bytes"])
    return r


def novarun(build, args):
    p = subprocess.run([os.path.join(build, "bin", "novarun")] + args, capture_output=True, text=True, timeout=3600)
    if p.returncode:
        raise RuntimeError(p.stderr.strip())
    return p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--fractions", default="0.8,0.7,0.6,0.5")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    import numpy as np
    bench = bench_cpu.Bench(argparse.Namespace(quick=True, build=args.build, threads=1, systems=""))
    with tempfile.TemporaryDirectory(prefix="nova-bench-remat-") as d:
        bench.tmp = d
        spec = bench.prepare("gpt4")
        model = spec["novac_model"]
        ind = os.path.join(d, "in")
        os.makedirs(ind, exist_ok=True)
        data = np.load(spec["data"])
        for n in spec["inputs"]:
            bench_cpu.write_tensor_pb(os.path.join(ind, n + ".pb"), data[n], n)
        rows = [("none", compile_step(args.build, model, [], d, "s0"))]
        p0 = rows[0][1]["peak"]
        for f in [float(x) for x in args.fractions.split(",")]:
            lim = int(p0 * f)
            rows.append(("%.2fx (%d)" % (f, lim), compile_step(args.build, model, ["--memory-limit=%d" % lim], d,
                                                                "s%d" % len(rows))))
        os.environ["NOVA_NUM_THREADS"] = "1"
        for _, r in rows:
            if "so" not in r:
                continue
            log = os.path.join(d, "loss.log")
            novarun(args.build, [r["so"], "--inputs", ind, "--steps", "2", "--loss-log", log, "-q"])
            r["losses"] = [float(l.split()[1]) for l in open(log) if l.strip()]
        for _ in range(2):
            for _, r in rows:
                if "so" not in r:
                    continue
                out = novarun(args.build, [r["so"], "--inputs", ind, "--repeat", str(args.repeat)])
                m = re.search(r"([0-9.]+) (ms|us) per run", out)
                ms = float(m.group(1)) * (1e-3 if m.group(2) == "us" else 1.0)
                r["ms"] = min(r.get("ms", ms), ms)
    base = rows[0][1]
    cpu = platform.processor()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print("4-layer GPT (d 256, 4 heads, T 128, vocab 512), batch 8, AdamW; %s (%d cpus); novarun on one thread, "
          "%d runs, the faster of two rounds; %s" % (cpu, os.cpu_count() or 1, args.repeat, time.strftime("%Y-%m-%d")))
    print()
    print("| --memory-limit | planned peak MiB (x unlimited) | segments | expensive values recomputed | "
          "recompute GFLOP | step ms (x unlimited) | losses match | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        if "error" in r:
            print("| %s | %s | | | | | | |" % (name, r["error"]))
            continue
        rc = r.get("recompute", {})
        same = all(abs(a - b) <= 1e-5 * max(1.0, abs(a)) for a, b in zip(base["losses"], r["losses"]))
        print("| %s | %.1f (%.2f) | %s | %s | %.2f | %.1f (%.2f) | %s | %.1f |" % (
            name, r["peak"] / 2**20, r["peak"] / base["peak"], rc.get("segments", "-"),
            rc.get("expensive_values", "-"), rc.get("flops", 0) / 1e9, r["ms"], r["ms"] / base["ms"],
            "yes" if same else "no: %s vs %s" % (r["losses"], base["losses"]), r["compile_s"]))


if __name__ == "__main__":
    main()
