#!/usr/bin/env python3
"""ONNX backend node tests through novac and novarun.

    python3 testsuite/onnx/conformance.py [--build DIR] [--ops OP,OP,...]
        [--subset FILE] [--write-md PATH] [--jobs N] [--timeout S] [--strict]
        [--filter REGEX] [--data DIR] [--no-fold] [--list] [--export DIR] [-v]

The tests are the node tests of the installed onnx package: one model per
test (usually one node; '*_expanded' tests hold the node's function body),
with input and expected output tensors.  onnx releases that ship them as files
(onnx/backend/test/data/node/test_*/model.onnx, test_data_set_*/input_K.pb,
output_K.pb) are read from there; newer releases build them in memory
(onnx.backend.test.loader.load_model_tests(kind="node")), and they are written
out in that same layout for each run.  --data DIR reads such a layout from DIR.

A test is selected when it tests an op of the set (--ops, default: the ops
novac's ONNX importer covers), or when its model uses only ops of the set.
Each selected test is attributed to the op it tests ('*_expanded' tests to the
op whose function body they hold) and classified:

  passed        novac compiled it, and for every test_data_set novarun's
                outputs have the expected count, dtype and shape, and values
                within onnx's backend tolerances (rtol 1e-3, atol 1e-7, unless
                listed in TOLERANCES below);
  failed        wrong values, dtype or shape, novarun error, a crash, a hang,
                or a sanitizer report (one-line reason);
  rejected      novac exited 1 (reason: its first diagnostic line);
  out of scope  the model uses an op outside the set, a dtype other than
                float32/float64/int64/int32/bool, a non-tensor type, an
                opset before 13, or its expected values depend on numpy's
                random generator.  Not compiled.

novac compiles static shapes, so graph inputs that ONNX uses as shape or axis
operands (Reshape's shape, Slice's starts/ends/axes/steps, ... see FOLD) are
given to novac as initializers holding the test's values; the remaining inputs
keep their order and are numbered input_0.pb, input_1.pb, ... for novarun.
--no-fold compiles the models unchanged.

Output: 'PASS: onnx :: NAME', 'FAIL: onnx :: NAME' and 'UNSUPPORTED: onnx ::
NAME' (rejected) with the reason indented on the next line, in name order, then
a summary.  With --subset FILE only the tests named there run (one per line,
'#' comments), and every one of them must pass: anything else, a test not
found included, prints FAIL.  Exit status 0, or 1 with --strict when anything
printed FAIL; 2 on bad usage or a missing build.
"""
import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import glob
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

try:
    import onnx
    from onnx import TensorProto, numpy_helper
except ImportError:
    sys.exit("conformance.py: needs the onnx Python package (pip install onnx numpy)")

SUITE = "onnx"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The ops novac's ONNX importer covers: the names in its converter tables
# (frontend/onnx*.c, entries {"Op", cv_...}), and If, which the loader handles.
def _importer_ops():
    ops = {"If"}
    for path in glob.glob(os.path.join(REPO, "frontend", "onnx*.c")):
        with open(path) as f:
            ops.update(re.findall(r'\{"([A-Z][A-Za-z0-9]*)", cv_', f.read()))
    return tuple(sorted(ops))


OPS = _importer_ops()
OPSET_MIN, OPSET_MAX = 7, 28

DTYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL}

# Inputs (op -> input positions) that fix an output's shape or the node's
# structure, and that models normally give as constants: folded into
# initializers when they are graph inputs of a test (see the module doc).
FOLD = {
    "Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Split": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), "ReduceMean": (1,), "ReduceSum": (1,),
    "ReduceMax": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "Trilu": (1,),
    "Dropout": (1, 2), "If": (0,), "Pad": (1, 3), "Tile": (1,), "OneHot": (1,), "TopK": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,),
    "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "CumSum": (1,), "CumProd": (1,), "Compress": (1,), "DFT": (1, 2), "ReverseSequence": (1,), "AffineGrid": (1,),
    "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,), "CenterCropPad": (1,), "Split": (1,), "SplitToSequence": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2),
}

# onnx's backend-test tolerances, and tests known to need others:
# name -> (rtol, atol).
RTOL, ATOL = 1e-3, 1e-7
TOLERANCES = {
    # float16 softmax of the function body: exp computed in float32 and rounded to float16 per op,
    # the reference's numpy exp rounds differently by one float16 ulp (2^-11 relative) in 2 of 192 values
    "test_attention_4d_causal_fp16_expanded": (2e-3, 1e-7),
    # an inverse DFT's exact zeros: the expected values carry numpy's float32 FFT roundoff (~2e-7)
    "test_dft_inverse": (1e-3, 1e-6), "test_dft_inverse_opset19": (1e-3, 1e-6),
}

