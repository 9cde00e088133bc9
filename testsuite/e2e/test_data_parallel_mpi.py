"""Data-parallel training over MPI: `mpirun -np 2 novarun step.so` (novac
--data-parallel, batch B per rank) against one process.

- Same training: 20 steps of 2 ranks end with the parameters of 20 steps of
  one process on the concatenated batch (batch 2B, compiled without the
  flag), within 1e-6 of the largest parameter value (the sums: each rank's
  gradient is the mean over its B samples, MPI sums the two in f32, times
  comm.scale = 1/2; one process sums the 2B samples' terms in its own order,
  so the last bits differ).  The MLP (SGD and AdamW), the GPT block (ONNX,
  momentum: AdamW divides each gradient by its own size, which makes the
  rounding noise of a gradient that is zero in exact arithmetic, like the
  attention's key bias's, an update of full size), and a zoo model (GPT-2 from transformers, exported with a fixed
  batch of 2: the reference is one process per rank's batch, the gradients
  averaged in numpy, step by step).
- The cuda target's kernels simulated on the CPU (--gpu-sim) with the MPI
  backend: the MLP as above (a real cuda step runs as one process for now).
- --shard-optimizer (ZeRO-1, --world-size=2): bit for bit the unsharded
  step's parameters and, cut in two, its optimizer state; per-rank
  checkpoints resume exactly; a limit the unsharded step does not fit;
  with --clip-grad-norm, the norm of the whole gradient summed over the
  ranks' shares (the one-process step's parameters within 3e-5); with
  --accumulate=2, the one-process accumulation's parameters.
- Failures: a rank that is stopped (SIGSTOP), killed (SIGKILL) or that
  leaves early makes the job end within --comm-timeout with the rank named;
  ranks that load different steps or different parameters are refused at
  the first step; a step compiled without --data-parallel is refused when
  launched as two processes.
Needs Open MPI's mpirun (`make deps` installs it)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from harness import NOVAC, NOVARUN, Failure, case, read_pb, results, run, st_read, st_write

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MLP = os.path.join(ROOT, "examples", "mlp.nova")
GPT = os.path.join(ROOT, "testsuite", "onnx", "models", "gpt_block", "model.onnx")
ZOO = os.path.join(ROOT, "testsuite", "zoo", "gpt2.ts", "model.onnx")
STEPS = 20
TOL = 1e-6
WORK = tempfile.mkdtemp(prefix="nova-mpi-")
MPIRUN = shutil.which("mpirun")
# mpirun as root (containers, CI) must be told so; the shared-memory transport's
# single-copy mode needs ptrace rights that containers often lack
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1",
           NOVA_NUM_THREADS="1")


def path(name):
    return os.path.join(WORK, name)


def mpirun(args, rc=0, timeout=300, np_=2):
    """mpirun -np 2 ARGS (a list, or a list of per-rank lists: MPMD)."""
    cmd = [MPIRUN, "-np", str(np_)] + args if isinstance(args[0], str) else \
        [MPIRUN] + sum([["-np", "1"] + a + [":"] for a in args], [])[:-1]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    if rc is not None and p.returncode != rc:
        raise Failure("%s: exit %d (expected %d)\n%s" % (" ".join(cmd[-6:]), p.returncode, rc, p.stderr[-3000:]))
    return p


def compare(got, ref, what, tol=None):
    """Every float tensor of REF within TOL (or tol) of its largest value in GOT."""
    tol = tol or TOL
    n = 0
    for k, r in ref.items():
        if r.dtype.kind != "f":
            continue
        g = got[k].astype(np.float64)
        scale = max(np.max(np.abs(r)), 1e-30)
        err = np.max(np.abs(g - r)) / scale
        if not err <= tol:
            raise Failure("%s: '%s' differs by %.3g of its largest value (tolerance %g)" % (what, k, err, tol))
        n += 1
    if not n:
        raise Failure("%s: nothing compared" % what)


def lm_data(name, samples, seq, vocab, names):
    rng = np.random.default_rng(7)
    st_write(path(name), {names[0]: rng.integers(0, vocab, (samples, seq)).astype(np.int64),
                          names[1]: rng.integers(0, vocab, (samples, seq)).astype(np.int64)})
    return path(name)


def same_as_concatenated(src, flags, per_rank, data, tag, dp_flags=(), tol=None):
    """STEPS steps on 2 ranks of PER_RANK samples against one process of 2 * PER_RANK (parameters within
    TOL, default 1e-6)."""
    def go():
        dp, one = path(tag + ".dp.so"), path(tag + ".one.so")
        run([NOVAC, src, "-o", dp, "--dim=batch=%d" % per_rank, "--data-parallel", "--bucket-size=16K"] + flags +
            list(dp_flags))
        run([NOVAC, src, "-o", one, "--dim=batch=%d" % (2 * per_rank)] + flags)
        mpirun([NOVARUN, dp, "--data", data, "--steps", str(STEPS), "--save", path(tag + ".dp.st"),
                "--loss-log", path(tag + ".dp.loss"), "-q"])
        run([NOVARUN, one, "--data", data, "--steps", str(STEPS), "--save", path(tag + ".one.st"),
             "--loss-log", path(tag + ".one.loss"), "-q"])
        got, _ = st_read(path(tag + ".dp.st"))
        ref, _ = st_read(path(tag + ".one.st"))
        with open(one[:-3] + ".json") as f:  # the parameters (optimizer state follows from them)
            params = {t["name"] for t in json.load(f)["tensors"] if t["role"] == "param"}
        compare(got, {k: v for k, v in ref.items() if k in params}, "parameters after %d steps" % STEPS, tol)
        la = np.loadtxt(path(tag + ".dp.loss"))[:, 1]
        lb = np.loadtxt(path(tag + ".one.loss"))[:, 1]
        if la.shape != (STEPS,) or np.max(np.abs(la - lb)) > 1e-5 * np.max(np.abs(lb)):
            raise Failure("losses (the global batch's, from rank 0) differ: %s vs %s" % (la[:4], lb[:4]))
    return go


def mlp_data():
    rng = np.random.default_rng(3)
    st_write(path("mlp.st"), {"x": rng.standard_normal((48, 784)).astype(np.float32),
                              "y": rng.integers(0, 10, 48).astype(np.int64)})
    return path("mlp.st")


def zoo_matches_averaged_gradients():
    """GPT-2 (transformers, fixed batch 2): 2 ranks x batch 2 with SGD against,
    step by step, one process run on each rank's batch with lr 0 (its
    gradients, --dump) and the update p - lr * (g0 + g1) / 2 in numpy."""
    lr, steps = np.float32(0.1), 6
    sys.path.insert(0, os.path.join(ROOT, "testsuite", "zoo"))
    import test_zoo  # noqa: E402  (its flags: the params PyTorch trains, frozen constants)
    ref = json.load(open(os.path.join(os.path.dirname(ZOO), "reference.json")))
    flags = test_zoo.novac_flags(ref, ZOO)
    dp, one = path("zoo.dp.so"), path("zoo.one.so")
    run([NOVAC, ZOO, "-o", dp, "--data-parallel", "--bucket-size=8K"] + flags)
    run([NOVAC, ZOO, "-o", one] + flags)
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 64, (4 * steps, 8)).astype(np.int64)
    labels = rng.integers(0, 64, (4 * steps, 8)).astype(np.int64)
    st_write(path("zoo.st"), {"input_ids": ids, "labels": labels})
    mpirun([NOVARUN, dp, "--data", path("zoo.st"), "--steps", str(steps), "--save", path("zoo.dp.st"), "-q"])
    # the reference: a checkpoint of the single-process step, its params replaced step by step
    run([NOVARUN, one, "--data", path("zoo.st"), "--steps", "1", "--lr", "0", "--save", path("zoo.p.st"), "-q"])
    params, meta = st_read(path("zoo.p.st"))
    params = {k: v.copy() for k, v in params.items()}
    meta = dict(meta, step="0")
    for k in range(steps):
        st_write(path("zoo.p.st"), params, meta)
        grads = []
        for r in range(2):  # rank r's batch of step k+1: global samples 4k + r + 2j
            rows = [4 * k + r, 4 * k + r + 2]
            st_write(path("zoo.r.st"), {"input_ids": ids[rows], "labels": labels[rows]})
            d = path("zoo.dump%d" % r)
            shutil.rmtree(d, ignore_errors=True)
            run([NOVARUN, one, "--load", path("zoo.p.st"), "--data", path("zoo.r.st"), "--steps", "1", "--lr", "0",
                 "--dump", d, "-q"])
            grads.append({f[5:-3]: read_pb(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("grad.")})
        if not grads[0]:
            raise Failure("no gradients dumped")
        for name, g0 in grads[0].items():
            g = (g0.astype(np.float32) + grads[1][name].astype(np.float32)) * np.float32(0.5)
            params[name] = (params[name] - lr * g).astype(params[name].dtype)
    got, _ = st_read(path("zoo.dp.st"))
    compare(got, {k: v for k, v in params.items() if k in grads[0]}, "GPT-2 after %d steps" % steps)


# ---- failures -------------------------------------------------------------------------------

def small_dp_step():
    so = path("fail.so")
    if not os.path.exists(so):
        run([NOVAC, MLP, "-o", so, "--dim=batch=4", "--train", "--data-parallel"])
    return so


def rank_pid(marker, rank, deadline):
    """The pid of the novarun of RANK whose command line holds MARKER."""
    while time.time() < deadline:
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                cmd = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
                env = open("/proc/%s/environ" % p, "rb").read().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"novarun") and marker.encode() in b" ".join(cmd) and \
                    ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
                return int(p)
        time.sleep(0.1)
    raise Failure("rank %d never started" % rank)


def stops_when(sig):
    """Rank 1 gets SIG after it has trained a moment: rank 0 must end the job,
    with the rank named, within the timeout (3 s) plus start-up."""
    def go():
        so = small_dp_step()
        marker = path("sig%d.loss" % sig)
        cmd = [MPIRUN, "-np", "2", NOVARUN, so, "--seed", "1", "--steps", "1000000", "--comm-timeout", "3",
               "--loss-log", marker, "-q"]
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        try:
            pid = rank_pid(marker, 1, t0 + 60)
            time.sleep(1.0)
            os.kill(pid, sig)
            t1 = time.time()
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        took = time.time() - t1
        if p.returncode == 0:
            raise Failure("the job exited 0 after rank 1 got signal %d" % sig)
        if "rank 1" not in err:
            raise Failure("no message names rank 1: %s" % err[-2000:])
        if sig == signal.SIGSTOP and "never joined" not in err:
            raise Failure("the timeout's message is missing: %s" % err[-2000:])
        if took > 30:
            raise Failure("the job took %.1f s to end after the signal" % took)
    return go


def leaves_early():
    """Rank 1 trains 2 steps and exits (done): rank 0, at step 3, times out naming it."""
    so = small_dp_step()
    p = mpirun([[NOVARUN, so, "--seed", "1", "--steps", "50", "--comm-timeout", "2", "-q"],
                [NOVARUN, so, "--seed", "1", "--steps", "2", "--comm-timeout", "2", "-q"]], rc=None, timeout=120)
    if p.returncode == 0 or "rank 1 never joined" not in p.stderr or "step 3" not in p.stderr:
        raise Failure("exit %d: %s" % (p.returncode, p.stderr[-2000:]))


def refuses_other_step():
    so = small_dp_step()
    other = path("other.so")
    run([NOVAC, MLP, "-o", other, "--dim=batch=4", "--train", "--data-parallel", "--optimizer=momentum"])
    p = mpirun([[NOVARUN, so, "--seed", "1", "--steps", "2"], [NOVARUN, other, "--seed", "1", "--steps", "2"]],
               rc=None, timeout=120)
    if p.returncode == 0 or "rank 1 runs another step.so than rank 0" not in p.stderr:
        raise Failure("exit %d: %s" % (p.returncode, p.stderr[-2000:]))


def refuses_other_params():
    so = small_dp_step()
    run([NOVARUN, so, "--seed", "1", "--steps", "1", "--save", path("one_step.st"), "-q"])
    p = mpirun([[NOVARUN, so, "--seed", "1", "--steps", "2"],
                [NOVARUN, so, "--seed", "1", "--steps", "2", "--load", path("one_step.st")]], rc=None, timeout=120)
    if p.returncode == 0 or "rank 1 starts from other parameters than rank 0" not in p.stderr:
        raise Failure("exit %d: %s" % (p.returncode, p.stderr[-2000:]))


SHARD = ["--world-size=2", "--shard-optimizer"]


def shard_same_as_unsharded():
    """--shard-optimizer: the same parameters and optimizer state, bit for bit, as the
    unsharded step (the same sums, the same elementwise updates on each share); a
    run resumed from the per-rank checkpoints (FILE, FILE.rank1) ends as the
    uninterrupted one; each rank keeps half of the optimizer state."""
    data = mlp_data()
    flags = ["--dim=batch=4", "--train", "--optimizer=adamw", "--data-parallel", "--nonfinite=skip-step",
             "--bucket-size=64K"]
    sh, un = path("sh.so"), path("un.so")
    run([NOVAC, MLP, "-o", sh] + flags + SHARD)
    run([NOVAC, MLP, "-o", un] + flags)
    mpirun([NOVARUN, sh, "--data", data, "--steps", "20", "--save", path("sh20.st"), "-q"])
    mpirun([NOVARUN, un, "--data", data, "--steps", "20", "--save", path("un20.st"), "-q"])
    a, _ = st_read(path("sh20.st"))
    b, _ = st_read(path("un20.st"))
    for k in ("w1", "b1", "w2", "b2"):
        if not np.array_equal(a[k], b[k]):
            raise Failure("'%s' differs from the unsharded step's: max |diff| %g" % (k, np.max(np.abs(a[k] - b[k]))))
    a1, _ = st_read(path("sh20.st.rank1"))
    for k in ("w1", "b2"):  # each rank's half of the moments: the unsharded moments, flat, cut in two
        for r, part in enumerate((a, a1)):
            full = b[k + ".adam_m"].reshape(-1)
            s = (full.size + 1) // 2
            want = np.zeros(s, np.float32)
            want[:len(full[r * s:(r + 1) * s])] = full[r * s:(r + 1) * s]
            if not np.array_equal(part[k + ".adam_m.shard"], want):
                raise Failure("rank %d's share of %s.adam_m is not that of the unsharded state" % (r, k))
    mpirun([NOVARUN, sh, "--data", data, "--steps", "10", "--save", path("sh10.st"), "-q"])
    mpirun([NOVARUN, sh, "--data", data, "--steps", "10", "--load", path("sh10.st"), "--save", path("shr.st"), "-q"])
    for suffix in ("", ".rank1"):
        if open(path("shr.st" + suffix), "rb").read() != open(path("sh20.st" + suffix), "rb").read():
            raise Failure("resumed from sh10.st%s: the checkpoint differs from 20 steps in one go" % suffix)
    with open(sh[:-3] + ".json") as f:
        ms = json.load(f)
    with open(un[:-3] + ".json") as f:
        mu = json.load(f)
    opt = lambda m: sum(t["bytes"] for t in m["tensors"] if t["role"] == "opt_state")  # noqa: E731
    if not ms["data_parallel"]["shard_optimizer"] or not opt(ms) * 2 <= opt(mu) + 64:
        raise Failure("optimizer state: %d bytes sharded, %d not" % (opt(ms), opt(mu)))


def shard_fits_memory_limit():
    """The GPT block under --memory-limit=240K: too little for the step with its whole
    optimizer state; with --shard-optimizer each rank holds half of it, fits, and trains."""
    flags = ["--dim=batch=2", "--train", "--optimizer=adamw", "--data-parallel", "--nonfinite=skip-step",
             "--memory-limit=240K"]
    p = run([NOVAC, GPT, "-o", path("gl.so")] + flags, expect_rc=None)
    if p.returncode != 1 or "does not fit" not in p.stderr:
        raise Failure("unsharded under 240K: exit %d: %s" % (p.returncode, p.stderr[-500:]))
    run([NOVAC, GPT, "-o", path("gs.so")] + flags + SHARD)
    with open(path("gs.json")) as f:
        peak = json.load(f)["memory"]["planned_peak_bytes"]
    if peak > 240 * 1024:
        raise Failure("the sharded step's planned peak %d is over the limit" % peak)
    mpirun([NOVARUN, path("gs.so"), "--data", lm_data("gl.st", 8, 8, 50, ("idx", "targets")), "--steps", "3", "-q"])


def refuses_other_world():
    """A step for 2 ranks (--world-size=2) run alone, and one for 3 under mpirun -np 2."""
    run([NOVAC, MLP, "-o", path("w2.so"), "--dim=batch=4", "--train", "--data-parallel"] + SHARD)
    run([NOVAC, MLP, "-o", path("w3.so"), "--dim=batch=4", "--train", "--data-parallel", "--world-size=3"])
    p = subprocess.run([NOVARUN, path("w2.so"), "--seed", "1", "--steps", "1"], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 1 or "compiled for 2 ranks (novac --world-size=2), but runs as 1" not in p.stderr:
        raise Failure("alone: exit %d: %s" % (p.returncode, p.stderr))
    p = mpirun([NOVARUN, path("w3.so"), "--seed", "1", "--steps", "1"], rc=None, timeout=120)
    if p.returncode == 0 or "compiled for 3 ranks (novac --world-size=3), but runs as 2" not in p.stderr:
        raise Failure("2 ranks: exit %d: %s" % (p.returncode, p.stderr[-2000:]))


def refuses_not_data_parallel():
    so = path("plain.so")
    run([NOVAC, MLP, "-o", so, "--dim=batch=4", "--train"])
    p = mpirun([NOVARUN, so, "--seed", "1", "--steps", "2"], rc=None, timeout=120)
    if p.returncode == 0 or "this step is not data-parallel" not in p.stderr:
        raise Failure("exit %d: %s" % (p.returncode, p.stderr[-2000:]))


def one_rank_prints():
    """Progress and results from rank 0 only; the loss is the global batch's."""
    so = small_dp_step()
    p = mpirun([NOVARUN, so, "--seed", "1", "--steps", "3"])
    if p.stderr.count("novarun: 3 steps in") != 1:
        raise Failure("the summary is not printed once: %s" % p.stderr)


