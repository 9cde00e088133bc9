"""--data-parallel in a world of one rank: the step sums each gradient over
the ranks (nova.all_reduce, bucketed) and scales it by comm.scale (1 by
default), so one process trains exactly as the same step without the flag:
the same losses, gradients and parameters, bit for bit, with AdamW, either
--nonfinite mode and small buckets.  Launcher variables without a launcher
are refused with a clear error.  (Two ranks: test_data_parallel_mpi.py.)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from harness import NOVAC, NOVARUN, Failure, case, read_pb, results, run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPT = os.path.join(ROOT, "testsuite", "onnx", "models", "gpt_block", "model.onnx")
BLOCK = os.path.join(ROOT, "examples", "transformer_block.nova")


def train(so, d, tag):
    """3 steps on random batches (--seed): (loss lines, {name: array} of --dump)."""
    log, dump = os.path.join(d, tag + ".loss"), os.path.join(d, tag + ".dump")
    run([NOVARUN, so, "--seed", "5", "--steps", "3", "--loss-log", log, "--dump", dump, "-q"])
    with open(log) as f:
        losses = f.read().splitlines()
    return losses, {fn: read_pb(os.path.join(dump, fn)) for fn in sorted(os.listdir(dump))}


def same_as_single(src, flags):
    def go():
        import numpy as np
        d = tempfile.mkdtemp(prefix="nova-dp-")
        try:
            a, b = os.path.join(d, "a.so"), os.path.join(d, "b.so")
            run([NOVAC, src, "-o", a] + flags)
            run([NOVAC, src, "-o", b, "--data-parallel", "--bucket-size=4K"] + flags)
            with open(b[:-3] + ".json") as f:   # (the sums are there: the same results are no accident)
                m = json.load(f)
            if len(m["collectives"]) < 2 or not any(t["name"] == "comm.scale" for t in m["tensors"]):
                raise Failure("no buckets or no comm.scale in the manifest: %r" % m["collectives"])
            la, ta = train(a, d, "a")
            lb, tb = train(b, d, "b")
            if la != lb or len(la) != 3:
                raise Failure("losses differ: %s vs %s" % (la, lb))
            if sorted(ta) != sorted(tb) or not any(k.startswith("grad.") for k in ta):
                raise Failure("dumped tensors differ: %s vs %s" % (sorted(ta), sorted(tb)))
            for k in ta:
                if not np.array_equal(ta[k], tb[k]):
                    raise Failure("%s differs: max |diff| %g" % (k, np.max(np.abs(ta[k].astype(np.float64) - tb[k]))))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return go


def refuses_false_worlds():
    """Launcher variables without a launcher: a clear error, never a hang or a
    world of one that trains alone (mpirun runs: test_data_parallel_mpi.py)."""
    d = tempfile.mkdtemp(prefix="nova-dp-")
    try:
        so = os.path.join(d, "s.so")
        run([NOVAC, BLOCK, "-o", so, "--dim=batch=2", "--train", "--data-parallel"])
        for var, want in (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE=2, but MPI_COMM_WORLD has 1 rank"),
                          ("PMI_SIZE", "PMI_SIZE=2, but MPI_COMM_WORLD has 1 rank"),
                          ("WORLD_SIZE", "WORLD_SIZE=2, but this process was not started by an MPI launcher"),
                          ("SLURM_NTASKS", "SLURM_NTASKS=2, but the step joined no MPI world")):
            p = subprocess.run([NOVARUN, so, "--seed", "1", "--steps", "1"], capture_output=True, text=True,
                               timeout=120, env=dict(os.environ, **{var: "2"}))
            if p.returncode != 1 or want not in p.stderr:
                raise Failure("%s=2: exit %d: %s" % (var, p.returncode, p.stderr))
        # a world of one, said so: runs
        run([NOVARUN, so, "--seed", "1", "--steps", "1", "-q"])
        p = subprocess.run([NOVARUN, so, "--seed", "1", "--steps", "1", "-q"], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, WORLD_SIZE="1"))
        if p.returncode:
            raise Failure("WORLD_SIZE=1: %s" % p.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("data_parallel.world_of_one.gpt_block", same_as_single(GPT, ["--dim=batch=4", "--train", "--optimizer=adamw",
                                                                  "--keep-grads"]))
case("data_parallel.world_of_one.skip_step", same_as_single(BLOCK, ["--dim=batch=2", "--train", "--optimizer=adamw",
                                                                   "--keep-grads", "--nonfinite=skip-step"]))
def bad_flags():
    """--comm-timeout and --trace given wrongly: usage errors (exit 2) and a trace that
    cannot be written (exit 1), each said plainly."""
    d = tempfile.mkdtemp(prefix="nova-dp-")
    try:
        so = os.path.join(d, "s.so")
        run([NOVAC, BLOCK, "-o", so, "--dim=batch=2", "--train", "--data-parallel"])
        for v in ("0", "-3", "abc", "1e3", "2000000"):
            p = subprocess.run([NOVARUN, so, "--seed", "1", "--steps", "1", "--comm-timeout", v], capture_output=True,
                               text=True, timeout=120)
            if p.returncode != 2 or "--comm-timeout needs a number of seconds" not in p.stderr:
                raise Failure("--comm-timeout %s: exit %d: %s" % (v, p.returncode, p.stderr))
        p = subprocess.run([NOVARUN, so, "--seed", "1", "--steps", "1", "--trace", os.path.join(d, "no", "t.json")],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 1 or "cannot write the trace" not in p.stderr:
            raise Failure("--trace into a missing folder: exit %d: %s" % (p.returncode, p.stderr))
        t = os.path.join(d, "t.json")  # a world of one: the runs, no collectives
        run([NOVARUN, so, "--seed", "1", "--steps", "3", "--trace", t, "-q"])
        with open(t) as f:
            ev = json.load(f)["traceEvents"]
        if sum(1 for e in ev if e.get("name", "").startswith("step ")) != 3:
            raise Failure("the trace does not hold the 3 runs: %s" % ev[:5])
        for a in (["--shard-optimizer"], ["--world-size=2"]):
            p = subprocess.run([NOVAC, BLOCK, "-o", so, "--dim=batch=2", "--train"] + a, capture_output=True,
                               text=True, timeout=120)
            if p.returncode != 1 or "needs --data-parallel" not in p.stderr:
                raise Failure("%s without --data-parallel: exit %d: %s" % (a, p.returncode, p.stderr))
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("data_parallel.refuses_false_worlds", refuses_false_worlds)
case("data_parallel.bad_flags", bad_flags)
print("# data_parallel: %d passed, %d failed" % (results["pass"], results["fail"]))
sys.exit(0)
