"""A record/replay cache of novac compiles, for running the GPU suites and
benchmark on a machine that has a GPU but no novac (no MLIR/LLVM there).

    NOVA_STEP_CACHE=DIR NOVA_STEP_CACHE_MODE=fill   here: every novac call runs
        for real and its result (exit status, stdout, stderr, wall time and
        the files it wrote next to -o) is recorded under DIR
    NOVA_STEP_CACHE=DIR NOVA_STEP_CACHE_MODE=use    there: every novac call is
        answered from DIR; novac is never run.  A call that was not recorded
        exits 127 with "not in the step cache"

A call's key is its scope (the caller names it: the suite), its arguments
with every existing file replaced by the SHA-256 of its contents and the -o
path by its base name, and how many identical calls came before it in this
process (so a test that compiles the same model twice, the files around it
changed in between, gets each answer in turn).  The test or benchmark must
therefore make the same novac calls in the same order in both modes, which
holds when what it compiles does not depend on what earlier runs returned.

bench/pack_gpu.sh fills a cache and packs it with novarun; bench/run_gpu.sh
uses it.
"""
import hashlib
import json
import os
import shutil
import subprocess
import time

MODE = os.environ.get("NOVA_STEP_CACHE_MODE", "")
DIR = os.environ.get("NOVA_STEP_CACHE", "")


def active():
    return bool(DIR) and MODE in ("fill", "use")


def _file_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _out_path(args):
    for i, a in enumerate(args):
        if a == "-o" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("-o") and len(a) > 2:
            return a[2:]
    return None


def _norm(args, out):
    norm = []
    for a in args:
        if out is not None and a == out:
            norm.append("OUT:" + os.path.basename(a))
        elif os.path.isfile(a):
            norm.append("FILE:" + _file_hash(a))
        elif a.startswith("--") and "=" in a and os.path.isfile(a.split("=", 1)[1]):
            flag, path = a.split("=", 1)
            norm.append(flag + "=FILE:" + _file_hash(path))
        else:
            norm.append(a)
    return norm


class StepCache:
    def __init__(self, scope):
        self.scope = "".join(c if c.isalnum() or c in "._-" else "_" for c in scope)
        self.seen = {}

    def _entry(self, cmd):
        args = list(cmd[1:])
        out = _out_path(args)
        h = hashlib.sha256(json.dumps(_norm(args, out)).encode()).hexdigest()[:24]
        n = self.seen.get(h, 0)
        self.seen[h] = n + 1
        return os.path.join(DIR, self.scope, "%s_%d" % (h, n)), out

    def novac(self, cmd, timeout):
        """Runs (fill) or replays (use) the novac command CMD: -> (rc, stdout,
        stderr, wall seconds of the real compile)."""
        entry, out = self._entry(cmd)
        if MODE == "use":
            meta_path = os.path.join(entry, "meta.json")
            if not os.path.exists(meta_path):
                return 127, "", "novac: not in the step cache %s: %s\n" % (DIR, " ".join(cmd)), 0.0
            with open(meta_path) as f:
                meta = json.load(f)
            if out is not None:
                for name in meta["files"]:
                    shutil.copyfile(os.path.join(entry, name),
                                    os.path.join(os.path.dirname(out) or ".", name))
            return meta["rc"], meta["stdout"], meta["stderr"], meta["wall_s"]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            rc, so, se = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, so, se = 124, "", "novac: timed out after %d s\n" % timeout
        wall = time.time() - t0
        files = []
        os.makedirs(entry, exist_ok=True)
        if out is not None:
            d = os.path.dirname(out) or "."
            stem = os.path.splitext(os.path.basename(out))[0]
            for name in sorted(os.listdir(d)):
                p_ = os.path.join(d, name)
                if ((name == os.path.basename(out) or name.startswith(stem + ".")) and
                        os.path.isfile(p_) and os.path.getmtime(p_) >= t0 - 0.01):
                    shutil.copyfile(p_, os.path.join(entry, name))
                    files.append(name)
        with open(os.path.join(entry, "meta.json"), "w") as f:
            json.dump({"cmd": cmd, "rc": rc, "stdout": so, "stderr": se, "wall_s": wall, "files": files}, f)
        return rc, so, se, wall
