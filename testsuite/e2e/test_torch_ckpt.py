"""Checkpoints PyTorch reads and writes (tools/torch_ckpt.py), against
PyTorch's own AdamW trajectory (testsuite/e2e/data/torch_ckpt, written by
make_torch_ckpt.py with torch; this test needs numpy only):

- novac to PyTorch: the model exported with its names kept, trained by
  novarun for 3 steps (AdamW, one group); the checkpoint in PyTorch's terms
  (state_dict names, BatchNorm buffers, exp_avg, exp_avg_sq, step) equals
  PyTorch's state after the same 3 steps;
- PyTorch to novac: PyTorch's state after 3 steps written as a novac
  checkpoint, loaded by novarun, trained one more step, equals PyTorch's
  state after 4;
- where torch is installed, the same both ways through a torch.nn.Module and
  torch.optim.AdamW (load_into, save_from) and the command line;
- bad input: a PyTorch state that lacks a parameter, or has another shape,
  is refused naming it; a missing, cut or foreign checkpoint file is an
  error naming it (exit status 1, no traceback)."""
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from harness import NOVAC, NOVARUN, Failure, case, run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "testsuite", "e2e", "data", "torch_ckpt")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import torch_ckpt  # noqa: E402

REF = dict(np.load(os.path.join(DATA, "ref.npz")))
FLAGS = ["--train", "--optimizer=adamw", "--lr=0.01", "--weight-decay=0.05", "--no-decay=none"]
TOL = 2e-5


class Work:
    def __enter__(self):
        self.d = tempfile.mkdtemp(prefix="nova-torch-ckpt-")
        self.so = self.p("step.so")
        run([NOVAC, os.path.join(DATA, "model.onnx"), "-o", self.so] + FLAGS)
        torch_ckpt.st_write(self.p("data.st"), {"x": REF["x"], "y": REF["y"]}, {})
        return self

    def __exit__(self, *a):
        shutil.rmtree(self.d, ignore_errors=True)

    def p(self, name):
        return os.path.join(self.d, name)

    def train(self, steps, save, load=None, dump=None):
        cmd = [NOVARUN, self.so, "--data", self.p("data.st"), "--steps", str(steps), "--save", save, "-q"]
        run(cmd + (["--load", load] if load else []) + (["--dump", dump] if dump else []))


def close(got, ref, what):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise Failure("%s: shape %s, PyTorch's %s" % (what, got.shape, ref.shape))
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-3) if ref.size else 0
    if not err <= TOL:
        raise Failure("%s differs from PyTorch's by %.3g" % (what, err))


def ref_state(k):
    model = {n[len("%d.model." % k):]: v for n, v in REF.items() if n.startswith("%d.model." % k)}
    optim = {}
    for n, v in REF.items():
        for key in ("exp_avg_sq", "exp_avg"):
            pre = "%d.%s." % (k, key)
            if n.startswith(pre):
                optim.setdefault(n[len(pre):], {})[key] = v
    for st in optim.values():
        st["step"] = REF["%d.step" % k]
    return model, optim


def check_torch_state(model, optim, steps, k, what):
    rm, ro = ref_state(k)
    for n, v in rm.items():
        if n.endswith("num_batches_tracked"):
            if steps != int(v):
                raise Failure("%s: %d steps, PyTorch's num_batches_tracked %d" % (what, steps, int(v)))
            continue
        if n not in model:
            raise Failure("%s: no '%s' (PyTorch's state_dict has it)" % (what, n))
        close(model[n], v, "%s '%s'" % (what, n))
    for n, st in ro.items():
        for key, v in st.items():
            close(optim[n][key], v, "%s %s of '%s'" % (what, key, n))


def check_checkpoint(path, k, what):
    """The novac checkpoint PATH, in PyTorch's terms, is PyTorch's state after K steps."""
    ckpt, meta = torch_ckpt.st_read(path)
    model, optim, steps = torch_ckpt.to_torch_state(ckpt, meta)
    check_torch_state(model, optim, steps, k, what)


def novac_to_torch():
    with Work() as w:
        w.train(3, w.p("c3.st"))
        check_checkpoint(w.p("c3.st"), 3, "novarun's checkpoint after 3 steps")


def torch_to_novac():
    with Work() as w:
        w.train(3, w.p("c3.st"))
        like, _ = torch_ckpt.st_read(w.p("c3.st"))
        model, optim = ref_state(3)
        torch_ckpt.st_write(w.p("t3.st"), torch_ckpt.from_torch_state(model, optim, like),
                            {"format": "novac", "step": "3"})
        w.train(1, w.p("c4.st"), load=w.p("t3.st"))
        check_checkpoint(w.p("c4.st"), 4, "PyTorch's state after 3 steps, then one novarun step")


