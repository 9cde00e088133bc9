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

from harness import NOVAC, NOVARUN, Failure, case, check_plan_mem, results, run

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
    check_plan_mem(mem)
    arena = mem["arena_bytes"]
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


def memory_report():
    """--memory-report: the JSON's series agrees with the manifest (the
    peak's op and bytes, constant parameters and optimizer state, the peak
    of the series at most the planned peak), a training step shows
    activations and gradients; the SVG is well-formed and names the peak;
    bad uses exit 1 and write nothing."""
    import xml.etree.ElementTree as ET
    d = tempfile.mkdtemp(prefix="nova-report-")
    try:
        rj, rs = os.path.join(d, "r.json"), os.path.join(d, "r.svg")
        _, m = manifest(GPT[1], GPT[2] + ["--memory-report=" + rj], d, "s")
        run([NOVAC, GPT[1], "-o", os.path.join(d, "t.so"), "--memory-report=" + rs] + GPT[2])
        with open(rj) as f:
            r = json.load(f)
        mem = m["memory"]
        kinds = r["kinds"]
        if kinds != ["parameters", "optimizer_state", "inputs_outputs", "gradients", "activations", "workspace"]:
            raise Failure("kinds %r" % kinds)
        peak = r["peak"]
        if peak["op"] != mem["peak_op"] or peak["at"] != mem["peak_at"] or not peak["at"]:
            raise Failure("peak %r, manifest %r at %r" % (peak, mem["peak_op"], mem["peak_at"]))
        if dict(zip(kinds, peak["bytes"])) != mem["at_peak"] or sum(peak["bytes"]) != peak["total_bytes"]:
            raise Failure("peak bytes %r, manifest %r" % (peak, mem["at_peak"]))
        series = r["series"]
        ops = [p[0] for p in series]
        if ops != sorted(set(ops)) or ops[0] != 0 or ops[-1] > r["ops"]:
            raise Failure("series ops not increasing from 0: %r" % ops[:20])
        if any(p[1:4] != series[0][1:4] for p in series):
            raise Failure("parameters, optimizer state or inputs and outputs change during the step")
        top = max(sum(p[1:]) for p in series)
        if top != peak["total_bytes"] or top > mem["planned_peak_bytes"]:
            raise Failure("series peak %d, report's %d, planned %d" % (top, peak["total_bytes"],
                                                                      mem["planned_peak_bytes"]))
        if r["lower_bound_bytes"] != mem["lower_bound_bytes"] or not 0 < r["forward_end"] < r["ops"]:
            raise Failure("report %r" % {k: v for k, v in r.items() if k != "series"})
        if not max(p[4] for p in series) > 0 or not max(p[5] for p in series) > 0:
            raise Failure("a training step without gradients or activations in the arena")
        svg = ET.parse(rs).getroot()
        text = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
        if "peak" not in text or "activations" not in text or len(list(svg.iter("{http://www.w3.org/2000/svg}path"))) != 6:
            raise Failure("svg: %s" % text[:300])
        for flags, msg in ((["-O0", "--memory-report=" + os.path.join(d, "o0.svg")], "no memory plan"),
                           (["--memory-report=" + os.path.join(d, "u.json")], "would be overwritten"),
                           (["--memory-report=" + os.path.join(d, "no", "such", "dir.svg")], "cannot write")):
            p = run([NOVAC, GPT[1], "-o", os.path.join(d, "u.so")] + GPT[2] + flags, expect_rc=1)
            if msg not in p.stderr or os.path.exists(os.path.join(d, "o0.svg")) or os.path.exists(os.path.join(d, "u.so")):
                raise Failure("%s: %s" % (flags, p.stderr))
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("memplan.memory_report", memory_report)


# ---- each update as soon as its gradient is complete (--nonfinite=skip-param) ----

