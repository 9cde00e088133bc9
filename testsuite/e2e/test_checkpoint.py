"""novarun --save/--load (safetensors checkpoints), --data (batches from a
safetensors file) and --seed (synthetic batches) on examples/mlp.nova
(batch 8) trained with sgd, momentum and adamw.

- resuming: 5 steps, --save, --load, 5 more steps gives bitwise the
  parameters and optimizer state of 10 steps in one run (--inputs, --data
  and --seed batches);
- --data: step k uses samples (k-1)*B .. k*B-1 modulo S, checked loss by
  loss against runs on those samples given with --inputs;
- --seed: the same seed gives the same batches, standard normal floats,
  uniform indices below the bound;
- every malformed checkpoint exits 1 naming the problem, before anything
  runs or is written.

The checkpoints are read and written here with struct and json alone,
independently of novarun's reader and writer."""
import json
import os
import shutil
import struct
import subprocess
import tempfile

import numpy as np

from harness import NOVAC, NOVARUN, Failure, case, read_pb, run, st_parts, st_raw, st_read, st_write, write_pb

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MLP = os.path.join(ROOT, "examples", "mlp.nova")
B = 8  # --dim=batch=8
WORK = tempfile.mkdtemp(prefix="nova-ckpt-")
# ---- steps and batches -----------------------------------------------------------------------

_steps = {}


def step(opt):
    """The mlp training step with optimizer OPT: (step.so, manifest)."""
    if opt not in _steps:
        so = os.path.join(WORK, "mlp_%s.so" % opt)
        run([NOVAC, MLP, "--dim=batch=%d" % B, "--train", "--optimizer=%s" % opt, "-o", so])
        _steps[opt] = (so, json.load(open(so[:-3] + ".json")))
    return _steps[opt]


def state_names(manifest):
    return sorted(t["name"] for t in manifest["tensors"] if t["role"] in ("param", "opt_state"))


rng = np.random.default_rng(20240611)
SAMPLES_X = rng.standard_normal((3 * B, 784)).astype(np.float32)
SAMPLES_Y = rng.integers(0, 10, 3 * B).astype(np.int64)


def inputs_dir(name, x, y):
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    write_pb(os.path.join(d, "x.pb"), x, "x")
    write_pb(os.path.join(d, "y.pb"), y, "y")
    return d


IN = inputs_dir("in", SAMPLES_X[:B], SAMPLES_Y[:B])
DATA = os.path.join(WORK, "data.st")
st_write(DATA, {"x": SAMPLES_X, "y": SAMPLES_Y})


def path(name):
    return os.path.join(WORK, name)


def novarun(*args, rc=0):
    return run([NOVARUN] + [str(a) for a in args] + ["-q"], expect_rc=rc)


def loss_log(p):
    return [(int(k), v) for k, v in (line.split() for line in open(p))]


def same_bits(a, b, what):
    if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
        diff = np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.shape == b.shape else None
        raise Failure("%s differs (%s %s vs %s %s, max difference %s)" % (what, a.dtype, a.shape, b.dtype, b.shape,
                                                                           diff))


# ---- resuming --------------------------------------------------------------------------------


