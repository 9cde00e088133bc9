#!/usr/bin/env python3
"""Compile time of every zoo model's training step (testsuite/zoo), with the
flags test_zoo.py uses: `novac model.onnx --train --optimizer=sgd --lr=0.1
[--freeze=...] -o step.so`, wall clock, median of --repeat runs.

    python3 bench/bench_zoo_compile.py [--repeat N] [--build DIR] [--out FILE]

Prints a Markdown table (machine, date, command) and writes it to --out."""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "testsuite", "zoo"))
sys.path.insert(0, os.path.join(ROOT, "testsuite", "e2e"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out")
    a = ap.parse_args()
    os.environ["NOVA_BUILD"] = a.build
    import json
    import test_zoo  # noqa: E402  (its cases run only under __main__)
    novac = os.path.join(a.build, "bin", "novac")
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    rows = []
    _, names = test_zoo.cases(test_zoo.HERE)
    for case in names:
        d = os.path.join(test_zoo.HERE, case)
        model = os.path.join(d, "model.onnx")
        ref = json.load(open(os.path.join(d, "reference.json")))
        flags = test_zoo.novac_flags(ref, model)
        times = []
        with tempfile.TemporaryDirectory() as t:
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                p = subprocess.run([novac, model] + flags + ["-o", os.path.join(t, "s.so")], capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                if p.returncode:
                    print("%s: novac failed: %s" % (case, p.stderr.strip()[:200]), file=sys.stderr)
                    break
        rows.append((case, statistics.median(times), min(times), max(times)))
    L = ["Zoo training-step compile time (`python3 bench/bench_zoo_compile.py --repeat %d`)" % a.repeat, "",
         "- date: %s" % datetime.date.today().isoformat(),
         "- machine: %s, %d cores, %s" % (cpu, os.cpu_count(), platform.platform()), "",
         "| case | median s | min s | max s |", "|---|---:|---:|---:|"]
    L += ["| %s | %.2f | %.2f | %.2f |" % r for r in rows]
    L.append("| **slowest** | **%.2f** | | |" % max(r[1] for r in rows))
    text = "\n".join(L) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
