#!/usr/bin/env python3
"""The model zoo (testsuite/zoo/, made by export_zoo.py) against PyTorch: for
every exported file, one SGD(lr=0.1) training step compiled by novac and run
by novarun, compared with what PyTorch computed:

  - the loss, relative error <= 1e-5;
  - the gradient of every trained parameter, <= 1e-4 (max abs error over
    max abs reference, floored at 1e-5 like test_train_onnx.py);
  - every parameter after the update, relative L2 error <= 1e-5;
  - nothing else is trained: an initializer that is not a trained PyTorch
    parameter (BatchNorm statistics, requires_grad=False tables, exporter
    constants: reference.json's "freeze" list, passed to novac as --freeze,
    since an ONNX file does not say what is trainable) gets no gradient and
    keeps its value, and no other gradient appears.

The training-mode Dropout / BatchNorm export (dropbn_train.*) draws its own
dropout mask, so it is checked on what does not depend on the mask: the
BatchNorm running statistics after the step (BatchNorm precedes Dropout),
the update against novac's own gradients (param - 0.1 * grad), a loss inside
the range of PyTorch's over 256 masks and different from the loss without
dropout, and three finite steps.

Needs numpy and onnx only (no torch).  Prints PASS:/FAIL: zoo :: CASE like
harness.py; a case in KNOWN_FAILURES prints XFAIL: (and the reason) when it
fails and XPASS: when it passes (counted as a failure by testsuite/run.sh:
update the table).

    python3 testsuite/zoo/test_zoo.py [--zoo DIR] [CASE ...]
    python3 testsuite/zoo/test_zoo.py --write-ops    # regenerate OPS.md
"""
import argparse
import collections
import json
import math
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

import harness  # noqa: E402
from harness import NOVAC, NOVARUN, Failure, check_close, check_plan_of, read_pb, run  # noqa: E402

SUITE = "zoo"
LR = 0.1

# case -> why it fails today (novac's first error, shortened).  A case listed
# here that passes is an XPASS, which fails the suite: remove it then.
KNOWN_FAILURES = {}


def file_part(name):
    """An initializer name as novarun --dump writes it in a file name."""
    return "".join("_" if (c == "/" or ord(c) < 32 or ord(c) == 127) else c for c in name)


def glob_escape(name):
    """NAME as an fnmatch(3) pattern that matches only itself."""
    return "".join("[%s]" % c if c in "*?[" else c for c in name)


FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16)


def trainable_candidates(model_path):
    """The floating-point initializers that nodes use: what novac trains
    unless --freeze names it."""
    m = onnx.load(model_path)
    used = set()

    def walk(g):
        for n in g.node:
            used.update(n.input)
            for a in n.attribute:
                for sg in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(sg)
    walk(m.graph)
    return [i.name for i in m.graph.initializer if i.data_type in FLOAT_TYPES and i.name in used]


def freeze_patterns(names, candidates):
    """--freeze patterns that match exactly NAMES among CANDIDATES (novac
    takes at most 64 patterns, 1000 characters): '*.SUFFIX' or 'PREFIX_*'
    where that matches no other candidate, else the name itself."""
    import fnmatch
    want = set(names)
    others = [c for c in candidates if c not in want]
    left = [n for n in names if n in candidates]
    pats = []
    while left:
        n = left[0]
        tries = []
        if "." in n:
            tries.append("*." + glob_escape(n.rsplit(".", 1)[1]))
        if "_" in n:
            tries.append(glob_escape(n.rsplit("_", 1)[0]) + "_*")
        pat = glob_escape(n)
        for t in tries:
            if not any(fnmatch.fnmatchcase(o, t) for o in others):
                pat = t
                break
        pats.append(pat)
        left = [m for m in left if not fnmatch.fnmatchcase(m, pat)]
    return pats


def novac_flags(ref, model_path):
    flags = ["--train", "--keep-grads", "--optimizer=sgd", "--lr=%g" % LR]
    if ref.get("freeze"):
        pats = freeze_patterns(ref["freeze"], trainable_candidates(model_path))
        arg = ",".join(pats)
        if any("," in p for p in pats) or len(pats) > 64 or len(arg) > 1000:
            raise Failure("the initializers to keep constant do not fit in --freeze: %s" % arg[:200])
        flags.append("--freeze=" + arg)
    return flags


def grad_err(got, ref):
    g = np.asarray(got, np.float64)
    r = np.asarray(ref, np.float64)
    if g.shape != r.shape:
        raise Failure("shape %s, expected %s" % (g.shape, r.shape))
    if not r.size:
        return 0.0
    return float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-5))


