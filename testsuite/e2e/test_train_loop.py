"""novarun's training loop around the step: learning-rate schedules
(--lr-schedule, --warmup, --min-lr, --decay-steps, --step-size, --gamma),
the JSON log (--log) and evaluation on held-out data (--eval-data,
--eval-every).

- schedules: every step's rate in the log equals the closed forms of
  PyTorch's schedulers (CosineAnnealingLR, StepLR) and of Hugging Face's
  warm-up schedules, written here with numpy; and the step used it: on a
  model whose gradient is constant (loss = sum(x w), dL/dw = x), plain SGD
  ends at w = -(sum of the rates) x;
- a schedule continues across --save / --load (its step count goes on);
- --eval-data: the loss and accuracy of the evaluation entry over the
  held-out batches equal numpy's forward pass of the trained parameters;
- bad input: a schedule without --steps, an unknown schedule, negative or
  non-finite values, --min-lr without a decaying schedule, a step without a
  run-time learning rate, lr given twice: exit 2 or 1 with the reason."""
import json
import math
import os
import shutil
import tempfile

import numpy as np

from harness import NOVAC, NOVARUN, Failure, case, read_pb, run, st_write

WORK = tempfile.mkdtemp(prefix="nova-loop-")
X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def novarun(*args, rc=0):
    return run([NOVARUN] + [str(a) for a in args], expect_rc=rc)


def refuses(cmd, rc, text):
    """CMD (a novac or novarun command) exits RC with TEXT on stderr."""
    p = run([str(a) for a in cmd], expect_rc=rc)
    if text not in p.stderr:
        raise Failure("stderr: %s" % p.stderr)


def path(name):
    return os.path.join(WORK, name)


def linear_step(lr=0.5):
    """loss = sum(x w), w: f32[4, 1] from zeros, batch 1, plain SGD."""
    so = path("lin_%g.so" % lr)
    if not os.path.exists(so):
        src = path("lin.nova")
        with open(src, "w") as f:
            f.write("input x: f32[batch, 4]\nparam w: f32[4, 1] = zeros\noutput loss = reduce_sum(x @ w)\n")
        run([NOVAC, src, "--dim=batch=1", "--train", "--lr=%g" % lr, "-o", so])
    return so


def const_data():
    p = path("const.st")
    if not os.path.exists(p):
        st_write(p, {"x": np.tile(X, (8, 1))})
    return p