def resume(opt, source, tag):
    """10 steps in one run == 5 steps, --save, --load, 5 steps: every param
    and opt_state bitwise, the loss of steps 6..10 too."""
    def go():
        so, manifest = step(opt)
        p = lambda s: path("%s.%s.%s" % (opt, tag, s))
        run1 = ["--steps", 10, "--save", p("10.st"), "--loss-log", p("10.log"), "--dump", p("dump10")]
        novarun(so, *source, *run1)
        novarun(so, *source, "--steps", 5, "--save", p("5.st"), "--loss-log", p("5.log"))
        novarun(so, *source, "--load", p("5.st"), "--steps", 5, "--save", p("resumed.st"), "--loss-log",
                p("resumed.log"), "--dump", p("dump_resumed"))
        whole, meta10 = st_read(p("10.st"))
        half, meta5 = st_read(p("5.st"))
        resumed, meta_r = st_read(p("resumed.st"))
        if sorted(whole) != state_names(manifest) or sorted(half) != state_names(manifest):
            raise Failure("checkpoint holds %s, the step's params and opt_state are %s" %
                          (sorted(whole), state_names(manifest)))
        if opt != "sgd" and not any(t["role"] == "opt_state" for t in manifest["tensors"]):
            raise Failure("%s has no opt_state to save" % opt)
        for meta, n in ((meta10, "10"), (meta5, "5"), (meta_r, "10")):
            if meta != {"format": "novac", "graph_hash": manifest["graph_hash"], "step": n}:
                raise Failure("metadata %s, expected step %s and graph_hash %s" % (meta, n, manifest["graph_hash"]))
        for name in whole:
            same_bits(resumed[name], whole[name], "after 5 + 5 steps, '%s'" % name)
        if all(half[n].tobytes() == whole[n].tobytes() for n in half):
            raise Failure("5 and 10 steps left the same values: nothing trained")
        for fn in os.listdir(p("dump10")):
            if fn.startswith("param."):
                same_bits(read_pb(os.path.join(p("dump_resumed"), fn)), read_pb(os.path.join(p("dump10"), fn)),
                          "--dump " + fn)
        tail = loss_log(p("10.log"))[5:]
        if loss_log(p("resumed.log")) != tail:
            raise Failure("losses after --load %s, in one run %s" % (loss_log(p("resumed.log")), tail))
        if open(p("10.st"), "rb").read() != open(p("resumed.st"), "rb").read():
            raise Failure("the two checkpoints after 10 steps are not the same file")
    case("checkpoint.resume.%s.%s" % (tag, opt), go)


# ---- --data ----------------------------------------------------------------------------------


def loss_on(opt, x, y, tag):
    """The loss of one step (--lr 0) on the batch x, y given with --inputs."""
    so, _ = step(opt)
    d = inputs_dir("batch_" + tag, x, y)
    novarun(so, "--inputs", d, "--steps", 1, "--lr", 0, "--loss-log", os.path.join(d, "log"))
    return loss_log(os.path.join(d, "log"))[0][1]


def data_batches(samples, steps, tag):
    """With --lr 0 the loss of step k depends only on its batch: each must be
    the loss of the samples (k-1)*B .. k*B-1 modulo S given with --inputs."""
    def go():
        so, _ = step("sgd")
        f = path("data_%s.st" % tag)
        st_write(f, {"x": SAMPLES_X[:samples], "y": SAMPLES_Y[:samples]})
        novarun(so, "--data", f, "--steps", steps, "--lr", 0, "--loss-log", path("data_%s.log" % tag))
        got = loss_log(path("data_%s.log" % tag))
        if [k for k, _ in got] != list(range(1, steps + 1)):
            raise Failure("loss log steps %s" % [k for k, _ in got])
        for k, loss in got:
            rows = [((k - 1) * B + j) % samples for j in range(B)]
            want = loss_on("sgd", SAMPLES_X[rows], SAMPLES_Y[rows], "%s_%d" % (tag, k))
            if loss != want:
                raise Failure("step %d: loss %s, on samples %s given with --inputs %s" % (k, loss, rows, want))
        if len({loss for _, loss in got}) < min(steps, 3):
            raise Failure("the loss log shows the same batch again: %s" % got)
    case("checkpoint.data.%s" % tag, go)


def data_trains():
    """S = 3*B, adamw: 3 different batches a cycle, and the loss goes down."""
    def go():
        so, _ = step("adamw")
        novarun(so, "--data", DATA, "--steps", 60, "--lr", "0.003", "--loss-log", path("trains.log"))
        got = [v for _, v in loss_log(path("trains.log"))]
        first, last = np.mean([float(v) for v in got[:3]]), np.mean([float(v) for v in got[-3:]])
        if len(set(got[:3])) != 3:
            raise Failure("steps 1-3 should see 3 different batches: %s" % got[:3])
        if not last < 0.5 * first:
            raise Failure("loss over a cycle %.4f -> %.4f: not trained" % (first, last))
    case("checkpoint.data.trains", go)