# Tests whose expected values come from numpy's random generator (training-mode
# Dropout with a nonzero ratio): no other implementation can reproduce them.
RANDOM = frozenset(("test_training_dropout", "test_training_dropout_default",
                    "test_training_dropout_default_mask", "test_training_dropout_mask"))
# Ops whose outputs are drawn from a random generator (the tests' expected
# values are one draw of numpy's).
RANDOM_OPS = frozenset(("Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
                        "RandomUniformLike"))

EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


def dtype_name(dt):
    try:
        return TensorProto.DataType.Name(dt).lower()
    except ValueError:
        return "dtype %d" % dt


# ---- the tests --------------------------------------------------------------

class Test:
    """One node test: NAME, MODEL (ModelProto), the op it tests, and its data
    sets, a list of (inputs, outputs), each a list of TensorProto."""

    def __init__(self, name, model, op, data_sets=None, data_dir=None):
        self.name, self.model, self.op = name, model, op
        self._data_sets, self.data_dir = data_sets, data_dir
        self.scope = None        # why it is out of scope, or None
        self.fold = []           # graph input names given to novac as initializers

    def opset(self):
        for imp in self.model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                return imp.version
        return None

    def data_sets(self):
        if self._data_sets is None:
            self._data_sets = []
            for ds in sorted(glob.glob(os.path.join(self.data_dir, "test_data_set_*")),
                             key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0)):
                self._data_sets.append((read_pbs(ds, "input", len(self.model.graph.input)),
                                        read_pbs(ds, "output", len(self.model.graph.output))))
        return self._data_sets

    def io_dtypes(self):
        return [v.type.tensor_type.elem_type for v in list(self.model.graph.input) + list(self.model.graph.output)
                if v.type.HasField("tensor_type")]

    def is_float32(self):
        dts = self.io_dtypes()
        return TensorProto.FLOAT in dts and TensorProto.DOUBLE not in dts


def read_pbs(ds, kind, n):
    out = []
    for k in range(n):
        path = os.path.join(ds, "%s_%d.pb" % (kind, k))
        if not os.path.exists(path):
            break
        t = TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        out.append(t)
    return out


def as_tensor(value, name):
    if isinstance(value, TensorProto):
        t = TensorProto()
        t.CopyFrom(value)
        t.name = name
        return t
    return numpy_helper.from_array(np.asarray(value), name)


def package_data_dir():
    d = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    return d if glob.glob(os.path.join(d, "test_*", "model.onnx")) else None


def load_tests_from_dir(root):
    tests = {}
    for model_path in sorted(glob.glob(os.path.join(root, "test_*", "model.onnx"))):
        d = os.path.dirname(model_path)
        tests[os.path.basename(d)] = Test(os.path.basename(d), onnx.load(model_path), None, data_dir=d)
    for t in tests.values():  # the op: the node of the test, or of the test it expands
        base = tests.get(EXPANDED.sub("", t.name), t)
        nodes = base.model.graph.node
        t.op = nodes[0].op_type if len(nodes) == 1 else guess_op(t.name)
    return tests


def guess_op(name):
    """The op a test of several nodes tests, from its name (test_reduce_sum_x
    -> ReduceSum): the longest op name that the test name starts with."""
    key = name[len("test_"):].replace("_", "").lower()
    best = None
    for op in onnx.defs.get_all_schemas():
        o = op.name.lower()
        if key.startswith(o) and (best is None or len(o) > len(best)):
            best = op.name
    return best or "?"


def load_tests_from_onnx():
    """onnx's node test cases, built in memory by the onnx package."""
    from onnx.backend.test.loader import load_model_tests
    import onnx.backend.test.case.node as node_cases
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = load_model_tests(kind="node")
    names = getattr(node_cases, "_existing_names", {})  # test name -> the node it tests
    tests = {}
    for c in cases:
        g = c.model.graph
        data_sets = []
        for inputs, outputs in c.data_sets:
            if any(isinstance(v, (list, dict)) or v is None for v in list(inputs) + list(outputs)):
                data_sets.append(None)  # sequences, maps, optionals: out of scope
                continue
            data_sets.append(([as_tensor(v, g.input[k].name) for k, v in enumerate(inputs)],
                              [as_tensor(v, g.output[k].name) for k, v in enumerate(outputs)]))
        base = EXPANDED.sub("", c.name)
        if base in names:
            op = names[base].op_type
        elif len(g.node) == 1:
            op = g.node[0].op_type
        else:
            op = guess_op(c.name)
        tests[c.name] = Test(c.name, c.model, op, data_sets=data_sets)
    return tests