def l2_err(got, ref):
    g = np.asarray(got, np.float64)
    r = np.asarray(ref, np.float64)
    if g.shape != r.shape:
        raise Failure("shape %s, expected %s" % (g.shape, r.shape))
    return float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))


def initial_values(model_path):
    m = onnx.load(model_path)
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def check_untrained(ref, dumped, inits, after=None):
    """Every name in ref["freeze"]: no gradient, value unchanged (or, when
    after has it, equal to the value PyTorch has after the step)."""
    after = after or {}
    for name in ref.get("freeze", []):
        part = file_part(name)
        if "grad." + part in dumped:
            raise Failure("initializer '%s' is not a trained PyTorch parameter but got a gradient" % name)
        if name in after:  # a running statistic: a buffer of the step (novarun --dump: buffer.NAME.pb)
            if "buffer." + part not in dumped:
                raise Failure("running statistic '%s' not in the dump" % name)
            e = l2_err(dumped["buffer." + part], after[name])
            if not e <= 1e-5:
                raise Failure("running statistic '%s' after the step: relative L2 error %.3g > 1e-5\n got %s\n ref %s"
                              % (name, e, np.ravel(dumped["buffer." + part])[:6], np.ravel(after[name])[:6]))
        elif "param." + part in dumped:
            v = dumped["param." + part]
            if v.shape != inits[name].shape or not np.array_equal(v, inits[name]):
                raise Failure("initializer '%s' is not a trained PyTorch parameter but the step changed it" % name)


# NOVA_TEST_MEMORY_FRACTION=F: each training step compiled with --memory-limit at F x its planned
# peak (or, where that is below what recomputation reaches, at the smallest peak novac reached):
# the backward recomputes expensive values from checkpoints, and every check below still holds.
MEMORY_FRACTION = float(os.environ.get("NOVA_TEST_MEMORY_FRACTION", "0"))


def compile_step(model, flags, so):
    run([NOVAC, model] + flags + ["-o", so])
    if not MEMORY_FRACTION or "--train" not in flags:
        return
    with open(so[:-3] + ".json") as f:
        peak = json.load(f)["memory"]["planned_peak_bytes"]
    limit = ["--memory-limit=%d" % int(peak * MEMORY_FRACTION)]
    p = run([NOVAC, model] + flags + limit + ["-o", so], expect_rc=None)
    if p.returncode:
        m = re.search(r"the smallest peak reached is ([0-9]+) bytes", p.stderr)
        if p.returncode != 1 or not m:
            raise Failure("novac --memory-limit: %s" % p.stderr.strip()[-400:])
        run([NOVAC, model] + flags + ["--memory-limit=" + m.group(1), "-o", so])


def step(case_dir, ref, d, steps=1, loss_log=None):
    so = os.path.join(d, "s.so")
    model = os.path.join(case_dir, "model.onnx")
    compile_step(model, novac_flags(ref, model), so)
    check_plan_of(os.path.join(d, "s.json"))
    dump = os.path.join(d, "dump%d" % steps)
    cmd = [NOVARUN, so, "--inputs", os.path.join(case_dir, "test_data_set_0"), "--steps", str(steps),
           "--dump", dump, "-q"]
    if loss_log:
        cmd += ["--loss-log", loss_log]
    run(cmd)
    return {fn[:-3]: read_pb(os.path.join(dump, fn)) for fn in os.listdir(dump) if fn.endswith(".pb")}


def check_eval(case_dir, ref, d):
    data = os.path.join(case_dir, "test_data_set_0")
    dumped = step(case_dir, ref, d)
    if "loss" not in dumped:
        raise Failure("no loss in the dump")
    check_close(dumped["loss"], read_pb(os.path.join(data, "output_1.pb")), 1e-5, "loss")
    inits = initial_values(os.path.join(case_dir, "model.onnx"))
    expected_grads = set()
    for fn in sorted(os.listdir(data)):
        if not (fn.startswith("grad.") and fn.endswith(".pb")):
            continue
        expected_grads.add(fn[:-3])
        if fn[:-3] not in dumped:
            raise Failure("no gradient for parameter '%s'" % fn[5:-3])
        e = grad_err(dumped[fn[:-3]], read_pb(os.path.join(data, fn)))
        if not e <= 1e-4:
            raise Failure("grad of %s: relative error %.3g > 1e-4" % (fn[5:-3], e))
    if not expected_grads:
        raise Failure("no reference gradients found")
    sdir = os.path.join(data, "sgd_step")
    for fn in sorted(os.listdir(sdir)):
        if fn.startswith("param.") and fn.endswith(".pb"):
            if fn[:-3] not in dumped:
                raise Failure("parameter '%s' not in the dump" % fn[6:-3])
            e = l2_err(dumped[fn[:-3]], read_pb(os.path.join(sdir, fn)))
            if not e <= 1e-5:
                raise Failure("SGD-updated %s: relative L2 error %.3g > 1e-5" % (fn[6:-3], e))
    check_untrained(ref, dumped, inits)
    # a gradient novac computed for something PyTorch does not train
    unchecked = set()
    for p in ref["parameters"]:
        if p.get("initializer") and ("copies" in p):
            unchecked.add("grad." + file_part(p["initializer"]))
            unchecked.update("grad." + file_part(c["initializer"]) for c in p["copies"])
    extra = sorted(k[5:] for k in dumped if k.startswith("grad.") and k not in expected_grads | unchecked)
    if extra:
        raise Failure("gradients for initializers PyTorch does not train: %s" % ", ".join(extra[:8]))


