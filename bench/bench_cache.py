#!/usr/bin/env python3
"""The compile cache (novac --cache-dir) on the 4-layer GPT training step:
wall time of a compile without a cache, of a miss (the compile and the
store) and of a hit, side by side in one run, medians of REPEAT runs each.

    python3 bench/bench_cache.py [BUILD_DIR] [REPEAT] [--target=cuda --device=h100 ...]

Prints a markdown table (for bench/RESULTS.md) with the machine."""
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    extra = [a for a in sys.argv[1:] if a.startswith("--")]
    build = args[0] if args else "build"
    repeat = int(args[1]) if len(args) > 1 else 5
    novac = os.path.join(ROOT, build, "bin", "novac")
    work = tempfile.mkdtemp(prefix="nova-bench-cache-")
    try:
        model = os.path.join(work, "gpt4.nova")
        with open(model, "w") as f:
            f.write(subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpt_nova.py"), "4", "256", "4", "128",
                                    "512"], capture_output=True, text=True, check=True).stdout)
        flags = [model, "--dim=batch=8", "--train", "--optimizer=adamw"] + extra

        def timed(cmd):
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            return time.perf_counter() - t

        plain, miss = [], []
        for k in range(repeat):  # interleaved, so that a drift of the machine falls on both
            plain.append(timed([novac] + flags + ["-o", os.path.join(work, "p.so")]))
            c = os.path.join(work, "c%d" % k)
            miss.append(timed([novac] + flags + ["--cache-dir=" + c, "-o", os.path.join(work, "m.so")]))
        hit = [timed([novac] + flags + ["--cache-dir=" + os.path.join(work, "c0"), "-o", os.path.join(work, "h.so")])
               for _ in range(repeat)]
        with open(os.path.join(work, "p.so"), "rb") as a, open(os.path.join(work, "h.so"), "rb") as b:
            same = a.read() == b.read()
        size = os.path.getsize(os.path.join(work, "h.so"))
        cpu = platform.processor() or platform.machine()
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        p, m, h = statistics.median(plain), statistics.median(miss), statistics.median(hit)
        print("machine: %s, %d CPUs; %s; %s" % (cpu, os.cpu_count(), time.strftime("%Y-%m-%d"),
                                                " ".join(["novac gpt4.nova"] + flags[1:])))
        print()
        print("| compile | median of %d | vs no cache |" % repeat)
        print("|---|---:|---:|")
        print("| no cache | %.3f s | 1.00 |" % p)
        print("| miss (compile + store) | %.3f s | %.3f |" % (m, m / p))
        print("| hit | %.1f ms | %.4f |" % (h * 1e3, h / p))
        print()
        print("step.so %d bytes; the hit's step.so %s the compiled one" % (size, "is byte for byte" if same else
                                                                         "DIFFERS FROM"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