# ---- scope ------------------------------------------------------------------

def out_of_scope(t, ops):
    """Why test T is out of scope for the op set OPS, or None."""
    g = t.model.graph
    opset = t.opset()
    if opset is None:
        return "opset: no ai.onnx opset import"
    if opset < OPSET_MIN:
        return "opset: %d (the set covers opsets %d..%d)" % (opset, OPSET_MIN, OPSET_MAX)
    if t.name in RANDOM:
        return "random: the expected values come from numpy's random generator"
    other = sorted({(n.domain + "." if n.domain not in ("", "ai.onnx") else "") + n.op_type
                    for n in g.node if n.domain not in ("", "ai.onnx") or n.op_type not in ops})
    if other:
        return "op outside the set: %s" % ", ".join(other)
    bad = set()
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if not v.type.HasField("tensor_type"):
            bad.add("%s type ('%s')" % (v.type.WhichOneof("value"), v.name))
        elif v.type.tensor_type.elem_type not in DTYPES:
            bad.add(dtype_name(v.type.tensor_type.elem_type))
    for init in g.initializer:
        if init.data_type not in DTYPES:
            bad.add(dtype_name(init.data_type))
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type not in DTYPES:
                bad.add(dtype_name(a.t.data_type))
            elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
                bad.add("sparse tensor")
            elif n.op_type == "Constant" and a.name in ("value_string", "value_strings"):
                bad.add("string")
            elif n.op_type == "Cast" and a.name == "to" and a.i not in DTYPES:
                bad.add(dtype_name(a.i))
    if bad:
        return "dtype outside float32/float64/int64/int32/bool: %s" % ", ".join(sorted(bad))
    if t.data_sets() and any(ds is None for ds in t.data_sets()):
        return "dtype outside float32/float64/int64/int32/bool: non-tensor test data"
    return None


# --all: the whole suite is in scope except these (issue 11's exclusions).
ALL_OPSET_MIN = 7
EXCLUDED_DTYPES = {TensorProto.STRING, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                   TensorProto.FLOAT8E5M2FNUZ, TensorProto.UINT4, TensorProto.INT4}
for _n in ("FLOAT4E2M1", "FLOAT8E8M0", "INT2", "UINT2"):
    if hasattr(TensorProto, _n):
        EXCLUDED_DTYPES.add(getattr(TensorProto, _n))
EXCLUDED_DOMAINS = ("ai.onnx.ml", "ai.onnx.preview.training")


def out_of_scope_all(t):
    """Why test T is outside the whole-suite count, or None."""
    g = t.model.graph
    opset = t.opset()
    if opset is None:
        return "opset: no ai.onnx opset import"
    if opset < ALL_OPSET_MIN:
        return "opset: %d (before %d)" % (opset, ALL_OPSET_MIN)
    if t.name in RANDOM or any(n.op_type in RANDOM_OPS for n in g.node):
        return "random: the expected values come from numpy's random generator"
    doms = sorted({n.domain for n in g.node if n.domain in EXCLUDED_DOMAINS} |
                  {i.domain for i in t.model.opset_import if i.domain in EXCLUDED_DOMAINS and len(g.node) and
                   any(n.domain == i.domain for n in g.node)})
    if doms:
        return "domain: %s" % ", ".join(doms)
    bad = set()
    for v in list(g.input) + list(g.output):
        kind = v.type.WhichOneof("value")
        if kind != "tensor_type":
            bad.add("%s-typed graph input/output" % kind)
        elif v.type.tensor_type.elem_type in EXCLUDED_DTYPES:
            bad.add(dtype_name(v.type.tensor_type.elem_type))
    for v in g.value_info:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in EXCLUDED_DTYPES:
            bad.add(dtype_name(v.type.tensor_type.elem_type))
    for init in g.initializer:
        if init.data_type in EXCLUDED_DTYPES:
            bad.add(dtype_name(init.data_type))
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in EXCLUDED_DTYPES:
                bad.add(dtype_name(a.t.data_type))
            elif n.op_type == "Constant" and a.name in ("value_string", "value_strings"):
                bad.add("string")
            elif n.op_type in ("Cast", "CastLike", "QuantizeLinear") and a.name in ("to", "output_dtype") and \
                    a.i in EXCLUDED_DTYPES:
                bad.add(dtype_name(a.i))
    if bad:
        return "excluded type: %s" % ", ".join(sorted(bad))
    if t.data_sets() and any(ds is None for ds in t.data_sets()):
        return "excluded type: sequence, map or optional test data"
    return None