def check_train(case_dir, ref, d):
    tm = ref["train_mode"]
    data = os.path.join(case_dir, "test_data_set_0")
    dumped = step(case_dir, ref, d)
    inits = initial_values(os.path.join(case_dir, "model.onnx"))
    if "loss" not in dumped:
        raise Failure("no loss in the dump")
    loss = float(dumped["loss"])
    r = tm["step1_loss_over_masks"]
    if not (r["min"] - 1e-4 <= loss <= r["max"] + 1e-4):
        raise Failure("loss %.7g outside PyTorch's range over %d dropout masks [%.7g, %.7g]"
                      % (loss, r["samples"], r["min"], r["max"]))
    nodrop = ref["onnxruntime"].get("torch_loss_without_dropout")
    if nodrop is not None and abs(loss - nodrop) <= 1e-6 * abs(nodrop):
        raise Failure("loss %.7g is the loss without dropout: no element was dropped" % loss)
    after = {}
    for s in tm["running_stats_after_step"]:
        after[s["initializer"]] = read_pb(os.path.join(data, "running_stats", "param.%s.pb"
                                                       % file_part(s["initializer"])))
    check_untrained(ref, dumped, inits, after)
    n = 0
    for fn in sorted(os.listdir(data)):
        if not (fn.startswith("grad.") and fn.endswith(".pb")):
            continue
        name = fn[5:-3]
        if "grad." + name not in dumped or "param." + name not in dumped:
            raise Failure("no gradient or value for parameter '%s'" % name)
        g = dumped["grad." + name]
        if not np.all(np.isfinite(g)):
            raise Failure("gradient of %s is not finite" % name)
        init = [i for i in inits if file_part(i) == name][0]
        e = l2_err(dumped["param." + name], inits[init] - np.float32(LR) * g)
        if not e <= 1e-5:
            raise Failure("%s after the step is not its value - %g * its gradient (relative L2 error %.3g)"
                          % (name, LR, e))
        n += 1
    if not n:
        raise Failure("no reference gradients found")
    log = os.path.join(d, "loss.log")
    step(case_dir, ref, d, steps=tm["trajectory"]["steps"], loss_log=log)
    got = [float(line.split()[1]) for line in open(log) if line.strip()]
    if len(got) != tm["trajectory"]["steps"] or not all(math.isfinite(x) for x in got):
        raise Failure("%d-step loss trajectory %s" % (tm["trajectory"]["steps"], got))


