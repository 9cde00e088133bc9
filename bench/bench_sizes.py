#!/usr/bin/env python3
"""A step for several batch sizes (novac --dim=batch=LO..HI) against steps
compiled for one size, side by side in one run: the time of a training
step (bind + run, through the C ABI; median of REPEAT after warm-up) at a
bucket's own size, where the bucketed step runs with masks and the exact
one without, and at a size between buckets (the bucketed step computes the
next bucket's rows); and the compile times.

    python3 bench/bench_sizes.py [BUILD_DIR] [REPEAT]

Prints a markdown table (for bench/RESULTS.md) with the machine."""
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "testsuite", "e2e"))
from stepapi import Step  # noqa: E402


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    novac = os.path.join(ROOT, build, "bin", "novac")
    work = tempfile.mkdtemp(prefix="nova-bench-sizes-")
    rng = np.random.default_rng(0)
    try:
        gpt = os.path.join(work, "gpt.nova")
        with open(gpt, "w") as f:
            f.write(subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpt_nova.py"), "2", "128", "4", "64",
                                    "256"], capture_output=True, text=True, check=True).stdout)
        models = [("mlp (examples/mlp.nova)", os.path.join(ROOT, "examples", "mlp.nova"), "1..64", [64, 32, 33],
                   lambda n: {"x": rng.standard_normal((n, 784)).astype(np.float32),
                              "y": rng.integers(0, 10, n).astype(np.int64)}),
                  ("GPT 2 layers, width 128, context 64", gpt, "1..16", [16, 8, 5],
                   lambda n: {"tokens": rng.integers(0, 256, (n, 64)).astype(np.int64),
                              "targets": rng.integers(0, 256, (n, 64)).astype(np.int64)})]
        flags = ["--train", "--optimizer=adamw"]

        def compile_(model, dim, out):
            t = time.perf_counter()
            subprocess.run([novac, model, "--dim=batch=" + dim, "-o", out] + flags, check=True, capture_output=True)
            return time.perf_counter() - t

        def step_ms(paths, data):
            """Median ms of a step of each of PATHS, their runs interleaved (the machine's drift shared)."""
            steps = [Step(p) for p in paths]
            ts = [[] for _ in steps]
            for i in range(repeat + 3):
                for s, t_ in zip(steps, ts):
                    t = time.perf_counter()
                    for k, v in data.items():
                        s.bind(k, v)
                    s.run()
                    if i >= 3:
                        t_.append((time.perf_counter() - t) * 1e3)
            for s in steps:
                s.close()
            return [statistics.median(t_) for t_ in ts]

        rows, comp = [], []
        for name, model, rng_text, sizes, make in models:
            b = os.path.join(work, "b-%d.so" % len(comp))
            tb = compile_(model, rng_text, b)
            te = []
            for n in sizes:
                e = os.path.join(work, "e-%d-%d.so" % (len(comp), n))
                te.append(compile_(model, str(n), e))
                data = make(n)
                me, mb = step_ms([e, b], data)
                rows.append((name, rng_text, n, me, mb))
            comp.append((name, rng_text, tb, statistics.mean(te)))
        print("Machine: %s, %d cores; %s; median of %d steps (bind + run) after 3" % (
            cpu_name(), os.cpu_count(), time.strftime("%Y-%m-%d"), repeat))
        print()
        print("| model | sizes | batch | exact step (ms) | bucketed step (ms) | bucketed / exact |")
        print("|---|---|---:|---:|---:|---:|")
        for name, rt, n, me, mb in rows:
            print("| %s | %s | %d | %.3f | %.3f | %.3f |" % (name, rt, n, me, mb, mb / me))
        print()
        print("| model | sizes | compile, bucketed (s) | compile, one size (s) |")
        print("|---|---|---:|---:|")
        for name, rt, tb, te in comp:
            print("| %s | %s | %.2f | %.2f |" % (name, rt, tb, te))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