def data_errors():
    so, _ = step("sgd")
    bad = {
        "missing_label": ({"x": SAMPLES_X}, "no tensor 'y' for the step's label 'y' (i64 [8])"),
        "extra_tensor": ({"x": SAMPLES_X, "y": SAMPLES_Y, "z": SAMPLES_Y}, "tensor 'z' is not an input or label"),
        "param": ({"x": SAMPLES_X, "y": SAMPLES_Y, "b2": np.zeros((24, 10), np.float32)},
                  "tensor 'b2' is the step's param, not an input or label"),
        "wrong_dtype": ({"x": SAMPLES_X.astype(np.float64), "y": SAMPLES_Y},
                        "tensor 'x' is f64 [24,784], but for the step's input f32 [8,784] it must be f32 [S,784]"),
        "wrong_shape": ({"x": SAMPLES_X.reshape(24, 28, 28), "y": SAMPLES_Y},
                        "tensor 'x' is f32 [24,28,28], but for the step's input f32 [8,784] it must be f32 [S,784]"),
        "unequal_samples": ({"x": SAMPLES_X, "y": SAMPLES_Y[:20]},
                            "tensor 'y' holds 20 samples, the tensors before it 24"),
        "too_few_samples": ({"x": SAMPLES_X[:5], "y": SAMPLES_Y[:5]},
                            "tensor 'x' holds 5 samples, fewer than one batch of the step's input (8)"),
        "lr_twice": ({"x": SAMPLES_X, "y": SAMPLES_Y, "lr": np.full(24, 0.1, np.float32)},
                     "tensor 'lr' gives the learning rate, and so does --lr"),
    }
    for name, (tensors, text) in bad.items():
        def go(tensors=tensors, text=text, name=name):
            f = path("bad_data_%s.st" % name)
            st_write(f, tensors)
            log = path("bad_data_%s.log" % name)
            p = novarun(so, "--data", f, "--steps", 2, "--lr", 0.1, "--loss-log", log, rc=1)
            if text not in p.stderr:
                raise Failure("expected '%s' in: %s" % (text, p.stderr))
            if os.path.exists(log):
                raise Failure("a step ran")
        case("checkpoint.data_error.%s" % name, go)

    def lr_schedule():
        """an input with a default (lr) may come from --data too: one value a step"""
        f = path("lr_data.st")
        st_write(f, {"x": SAMPLES_X, "y": SAMPLES_Y, "lr": np.array([0, 0, 0.5] * 8, np.float32)})
        novarun(so, "--data", f, "--steps", 6, "--loss-log", path("lr.log"))
        novarun(so, "--data", DATA, "--steps", 6, "--lr", 0, "--loss-log", path("lr0.log"))
        got, ref = loss_log(path("lr.log")), loss_log(path("lr0.log"))
        if got[:3] != ref[:3] or got[3:] == ref[3:]:
            raise Failure("lr 0, 0, 0.5: losses %s; with --lr 0 %s" % (got, ref))
    case("checkpoint.data.lr_per_step", lr_schedule)

    def two_sources():
        p = novarun(so, "--inputs", IN, "--data", DATA, "--steps", 1, rc=2)
        if "--inputs and --data both give the batch" not in p.stderr:
            raise Failure(p.stderr)
    case("checkpoint.usage.two_batch_sources", two_sources)


# ---- --seed ----------------------------------------------------------------------------------