if not MPIRUN:
    case("data_parallel_mpi.mpirun", lambda: (_ for _ in ()).throw(
        Failure("mpirun not found: install Open MPI (make deps; Debian: openmpi-bin)")))
else:
    case("data_parallel_mpi.mlp_sgd", same_as_concatenated(MLP, ["--train", "--optimizer=sgd"], 4, mlp_data(), "mlp_sgd"))
    case("data_parallel_mpi.mlp_adamw", same_as_concatenated(MLP, ["--train", "--optimizer=adamw"], 4, mlp_data(),
                                                             "mlp_adamw"))
    case("data_parallel_mpi.gpt_block_momentum", same_as_concatenated(
        GPT, ["--train", "--optimizer=momentum"], 2, lm_data("gpt.st", 24, 8, 50, ("idx", "targets")), "gpt"))
    case("data_parallel_mpi.gpt_block_sharded_sgd", same_as_concatenated(
        GPT, ["--train", "--optimizer=sgd", "--nonfinite=skip-step"], 2,
        lm_data("gpts.st", 24, 8, 50, ("idx", "targets")), "gpts", SHARD))
    # clipped: the norm of the sharded step sums each rank's squares of its flat shares, then the ranks' sums: in
    # f32, another order than the whole gradient's (3e-6 relative on the norm), which every update carries
    case("data_parallel_mpi.mlp_momentum_sharded_clipped", same_as_concatenated(
        MLP, ["--train", "--optimizer=momentum", "--clip-grad-norm=0.5", "--nonfinite=skip-step"], 4, mlp_data(),
        "clip", SHARD, tol=3e-5))
    case("data_parallel_mpi.mlp_momentum_sharded_accumulated", same_as_concatenated(
        MLP, ["--train", "--optimizer=momentum", "--accumulate=2", "--nonfinite=skip-step"], 4, mlp_data(), "accum",
        SHARD))
    case("data_parallel_mpi.gpu_sim_mlp_sgd", same_as_concatenated(
        MLP, ["--train", "--optimizer=sgd"], 4, mlp_data(), "gpusim", ["--target=cuda", "--device=h100", "--gpu-sim"]))
    case("data_parallel_mpi.shard_same_as_unsharded", shard_same_as_unsharded)
    case("data_parallel_mpi.shard_fits_memory_limit", shard_fits_memory_limit)
    case("data_parallel_mpi.refuses_other_world", refuses_other_world)
    case("data_parallel_mpi.zoo_gpt2", zoo_matches_averaged_gradients)
    case("data_parallel_mpi.rank0_prints", one_rank_prints)
    case("data_parallel_mpi.stopped_rank", stops_when(signal.SIGSTOP))
    case("data_parallel_mpi.killed_rank", stops_when(signal.SIGKILL))
    case("data_parallel_mpi.rank_leaves_early", leaves_early)
    case("data_parallel_mpi.refuses_other_step", refuses_other_step)
    case("data_parallel_mpi.refuses_other_params", refuses_other_params)
    case("data_parallel_mpi.refuses_not_data_parallel", refuses_not_data_parallel)
shutil.rmtree(WORK, ignore_errors=True)
print("# data_parallel_mpi: %d passed, %d failed" % (results["pass"], results["fail"]))
sys.exit(0)
