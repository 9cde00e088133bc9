"""Shared helpers for the end-to-end tests: compile a .nova model with novac,
run it with novarun on .pb inputs, read the outputs back, compare with a
reference computed independently in numpy (float64).

Every test prints one line, 'PASS: e2e :: NAME' or 'FAIL: e2e :: NAME' (another
suite name than e2e if case() is given one), and the reason on the following
lines when it fails.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
from onnx import numpy_helper

BUILD = os.environ.get("NOVA_BUILD", "build")
NOVAC = os.path.join(BUILD, "bin", "novac")
NOVARUN = os.path.join(BUILD, "bin", "novarun")

results = {"pass": 0, "fail": 0}

# NOVA_TEST_FLAGS: extra novac flags for every compile (the gpu-sim suites run
# the same tests with "--target=cuda --device=h100 --gpu-sim"); NOVA_TEST_TAG
# prefixes the suite names they print.
EXTRA_FLAGS = os.environ.get("NOVA_TEST_FLAGS", "").split()
TAG = os.environ.get("NOVA_TEST_TAG", "")

# NOVA_STEP_CACHE (tools/stepcache.py): novac calls recorded here (fill) and
# replayed on a GPU machine without novac (use).  A fill run compiles each
# step as asked and records it, then compiles it again with --gpu-sim and runs
# that, so the test goes on exactly as it will on the GPU.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import stepcache  # noqa: E402

CACHE = stepcache.StepCache(TAG + os.path.basename(sys.argv[0])) if stepcache.active() else None


def write_pb(path, arr, name):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(arr, name).SerializeToString())


def read_pb(path):
    from onnx import TensorProto
    t = TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


class Failure(Exception):
    pass


TIMEOUT = float(os.environ.get("NOVA_TEST_TIMEOUT", "300"))   # seconds, each novac/novarun call


def run(cmd, expect_rc=0):
    if cmd and cmd[0] == NOVAC:
        cmd = list(cmd) + EXTRA_FLAGS
    if CACHE and cmd and cmd[0] == NOVAC:
        rc, out, err, _ = CACHE.novac(cmd, TIMEOUT)
        p = subprocess.CompletedProcess(cmd, rc, out, err)
        if stepcache.MODE == "fill":
            p = subprocess.run(cmd + ["--gpu-sim"], capture_output=True, text=True, timeout=TIMEOUT)
    else:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if expect_rc is not None and p.returncode != expect_rc:
        raise Failure("%s exited %d (expected %d)\n%s%s" % (" ".join(cmd), p.returncode, expect_rc,
                                                           p.stdout, p.stderr))
    return p


def check_plan_of(manifest_path):
    """The memory plan in a step's manifest (check_plan_mem), when it has one.
    Every training step the suites compile goes through it."""
    with open(manifest_path) as f:
        mem = json.load(f)["memory"]
    if mem.get("intermediates") == "planned-arena":
        check_plan_mem(mem)


def check_plan_mem(mem):
    """A manifest's planned memory: no two intermediates live at the same time
    share a byte (a sweep over the buffers by offset), each lies in the arena,
    64-byte aligned, with a live range that is not empty, and the arena is no
    smaller than the most bytes live at once."""
    plan, arena = mem["plan"], mem["arena_bytes"]
    for e in plan:
        if e["offset"] < 0 or e["offset"] % 64 or e["offset"] + e["bytes"] > arena:
            raise Failure("buffer outside the %d-byte arena: %r" % (arena, e))
        if e["live"][0] > e["live"][1]:
            raise Failure("empty live range %r" % e)
    by_offset = sorted(plan, key=lambda e: e["offset"])
    for i, a in enumerate(by_offset):
        for b in by_offset[i + 1:]:
            if b["offset"] >= a["offset"] + a["bytes"]:
                break
            if not (a["live"][1] < b["live"][0] or b["live"][1] < a["live"][0]):
                raise Failure("buffers live at the same time overlap:\n %r\n %r" % (a, b))
    if not arena >= mem["lower_bound_bytes"]:
        raise Failure("arena %d below the bytes live at once, %d" % (arena, mem["lower_bound_bytes"]))


def _compile_and_run(model_text, inputs, files, flags, dump, steps):
    """Compiles and runs once (or trains `steps` steps); returns (outputs in
    order, dict of everything --dump wrote: NAME.pb -> array, or None)."""
    d = tempfile.mkdtemp(prefix="nova-e2e-")
    try:
        for name, arr in (files or {}).items():
            arr.tofile(os.path.join(d, name))
        onnx_bytes = isinstance(model_text, bytes)  # a serialized ONNX model, else .nova text
        model = os.path.join(d, "model.onnx" if onnx_bytes else "model.nova")
        with open(model, "wb" if onnx_bytes else "w") as f:
            f.write(model_text)
        so = os.path.join(d, "model.so")
        run([NOVAC, model, "-o", so] + list(flags))
        if "--train" in flags:
            check_plan_of(os.path.join(d, "model.json"))
        ind = os.path.join(d, "in")
        os.mkdir(ind)
        for name, arr in inputs.items():
            write_pb(os.path.join(ind, name + ".pb"), arr, name)
        outd = os.path.join(d, "out")
        cmd = [NOVARUN, so, "--inputs", ind, "--outputs", outd, "-q"]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        if dump:
            cmd += ["--dump", os.path.join(d, "dump")]
        run(cmd)
        outs = []
        i = 0
        while os.path.exists(os.path.join(outd, "output_%d.pb" % i)):
            outs.append(read_pb(os.path.join(outd, "output_%d.pb" % i)))
            i += 1
        dumped = None
        if dump:
            dumped = {fn[:-3]: read_pb(os.path.join(d, "dump", fn))
                      for fn in os.listdir(os.path.join(d, "dump")) if fn.endswith(".pb")}
        return outs, dumped
    finally:
        shutil.rmtree(d, ignore_errors=True)


def compile_and_run(model_text, inputs, files=None, flags=(), dump=False, steps=None):
    """Compiles model_text (.nova text, or bytes: a serialized ONNX model),
    binds inputs (dict name -> array), returns
    (outputs in order, dict of dumped params or None).  steps=N runs
    N training steps (novarun --steps N) instead of one plain run."""
    outs, dumped = _compile_and_run(model_text, inputs, files, flags, dump, steps)
    params = None
    if dump:
        params = {k[6:]: v for k, v in dumped.items() if k.startswith("param.")}
    return outs, params


def compile_and_train(model_text, inputs, files=None, flags=(), steps=1):
    """Compiles model_text with --train plus flags, trains `steps` steps on
    inputs and returns (grads, params, loss) as --dump wrote them after the
    last step: dicts param name -> gradient (computed in that step) and
    param name -> value (after its update), and the loss of that step."""
    _, dumped = _compile_and_run(model_text, inputs, files, ["--train", "--keep-grads"] + list(flags), True, steps)
    grads = {k[5:]: v for k, v in dumped.items() if k.startswith("grad.")}
    params = {k[6:]: v for k, v in dumped.items() if k.startswith("param.")}
    return grads, params, dumped.get("loss")


def rel_err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise Failure("shape %s, expected %s" % (got.shape, ref.shape))
    scale = max(np.max(np.abs(ref)) if ref.size else 0.0, 1e-30)
    return float(np.max(np.abs(got - ref)) / scale) if ref.size else 0.0


def check_close(got, ref, tol, what="output"):
    e = rel_err(got, ref)
    if not e <= tol:
        raise Failure("%s: relative error %.3g > %.3g\n got %s\n ref %s" %
                      (what, e, tol, np.asarray(got).ravel()[:6], np.asarray(ref).ravel()[:6]))
    return e


def fd_grad(loss, P, name):
    """Central differences of loss() (reading P) in every element of P[name]."""
    x = P[name]
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        old = x[idx]
        h = 1e-6 * max(1.0, abs(old))
        xp, xm = old + h, old - h
        x[idx] = xp
        fp = loss()
        x[idx] = xm
        fm = loss()
        x[idx] = old
        g[idx] = (fp - fm) / (xp - xm)
    return g


def case(name, fn, suite="e2e"):
    only = os.environ.get("NOVA_TEST_ONLY")  # (a substring of the case names to run, when developing)
    if only and only not in name:
        return
    try:
        fn()
        print("PASS: %s%s :: %s" % (TAG, suite, name), flush=True)
        results["pass"] += 1
    except Exception as e:  # a failing test reports, the suite goes on
        print("FAIL: %s%s :: %s" % (TAG, suite, name), flush=True)
        print("    " + str(e).replace("\n", "\n    "), flush=True)
        results["fail"] += 1


erf = np.vectorize(math.erf)


# ---- safetensors, independently of novarun ---------------------------------------------------

ST_TYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}
ST_NAMES = {np.dtype(v): k for k, v in ST_TYPES.items()}


def st_parts(path):
    """(header dict, data bytes) of a safetensors file."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def st_read(path):
    """(dict name -> array, metadata dict)."""
    header, data = st_parts(path)
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype=ST_TYPES[e["dtype"]]).reshape(e["shape"])
    return out, header.get("__metadata__", {})


def st_raw(path, header, data):
    """Writes HEADER (a dict, or bytes as they are) and DATA as a safetensors file."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def st_write(path, tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": ST_NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    st_raw(path, header, data)