def reference(kind, base, steps, warmup=0, min_lr=0.0, decay=None, step_size=1, gamma=0.1, start=0):
    """The rate of each step start+1 .. start+steps (t = the steps before it)."""
    T = decay if decay else start + steps
    out = []
    for t in range(start, start + steps):
        if t < warmup:
            out.append(base * t / warmup)  # transformers' get_*_schedule_with_warmup
            continue
        p = min(1.0, (t - warmup) / max(1, T - warmup))
        if kind == "constant":
            out.append(base)
        elif kind == "linear":
            out.append(min_lr + (base - min_lr) * (1 - p))
        elif kind == "cosine":  # CosineAnnealingLR(eta_min=min_lr, T_max=T - warmup)
            out.append(min_lr + (base - min_lr) * (1 + math.cos(math.pi * p)) / 2)
        elif kind == "step":  # StepLR(step_size, gamma)
            out.append(base * gamma ** ((t - warmup) // step_size))
    return np.array(out)


def read_log(p):
    return [json.loads(line) for line in open(p)]


def schedule_case(name, kind, steps, flags, ref_kw, lr=0.5):
    def fn():
        so = linear_step(lr)
        log, dump = path(name + ".jsonl"), path(name + "_dump")
        novarun(so, "--data", const_data(), "--steps", steps, "--lr-schedule=%s" % kind, *flags, "--log", log,
                "--dump", dump, "-q")
        rows = read_log(log)
        got = np.array([r["lr"] for r in rows])
        want = reference(kind, lr, steps, **ref_kw)
        if [r["step"] for r in rows] != list(range(1, steps + 1)):
            raise Failure("steps in the log: %s" % [r["step"] for r in rows])
        if not np.allclose(got, want, rtol=1e-7, atol=1e-9):
            raise Failure("rates\n got  %s\n want %s" % (got, want))
        # the step used them: w = -(sum of the f32 rates) x
        w = read_pb(os.path.join(dump, "param.w.pb")).ravel()
        wref = -np.sum(want.astype(np.float32).astype(np.float64)) * X
        if not np.allclose(w, wref, rtol=1e-5, atol=1e-6):
            raise Failure("w %s, want %s" % (w, wref))
    case("loop.schedule_" + name, fn)


def resume_case():
    def fn():
        so = linear_step()
        ck, log1, log2 = path("r.st"), path("r1.jsonl"), path("r2.jsonl")
        flags = ["--lr-schedule=cosine", "--warmup=2", "--decay-steps=10"]
        novarun(so, "--data", const_data(), "--steps", 4, *flags, "--log", log1, "--save", ck, "-q")
        novarun(so, "--data", const_data(), "--steps", 6, *flags, "--log", log2, "--load", ck, "-q")
        got = [r["lr"] for r in read_log(log1) + read_log(log2)]
        steps = [r["step"] for r in read_log(log2)]
        want = reference("cosine", 0.5, 10, warmup=2, decay=10)
        if steps != list(range(5, 11)) or not np.allclose(got, want, rtol=1e-7, atol=1e-9):
            raise Failure("steps %s, rates %s, want %s" % (steps, got, want))
    case("loop.schedule_resumes", fn)


def eval_case():
    """A 3-class linear classifier trained on a few batches, evaluated every 2 steps on held-out data."""
    def fn():
        src, so = path("cls.nova"), path("cls.so")
        with open(src, "w") as f:
            f.write("input x: f32[batch, 5]\nlabel y: i64[batch]\nparam w: f32[5, 3] = normal(0.5)\n"
                    "param b: f32[3] = zeros\nlogits = x @ w + b\noutput logits\n"
                    "output loss = cross_entropy(logits, y)\n")
        run([NOVAC, src, "--dim=batch=4", "--train", "--lr=0.1", "-o", so])
        rng = np.random.default_rng(3)
        train = {"x": rng.standard_normal((16, 5)).astype(np.float32), "y": rng.integers(0, 3, 16)}
        held = {"x": rng.standard_normal((10, 5)).astype(np.float32), "y": rng.integers(0, 3, 10)}
        st_write(path("train.st"), train)
        st_write(path("held.st"), held)
        log, dump = path("cls.jsonl"), path("cls_dump")
        p = novarun(so, "--data", path("train.st"), "--steps", 5, "--eval-data", path("held.st"), "--eval-every", 2,
                    "--log", log, "--dump", dump)
        evals = [r for r in read_log(log) if "eval_loss" in r]
        if [r["step"] for r in evals] != [2, 4, 5] or any(r["eval_batches"] != 2 for r in evals):
            raise Failure("evaluations: %s" % evals)
        if "eval loss" not in p.stderr or "accuracy" not in p.stderr:
            raise Failure(p.stderr)
        # the last evaluation against numpy with the trained parameters (2 whole batches: 8 of the 10 samples)
        w = read_pb(os.path.join(dump, "param.w.pb")).astype(np.float64)
        b = read_pb(os.path.join(dump, "param.b.pb")).astype(np.float64)
        x, y = held["x"][:8].astype(np.float64), held["y"][:8]
        z = x @ w + b
        lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
        per = lse - z[np.arange(8), y]
        loss = np.mean([per[:4].mean(), per[4:].mean()])
        acc = np.mean(z.argmax(1) == y)
        last = evals[-1]
        if abs(last["eval_loss"] - loss) > 1e-5 * max(1, abs(loss)) or abs(last["eval_accuracy"] - acc) > 1e-12:
            raise Failure("eval %s, numpy loss %.7f accuracy %.4f" % (last, loss, acc))
    case("loop.eval_data", fn)


def clip_case():
    """--clip-grad-norm: loss = sum(x w + b) has gradients x (w) and 1 (b), norm sqrt(31); plain SGD moves
    them by lr min(1, M / (norm + 1e-6)) (torch.nn.utils.clip_grad_norm_'s factor), M bound at run time."""
    def fn():
        src, so = path("clip.nova"), path("clip.so")
        with open(src, "w") as f:
            f.write("input x: f32[batch, 4]\nparam w: f32[4, 1] = zeros\nparam b: f32[1] = zeros\n"
                    "output loss = reduce_sum(x @ w + b)\n")
        run([NOVAC, src, "--dim=batch=1", "--train", "--lr=0.5", "--clip-grad-norm=1", "-o", so])
        man = json.load(open(path("clip.json")))
        names = {t["name"]: t["role"] for t in man["tensors"]}
        if names.get("clip.max_norm") != "input" or names.get("grad_norm") != "status":
            raise Failure("manifest tensors: %s" % names)
        norm = math.sqrt(float(np.sum(X.astype(np.float64) ** 2)) + 1)
        for m, steps in ((None, 1), (2.5, 3), (100, 2)):
            log, dump = path("clip%s.jsonl" % m), path("clip%s_dump" % m)
            extra = ["--clip-grad-norm", m] if m else []
            novarun(so, "--data", const_data(), "--steps", steps, *extra, "--log", log, "--dump", dump, "-q")
            rows = read_log(log)
            if abs(rows[0]["grad_norm"] - norm) > 1e-5 * norm:
                raise Failure("grad_norm %s, want %.7f" % (rows[0]["grad_norm"], norm))
            coef = min(1.0, (m or 1) / (norm + 1e-6))  # the gradient is the same every step
            w = read_pb(os.path.join(dump, "param.w.pb")).ravel()
            b = read_pb(os.path.join(dump, "param.b.pb")).ravel()
            if not np.allclose(w, -0.5 * steps * coef * X, rtol=1e-5) or abs(b[0] + 0.5 * steps * coef) > 1e-5:
                raise Failure("max norm %s: w %s b %s, want %s %s" % (m, w, b, -0.5 * steps * coef * X,
                                                                    -0.5 * steps * coef))
        refuses([NOVARUN, linear_step(), "--data", const_data(), "--steps", 1, "--clip-grad-norm", 1], 1,
                "compile it with novac --clip-grad-norm")
        refuses([NOVAC, src, "--dim=batch=1", "--train", "--clip-grad-norm=1", "--nonfinite=skip-param", "-o",
                 path("c2.so")], 1, "use --nonfinite=skip-step")
        for bad in ("0", "-1", "nan"):
            refuses([NOVAC, src, "--dim=batch=1", "--train", "--clip-grad-norm=" + bad, "-o", path("c3.so")], 2,
                    "--clip-grad-norm")
    case("loop.clip_grad_norm", fn)


def no_decay_case():
    """--no-decay: one AdamW step on loss = sum(x w + b) from w = b = 1 moves each param by
    -lr g / (|g| + eps), and decays those not excluded by lr wd (by default: w, not the bias b)."""
    def fn():
        src = path("wd.nova")
        with open(src, "w") as f:
            f.write("input x: f32[batch, 4]\nparam w: f32[4, 1] = ones\nparam b: f32[1] = ones\n"
                    "output loss = reduce_sum(x @ w + b)\n")
        lr, wd = 0.1, 0.5
        step = lambda p0, g, decay: p0 * (1 - lr * wd * decay) - lr * g / (np.abs(g) + 1e-8)
        for flag, dw, db in ((None, 1, 0), ("none", 1, 1), ("w", 0, 1), ("b,w", 0, 0)):
            so, dump = path("wd_%s.so" % flag), path("wd_%s" % flag)
            run([NOVAC, src, "--dim=batch=1", "--train", "--optimizer=adamw", "--lr=%g" % lr, "--weight-decay=%g" % wd,
                 "-o", so] + (["--no-decay=" + flag] if flag else []))
            novarun(so, "--data", const_data(), "--steps", 1, "--dump", dump, "-q")
            w = read_pb(os.path.join(dump, "param.w.pb")).ravel()
            b = read_pb(os.path.join(dump, "param.b.pb")).ravel()
            ww, bw = step(np.ones(4), X.astype(np.float64), dw), step(np.ones(1), np.ones(1), db)
            if not np.allclose(w, ww, rtol=1e-6) or not np.allclose(b, bw, rtol=1e-6):
                raise Failure("--no-decay=%s: w %s b %s, want %s %s" % (flag, w, b, ww, bw))
        refuses([NOVAC, src, "--dim=batch=1", "--train", "--optimizer=adamw", "--no-decay=bias*", "-o",
                 path("wd_x.so")], 1, "--no-decay: pattern 1 of 'bias*' matches no parameter")
    case("loop.no_decay", fn)


def accumulate_case():
    """--accumulate=K: K runs on micro-batches of B update like one run on their K B samples (mean loss: the
    mean of the micro-batches' gradients), for sgd and adamw, within 1e-6; nothing moves before the K-th run;
    K rebound at run time (novarun --accumulate)."""
    def fn():
        src = path("acc.nova")
        with open(src, "w") as f:
            f.write("input x: f32[batch, 6]\nlabel y: i64[batch]\nparam w1: f32[6, 8] = normal(0.5)\n"
                    "param b1: f32[8] = zeros\nparam w2: f32[8, 3] = normal(0.5)\n"
                    "h = tanh(x @ w1 + b1)\noutput loss = cross_entropy(h @ w2, y)\n")
        rng = np.random.default_rng(11)
        data = path("acc.st")
        st_write(data, {"x": rng.standard_normal((16, 6)).astype(np.float32), "y": rng.integers(0, 3, 16)})

        def params(dump):
            return {n: read_pb(os.path.join(dump, "param.%s.pb" % n)) for n in ("w1", "b1", "w2")}

        for opt in ("sgd", "adamw"):
            big, small = path("acc_big_%s.so" % opt), path("acc_small_%s.so" % opt)
            common = ["--train", "--optimizer=" + opt, "--lr=0.1"]
            run([NOVAC, src, "--dim=batch=8"] + common + ["-o", big])
            run([NOVAC, src, "--dim=batch=2", "--accumulate=4"] + common + ["-o", small])
            novarun(big, "--data", data, "--steps", 2, "--dump", path("ab"), "-q")
            novarun(small, "--data", data, "--steps", 8, "--dump", path("as"), "--log", path("as.jsonl"), "-q")
            a, b = params(path("ab")), params(path("as"))
            for n in a:
                if not np.allclose(a[n], b[n], rtol=1e-6, atol=1e-6):
                    raise Failure("%s %s: %s vs %s (max diff %g)" % (opt, n, a[n].ravel()[:4], b[n].ravel()[:4],
                                                                     np.abs(a[n] - b[n]).max()))
            ups = [r.get("update") for r in read_log(path("as.jsonl"))]
            if ups != [False, False, False, True] * 2:
                raise Failure("updates: %s" % ups)
            # before the 4th run nothing moved: the params are the initial ones
            novarun(small, "--data", data, "--steps", 3, "--dump", path("a3"), "-q")
            novarun(big, "--data", data, "--steps", 1, "--lr", 0, "--dump", path("a0"), "-q")
            a, b = params(path("a0")), params(path("a3"))
            if any(not np.array_equal(a[n], b[n]) for n in a):
                raise Failure("%s: the params moved before the 4th run" % opt)
        # K rebound at run time: 2 runs of 2 = one run of 4
        b4 = path("acc_b4.so")
        run([NOVAC, src, "--dim=batch=4", "--train", "--optimizer=sgd", "--lr=0.1", "-o", b4])
        small = path("acc_small_sgd.so")
        novarun(b4, "--data", data, "--steps", 3, "--dump", path("b4"), "-q")
        novarun(small, "--data", data, "--steps", 6, "--accumulate", 2, "--dump", path("s2"), "-q")
        a, b = params(path("b4")), params(path("s2"))
        for n in a:
            if not np.allclose(a[n], b[n], rtol=1e-6, atol=1e-6):
                raise Failure("--accumulate 2 at run time: %s differs by %g" % (n, np.abs(a[n] - b[n]).max()))
        refuses([NOVARUN, b4, "--data", data, "--steps", 1, "--accumulate", 2], 1,
                "compile it with novac --accumulate")
        refuses([NOVAC, src, "--dim=batch=2", "--train", "--accumulate=4", "--nonfinite=skip-param", "-o",
                 path("x.so")], 1, "use --nonfinite=skip-step")
    case("loop.accumulate", fn)


def plot_case():
    """tools/plot_log.py draws the log of a cosine run: a loss polyline with a point per step, a rate polyline."""
    def fn():
        import subprocess
        import xml.etree.ElementTree as ET
        so, log, out = linear_step(), path("plot.jsonl"), path("plot.svg")
        novarun(so, "--data", const_data(), "--steps", 7, "--lr-schedule=cosine", "--log", log, "-q")
        tool = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "plot_log.py")
        p = subprocess.run(["python3", tool, log, "-o", out], capture_output=True, text=True)
        if p.returncode:
            raise Failure(p.stderr)
        lines = [e for e in ET.parse(out).getroot().iter() if e.tag.endswith("polyline")]
        if len(lines) != 2 or any(len(e.get("points").split()) != 7 for e in lines):
            raise Failure("polylines: %s" % [e.get("points") for e in lines])
        bad = path("bad.jsonl")
        with open(bad, "w") as f:
            f.write("{\"step\": 1, \"loss\": 1}\nnot json\n")
        p = subprocess.run(["python3", tool, bad, "-o", path("bad.svg")], capture_output=True, text=True)
        if p.returncode != 1 or "bad.jsonl:2: not a JSON line" not in p.stderr:
            raise Failure("exit %d: %s" % (p.returncode, p.stderr))
    case("loop.plot_log", fn)


def bad_case(name, args, rc, text, step=None):
    case("loop.bad_" + name, lambda: refuses([NOVARUN, step or linear_step()] + list(args), rc, text))


def bad_cases():
    d = const_data()
    bad_case("no_steps", ["--data", d, "--lr-schedule=cosine"], 2, "a learning-rate schedule needs --steps N")
    bad_case("unknown", ["--data", d, "--steps", 2, "--lr-schedule=exp"], 2,
             "--lr-schedule is constant, linear, cosine or step, not 'exp'")
    bad_case("negative_warmup", ["--data", d, "--steps", 2, "--warmup=-1"], 2, "--warmup needs an integer >= 0")
    bad_case("nan_min_lr", ["--data", d, "--steps", 2, "--lr-schedule=linear", "--min-lr=nan"], 2,
             "--min-lr needs a finite number >= 0")
    bad_case("inf_gamma", ["--data", d, "--steps", 2, "--lr-schedule=step", "--step-size=1", "--gamma=inf"], 2,
             "--gamma needs a finite number > 0")
    bad_case("min_lr_constant", ["--data", d, "--steps", 2, "--lr-schedule=constant", "--min-lr=0.1"], 2,
             "--min-lr is the end of a linear or cosine schedule")
    bad_case("step_no_size", ["--data", d, "--steps", 2, "--lr-schedule=step"], 2, "needs --step-size N")
    bad_case("gamma_alone", ["--data", d, "--steps", 2, "--gamma=0.5"], 2, "shape a --lr-schedule")
    bad_case("eval_every_alone", ["--data", d, "--steps", 2, "--eval-every", 2], 2, "--eval-every N needs --eval-data")
    bad_case("log_no_steps", ["--data", d, "--log", path("x.jsonl")], 2, "go with --steps N")
    lr_data = path("lr.st")
    st_write(lr_data, {"x": np.tile(X, (4, 1)), "lr": np.full(4, 0.1, np.float32)})
    bad_case("lr_twice", ["--data", lr_data, "--steps", 2, "--lr-schedule=cosine"], 1,
             "tensor 'lr' gives the learning rate, and so does --lr-schedule")

    def no_lr_step():
        src, so = path("fwd.nova"), path("fwd.so")
        with open(src, "w") as f:
            f.write("input x: f32[1, 4]\nparam w: f32[4, 1] = zeros\noutput loss = reduce_sum(x @ w)\n")
        run([NOVAC, src, "-o", so])
        p = novarun(so, "--seed", 1, "--steps", 2, "--lr-schedule=cosine", rc=1)
        if "this step has no loss" not in p.stderr and "no run-time learning rate" not in p.stderr:
            raise Failure(p.stderr)
    case("loop.bad_no_lr", no_lr_step)


try:
    schedule_case("constant_warmup", "constant", 8, ["--warmup=3"], {"warmup": 3})
    schedule_case("linear", "linear", 9, ["--min-lr=0.1"], {"min_lr": 0.1})
    schedule_case("cosine", "cosine", 12, ["--warmup=2", "--min-lr=0.01"], {"warmup": 2, "min_lr": 0.01})
    schedule_case("cosine_decay_steps", "cosine", 12, ["--decay-steps=8"], {"decay": 8})
    schedule_case("step", "step", 10, ["--step-size=3", "--gamma=0.5", "--warmup=1"],
                  {"step_size": 3, "gamma": 0.5, "warmup": 1})
    resume_case()
    eval_case()
    clip_case()
    no_decay_case()
    accumulate_case()
    plot_case()
    bad_cases()
finally:
    shutil.rmtree(WORK, ignore_errors=True)
