"""No emitted kernel exceeds its device (testsuite/cuda/run.sh): random
batched, broadcast and transposed GEMM shapes (a fixed seed, or argv[3])
compiled for every GPU architecture at fp32 and bf16; ptxas's shared memory
per block (static and dynamic) must be within the architecture's opt-in
limit, the static part within 48 KiB, registers within
255 a thread and 64 Ki a block, threads within 1024, and every shape a GEMM
kernel.  Prints "ok" or the offending kernels."""
import json
import random
import subprocess
import sys

novac, tmp, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
SMEM_OPTIN = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448}
DEVICES = {"a100-80gb": "sm_80", "rtx3060": "sm_86", "l4": "sm_89", "h100": "sm_90", "h200": "sm_90"}
bad = []
for n in range(2):
    b, m, k, nn = rnd.choice([1, 3, 8]), rnd.randint(1, 700), rnd.randint(1, 900), rnd.randint(1, 700)
    ta, tb = rnd.random() < 0.5, rnd.random() < 0.5
    a = "a: f32[%d, %d, %d]" % ((b, k, m) if ta else (b, m, k))
    w = "w: f32[%d, %d]" % ((nn, k) if tb else (k, nn))
    text = "input %s\ninput %s\nc = matmul(%s, %s)\noutput c\n" % (
        a, w, "transpose(a, perm=[0, 2, 1])" if ta else "a", "transpose(w)" if tb else "w")
    src = "%s/lim%d.nova" % (tmp, n)
    with open(src, "w") as f:
        f.write(text)
    for dev, sm in DEVICES.items():
        for prec in ("fp32", "bf16"):
            so = "%s/lim%d.%s.%s.so" % (tmp, n, dev, prec)
            r = subprocess.run([novac, src, "--target=cuda", "--device=" + dev, "--precision=" + prec, "-o", so],
                               capture_output=True, text=True)
            what = "%s on %s, %s" % (text.strip().replace("\n", "; "), dev, prec)
            if r.returncode:
                bad.append("%s: novac exited %d: %s" % (what, r.returncode, r.stderr[:300]))
                continue
            with open(so[:-3] + ".json") as f:
                man = json.load(f)
            if man["gemm_kernels"] < 1:
                bad.append("%s: no GEMM kernel" % what)
            for kn in man["kernels"]:
                threads = kn["block"][0] * kn["block"][1] * kn["block"][2]
                regs = kn.get("registers", 0)
                static = kn["shared_memory"] - kn.get("dynamic_shared_memory", 0)
                if kn["shared_memory"] > SMEM_OPTIN[sm] or static > 49152 or not 0 < regs <= 255 or \
                        regs * threads > 65536 or threads > 1024:
                    bad.append("%s: kernel %s: %d B shared, %d registers, %d threads" %
                               (what, kn["name"], kn["shared_memory"], regs, threads))
print("\n".join(bad) if bad else "ok")