def updates_early():
    """By default each param's update runs as soon as its gradient is
    complete, so the arena never holds every gradient at once (the
    report's gradients stay below their sum), the planned peak is no
    higher than with --nonfinite=skip-step (every update after the whole
    backward pass), and training gives the same results."""
    d = tempfile.mkdtemp(prefix="nova-early-")
    try:
        rj = os.path.join(d, "r.json")
        free = [f for f in GPT[2] if f != "--keep-grads"]   # gradients in the arena
        _, m0 = manifest(GPT[1], free + ["--nonfinite=skip-step"], d, "s0")
        _, m1 = manifest(GPT[1], free + ["--memory-report=" + rj], d, "s1")
        check_plan(m1["memory"])
        with open(rj) as f:
            r = json.load(f)
        grads = sum(t["bytes"] for t in m1["tensors"] if t["role"] == "param" and t.get("trained", True)
                    and any(u.get("updates") == t["name"] for u in m1["tensors"]))
        most = max(p[4] for p in r["series"])
        if m1.get("keep_grads") is not False or not 0 < most < grads * 0.75:
            raise Failure("gradients live at once: %d bytes of %d (kept: %r)" % (most, grads, m1.get("keep_grads")))
        if not m1["memory"]["planned_peak_bytes"] <= m0["memory"]["planned_peak_bytes"]:
            raise Failure("planned peak %d, with every update last %d" % (m1["memory"]["planned_peak_bytes"],
                                                                          m0["memory"]["planned_peak_bytes"]))
        names = [t["name"] for t in m1["tensors"] if t["role"] == "status"]
        if names != ["nonfinite.skipped", "nonfinite"] or [t["name"] for t in m0["tensors"] if t["role"] == "status"] != ["nonfinite"]:
            raise Failure("status tensors %r" % names)
        so0, _ = manifest(GPT[1], GPT[2] + ["--nonfinite=skip-step"], d, "k0")
        so1, _ = manifest(GPT[1], GPT[2], d, "k1")
        same_training(so0, so1, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


SKIP_MODEL = """input x: f32[2, 3]
label t: f32[2, 2]
param w: f32[3, 2] = xavier
param b: f32[2] = zeros
param u: f32[2] = ones
d = x @ w + b - t
output loss = reduce_mean(sqrt(d * d)) + reduce_sum(u * u)
"""


def skip_param():
    """A batch with x = 0 and t = b = 0: d = 0, whose sqrt has a NaN
    gradient, so w's and b's gradients are NaN while u's is 2u.  With
    --nonfinite=skip-param (the default) u is updated (1 - 0.01 * 2) and w
    and b keep their values; with skip-step nothing changes.  Both report
    the step; the flags are checked."""
    import numpy as np
    from harness import read_pb, write_pb
    d = tempfile.mkdtemp(prefix="nova-skip-")
    try:
        src = os.path.join(d, "m.nova")
        with open(src, "w") as f:
            f.write(SKIP_MODEL)
        ind = os.path.join(d, "in")
        os.mkdir(ind)
        write_pb(os.path.join(ind, "x.pb"), np.zeros((2, 3), np.float32), "x")
        write_pb(os.path.join(ind, "t.pb"), np.zeros((2, 2), np.float32), "t")
        got = {}
        for mode in ("skip-param", "skip-step"):
            so = os.path.join(d, mode + ".so")
            run([NOVAC, src, "--train", "--lr=0.01", "--nonfinite=" + mode, "-o", so])
            out = os.path.join(d, mode)
            p = run([NOVARUN, so, "--inputs", ind, "--steps", "1", "--skip-nonfinite", "--dump", out])
            want = ("non-finite gradients; 2 of 3 parameters kept their values, the others were updated"
                    if mode == "skip-param" else "non-finite gradients; parameters unchanged, step skipped")
            if want not in p.stderr:
                raise Failure("%s: %s" % (mode, p.stderr))
            got[mode] = {k: read_pb(os.path.join(out, "param.%s.pb" % k)) for k in ("w", "b", "u")}
        a, b = got["skip-param"], got["skip-step"]
        if not (np.array_equal(a["w"], b["w"]) and np.array_equal(a["b"], b["b"]) and np.all(b["u"] == 1)
                and np.allclose(a["u"], 0.98, rtol=1e-6)):
            raise Failure("after the step: skip-param %r, skip-step %r" % (a, b))
        for flags, rc, msg in ((["--train", "--nonfinite=sometimes"], 2, "--nonfinite takes skip-step or skip-param"),
                               (["--nonfinite=skip-step"], 1, "--nonfinite needs --train"),
                               (["--train", "--precision=fp16", "--nonfinite=skip-param"], 1,
                                "cannot be used with dynamic loss scaling")):
            p = run([NOVAC, src, "-o", os.path.join(d, "x.so")] + flags, expect_rc=rc)
            if msg not in p.stderr:
                raise Failure("%s: %s" % (flags, p.stderr))
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("memplan.updates_early", updates_early)
case("memplan.skip_param", skip_param)


WIDE_CHECK_MODEL = """input m: f32[64, 64]
param w: f32[64, 64] = ones
param u: f32[64, 64] = ones
z = w * m
output loss = reduce_mean(sqrt(z * z)) + reduce_mean(u * u)
"""


def wide_check():
    """The finite check of a gradient of 4096 elements, which the cpu
    target sums as partial sums in vector lanes (cpu_tile.c): one NaN, at
    the first, last or any element (m = 0 there: sqrt of z^2 has a NaN
    gradient at z = 0, the loss stays finite), is found wherever it falls
    in the lanes and rows; w keeps its values, u is updated.  With no zero
    in m, the step is not skipped."""
    import numpy as np
    from harness import read_pb, write_pb
    d = tempfile.mkdtemp(prefix="nova-wide-")
    try:
        src = os.path.join(d, "m.nova")
        with open(src, "w") as f:
            f.write(WIDE_CHECK_MODEL)
        so = os.path.join(d, "s.so")
        run([NOVAC, src, "--train", "--lr=0.5", "-o", so])
        for at in (None, 0, 7, 15, 16, 255, 2049, 4095):
            m = np.ones((64, 64), np.float32)
            if at is not None:
                m.flat[at] = 0
            ind = os.path.join(d, "in%s" % at)
            os.mkdir(ind)
            write_pb(os.path.join(ind, "m.pb"), m, "m")
            out = os.path.join(d, "out%s" % at)
            p = run([NOVARUN, so, "--inputs", ind, "--steps", "1", "--skip-nonfinite", "--dump", out])
            skipped = "non-finite gradients" in p.stderr
            w, u = read_pb(os.path.join(out, "param.w.pb")), read_pb(os.path.join(out, "param.u.pb"))
            if skipped != (at is not None) or np.all(w == 1) != (at is not None) or np.any(u == 1):
                raise Failure("zero at %r: skipped %r, w %s, u %s: %s" % (at, skipped, w.flat[:4], u.flat[:4],
                                                                      p.stderr))
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("memplan.wide_check", wide_check)


def remat_reduces(target, extra=()):
    """A limit just under the step's planned peak: the backward recomputes
    the attention's scores and probabilities from q and k (flash
    attention's recurrence: one segment, the scores' matmul the expensive
    value), the plan fits; a limit of 0.9x: matmuls recomputed from
    checkpoints (segments); with --recompute=none, cheap ones in linalg.
    Each plan passes the overlap check, and training gives the same
    losses, gradients and parameters."""
    def fits(m, limit):
        mem = m["memory"]
        check_plan(mem)
        if mem.get("memory_limit") != limit or not mem["planned_peak_bytes"] <= limit:
            raise Failure("limit %d: manifest memory: %r" % (limit, {k: v for k, v in mem.items() if k != "plan"}))
        return mem, mem.get("remat") or {}, mem.get("recompute") or {}

    def go():
        d = tempfile.mkdtemp(prefix="nova-remat-")
        try:
            # (sgd: see recompute_cheap; a recomputed matmul rounds as it fuses in the backward)
            flags = [f for f in GPT[2] if not f.startswith("--optimizer")] + ["--optimizer=sgd"] + target + list(extra)
            so0, m0 = manifest(GPT[1], flags, d, "s0")
            p0 = m0["memory"]["planned_peak_bytes"]
            so1, m1 = manifest(GPT[1], flags + ["--memory-limit=%d" % (p0 - 1)], d, "s1")
            mem, rm, rc = fits(m1, p0 - 1)
            builds = [so1]
            if extra:  # the linalg stage alone
                if rm.get("peak_without_bytes") != p0 or "recompute" in mem:
                    raise Failure("manifest memory: %r" % {k: v for k, v in mem.items() if k != "plan"})
                if not rm.get("recomputed", 0) >= 1 or not rm.get("recomputed_bytes", 0) > 0:
                    raise Failure("nothing recomputed: %r" % rm)
            else:
                if not rc.get("expensive_values", 0) >= 1 or not rc.get("flops", 0) > 0 or rc.get("segments") != 1:
                    raise Failure("the attention's probabilities not recomputed in one segment: %r" % rc)
                # 0.9x: below what norms and attention alone reach (0.99x), above the smallest plan (0.87x)
                lim = int(0.9 * p0)
                so2, m2 = manifest(GPT[1], flags + ["--memory-limit=%d" % lim], d, "s2")
                mem, rm, rc = fits(m2, lim)
                if not rc.get("expensive_values", 0) >= 1 or not rc.get("flops", 0) > 0 or rc.get("segments", 0) < 2:
                    raise Failure("no matmul recomputed from a checkpoint: %r" % rc)
                builds.append(so2)
            if target:
                return   # cuda: the plans only (numerics: the --gpu-sim suites)
            for so in builds:
                same_training(so0, so, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return go


def attention_fused():
    """--attention=fused: the GPT block's attention, exported op by op
    (MatMul, Div, Where with -inf, Softmax, MatMul), becomes one
    nova.attention whose backward recomputes the probabilities; the plan
    passes the overlap check and training gives the same losses, gradients
    and parameters as the ops as written."""
    d = tempfile.mkdtemp(prefix="nova-attn-")
    try:
        flags = [f for f in GPT[2] if not f.startswith("--optimizer")] + ["--optimizer=sgd"]
        so0, m0 = manifest(GPT[1], flags, d, "s0")
        p = run([NOVAC, GPT[1], "-o", os.path.join(d, "s1.so"), "--attention=fused", "-v",
                 "--dump-after=attention"] + flags)
        if "1 attention fused" not in p.stderr or p.stderr.count('"nova.attention"') != 1 or \
                '"nova.softmax"' in p.stderr.split("IR after attention")[1]:
            raise Failure("not one attention: %s" % p.stderr[-2000:])
        with open(os.path.join(d, "s1.json")) as f:
            check_plan(json.load(f)["memory"])
        if "--attention=fused" not in json.dumps(json.load(open(os.path.join(d, "s1.json"))).get("flags", "")):
            raise Failure("the manifest's flags do not say --attention=fused")
        same_training(so0, os.path.join(d, "s1.so"), d)
        p = run([NOVAC, GPT[1], "-o", os.path.join(d, "x.so"), "--attention=flash"] + flags, expect_rc=2)
        if "--attention takes decomposed or fused" not in p.stderr:
            raise Failure("--attention=flash: %s" % p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def remat_cannot_fit():
    d = tempfile.mkdtemp(prefix="nova-remat-")
    try:
        # above the parameters and AdamW state (195 KB), below what recomputation reaches
        p = run([NOVAC, GPT[1], "-o", os.path.join(d, "s.so"), "--memory-limit=200K"] + GPT[2], expect_rc=1)
        if "does not fit" not in p.stderr or "smallest peak reached is" not in p.stderr:
            raise Failure("message: %s" % p.stderr)
        # below them: said without a search
        p = run([NOVAC, GPT[1], "-o", os.path.join(d, "s.so"), "--memory-limit=4K"] + GPT[2], expect_rc=1)
        if "parameters and optimizer state alone take 195292 bytes" not in p.stderr:
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
    loops (manifest parallel_loops > 0) or the runtime's contraction kernel
    (contraction_kernels > 0: its blocks are shared out on the threads)
    give bit-identical results on 1, 2 and 3 threads (NOVA_NUM_THREADS):
    shares are disjoint, so only the order of independent iterations
    changes."""
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
            if not (m.get("parallel_loops", 0) > 0 or m.get("contraction_kernels", 0) > 0):
                raise Failure("%s: no parallel loops nor contraction kernels in the manifest (%r, %r)"
                              % (name, m.get("parallel_loops"), m.get("contraction_kernels")))
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
case("memplan.remat_linalg_same_gradients", remat_reduces([], ["--recompute=none"]))
case("memplan.remat_limits", remat_cannot_fit)
case("memplan.attention_fused", attention_fused)
print("# memplan: %d passed, %d failed" % (results["pass"], results["fail"]))
sys.exit(0)