def seed_cases():
    def deterministic():
        so, _ = step("adamw")
        for tag, seed in (("a", 42), ("b", 42), ("c", 43)):
            novarun(so, "--seed", seed, "--steps", 6, "--loss-log", path("seed_%s.log" % tag))
        a, b, c = (loss_log(path("seed_%s.log" % t)) for t in "abc")
        if a != b:
            raise Failure("seed 42 twice: %s and %s" % (a, b))
        if a == c:
            raise Failure("seeds 42 and 43 gave the same losses")
        if len({v for _, v in a}) < 6:
            raise Failure("the batches of seed 42 repeat: %s" % a)
    case("checkpoint.seed.deterministic", deterministic)

    def distribution():
        """floats standard normal, indices uniform in [0, 7) (7 the table's rows)"""
        d = path("dist")
        os.makedirs(d, exist_ok=True)
        np.arange(7, dtype=np.float32).tofile(os.path.join(d, "t.bin"))
        with open(os.path.join(d, "m.nova"), "w") as f:
            f.write('input x: f32[64, 256]\ninput i: i64[8192]\nconst t: f32[7] = file("t.bin")\n'
                    'output a = x * 1.0\noutput g = gather(t, i)\n')
        so = os.path.join(d, "m.so")
        run([NOVAC, os.path.join(d, "m.nova"), "-o", so])
        novarun(so, "--seed", 5, "--outputs", os.path.join(d, "out"))
        a, g = read_pb(os.path.join(d, "out", "output_0.pb")), read_pb(os.path.join(d, "out", "output_1.pb"))
        if not (abs(a.mean()) < 0.05 and abs(a.std() - 1) < 0.05 and abs(np.mean(a ** 4) - 3) < 0.3):
            raise Failure("not standard normal: mean %.4f std %.4f kurtosis %.3f" % (a.mean(), a.std(),
                                                                                    np.mean(a ** 4)))
        counts = np.bincount(g.astype(np.int64), minlength=7)
        if len(counts) != 7 or np.any(np.abs(counts - 8192 / 7) > 0.1 * 8192 / 7):
            raise Failure("indices not uniform in [0, 7): counts %s" % counts)
        novarun(so, "--seed", 6, "--outputs", os.path.join(d, "out6"))
        if read_pb(os.path.join(d, "out6", "output_0.pb")).tobytes() == a.tobytes():
            raise Failure("seeds 5 and 6 gave the same batch")
    case("checkpoint.seed.distribution", distribution)


# ---- bad checkpoints -------------------------------------------------------------------------


