#!/usr/bin/env python3
"""A novac step on 1 and on 2 threads, on a quiet machine and beside a busy
process, side by side in one run.

    python3 bench/bench_contention.py STEP.so [--inputs DIR | --seed N]
                                      [--rounds 5] [--repeat 6] [--build DIR]

For each condition (quiet; one busy process pinned to CPU 0, the CPU the
step's calling thread shares) and each thread count (NOVA_NUM_THREADS=1, 2;
the step pinned to CPUs 0-1 with taskset), `novarun STEP.so --repeat N`
prints the median time per run; rounds are interleaved and the table gives
the median over rounds.  A thread pool that degrades gracefully is never
slower on 2 threads than on 1, busy machine or not.  Prints a markdown
table.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def run_step(novarun, so, data_args, threads, repeat):
    env = dict(os.environ, NOVA_NUM_THREADS=str(threads))
    p = subprocess.run(["taskset", "-c", "0,1", novarun, so, "--repeat", str(repeat)] + data_args,
                       capture_output=True, text=True, env=env, timeout=600)
    m = re.search(r"([0-9.]+) (ms|us) per run", p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        raise SystemExit("novarun failed: %s" % (p.stderr.strip().splitlines() or ["?"])[-1])
    return float(m.group(1)) * (1e-3 if m.group(2) == "us" else 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step")
    ap.add_argument("--inputs", help="novarun --inputs DIR (default: --seed 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    novarun = os.path.join(a.build, "bin", "novarun")
    data = ["--inputs", a.inputs] if a.inputs else ["--seed", str(a.seed)]
    times = {}
    busy = None
    try:
        for r in range(a.rounds):
            for cond in ("quiet", "busy"):
                if cond == "busy":
                    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
                    time.sleep(0.2)
                for t in (1, 2):
                    times.setdefault((cond, t), []).append(run_step(novarun, a.step, data, t, a.repeat))
                if busy:
                    busy.kill()
                    busy.wait()
                    busy = None
    finally:
        if busy:
            busy.kill()
    model = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    print("Machine: %s, %d CPUs; step %s; %d rounds, medians (ms per run)\n" % (
        model, os.cpu_count(), os.path.basename(a.step), a.rounds))
    print("| condition | 1 thread | 2 threads | 2 threads / 1 thread |")
    print("|---|---:|---:|---:|")
    for cond in ("quiet", "busy"):
        one, two = statistics.median(times[(cond, 1)]), statistics.median(times[(cond, 2)])
        label = "quiet" if cond == "quiet" else "one busy process on CPU 0"
        print("| %s | %.1f | %.1f | %.2f |" % (label, one, two, two / one))
    return 0


if __name__ == "__main__":
    sys.exit(main())