def one_case(zoo, name):
    case_dir = os.path.join(zoo, name)
    ref = json.load(open(os.path.join(case_dir, "reference.json")))
    d = tempfile.mkdtemp(prefix="nova-zoo-")
    try:
        (check_train if ref["mode"] == "train" else check_eval)(case_dir, ref, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def report(name, fn):
    tag = harness.TAG
    known = KNOWN_FAILURES.get(name)
    try:
        fn()
        ok, why = True, None
    except Exception as e:  # a failing case reports, the suite goes on
        ok, why = False, str(e)
    if known is None:
        print("%s: %s%s :: %s" % ("PASS" if ok else "FAIL", tag, SUITE, name), flush=True)
        if not ok:
            print("    " + why.replace("\n", "\n    "), flush=True)
        harness.results["pass" if ok else "fail"] += 1
    elif ok:
        print("XPASS: %s%s :: %s" % (tag, SUITE, name), flush=True)
        print("    listed in KNOWN_FAILURES (%s) but passes: remove it" % known, flush=True)
        harness.results["fail"] += 1
    else:
        print("XFAIL: %s%s :: %s" % (tag, SUITE, name), flush=True)
        print("    " + known, flush=True)


def cases(zoo):
    z = json.load(open(os.path.join(zoo, "zoo.json")))
    return z, [c["case"] for c in z["cases"] if c["export"] == "ok"
               and os.path.exists(os.path.join(zoo, c["case"], "model.onnx"))]


def first_error(zoo, name):
    """novac's first error (or 'compiles') for a case, with the test's flags."""
    case_dir = os.path.join(zoo, name)
    ref = json.load(open(os.path.join(case_dir, "reference.json")))
    d = tempfile.mkdtemp(prefix="nova-zoo-")
    try:
        model = os.path.join(case_dir, "model.onnx")
        p = run([NOVAC, model] + novac_flags(ref, model) + ["-o", os.path.join(d, "s.so")], expect_rc=None)
        if p.returncode == 0:
            return None
        lines = [l for l in (p.stderr + p.stdout).splitlines() if "error" in l] or \
            (p.stderr + p.stdout).splitlines() or ["exit status %d" % p.returncode]
        return lines[0].replace(case_dir + "/", "").replace(os.path.join(case_dir, ""), "")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def write_ops(zoo):
    z, names = cases(zoo)
    version = run([NOVAC, "--version"], expect_rc=None).stdout.strip()
    try:
        import subprocess
        head = subprocess.run(["git", "-C", HERE, "log", "-1", "--format=%h %cd", "--date=iso"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        head = ""
    out = ["# Operators of the zoo models, and where novac stops", "",
           "Generated by `python3 testsuite/zoo/test_zoo.py --write-ops` (%s%s): for every "
           "exported file, its opset, its ONNX operators with their counts, and novac's first error for "
           "`novac model.onnx --train --keep-grads --optimizer=sgd --lr=0.1 [--freeze=...]`, the compile test_zoo.py "
           "does (*compiles* when there is none, then what test_zoo.py's checks of that step say; "
           "a known failure is reported as it is, without the XFAIL table)." % (version, ", at commit " + head if head else ""), ""]
    total = collections.Counter()
    rows = []
    for c in z["cases"]:
        if c["export"] != "ok":
            rows.append((c["case"], c, None, "not exported (%s): %s" % (c["export"], c["error"])))
            continue
        m = onnx.load(os.path.join(zoo, c["case"], "model.onnx"))
        ops = collections.Counter()
        for n in m.graph.node:
            ops[(n.domain + "::" if n.domain else "") + n.op_type] += 1
        total.update({k: 1 for k in ops})
        err = first_error(zoo, c["case"])
        if err is None:
            try:
                one_case(zoo, c["case"])
                res = "PASS"
            except Exception as e:
                res = "FAIL: " + str(e).strip().splitlines()[-1][:200]
            err = ("compiles", res)
        rows.append((c["case"], c, ops, err))
    def text(err):
        return "compiles; test_zoo.py: %s" % err[1] if isinstance(err, tuple) else "`%s`" % err

    out += ["## Summary", "", "| case | opset | nodes | novac |", "|---|---|---|---|"]
    for name, c, ops, err in rows:
        out.append("| %s | %s | %s | %s |" % (name, c["opset"], sum(ops.values()) if ops else "-",
                                             text(err).replace("|", "\\|")))
    out += ["", "## Operators by the number of cases that use them", "",
            ", ".join("%s (%d)" % (k, v) for k, v in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))), ""]
    for name, c, ops, err in rows:
        out += ["## %s" % name, ""]
        if ops is None:
            out += [err, ""]
            continue
        out += ["opset %d, %d nodes, %d initializers" % (c["opset"], sum(ops.values()), c["initializers"]), "",
                ", ".join("%s %d" % kv for kv in sorted(ops.items())), "",
                "novac: " + text(err), ""]
    with open(os.path.join(zoo, "OPS.md"), "w") as f:
        f.write("\n".join(out))
    for name, c, ops, err in rows:
        print("%-28s %s" % (name, text(err)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", default=HERE, help="the zoo directory (default: this script's)")
    ap.add_argument("--write-ops", action="store_true", help="write ZOO/OPS.md instead of testing")
    ap.add_argument("cases", nargs="*")
    args = ap.parse_args()
    if args.write_ops:
        write_ops(args.zoo)
        return 0
    _, names = cases(args.zoo)
    for name in names:
        if args.cases and name not in args.cases:
            continue
        report(name, lambda name=name: one_case(args.zoo, name))
    return 1 if harness.results["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
