"""Generated initial values (runtime/rt_init.h), exactly: a numpy
splitmix64 + Box-Muller reproduces every value bit for bit, for params
(whose recipe the step.so carries and computes when it opens, on its
threads: a tensor over one 65536-element share checks that the shares
join up) and for consts (computed by novac into the IR):

  draw k of a tensor = mix(seed + (k + 1) golden), seed = FNV-1a(name) ^ graph seed
  uniform element i: draw i; normal element i: draws 2i, 2i+1 (cosine branch)

in f32, f64, f16 and bf16 (rounded to nearest even from the float64
value), for normal, uniform, he, xavier, ones, a constant and causal_mask;
the `seed` statement changes the values; the step.so holds no bytes for
them (its size does not grow with the parameters)."""
import math
import os
import shutil
import tempfile

import numpy as np

from harness import NOVAC, NOVARUN, Failure, case, read_pb, run, write_pb

G = np.uint64(0x9E3779B97F4A7C15)


def mix(z):
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def unif(seed, k):
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (k.astype(np.uint64) + np.uint64(1)) * G
    return (mix(z) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def gauss(seed, n):
    i = np.arange(n, dtype=np.uint64)
    u = 1.0 - unif(seed, 2 * i)
    v = unif(seed, 2 * i + np.uint64(1))
    # the C library's log and cos (Python's math module calls them), as the step does
    log = np.frompyfunc(math.log, 1, 1)(u).astype(np.float64)
    cos = np.frompyfunc(math.cos, 1, 1)(2.0 * math.pi * v).astype(np.float64)
    return np.sqrt(-2.0 * log) * cos


def fnv1a(name):
    h = 1469598103934665603
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & (2 ** 64 - 1)
    return h


def bf16(x):
    """float64 -> bf16 (nearest even), as float32 values."""
    b = np.asarray(x, np.float64)
    # round the float64 to 8 significant bits directly (not through float32: double rounding)
    m, e = np.frexp(b)
    r = np.ldexp(np.round(np.ldexp(m, 8)), e - 8)  # np.round: half to even
    return r.astype(np.float32)


def expected(name, kind, shape, dtype, graph_seed, a=0.0, b=0.0):
    n = int(np.prod(shape))
    s = fnv1a(name) ^ graph_seed
    fan_in = shape[0] if shape else 1
    fan_out = shape[1] if len(shape) > 1 else fan_in
    for d in shape[2:]:
        fan_in *= d
        fan_out *= d
    if kind == "normal":
        v = a * gauss(s, n)
    elif kind == "he":
        v = np.sqrt(2.0 / fan_in) * gauss(s, n)
    elif kind == "uniform":
        v = a + (b - a) * unif(s, np.arange(n, dtype=np.uint64))
    elif kind == "xavier":
        lim = np.sqrt(6.0 / (fan_in + fan_out))
        v = -lim + 2 * lim * unif(s, np.arange(n, dtype=np.uint64))
    elif kind == "const":
        v = np.full(n, a)
    elif kind == "causal":
        cols, rows = shape[-1], shape[-2]
        i = np.arange(n)
        v = np.where(i % cols > (i // cols) % rows, a, 0.0)
    v = v.reshape(shape)
    if dtype == "f64":
        return v
    if dtype == "f32":
        return v.astype(np.float32)
    if dtype == "f16":
        return v.astype(np.float16)
    return bf16(v)


PARAMS = [  # name, dtype, shape, init text, (kind, a, b)
    ("w_normal", "f32", (7, 33), "normal(0.5)", ("normal", 0.5, 0)),
    ("w_he", "f64", (300, 300), "he", ("he", 0, 0)),  # 90000 elements: two shares
    ("w_big", "f32", (3, 70000), "normal(1)", ("normal", 1.0, 0)),
    ("w_uniform", "f16", (5, 5), "uniform(-2, 3)", ("uniform", -2.0, 3.0)),
    ("w_xavier", "bf16", (4, 6, 3), "xavier", ("xavier", 0, 0)),
    ("w_ones", "f32", (3,), "ones", ("const", 1.0, 0)),
    ("w_const", "f32", (2, 2), "2.5", ("const", 2.5, 0)),
    ("w_causal", "f32", (2, 4, 4), "causal_mask(-7)", ("causal", -7.0, 0)),
]


def model(seed):
    s = ["seed %d" % seed] if seed is not None else []
    s.append("input x: f32[1]")
    for name, dt, shape, init, _ in PARAMS:
        s.append("param %s: %s[%s] = %s" % (name, dt, ", ".join(map(str, shape)), init))
    s.append("const c_normal: f32[300] = normal(1)")
    s.append("const c_xavier: f64[20, 30] = xavier")
    terms = ["reduce_sum(cast(%s, to=f32))" % p[0] if p[1] != "f32" else "reduce_sum(%s)" % p[0] for p in PARAMS]
    s.append("output y = x * (%s)" % " + ".join(terms))
    s.append("output c1 = c_normal * x")
    s.append("output c2 = c_xavier * cast(x, to=f64)")
    return "\n".join(s) + "\n"


def compile_dump(seed):
    d = tempfile.mkdtemp(prefix="nova-init-")
    try:
        with open(os.path.join(d, "m.nova"), "w") as f:
            f.write(model(seed))
        so = os.path.join(d, "m.so")
        run([NOVAC, os.path.join(d, "m.nova"), "-o", so])
        os.mkdir(os.path.join(d, "in"))
        write_pb(os.path.join(d, "in", "x.pb"), np.ones(1, np.float32), "x")
        run([NOVARUN, so, "--inputs", os.path.join(d, "in"), "--outputs", os.path.join(d, "out"),
             "--dump", os.path.join(d, "dump"), "-q"])
        got = {p[0]: read_pb(os.path.join(d, "dump", "param.%s.pb" % p[0])) for p in PARAMS}
        got["c_normal"] = read_pb(os.path.join(d, "out", "output_1.pb"))
        got["c_xavier"] = read_pb(os.path.join(d, "out", "output_2.pb"))
        return got, os.path.getsize(so)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def check_all(got, graph_seed):
    for name, dt, shape, _, (kind, a, b) in PARAMS:
        ref = expected(name, kind, shape, dt, graph_seed, a, b)
        g = np.asarray(got[name])
        if g.shape != tuple(shape):
            raise Failure("%s: shape %s, expected %s" % (name, g.shape, shape))
        if not np.array_equal(g.astype(np.float64), ref.astype(np.float64)):
            bad = np.argwhere(g.astype(np.float64) != ref.astype(np.float64))[0]
            raise Failure("%s (%s %s): element %s is %r, expected %r" % (name, dt, kind, tuple(bad), g[tuple(bad)],
                                                                        ref[tuple(bad)]))
    for name, kind, shape, dt in (("c_normal", "normal", (300,), "f32"), ("c_xavier", "xavier", (20, 30), "f64")):
        ref = expected(name, kind, shape, dt, graph_seed, 1.0)
        if not np.array_equal(np.asarray(got[name]), ref):
            raise Failure("const %s: values differ from the generator's" % name)


def exact_values():
    got, size = compile_dump(None)
    check_all(got, 0)
    nbytes = sum(int(np.prod(p[2])) * (8 if p[1] == "f64" else 4) for p in PARAMS)
    if size > nbytes:
        raise Failure("step.so is %d bytes, more than its %d bytes of parameters: it holds values, not recipes"
                      % (size, nbytes))


def seed_statement():
    got, _ = compile_dump(1234)
    check_all(got, 1234)


def threads_do_not_change_values():
    old = os.environ.get("NOVA_NUM_THREADS")
    try:
        os.environ["NOVA_NUM_THREADS"] = "1"
        one, _ = compile_dump(5)
        os.environ["NOVA_NUM_THREADS"] = "3"
        three, _ = compile_dump(5)
    finally:
        if old is None:
            os.environ.pop("NOVA_NUM_THREADS", None)
        else:
            os.environ["NOVA_NUM_THREADS"] = old
    for k in one:
        if not np.array_equal(one[k], three[k]):
            raise Failure("%s differs between 1 and 3 threads" % k)


case("init.exact_values", exact_values)
case("init.seed_statement", seed_statement)
case("init.threads_do_not_change_values", threads_do_not_change_values)


def huge_generated_param_compiles():
    """A 32 GiB he param is a recipe: it compiles at once to a small step.so (file(...) bytes keep their limit)."""
    d = tempfile.mkdtemp(prefix="nova-init-")
    try:
        with open(os.path.join(d, "m.nova"), "w") as f:
            f.write("input x: f32[1]\nparam w: f32[8589934592] = he\noutput y = x * reduce_sum(w)\n")
        run([NOVAC, os.path.join(d, "m.nova"), "-o", os.path.join(d, "m.so")])
        size = os.path.getsize(os.path.join(d, "m.so"))
        if size > 4 << 20:
            raise Failure("step.so of a generated 32 GiB param is %d bytes" % size)
    finally:
        shutil.rmtree(d, ignore_errors=True)


case("init.huge_generated_param_compiles", huge_generated_param_compiles)