def bad_checkpoints():
    """Each malformed checkpoint: exit 1, a message naming the problem, and
    nothing ran (no loss log, no --save file, no --dump folder)."""
    so, manifest = step("momentum")
    good = path("good.st")
    novarun(so, "--inputs", IN, "--steps", 2, "--save", good)
    header, data = st_parts(good)
    size = os.path.getsize(good)

    def edit(fn):
        h = json.loads(json.dumps(header))
        fn(h)
        return h

    def retype(name, dtype, shape):
        def fn(h):
            h[name]["dtype"], h[name]["shape"] = dtype, shape
        return fn

    def w1_off(b, e):
        def fn(h):
            h["w1"]["data_offsets"] = [b, e]
        return fn

    def drop(name):
        return lambda h: h.pop(name)

    def add_extra(h):
        h["extra"] = {"dtype": "F32", "shape": [10], "data_offsets": [len(data), len(data) + 40]}

    other_hash = dict(header["__metadata__"], graph_hash="00000000deadbeef")
    blob = open(good, "rb").read()
    hlen = struct.unpack("<Q", blob[:8])[0]
    cases = {
        "truncated": (lambda f: open(f, "wb").write(blob[:size - 1000]),
                      "out of bounds: the data section has %d bytes (truncated file?)" % (len(data) - 1000)),
        "truncated_header": (lambda f: open(f, "wb").write(blob[:hlen // 2]),
                             "its header length %d goes beyond the end of the file" % hlen),
        "header_length_beyond_file": (lambda f: open(f, "wb").write(struct.pack("<Q", size) + blob[8:]),
                                      "its header length %d goes beyond the end of the file (%d bytes)" %
                                      (size, size)),
        "bad_json": (lambda f: st_raw(f, b'{"w1": {"dtype": "F32", "shape": [784, 128],', data),
                     "the header is not valid JSON"),
        "json_not_object": (lambda f: st_raw(f, b'["w1"]', data), "its header does not start with '{'"),
        "offsets_out_of_bounds": (lambda f: st_raw(f, edit(w1_off(len(data), len(data) + 401408)), data),
                                  "tensor 'w1': data_offsets [%d, %d] out of bounds" % (len(data),
                                                                                      len(data) + 401408)),
        "offsets_wrong_size": (lambda f: st_raw(f, edit(w1_off(0, 1000)), data),
                               "tensor 'w1': data_offsets [0, 1000] span 1000 bytes, but f32 [784,128] needs 401408"),
        "offsets_reversed": (lambda f: st_raw(f, edit(w1_off(401408, 0)), data),
                             "tensor 'w1': data_offsets is not a pair [begin, end] with begin <= end"),
        "overlapping": (lambda f: st_raw(f, edit(w1_off(256, 256 + 401408)), data), "overlap: data_offsets"),
        "missing_param": (lambda f: st_raw(f, edit(drop("b2")), data),
                          "the checkpoint lacks param 'b2' (f32 [10]) of the step"),
        "missing_opt_state": (lambda f: st_raw(f, edit(drop("w1.momentum")), data),
                              "the checkpoint lacks opt_state 'w1.momentum' (f32 [784,128]) of the step"),
        "extra_tensor": (lambda f: st_raw(f, edit(add_extra), data + bytes(40)),
                         "tensor 'extra' is not a tensor of the step"),
        "input_tensor": (lambda f: st_write(f, dict(st_read(good)[0], x=SAMPLES_X[:B])),
                         "tensor 'x' is the step's input, not a param or opt_state"),
        "wrong_dtype": (lambda f: st_write(f, dict(st_read(good)[0], b2=np.zeros(10, np.float64))),
                        "tensor 'b2': the checkpoint holds f64 [10], the step's param is f32 [10]"),
        "wrong_shape": (lambda f: st_raw(f, edit(retype("w2", "F32", [10, 128])), data),
                        "tensor 'w2': the checkpoint holds f32 [10,128], the step's param is f32 [128,10]"),
        "unknown_dtype": (lambda f: st_raw(f, edit(retype("b2", "F8_E4M3", [40])), data),
                          "tensor 'b2': dtype \"F8_E4M3\" is not supported"),
        "duplicate_name": (lambda f: st_raw(f, json.dumps(header).replace('"b2":', '"b1":').encode(), data),
                           "tensor 'b1' appears twice in the header"),
        "not_safetensors_pb": (lambda f: shutil.copy(os.path.join(IN, "x.pb"), f), "not a safetensors file"),
        "not_safetensors_text": (lambda f: open(f, "w").write("hello\n"),
                                 "not a safetensors file: 6 bytes, too short for the 8-byte header length"),
        "empty_header": (lambda f: st_raw(f, b"{}", b""), "the checkpoint lacks param 'w1'"),
        "bad_metadata": (lambda f: st_raw(f, edit(lambda h: h.__setitem__("__metadata__", {"step": 5})), data),
                         "__metadata__ entry 'step' is not a string"),
        "bad_step": (lambda f: st_raw(f, edit(lambda h: h["__metadata__"].__setitem__("step", "1e3")), data),
                     "__metadata__ \"step\" is \"1e3\", not a number of steps"),
        "other_graph_mismatch": (lambda f: st_raw(f, edit(lambda h: (h.__setitem__("__metadata__", other_hash),
                                                                     h.pop("b1.momentum"))), data),
                                 "lacks opt_state 'b1.momentum' (f32 [128]) of the step (the checkpoint was "
                                 "written for graph 00000000deadbeef, this step is graph %s)" %
                                 manifest["graph_hash"]),
        "sgd_checkpoint": (lambda f: novarun(step("sgd")[0], "--inputs", IN, "--steps", 1, "--save", f),
                           "the checkpoint lacks opt_state 'w1.momentum' (f32 [784,128]) of the step (the "
                           "checkpoint was written for graph %s, this step is graph %s)" %
                           (step("sgd")[1]["graph_hash"], manifest["graph_hash"])),
        "missing_file": (lambda f: None, "No such file or directory"),
    }
    for name, (make, text) in cases.items():
        def go(make=make, text=text, name=name):
            f = path("bad_%s.st" % name)
            make(f)
            out, log, dump = (path("bad_%s.%s" % (name, x)) for x in ("out.st", "log", "dump"))
            p = novarun(so, "--inputs", IN, "--load", f, "--steps", 3, "--save", out, "--loss-log", log,
                        "--dump", dump, rc=1)
            if text not in p.stderr or not p.stderr.startswith("novarun: %s: " % f):
                raise Failure("expected 'novarun: %s: ...%s' in: %s" % (f, text, p.stderr))
            if "step 1" in p.stderr or any(os.path.exists(x) for x in (out, log, dump)):
                raise Failure("something ran or was written after a bad --load: %s" % p.stderr)
        case("checkpoint.bad.%s" % name, go)

    def other_graph_match():
        f = path("other_graph.st")
        st_raw(f, edit(lambda h: h.__setitem__("__metadata__", other_hash)), data)
        p = run([NOVARUN, so, "--inputs", IN, "--load", f, "--steps", "1", "--save", path("og_out.st"), "-q"])
        if "warning: %s was written for graph 00000000deadbeef, this step is graph %s" % (
                f, manifest["graph_hash"]) not in p.stderr:
            raise Failure("no warning: %s" % p.stderr)
        if st_read(path("og_out.st"))[1]["step"] != "3":
            raise Failure("step count %s after 2 + 1 steps" % st_read(path("og_out.st"))[1])
    case("checkpoint.other_graph_matching_tensors", other_graph_match)

    def save_is_atomic():
        """a failed --save leaves the old file; a good one leaves no temporary file"""
        d = path("atomic")
        os.makedirs(d, exist_ok=True)
        f = os.path.join(d, "ck.st")
        novarun(so, "--inputs", IN, "--steps", 1, "--save", f)
        first = open(f, "rb").read()
        novarun(so, "--inputs", IN, "--steps", 2, "--save", f)
        if open(f, "rb").read() == first or os.listdir(d) != ["ck.st"]:
            raise Failure("after a second --save: %s" % os.listdir(d))
        p = novarun(so, "--inputs", IN, "--steps", 1, "--save", os.path.join(d, "no", "ck.st"), rc=1)
        if "writing %s" % os.path.join(d, "no", "ck.st") not in p.stderr or os.listdir(d) != ["ck.st"]:
            raise Failure(p.stderr)
    case("checkpoint.save_atomic", save_is_atomic)

    def save_cleans_stale_temps():
        # what a --save killed before its rename leaves, removed by the next save
        d = os.path.join(WORK, "stale")
        os.makedirs(d, exist_ok=True)
        f = os.path.join(d, "ck.st")
        for leaf in ("ck.st.tmp.a1b2c3", "ck.st.tmp.zzzzzz"):
            open(os.path.join(d, leaf), "wb").write(b"x" * 4096)
        open(os.path.join(d, "other.st.tmp.a1b2c3"), "wb").write(b"keep")
        novarun(so, "--inputs", IN, "--steps", 1, "--save", f)
        if sorted(os.listdir(d)) != ["ck.st", "other.st.tmp.a1b2c3"]:
            raise Failure("after a save: %s" % sorted(os.listdir(d)))
    case("checkpoint.save_cleans_stale_temps", save_cleans_stale_temps)

    def save_refuses_non_regular():
        p = novarun(so, "--inputs", IN, "--steps", 1, "--save", "/dev/null", rc=1)
        if "not a regular file" not in p.stderr or not os.path.exists("/dev/null"):
            raise Failure(p.stderr)
        p = novarun(so, "--inputs", IN, "--steps", 1, "--save", WORK, rc=1)
        if "writing %s: Is a directory" % WORK not in p.stderr:
            raise Failure(p.stderr)
    case("checkpoint.save_refuses_non_regular", save_refuses_non_regular)


# ---- all -------------------------------------------------------------------------------------

try:
    for opt in ("sgd", "momentum", "adamw"):
        resume(opt, ["--inputs", IN], "inputs")
    resume("adamw", ["--data", DATA], "data")
    resume("momentum", ["--seed", 7], "seed")
    data_batches(3 * B, 7, "three_batches")
    data_batches(B + B // 2, 5, "straddle")
    data_trains()
    data_errors()
    seed_cases()
    bad_checkpoints()
finally:
    shutil.rmtree(WORK, ignore_errors=True)