def fold_inputs(t):
    """Graph inputs of T that FOLD gives to novac as initializers: those at
    the folded positions of the nodes that take them, and for an '*_expanded'
    test (the op's function body) the graph inputs at the folded positions of
    the op it expands (its graph inputs are that op's inputs, in order)."""
    names = {v.name for v in t.model.graph.input}
    fold = set()
    for n in t.model.graph.node:
        for k in FOLD.get(n.op_type, ()):
            if k < len(n.input) and n.input[k] in names:
                fold.add(n.input[k])
    if EXPANDED.search(t.name):
        for k in FOLD.get(t.op, ()):
            if k < len(t.model.graph.input):
                fold.add(t.model.graph.input[k].name)
    return [v.name for v in t.model.graph.input if v.name in fold]


# ---- running one test -------------------------------------------------------

class Result:
    def __init__(self, status, reason=""):
        self.status, self.reason = status, reason  # status: pass, fail, reject, scope


def run_cmd(cmd, timeout, env=None):
    """(returncode, stderr, timed_out); the command runs in its own process
    group, all of which is killed on a timeout."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err.decode("utf-8", "replace"), False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        return p.returncode, err.decode("utf-8", "replace"), True


SANITIZER = re.compile(r"ERROR: (Address|Leak|Memory|Thread|UndefinedBehavior)Sanitizer|runtime error: ")


def first_line(text, prefer=None):
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if prefer:
        for ln in lines:
            if prefer.search(ln):
                return ln
    return lines[0] if lines else ""


def signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return "signal %d" % -rc


def tool_failure(tool, rc, err, timed_out, timeout):
    """A one-line reason for a tool run that did not exit 0 or 1, or that
    reported a sanitizer error; None otherwise."""
    if timed_out:
        return "%s timed out after %g s" % (tool, timeout)
    m = SANITIZER.search(err)
    if m:
        return "%s: sanitizer: %s" % (tool, first_line(err, SANITIZER))
    if rc < 0:
        line = first_line(err)
        return "%s crashed (%s)%s" % (tool, signal_name(rc), ": " + line if line else "")
    if rc not in (0, 1):
        line = first_line(err)
        return "%s exited %d%s" % (tool, rc, ": " + line if line else "")
    return None


def compare(k, got, exp, rtol, atol):
    """Why output K, GOT, is not EXP, or None."""
    if got.dtype != exp.dtype:
        return "output %d: dtype %s, expected %s" % (k, got.dtype, exp.dtype)
    if got.shape != exp.shape:
        return "output %d: shape %s, expected %s" % (k, list(got.shape), list(exp.shape))
    if exp.dtype.name == "bfloat16":  # as onnx's backend runner: in float32, within two bfloat16 ulps
        got, exp, rtol = got.astype(np.float32), exp.astype(np.float32), max(rtol, 2 ** -6)
    if exp.dtype.kind in "fc":
        with np.errstate(all="ignore"):
            ok = np.isclose(got, exp, rtol=rtol, atol=atol, equal_nan=True)
            if ok.all():
                return None
            err = np.where(ok, 0, np.abs(got.astype(np.float64) - exp.astype(np.float64)))
            err = np.where(np.isnan(err), np.inf, err)
        worst = np.unravel_index(int(np.argmax(err)), exp.shape) if exp.ndim else ()
        return ("output %d: %d of %d values differ (rtol %g, atol %g); at %s got %.7g, expected %.7g"
                % (k, int((~ok).sum()), ok.size, rtol, atol, list(int(i) for i in worst),
                   float(got[worst]), float(exp[worst])))
    ok = got == exp
    if ok.all():
        return None
    worst = tuple(int(i) for i in np.argwhere(~ok)[0]) if exp.ndim else ()
    return ("output %d: %d of %d values differ; at %s got %s, expected %s"
            % (k, int((~ok).sum()), ok.size, list(worst), got[worst], exp[worst]))


def to_array(t):
    return numpy_helper.to_array(t)


class Runner:
    def __init__(self, novac, novarun, timeout, fold, workdir):
        self.novac, self.novarun, self.timeout, self.fold, self.workdir = novac, novarun, timeout, fold, workdir

    def run(self, t):
        d = tempfile.mkdtemp(prefix=t.name + ".", dir=self.workdir)
        try:
            return self._run(t, d)
        except Exception as e:  # a broken test or a bug here: report it, keep going
            return Result("fail", "runner: %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def _run(self, t, d):
        data_sets = t.data_sets()
        if not data_sets:
            return Result("fail", "the test has no test_data_set")
        fold = t.fold if self.fold else []
        # Data sets that share the folded values share one compiled step.
        groups = collections.OrderedDict()
        for i, (inputs, _) in enumerate(data_sets):
            names = [v.name for v in t.model.graph.input]
            key = tuple(inputs[names.index(n)].SerializeToString() for n in fold)
            groups.setdefault(key, []).append(i)
        rtol, atol = TOLERANCES.get(t.name, (RTOL, ATOL))
        many = len(data_sets) > 1
        for gi, members in enumerate(groups.values()):
            gd = os.path.join(d, "step%d" % gi)
            os.mkdir(gd)
            model = onnx.ModelProto()
            model.CopyFrom(t.model)
            kept = list(range(len(model.graph.input)))
            if fold:
                inputs = data_sets[members[0]][0]
                kept = [k for k, v in enumerate(t.model.graph.input) if v.name not in fold]
                for k, v in enumerate(t.model.graph.input):
                    if v.name in fold:
                        model.graph.initializer.append(as_tensor(inputs[k], v.name))
                del model.graph.input[:]
                model.graph.input.extend(t.model.graph.input[k] for k in kept)
            model_path = os.path.join(gd, "model.onnx")
            with open(model_path, "wb") as f:
                f.write(model.SerializeToString())
            so = os.path.join(gd, "step.so")
            rc, err, timed_out = self._novac(model_path, so, gd)
            bad = tool_failure("novac", rc, err, timed_out, self.timeout)
            if bad:
                return Result("fail", bad)
            if rc == 1:
                return Result("reject", first_line(err, re.compile(r"error")) or "novac exited 1 without a message")
            if not os.path.exists(so):
                return Result("fail", "novac exited 0 but wrote no %s" % os.path.basename(so))
            for i in members:
                inputs, outputs = data_sets[i]
                where = "test_data_set_%d: " % i if many else ""
                ind, outd = os.path.join(gd, "in%d" % i), os.path.join(gd, "out%d" % i)
                os.mkdir(ind)
                for n, k in enumerate(kept):
                    if k < len(inputs):
                        with open(os.path.join(ind, "input_%d.pb" % n), "wb") as f:
                            f.write(inputs[k].SerializeToString())
                rc, err, timed_out = run_cmd([self.novarun, so, "--inputs", ind, "--outputs", outd, "-q"],
                                             self.timeout)
                bad = tool_failure("novarun", rc, err, timed_out, self.timeout)
                if bad:
                    return Result("fail", where + bad)
                if rc != 0:
                    line = first_line(err, re.compile(r"error")).replace(gd + "/", "")
                    line = re.sub(r"^novarun: ", "", line) or "exited %d without a message" % rc
                    return Result("fail", where + "novarun: " + line)
                got = sorted(glob.glob(os.path.join(outd, "output_*.pb")))
                if len(got) != len(outputs):
                    return Result("fail", where + "novarun wrote %d output%s, expected %d"
                                  % (len(got), "" if len(got) == 1 else "s", len(outputs)))
                for k, exp in enumerate(outputs):
                    path = os.path.join(outd, "output_%d.pb" % k)
                    if not os.path.exists(path):
                        return Result("fail", where + "novarun wrote no output_%d.pb" % k)
                    g = TensorProto()
                    with open(path, "rb") as f:
                        g.ParseFromString(f.read())
                    why = compare(k, to_array(g), to_array(exp), rtol, atol)
                    if why:
                        return Result("fail", where + why)
        return Result("pass")

    def _novac(self, model_path, so, cwd):
        rc, err, timed_out = run_cmd([self.novac, model_path, "-o", so], self.timeout)
        return rc, err.replace(cwd + "/", ""), timed_out


# ---- reporting --------------------------------------------------------------

STATUS_WORD = {"pass": "PASS", "fail": "FAIL", "reject": "UNSUPPORTED"}


def print_result(t, r, subset, verbose):
    if r.status == "scope":
        if subset:
            print("FAIL: %s :: %s\n    out of scope: %s" % (SUITE, t.name, r.reason))
        elif verbose:
            print("SKIP: %s :: %s\n    out of scope: %s" % (SUITE, t.name, r.reason))
        return
    word = STATUS_WORD[r.status]
    if subset and r.status == "reject":
        word = "FAIL"
    print("%s: %s :: %s" % (word, SUITE, t.name))
    if r.reason:
        print("    " + r.reason)
    sys.stdout.flush()


def reason_key(reason):
    """REASON with names and numbers blanked, to group alike reasons."""
    key = re.sub(r"'[^']*'", "'…'", reason)
    return re.sub(r"(?<![A-Za-z_])-?\d+(\.\d+)?(e[-+]?\d+)?", "N", key)


def group_reasons(items):
    """[(reason, [names])], alike reasons merged; each reason shown as it is
    when all its tests share it, else with names and numbers blanked."""
    groups = collections.OrderedDict()
    for name, reason in sorted(items, key=lambda x: (reason_key(x[1]), x[0])):
        groups.setdefault(reason_key(reason), []).append((name, reason))
    out = []
    for key, members in groups.items():
        reasons = {r for _, r in members}
        out.append((members[0][1] if len(reasons) == 1 else key, [n for n, _ in members]))
    return sorted(out, key=lambda x: (-len(x[1]), x[0]))


def md_escape(s):
    return s.replace("|", "\\|").replace("`", "'")


def write_md(path, tests, results, ops, meta):
    by_op = collections.defaultdict(list)
    for t in tests:
        by_op[t.op].append(t)
    L = []
    L.append("# ONNX node-test conformance")
    L.append("")
    L.append("The node tests of the onnx Python package, compiled with novac and run with novarun")
    L.append("(testsuite/onnx/conformance.py; see its header for what each class means).")
    L.append("")
    L.append("- onnx package: %s (%s)" % (onnx.__version__, meta["source"]))
    L.append("- novac: %s" % meta["novac_version"])
    L.append("- date: %s" % meta["date"])
    L.append("- command: `%s`" % meta["command"])
    L.append("- tolerances: rtol %g, atol %g%s; dtype and shape compared exactly"
             % (RTOL, ATOL, " (others for %d listed tests)" % len(TOLERANCES) if TOLERANCES else ""))
    L.append("- shape operands: %s" % ("graph inputs used as shape or axis operands are compiled as "
                                       "initializers with the test's values" if meta["fold"]
                                       else "models compiled unchanged (--no-fold)"))
    L.append("- wall time: %.0f s with %d jobs" % (meta["wall"], meta["jobs"]))
    L.append("")

    def counts(ts):
        c = collections.Counter(results[t.name].status for t in ts)
        f32 = [t for t in ts if results[t.name].status != "scope" and t.is_float32()]
        f32p = sum(1 for t in f32 if results[t.name].status == "pass")
        n = c["pass"] + c["fail"] + c["reject"]
        return [n, c["pass"], c["fail"], c["reject"], c["scope"], "%d/%d" % (f32p, len(f32))]

    def table(rows_ops, total_label):
        L.append("| op | tests | passed | failed | rejected | out of scope | float32 passed/total |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        tot = []
        for op in rows_ops:
            row = counts(by_op.get(op, []))
            L.append("| %s | %s |" % (op, " | ".join(str(x) for x in row)))
            tot.extend(by_op.get(op, []))
        row = counts(tot)
        L.append("| **%s** | %s |" % (total_label, " | ".join("**%s**" % x for x in row)))
        L.append("")

    set_ops = sorted(ops)
    L.append("## Summary")
    L.append("")
    L.append("'tests' counts the tests in scope (passed + failed + rejected); float32: the tests in scope "
             "whose graph inputs and outputs include float32 and no float64.")
    L.append("")
    table(set_ops, "all")
    others = sorted(op for op in by_op if op not in ops)
    if others:
        L.append("### Function bodies of other ops")
        L.append("")
        L.append("'*_expanded' tests of ops outside the set whose bodies use only ops of the set.")
        L.append("")
        table(others, "all")

    in_scope = [t for t in tests if results[t.name].status != "scope"]
    if in_scope:
        L.append("## About the tests in scope")
        L.append("")
        L.extend(facts(in_scope, meta["fold"]))
        L.append("")

    L.append("## Details")
    L.append("")
    for op in set_ops + others:
        ts = by_op.get(op, [])
        bad = [t for t in ts if results[t.name].status != "pass"]
        if not ts:
            L.append("### %s\n\nNo node test.\n" % op)
            continue
        if not bad:
            continue
        L.append("### %s" % op)
        L.append("")
        for status, title in (("fail", "Failed"), ("reject", "Rejected"), ("scope", "Out of scope")):
            items = [(t.name, results[t.name].reason) for t in ts if results[t.name].status == status]
            if not items:
                continue
            L.append("%s (%d):" % (title, len(items)))
            L.append("")
            if status == "scope":
                groups = collections.defaultdict(list)
                for name, reason in items:
                    category, _, detail = reason.partition(": ")
                    groups[category].append((name, detail))
                for category, members in sorted(groups.items()):
                    details = {d for _, d in members}
                    if len(details) == 1:
                        L.append("- %s: %s (%d): %s" % (category, md_escape(details.pop()), len(members),
                                                        ", ".join(n for n, _ in members)))
                    else:
                        L.append("- %s (%d): %s" % (category, len(members), ", ".join(
                            "%s (%s)" % (n, md_escape(d)) for n, d in members)))
            else:
                for reason, names in group_reasons(items):
                    L.append("- %s (%d): %s" % (md_escape(reason), len(names), ", ".join(names)))
            L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L).rstrip("\n") + "\n")


def facts(tests, fold):
    """Lines about the tests in scope that matter to an importer."""
    opsets = collections.Counter(t.opset() for t in tests)
    newer = [t for t in tests if t.opset() > OPSET_MAX]
    omitted_in = [t for t in tests if any(n.input and "" in n.input for n in t.model.graph.node)]
    omitted_out = [t for t in tests if any("" in n.output for n in t.model.graph.node)]
    folded = [t for t in tests if t.fold]
    zero, scalar = [], []
    for t in tests:
        vals = [v for v in list(t.model.graph.input) + list(t.model.graph.output)]
        dims = [[d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim] for v in vals]
        if any(0 in ds for ds in dims):
            zero.append(t)
        if any(len(ds) == 0 for ds in dims):
            scalar.append(t)
    many_ds = [t for t in tests if len(t.data_sets()) > 1]
    out = []
    out.append("- %d tests; model opsets: %s" % (len(tests), ", ".join(
        "%d: %d" % (o, n) for o, n in sorted(opsets.items()))))
    out.append("- %d tests import an opset above %d; for these ops, versions after %d add only "
               "dtypes (Cast also round_mode, Range stash_type)" % (len(newer), OPSET_MAX, OPSET_MAX))
    out.append("- %d tests have a node with an omitted optional input (empty name); those are not "
               "graph inputs, so input_K.pb numbering has no gaps" % len(omitted_in))
    out.append("- %d tests have a node with an omitted optional output (empty name)" % len(omitted_out))
    out.append("- %d tests %s graph inputs as shape or axis operands" % (
        len(folded), "fold" if fold else "have"))
    out.append("- %d tests have a zero-sized input or output, %d a rank-0 one" % (len(zero), len(scalar)))
    out.append("- %d tests have more than one test_data_set" % len(many_ds))
    return out


# ---- main -------------------------------------------------------------------

def read_subset(path):
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def main(argv):
    ap = argparse.ArgumentParser(prog="conformance.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="novac's build directory (default: build)")
    ap.add_argument("--ops", help="the op set, comma-separated (default: the importer's set)")
    ap.add_argument("--subset", metavar="FILE", help="run only the tests named in FILE; each must pass")
    ap.add_argument("--write-md", metavar="PATH", help="write the report in Markdown to PATH")
    ap.add_argument("--jobs", "-j", type=int, default=2, help="tests run in parallel (default 2)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per novac or novarun run (default 60)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a test FAILs")
    ap.add_argument("--filter", metavar="REGEX", help="only tests whose name matches REGEX (re.search)")
    ap.add_argument("--data", metavar="DIR", help="read the tests from DIR/test_*/ (the onnx file layout)")
    ap.add_argument("--no-fold", dest="fold", action="store_false",
                    help="compile the models unchanged (no shape operands folded into initializers)")
    ap.add_argument("--all", action="store_true",
                    help="the whole node suite: every op in scope; out of scope only float8/float4/int4/int2, "
                         "string, sequence/map/optional graph inputs and outputs, the ai.onnx.ml and "
                         "ai.onnx.preview.training domains, opsets before 7 and random expected values")
    ap.add_argument("--list", action="store_true", help="list the selected tests with their op and scope; run nothing")
    ap.add_argument("--export", metavar="DIR", help="write the selected tests to DIR in the onnx file layout; run nothing")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print the out-of-scope tests (SKIP)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")

    start = time.monotonic()
    subset = None
    if args.subset:
        subset = read_subset(args.subset)
        if not subset:
            return 0
    ops = set(OPS)
    if args.all:
        ops = {sc.name for sc in onnx.defs.get_all_schemas_with_history() if sc.domain in ("", "ai.onnx")}
    if args.ops:
        ops = {o.strip() for o in args.ops.split(",") if o.strip()}
        unknown = sorted(o for o in ops if not onnx.defs.has(o))
        if unknown:
            ap.error("--ops: not ONNX ops: %s" % ", ".join(unknown))

    build = os.path.abspath(args.build)
    novac, novarun = os.path.join(build, "bin", "novac"), os.path.join(build, "bin", "novarun")
    if not (args.list or args.export):
        for tool in (novac, novarun):
            if not os.access(tool, os.X_OK):
                print("conformance.py: %s is missing; build it first (make)" % tool, file=sys.stderr)
                return 2

    if args.data:
        if not os.path.isdir(args.data):
            ap.error("--data: %s is not a directory" % args.data)
        tests = load_tests_from_dir(args.data)
        source = "node tests read from %s" % args.data
    elif package_data_dir():
        tests = load_tests_from_dir(package_data_dir())
        source = "node tests shipped in the package"
    else:
        tests = load_tests_from_onnx()
        source = "node tests built by onnx.backend.test.loader"

    # Selection: the subset, or the tests of the set's ops plus those using only its ops.
    missing = []
    if subset is not None:
        missing = sorted(set(n for n in subset if n not in tests))
        chosen = [tests[n] for n in sorted(set(subset)) if n in tests]
    else:
        chosen = []
        for t in tests.values():
            uses_set_only = all(n.domain in ("", "ai.onnx") and n.op_type in ops for n in t.model.graph.node)
            if args.all or t.op in ops or uses_set_only:
                chosen.append(t)
    if args.filter:
        rx = re.compile(args.filter)
        chosen = [t for t in chosen if rx.search(t.name)]
        missing = [n for n in missing if rx.search(n)]
    chosen.sort(key=lambda t: t.name)
    for t in chosen:
        t.scope = out_of_scope_all(t) if args.all or subset is not None else out_of_scope(t, ops)
        if t.scope is None:
            t.fold = fold_inputs(t)

    if args.list:
        for t in chosen:
            print("%s  %s  opset %s  %s%s" % (t.name, t.op, t.opset(), "out of scope: " + t.scope if t.scope else "in scope",
                                             "  folds " + ",".join(t.fold) if t.fold and args.fold else ""))
        return 0
    if args.export:
        export(chosen, args.export)
        print("wrote %d tests to %s" % (len(chosen), args.export))
        return 0

    novac_version = subprocess.run([novac, "--version"], capture_output=True, text=True).stdout.strip()
    results = {}
    for t in chosen:
        if t.scope:
            results[t.name] = Result("scope", t.scope)
    todo = [t for t in chosen if t.scope is None]
    workdir = tempfile.mkdtemp(prefix="nova-onnx-")
    failed = False
    try:
        runner = Runner(novac, novarun, args.timeout, args.fold, workdir)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {t.name: pool.submit(runner.run, t) for t in todo}
            for t in chosen:  # in name order, as each finishes
                if t.name in futures:
                    results[t.name] = futures[t.name].result()
                print_result(t, results[t.name], subset is not None, args.verbose)
                failed |= results[t.name].status == "fail" or (subset is not None and results[t.name].status != "pass")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for n in missing:
        print("FAIL: %s :: %s\n    not found among the onnx %s node tests" % (SUITE, n, onnx.__version__))
        failed = True

    wall = time.monotonic() - start
    c = collections.Counter(r.status for r in results.values())
    print("%s: %d tests (onnx %s, %d ops): %d passed, %d failed, %d unsupported, %d out of scope%s; %.1f s"
          % (SUITE, len(chosen) + len(missing), onnx.__version__, len(ops), c["pass"], c["fail"] + len(missing),
             c["reject"], c["scope"], ", %d not found" % len(missing) if missing else "", wall))

    if args.write_md:
        cmd = ["python3", os.path.relpath(os.path.abspath(__file__), REPO)] + argv
        meta = {"source": source, "novac_version": novac_version or "?",
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                "command": " ".join(cmd), "fold": args.fold, "wall": wall, "jobs": args.jobs}
        write_md(args.write_md, chosen, results, ops, meta)
    return 1 if args.strict and failed else 0


def export(tests, root):
    for t in tests:
        d = os.path.join(root, t.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(t.model.SerializeToString())
        for i, ds in enumerate(t.data_sets()):
            if ds is None:
                continue
            dd = os.path.join(d, "test_data_set_%d" % i)
            os.makedirs(dd, exist_ok=True)
            for kind, tensors in (("input", ds[0]), ("output", ds[1])):
                for k, tp in enumerate(tensors):
                    with open(os.path.join(dd, "%s_%d.pb" % (kind, k)), "wb") as f:
                        f.write(tp.SerializeToString())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
