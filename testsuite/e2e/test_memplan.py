"""The static memory plan and the in-place updates, checked from outside:
an independent checker over the manifest's plan (no two intermediates that
are live at the same time share a byte; every one inside the arena, aligned;
the arena no larger than the sum of the intermediates), the in-place updates
of a training step, and training with the plan (-O2) giving the same losses
as without it (-O0, heap buffers and copied updates), step for step."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from harness import NOVAC, NOVARUN, Failure, case, results, run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = [("mlp.adamw", os.path.join(ROOT, "examples", "mlp.nova"), ["--dim=batch=16", "--train", "--optimizer=adamw"]),
          ("transformer_block.forward", os.path.join(ROOT, "examples", "transformer_block.nova"), ["--dim=batch=2"]),
          ("gpt_block.adamw", os.path.join(ROOT, "testsuite", "onnx", "models", "gpt_block", "model.onnx"),
           ["--dim=batch=4", "--train", "--keep-grads", "--optimizer=adamw"]),
          ("cnn.momentum", os.path.join(ROOT, "testsuite", "onnx", "models", "cnn", "model.onnx"),
           ["--dim=batch=2", "--train", "--optimizer=momentum"])]


def manifest(src, flags, d, name):
    so = os.path.join(d, name + ".so")
    run([NOVAC, src, "-o", so] + flags)
    with open(os.path.join(d, name + ".json")) as f:
        return so, json.load(f)


def check_plan(mem):
    """The independent overlap check."""
    if mem.get("intermediates") != "planned-arena":
        raise Failure("intermediates: %r, expected planned-arena" % mem.get("intermediates"))
    plan, arena = mem["plan"], mem["arena_bytes"]
    for e in plan:
        if e["offset"] % 64 or e["offset"] < 0 or e["offset"] + e["bytes"] > arena:
            raise Failure("buffer %r lies outside the %d-byte arena or is misaligned" % (e, arena))
        if e["live"][0] > e["live"][1]:
            raise Failure("empty live range %r" % e)
    for i, a in enumerate(plan):
        for b in plan[i + 1:]:
            live = not (a["live"][1] < b["live"][0] or b["live"][1] < a["live"][0])
            overlap = a["offset"] < b["offset"] + b["bytes"] and b["offset"] < a["offset"] + a["bytes"]
            if live and overlap:
                raise Failure("buffers live at the same time overlap:\n %r\n %r" % (a, b))
    if arena > max(mem["intermediate_bytes"], 64):
        raise Failure("arena %d larger than the intermediates' sum %d" % (arena, mem["intermediate_bytes"]))
    if mem["planned_peak_bytes"] > mem["unplanned_peak_bytes"]:
        raise Failure("planned peak above the unplanned one: %r" % mem)


def plan_case(name, src, flags, extra=()):
    def go():
        d = tempfile.mkdtemp(prefix="nova-plan-")
        try:
            _, m = manifest(src, flags + list(extra), d, "s")
            check_plan(m["memory"])
            if len(m["memory"]["plan"]) < 3:
                raise Failure("only %d intermediates planned" % len(m["memory"]["plan"]))
            if "--train" in flags:
                upd = [t for t in m["tensors"] if t["role"] == "update"]
                done = [t for t in upd if t.get("in_place")]
                # every update of the MLP; most of the GPT block's (a few of its update buffers
                # are used by bufferization for earlier values, and keep their copy)
                if not upd or len(done) < (len(upd) if name.startswith("mlp") else 0.8 * len(upd)):
                    raise Failure("updates not in place: %s" % [t["name"] for t in upd if not t.get("in_place")])
                _, m0 = manifest(src, flags + list(extra) + ["-O0"], d, "s0")
                if m0["memory"]["intermediates"] == "planned-arena" or any(t.get("in_place") for t in m0["tensors"]):
                    raise Failure("-O0 should plan nothing")
                # gradients are computed in the caller's output buffers, not copied there (all of the
                # MLP's; the cuda target's come out of bufferization that way already)
                grads = [t for t in m["tensors"] if t["role"] == "grad"]
                need = 0 if extra else len(grads) if name.startswith("mlp") else 0.75 * len(grads)
                if not m["memory"].get("outputs_computed_in_place", 0) >= need:
                    raise Failure("outputs computed in place: %r, %d gradients" %
                                  (m["memory"].get("outputs_computed_in_place"), len(grads)))
                if not m["memory"]["tensor_bytes"] < m0["memory"]["tensor_bytes"]:
                    raise Failure("in-place updates saved no memory: %d vs %d" %
                                  (m["memory"]["tensor_bytes"], m0["memory"]["tensor_bytes"]))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    case("memplan.%s%s" % (name, ".cuda" if extra else ""), go)


for name, src, flags in MODELS:
    plan_case(name, src, flags)
plan_case("mlp.adamw", MODELS[0][1], MODELS[0][2], ["--target=cuda", "--device=h100"])


def same_losses():
    """30 AdamW steps of the MLP with the plan, in-place updates and
    vectorized code (-O2) and without (-O0): the same losses (vector code
    contracts multiply-adds into FMAs: equal to 1e-5)."""
    d = tempfile.mkdtemp(prefix="nova-plan-")
    try:
        logs = []
        for opt in ("-O2", "-O0"):
            so = os.path.join(d, "m%s.so" % opt)
            run([NOVAC, MODELS[0][1], "-o", so, opt] + MODELS[0][2])
            log = os.path.join(d, "loss%s.txt" % opt)
            run([NOVARUN, so, "--seed", "3", "--steps", "30", "--loss-log", log, "-q"])
            with open(log) as f:
                logs.append(f.read())
        a = [float(l.split()[1]) for l in logs[0].splitlines()]
        b = [float(l.split()[1]) for l in logs[1].splitlines()]
        if len(a) != 30 or len(b) != 30 or any(abs(x - y) > 1e-5 * max(abs(y), 1e-3) for x, y in zip(a, b)):
            raise Failure("losses differ:\n-O2: %s\n-O0: %s" % (logs[0][:300], logs[1][:300]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("memplan.same_losses_O2_O0", same_losses)


# ---- rematerialization (--memory-limit) ----------------------------------------

GPT = MODELS[2]


def train_dump(so, d, tag):
    """3 AdamW steps on one batch (batch 4, T 8, vocab 50): (losses,
    {NAME.pb: array} of --dump)."""
    import numpy as np
    from harness import read_pb, write_pb
    ind = os.path.join(d, "in")
    if not os.path.isdir(ind):
        os.mkdir(ind)
        rng = np.random.default_rng(5)
        for name in ("idx", "targets"):
            write_pb(os.path.join(ind, name + ".pb"), rng.integers(0, 50, (4, 8)).astype(np.int64), name)
    log, dump = os.path.join(d, tag + ".loss"), os.path.join(d, tag + ".dump")
    run([NOVARUN, so, "--inputs", ind, "--steps", "3", "--loss-log", log, "--dump", dump, "-q"])
    with open(log) as f:
        losses = [float(l.split()[1]) for l in f.read().splitlines()]
    return losses, {fn: read_pb(os.path.join(dump, fn)) for fn in sorted(os.listdir(dump))}


def same_training(so0, so1, d):
    """3 steps of two builds of the GPT block: the same losses, gradients
    and parameters (recomputation changes only the rounding order inside
    fused loops: 1e-6)."""
    import numpy as np
    l0, t0 = train_dump(so0, d, "a")
    l1, t1 = train_dump(so1, d, "b")
    if len(l0) != 3 or any(abs(a - b) > 1e-6 * max(abs(a), 1.0) for a, b in zip(l0, l1)):
        raise Failure("losses differ: %s vs %s" % (l0, l1))
    if sorted(t0) != sorted(t1) or not any(k.startswith("grad.") for k in t0):
        raise Failure("dumped tensors differ: %s vs %s" % (sorted(t0), sorted(t1)))
    for k in t0:
        a, b = t0[k].astype(np.float64), t1[k].astype(np.float64)
        # (a gradient that is 0 but for rounding, a key bias's: 1e-6 of 1e-3)
        if a.shape != b.shape or np.max(np.abs(a - b)) > 1e-6 * max(np.max(np.abs(a)), 1e-3):
            raise Failure("%s differs with recomputation: max |diff| %g" % (k, np.max(np.abs(a - b))))


def recompute_cheap(target):
    """The GPT block as exported (an erf-GELU in five ONNX ops): by
    default the backward recomputes the cheap values it reads (the
    manifest counts them, it keeps fewer bytes), the plan passes the
    overlap check and is smaller than with --recompute=none, and training
    gives the same losses, gradients and parameters."""
    def go():
        d = tempfile.mkdtemp(prefix="nova-recompute-")
        try:
            # (sgd: adamw turns the rounding noise of a gradient that is 0 in exact arithmetic, a
            # key bias's, into updates of lr's size)
            flags = [f for f in GPT[2] if not f.startswith("--optimizer")] + ["--optimizer=sgd"] + target
            so0, m0 = manifest(GPT[1], flags + ["--recompute=none"], d, "s0")
            so1, m1 = manifest(GPT[1], flags, d, "s1")
            check_plan(m1["memory"])
            rc = m1["memory"].get("recompute") or {}
            if not rc.get("values", 0) >= 4 or not 0 < rc.get("kept_bytes", 0) < rc.get("kept_bytes_without", 0):
                raise Failure("manifest recompute: %r" % rc)
            if "recompute" in m0["memory"]:
                raise Failure("--recompute=none recomputed: %r" % m0["memory"]["recompute"])
            a0, a1 = m0["memory"]["arena_bytes"], m1["memory"]["arena_bytes"]
            if not a1 < a0:
                raise Failure("arena with recomputation %d, without %d" % (a1, a0))
            for m in (m0, m1):
                if not m["memory"]["arena_bytes"] >= m["memory"]["lower_bound_bytes"] > 0:
                    raise Failure("arena below its lower bound: %r" % {k: v for k, v in m["memory"].items() if k != "plan"})
            if not target:
                same_training(so0, so1, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return go


case("memplan.recompute_cheap", recompute_cheap([]))
case("memplan.recompute_cheap.cuda", recompute_cheap(["--target=cuda", "--device=h100", "--gpu-sim"]))


def remat_reduces(target):
    """A limit just under the step's planned peak: some activations are
    recomputed, the plan fits the limit and passes the overlap check, and
    training gives the same losses, gradients and parameters."""
    def go():
        d = tempfile.mkdtemp(prefix="nova-remat-")
        try:
            so0, m0 = manifest(GPT[1], GPT[2] + target, d, "s0")
            p0 = m0["memory"]["planned_peak_bytes"]
            so1, m1 = manifest(GPT[1], GPT[2] + target + ["--memory-limit=%d" % (p0 - 1)], d, "s1")
            mem = m1["memory"]
            check_plan(mem)
            rm = mem.get("remat") or {}
            if mem.get("memory_limit") != p0 - 1 or rm.get("peak_without_bytes") != p0:
                raise Failure("manifest memory: %r" % {k: v for k, v in mem.items() if k != "plan"})
            if not rm.get("recomputed", 0) >= 1 or not rm.get("recomputed_bytes", 0) > 0:
                raise Failure("nothing recomputed: %r" % rm)
            if not mem["planned_peak_bytes"] <= p0 - 1:
                raise Failure("planned peak %d above the limit %d" % (mem["planned_peak_bytes"], p0 - 1))
            if target:
                return   # cuda: the plan only (numerics: the --gpu-sim suites)
            same_training(so0, so1, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return go


def remat_cannot_fit():
    d = tempfile.mkdtemp(prefix="nova-remat-")
    try:
        p = run([NOVAC, GPT[1], "-o", os.path.join(d, "s.so"), "--memory-limit=4K"] + GPT[2], expect_rc=1)
        if "does not fit" not in p.stderr or "smallest peak reached is" not in p.stderr:
            raise Failure("message: %s" % p.stderr)
        if os.path.exists(os.path.join(d, "s.so")):
            raise Failure("a step.so was written")
        p = run([NOVAC, GPT[1], "-o", os.path.join(d, "s.so"), "--memory-limit=1G"] + GPT[2])
        with open(os.path.join(d, "s.json")) as f:
            mem = json.load(f)["memory"]
        if mem["remat"]["recomputed"] != 0 or mem["memory_limit"] != 1 << 30:
            raise Failure("a limit the step fits in recomputed something: %r" % mem["remat"])
        for bad, rc, msg in (("--memory-limit=12Q", 2, "positive number of bytes"),
                             ("--memory-limit=0", 2, "positive number of bytes"),
                             ("--memory-limit=-5", 2, "positive number of bytes")):
            p = run([NOVAC, GPT[1], "-o", os.path.join(d, "x.so"), bad] + GPT[2], expect_rc=rc)
            if msg not in p.stderr:
                raise Failure("%s: %s" % (bad, p.stderr))
        p = run([NOVAC, GPT[1], "-o", os.path.join(d, "x.so"), "--memory-limit=1M", "-O0"] + GPT[2], expect_rc=1)
        if "needs -O1" not in p.stderr:
            raise Failure("-O0: %s" % p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---- threads (parallel loops) ----------------------------------------------------

def threads_same_results():
    """The MLP (batch 256) and a 384x320x288 GEMM compiled with parallel
    loops (manifest parallel_loops > 0) give bit-identical results on 1, 2
    and 3 threads (NOVA_NUM_THREADS): shares are disjoint, so only the
    order of independent iterations changes."""
    import numpy as np
    from harness import read_pb, write_pb
    d = tempfile.mkdtemp(prefix="nova-par-")
    try:
        gemm = os.path.join(d, "g.nova")
        with open(gemm, "w") as f:
            f.write("input a: f32[M, K]\ninput b: f32[K, N]\nc = matmul(a, b)\noutput c\n")
        rng = np.random.default_rng(7)
        ind = os.path.join(d, "in")
        os.mkdir(ind)
        write_pb(os.path.join(ind, "a.pb"), rng.standard_normal((384, 288)).astype(np.float32), "a")
        write_pb(os.path.join(ind, "b.pb"), rng.standard_normal((288, 320)).astype(np.float32), "b")
        for name, src, flags, run_args in (
                ("mlp", MODELS[0][1], ["--dim=batch=256", "--train", "--optimizer=adamw"], ["--seed", "4", "--steps", "3"]),
                ("gemm", gemm, ["--dim=M=384", "--dim=N=320", "--dim=K=288"], ["--inputs", ind])):
            so, m = manifest(src, flags, d, name)
            if not m.get("parallel_loops", 0) > 0:
                raise Failure("%s: no parallel loops in the manifest (%r)" % (name, m.get("parallel_loops")))
            got = []
            for threads in ("1", "2", "3"):
                out = os.path.join(d, "%s.out%s" % (name, threads))
                cmd = [NOVARUN, so, "--outputs", out, "-q"] + run_args
                if "--steps" in run_args:
                    cmd += ["--dump", out + ".dump"]
                env = dict(os.environ, NOVA_NUM_THREADS=threads)
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
                if p.returncode:
                    raise Failure("%s with %s threads: %s" % (name, threads, p.stderr))
                dumped = os.listdir(out + ".dump") if os.path.isdir(out + ".dump") else []
                files = sorted(os.listdir(out)) + sorted("dump/" + f for f in dumped)
                got.append({f: read_pb(os.path.join(out, f) if not f.startswith("dump/")
                                       else os.path.join(out + ".dump", f[5:])) for f in files})
            for g in got[1:]:
                if sorted(g) != sorted(got[0]) or any(not np.array_equal(g[k], got[0][k]) for k in g):
                    raise Failure("%s: results differ between thread counts" % name)
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("threads.same_results_1_2_3", threads_same_results)
case("memplan.remat_same_gradients", remat_reduces([]))
case("memplan.remat.cuda", remat_reduces(["--target=cuda", "--device=h100"]))
case("memplan.remat_limits", remat_cannot_fit)
print("# memplan: %d passed, %d failed" % (results["pass"], results["fail"]))
sys.exit(0)