def bad_input():
    with Work() as w:
        w.train(1, w.p("c1.st"))
        like, _ = torch_ckpt.st_read(w.p("c1.st"))
        model, optim = ref_state(3)
        for broken, words in ((dict((k, v) for k, v in model.items() if k != "head.bias"), ["head.bias"]),
                              (dict(model, **{"head.weight": model["head.weight"].T}), ["head.weight", "[16, 4]"])):
            try:
                torch_ckpt.from_torch_state(broken, optim, like)
            except torch_ckpt.CheckpointError as e:
                if any(wd not in str(e) for wd in words):
                    raise Failure("expected %s in: %s" % (words, e))
                continue
            raise Failure("a PyTorch state without %s was accepted" % words)
        good = open(w.p("c1.st"), "rb").read()
        with open(w.p("short.st"), "wb") as f:  # its last tensor's bytes cut off
            f.write(good[:-8])
        with open(w.p("junk.st"), "wb") as f:
            f.write(b"\xff" * 64)
        for name, words in (("nonexistent.st", ["nonexistent.st"]), ("short.st", ["short.st", "data_offsets"]),
                            ("junk.st", ["junk.st", "not a safetensors file"])):
            p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_ckpt.py"), "names", w.p(name)],
                               capture_output=True, text=True)
            if p.returncode != 1 or any(wd not in p.stderr for wd in words) or "Traceback" in p.stderr:
                raise Failure("torch_ckpt.py names %s: rc %d, %s" % (name, p.returncode, p.stderr))


def through_torch():
    """The live round trip: into a torch.nn.Module + AdamW, one PyTorch step, back, one novarun step."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "testsuite", "e2e", "data"))
    net = importlib.import_module("make_torch_ckpt").net
    with Work() as w:
        w.train(3, w.p("c3.st"))
        m = net()
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.05)
        steps = torch_ckpt.load_into(m, opt, w.p("c3.st"))
        x, y = torch.from_numpy(REF["x"][18:24]), torch.from_numpy(REF["y"][18:24])
        opt.zero_grad()
        m(x, y).backward()
        opt.step()
        got = {n: t.detach().numpy() for n, t in m.state_dict().items()}
        optim = {n: {k: v.numpy() for k, v in opt.state[p].items()} for n, p in m.named_parameters()}
        check_torch_state(got, optim, steps + 1, 4, "novarun's 3 steps, one PyTorch step")
        torch_ckpt.save_from(m, opt, w.p("c3.st"), w.p("t4.st"))
        # the same state back in novarun: it equals PyTorch's after 4 steps
        check_checkpoint(w.p("t4.st"), 4, "save_from after 4 steps")
        w.train(1, w.p("c5.st"), load=w.p("t4.st"))
        # the command line: to-torch, then from-torch, gives back the checkpoint
        mod = os.path.join(w.d, "netmod.py")
        with open(mod, "w") as f:
            f.write("import sys\nsys.path.insert(0, %r)\nfrom make_torch_ckpt import net\n"
                    % os.path.join(ROOT, "testsuite", "e2e", "data"))
        tool = [sys.executable, os.path.join(ROOT, "tools", "torch_ckpt.py")]
        subprocess.run(tool + ["to-torch", w.p("c5.st"), "--module", "netmod:net", "-o", w.p("c5.pt")], check=True,
                       cwd=w.d, capture_output=True)
        subprocess.run(tool + ["from-torch", w.p("c5.pt"), "--module", "netmod:net", "--like", w.p("c5.st"), "-o",
                               w.p("back.st")], check=True, cwd=w.d, capture_output=True)
        a, _ = torch_ckpt.st_read(w.p("c5.st"))
        b, _ = torch_ckpt.st_read(w.p("back.st"))
        for n in a:
            if not np.array_equal(a[n], b[n]):
                raise Failure("to-torch then from-torch changed '%s'" % n)


def main():
    case("torch-ckpt :: novarun's AdamW checkpoint in PyTorch's terms equals PyTorch's", novac_to_torch)
    case("torch-ckpt :: PyTorch's state as a novac checkpoint, trained on by novarun", torch_to_novac)
    case("torch-ckpt :: bad input", bad_input)
    if importlib.util.find_spec("torch"):  # (the fixtures above are PyTorch's; this one runs it)
        case("torch-ckpt :: through a torch.nn.Module and AdamW, and the command line", through_torch)


if __name__ == "__main__":
    main()
