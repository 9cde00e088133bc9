#!/usr/bin/env python3
"""GPU benchmark of novac's --target=cuda steps, in one run:

  1. GEMM: novac's generated matmul kernels vs cuBLAS (PyTorch) fp32, tf32, bf16, fp16 on
     GPT-2 small's transformer and attention shapes and squares
  2. training step (AdamW): MLP, GPT block, 4-layer GPT, GPT-2 small (bf16), novac vs PyTorch
     eager and torch.compile, MFU
  3. exhaustive block-size tuner of the pointwise kernels (evaluation only) vs the analytic choice
  4. GEMM tile search: every tensor-core GEMM shape of the bf16 GPT steps, the analytic tiles
     against a grid of block / warp tiles, BK and pipeline stages (novac --gemm-tile)

    python3 bench/bench_gpu.py [BUILD_DIR] [--out FILE] [--dry-run]

Builds nothing: BUILD_DIR (default build/) must hold bin/novac and
bin/novarun.  Writes a markdown report to stdout and to --out (default
bench/gpu_results.md); progress goes to stderr.  Every novac/novarun call has
a timeout and a failing part is reported as an error in its table; the run
goes on.  A time budget (--budget, seconds) skips what is left once spent.

--dry-run proves the flow on a machine without a GPU: steps are compiled with
--target=cuda --device=h100 --gpu-sim (the kernels run as CPU loops), the
GEMM shapes are scaled down 16x per dimension, repeat counts are tiny,
--profile (cuda steps only) is not used, and the PyTorch CUDA numbers are
reported as "n/a (dry run)" (the PyTorch code paths still run once on the
CPU, untimed).  Its numbers are CPU simulation times, not GPU measurements.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import stepcache  # noqa: E402  (NOVA_STEP_CACHE: compiles recorded elsewhere, see bench/pack_gpu.sh)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpt_nova  # noqa: E402
GPT_MODEL = os.path.join(ROOT, "testsuite", "onnx", "models", "gpt_block", "model.onnx")
MLP_MODEL = os.path.join(ROOT, "examples", "mlp.nova")
GPT_VOCAB, GPT_T = 50, 8          # testsuite/onnx/models/export.py: VOCAB, T
MLP_CLASSES = 10
# (kind, batch, M, N, K, B transposed): GPT-2 small's products at batch 8 x context 1024 (8192 tokens; QKV,
# projection, MLP up and down, the head's 50257 columns; attention's Q K^T and P V per head, 8 x 12 heads), squares
GEMM_SHAPES = [("transformer", 1, 8192, 2304, 768, False), ("transformer", 1, 8192, 768, 768, False),
               ("transformer", 1, 8192, 3072, 768, False), ("transformer", 1, 8192, 768, 3072, False),
               ("transformer", 1, 8192, 50257, 768, False), ("attention", 96, 1024, 1024, 64, True),
               ("attention", 96, 1024, 64, 1024, False),
               ("square", 1, 1024, 1024, 1024, False), ("square", 1, 4096, 4096, 4096, False)]
BLOCKS = [32, 64, 128, 256, 512, 1024]
GEMM_NOVA = """# bench/bench_gpu.py: one GEMM, c = a @ b
input a: f32[M, K]
input b: f32[K, N]
c = matmul(a, b)
output c
"""
NA_DRY = "n/a (dry run)"
PEAK_BF16 = [("H200", 989.4), ("H100", 989.4), ("A100", 312.0), ("L4", 121.0), ("RTX 4090", 165.2)]
TRAIN_FLAGS = ["--train", "--optimizer=adamw", "--lr=1e-3"]


def log(msg):
    print("[bench_gpu %6.1fs] %s" % (time.perf_counter() - T0, msg), file=sys.stderr, flush=True)


T0 = time.perf_counter()


# ------------------------------------------------------------------ formatting

def fnum(x, fmt="%.3f"):
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    return fmt % x


def ratio(a, b, fmt="%.2f"):
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b == 0:
        return "n/a"
    return fmt % (a / b)


def short_err(msg, n=160):
    msg = " ".join(str(msg).split()).replace("|", "/")
    return "error: " + (msg[:n] + "..." if len(msg) > n else msg)


def table(head, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(head) - 1)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


# ------------------------------------------------------------ TensorProto I/O
# onnx.numpy_helper when onnx is installed; else a minimal encoder/decoder of
# the fields novarun reads and writes (dims, data_type, name, raw_data).

_DT = {np.dtype(np.float32): 1, np.dtype(np.int64): 7}
_DT_BACK = {1: np.float32, 7: np.int64, 11: np.float64, 6: np.int32}


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tensorproto_bytes_fallback(arr, name):
    arr = np.ascontiguousarray(arr)
    nm = name.encode()
    raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return (b"".join(b"\x08" + _varint(int(d)) for d in arr.shape) + b"\x10" + _varint(_DT[arr.dtype]) +
            b"\x42" + _varint(len(nm)) + nm + b"\x4a" + _varint(len(raw)) + raw)


def _read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def tensorproto_array_fallback(buf):
    dims, dt, raw, i = [], 1, None, 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
            if field == 1:
                dims.append(v)
            elif field == 2:
                dt = v
        elif wire == 2:
            n, i = _read_varint(buf, i)
            chunk = buf[i:i + n]
            i += n
            if field == 1:
                j = 0
                while j < len(chunk):
                    v, j = _read_varint(chunk, j)
                    dims.append(v)
            elif field == 9:
                raw = chunk
            elif field == 4 and raw is None:
                raw, dt = chunk, 1
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("TensorProto: wire type %d" % wire)
    if raw is None:
        raise ValueError("TensorProto without raw_data")
    return np.frombuffer(raw, dtype=np.dtype(_DT_BACK[dt]).newbyteorder("<")).reshape(dims)


def write_pb(path, arr, name):
    try:
        from onnx import numpy_helper
        data = numpy_helper.from_array(np.ascontiguousarray(arr), name).SerializeToString()
    except ImportError:
        data = tensorproto_bytes_fallback(arr, name)
    with open(path, "wb") as f:
        f.write(data)


def read_pb(path):
    with open(path, "rb") as f:
        data = f.read()
    try:
        import onnx
        from onnx import numpy_helper
        t = onnx.TensorProto()
        t.ParseFromString(data)
        return numpy_helper.to_array(t)
    except ImportError:
        return tensorproto_array_fallback(data)


def write_inputs(d, arrays):
    os.makedirs(d, exist_ok=True)
    for name, arr in arrays.items():
        write_pb(os.path.join(d, name + ".pb"), arr, name)
    return d


# ------------------------------------------------------- novac / novarun calls

def run_cmd(cmd, timeout):
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err + "\ntimed out after %d s" % timeout, time.perf_counter() - t0
    except OSError as e:
        return 127, "", str(e), time.perf_counter() - t0


def last_error_line(stderr, stdout=""):
    lines = [l for l in (stderr + "\n" + stdout).splitlines() if l.strip() and "note:" not in l]
    errs = [l for l in lines if "error" in l.lower() or "timed out" in l or "fail" in l.lower()]
    return (errs or lines or ["(no message)"])[-1].strip()


_RE_WALL = re.compile(r"novarun: ([0-9.]+) (ms|us) per run \(median of (\d+)\)")
_RE_GPU = re.compile(r"novarun: ([0-9.]+) ms per run on the GPU \(CUDA events, median of (\d+)\)")
_RE_PROF = re.compile(r"novarun: profile of the last run: (\d+) launches, ([0-9.]+) ms in kernels")
_RE_KLINE = re.compile(r"^\s+(nova_k\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)%\s*$")


def parse_novarun(stderr):
    """-> dict wall_ms, gpu_ms, launches, kernel_ms_total, kernels {name: (launches, ms)}
    (missing entries are None)."""
    r = {"wall_ms": None, "gpu_ms": None, "launches": None, "kernel_ms_total": None, "kernels": None}
    m = _RE_WALL.search(stderr)
    if m:
        r["wall_ms"] = float(m.group(1)) * (1e-3 if m.group(2) == "us" else 1.0)
    m = _RE_GPU.search(stderr)
    if m:
        r["gpu_ms"] = float(m.group(1))
    m = _RE_PROF.search(stderr)
    if m:
        r["launches"], r["kernel_ms_total"] = int(m.group(1)), float(m.group(2))
        ks = {}
        for line in stderr[m.end():].splitlines():
            km = _RE_KLINE.match(line)
            if km:
                ks[km.group(1)] = (int(km.group(2)), float(km.group(3)))
        r["kernels"] = ks
    return r


def selftest_parsers():
    """Checks the novarun output parser and the TensorProto fallback (dry run)."""
    sample = ("novarun: step s.so: 3 tensors, 2 bound from in\n"
              "novarun: 1.250 ms per run (median of 20)\n"
              "novarun: 0.980 ms per run on the GPU (CUDA events, median of 20)\n"
              "novarun: profile of the last run: 3 launches, 0.900 ms in kernels\n"
              "  kernel       launches           ms   share\n"
              "  nova_k1             1       0.8000   88.9%\n"
              "  nova_k0             2       0.1000   11.1%\n")
    r = parse_novarun(sample)
    assert r["wall_ms"] == 1.25 and r["gpu_ms"] == 0.98 and r["launches"] == 3, r
    assert r["kernels"] == {"nova_k1": (1, 0.8), "nova_k0": (2, 0.1)}, r
    assert parse_novarun("novarun: 12.50 us per run (median of 3)\n")["wall_ms"] == 0.0125
    for a in (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5, np.arange(300, dtype=np.int64).reshape(3, 100)):
        b = tensorproto_array_fallback(tensorproto_bytes_fallback(a, "t"))
        assert b.dtype == a.dtype and np.array_equal(a, b)
        try:
            from onnx import numpy_helper
            assert numpy_helper.from_array(a, "t").SerializeToString() == tensorproto_bytes_fallback(a, "t")
        except ImportError:
            pass
    return "ok"


class Bench:
    def __init__(self, args):
        self.args = args
        self.dry = args.dry_run
        b = os.path.abspath(args.build)
        self.novac, self.novarun = os.path.join(b, "bin", "novac"), os.path.join(b, "bin", "novarun")
        self.target = (["--target=cuda", "--device=h100", "--gpu-sim"] if self.dry
                       else ["--target=cuda", "--device=" + args.device])
        self.tmp = tempfile.mkdtemp(prefix="nova-bench-gpu-")
        self.deadline = T0 + args.budget
        self.cache = {}
        self.stepcache = stepcache.StepCache("bench_gpu") if stepcache.active() else None
        self.failures = []
        self.torch = None
        self.torch_err = None
        self.notes = []

    def left(self):
        return self.deadline - time.perf_counter()

    def out_of_time(self, need=5):
        return self.left() < need

    # -------------------------------------------------------------- compiling
    def compile(self, key, model, flags):
        """Compiles MODEL with FLAGS + the target flags; cached by KEY.  ->
        dict ok, so, wall_s, err, kernels (the manifest's list, or None)."""
        if key in self.cache:
            return self.cache[key]
        d = os.path.join(self.tmp, re.sub(r"[^A-Za-z0-9_.=-]", "_", key))
        os.makedirs(d, exist_ok=True)
        so = os.path.join(d, "step.so")
        cmd = [self.novac, model] + flags + self.target + ["-o", so]
        log("compile %s" % key)
        if self.out_of_time():
            r = {"ok": False, "so": so, "wall_s": None, "err": "skipped (time budget)", "kernels": None, "cmd": cmd}
            self.cache[key] = r
            return r
        if self.stepcache:
            rc, out, err, wall = self.stepcache.novac(cmd, self.args.compile_timeout)
        else:
            rc, out, err, wall = run_cmd(cmd, min(self.args.compile_timeout, max(5, self.left())))
        r = {"ok": rc == 0 and os.path.exists(so), "so": so, "wall_s": wall, "err": None, "kernels": None, "cmd": cmd}
        if not r["ok"]:
            r["err"] = "novac rc %d: %s" % (rc, last_error_line(err, out))
            self.failures.append("compile %s: %s" % (key, r["err"]))
        else:
            r["kernels"] = self.kernels_of(so, model, flags)
        self.cache[key] = r
        return r

    def kernels_of(self, so, model, flags):
        """The manifest's GPU kernel list.  A --gpu-sim step's manifest is a
        CPU one, so the dry run asks for the cuda manifest of the same mapping
        (--emit=manifest without --gpu-sim; not part of the compile time)."""
        path = os.path.splitext(so)[0] + ".json"
        if self.dry:
            path = os.path.splitext(so)[0] + ".cuda.json"
            tflags = [f for f in self.target if f != "--gpu-sim"]
            rc, _, err, _ = run_cmd([self.novac, model] + flags + tflags + ["--emit=manifest", "-o", path],
                                    min(120, max(5, self.left())))
            if rc != 0:
                return None
        try:
            with open(path) as f:
                ks = json.load(f).get("kernels") or []
            ks = [k for k in ks if str(k.get("name", "")).startswith("nova_k")]
            return ks or None
        except (OSError, ValueError):
            return None

    # ---------------------------------------------------------------- running
    def run(self, so, inputs, repeat, profile=False, outputs=None):
        cmd = [self.novarun, so, "--inputs", inputs, "--repeat", str(repeat)]
        if profile and not self.dry:
            cmd.append("--profile")
        if outputs:
            cmd += ["--outputs", outputs]
        if self.out_of_time():
            return {"ok": False, "err": "skipped (time budget)", "wall_s": 0}
        rc, out, err, wall = run_cmd(cmd, min(self.args.run_timeout, max(5, self.left())))
        r = parse_novarun(err)
        r.update(ok=rc == 0, wall_s=wall, err=None, cmd=cmd)
        if rc != 0:
            r["err"] = "novarun rc %d: %s" % (rc, last_error_line(err, out).replace(self.tmp + os.sep, ""))
            self.failures.append("%s: %s" % (" ".join(cmd[:2]), r["err"]))
        elif not self.dry and r["gpu_ms"] is None:
            r["note"] = "no GPU time line (not a cuda step?)"
        return r

    # ------------------------------------------------------------------ torch
    def get_torch(self):
        """torch with CUDA (GPU run) or on the CPU (dry run); None + torch_err."""
        if self.torch is None and self.torch_err is None:
            try:
                import torch
                if not self.dry and not torch.cuda.is_available():
                    raise RuntimeError("torch %s: CUDA not available" % torch.__version__)
                self.torch = torch
            except Exception as e:  # noqa: BLE001 (ImportError, driver problems)
                self.torch_err = "%s: %s" % (type(e).__name__, e)
        return self.torch

    def torch_device(self):
        return "cpu" if self.dry else "cuda"

    def torch_time_ms(self, fn, warmup, repeat):
        """Median ms per call of FN (CUDA events around each call, after
        WARMUP calls) and mean wall ms per call; on the CPU (dry run)
        perf_counter for both."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        if self.dry:
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(ts), statistics.mean(ts)
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
        t0 = time.perf_counter()
        for s, e in ev:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / repeat
        return statistics.median(s.elapsed_time(e) for s, e in ev), wall


# ======================================================================= 1. GEMM

def gemm_text(batch, M, N, K, tb, dt="f32"):
    """The .nova text of one GEMM c = a @ b (a [batch,] M x K; b K x N, or
    stored N x K and transposed when TB: attention's Q K^T)."""
    lead = "%d, " % batch if batch > 1 else ""
    bshape = (N, K) if tb else (K, N)
    perm = "perm=[0, 2, 1]" if batch > 1 else "perm=[1, 0]"
    return ("# bench/bench_gpu.py: one GEMM\ninput a: %s[%s%d, %d]\ninput b: %s[%s%d, %d]\nc = matmul(a, %s)\n"
            "output c\n" % (dt, lead, M, K, dt, lead, bshape[0], bshape[1],
                             "transpose(b, %s)" % perm if tb else "b"))


def novac_gemm(B, row, tag, model, flags, inp, g):
    """Compiles and runs one novac GEMM (FLAGS), filling ROW with compile_s,
    kernel_ms (the matmul kernels of --profile), step_ms, launches; returns
    the output array, or None."""
    key = "gemm_%s%s" % (g["key"], tag)
    c = B.compile(key, model, flags)
    row["compile_s"] = c["wall_s"] if c["ok"] else short_err(c["err"])
    if not c["ok"]:
        row["kernel_ms"] = row["step_ms"] = "not compiled"
        return None
    # the result is read back and checked where it is at most 64M elements (the head's 8192 x 50257 is 1.6 GB)
    outd = os.path.join(B.tmp, key + "_out") if g["batch"] * g["M"] * g["N"] <= GEMM_CHECK_MAX else None
    r = B.run(c["so"], inp, B.args.gemm_repeat, profile=True, outputs=outd)
    if not r["ok"]:
        row["kernel_ms"] = row["step_ms"] = short_err(r["err"])
        return None
    mm = [k for k in (c["kernels"] or []) if k.get("op") == "matmul"]
    row["schedule"] = "; ".join(k.get("schedule", "") for k in mm)
    if B.dry:
        row["kernel_ms"] = NA_DRY
        row["step_ms"] = r["wall_ms"]
        row["step_kind"] = "wall, CPU sim"
    else:
        prof = r["kernels"] or {}
        if not mm:
            row["kernel_ms"] = "error: no matmul kernel in the manifest"
        elif not all(k["name"] in prof for k in mm):
            row["kernel_ms"] = "error: matmul kernel %s missing from --profile" % ",".join(k["name"] for k in mm)
        else:
            row["kernel_ms"] = sum(prof[k["name"]][1] for k in mm)
        row["step_ms"] = r["gpu_ms"] if r["gpu_ms"] is not None else "error: no GPU time line"
        row["step_kind"] = "GPU events"
        row["launches"] = r["launches"]
    if outd is None:
        row["err"] = "not checked (%d x %d output)" % (g["batch"] * g["M"], g["N"])
        return None
    try:
        return read_pb(os.path.join(outd, "output_0.pb")).astype(np.float32)
    except Exception as e:  # noqa: BLE001
        row["err"] = short_err("reading the output: %s" % e)
        return None


GEMM_CHECK_MAX = 64 << 20
# novac flags and cuBLAS dtype of each precision of section 1; tolerance of the result against float64
GEMM_PRECS = [("f32", [], "fp32", 1e-3), ("tf32", ["--matmul-precision=tf32"], "tf32", 1e-2),
              ("bf16", ["--precision=bf16"], "bf16", 3e-2), ("fp16", ["--precision=fp16"], "fp16", 5e-3)]


def gemm_shapes(B):
    """GEMM_SHAPES as dicts (scaled down 16x per dimension in the dry run)."""
    out = []
    for kind, batch, M, N, K, tb in GEMM_SHAPES:
        if B.dry:
            batch, M, N, K = max(1, batch // 16), max(16, M // 16), max(16, N // 16), max(16, K // 16)
        out.append({"kind": kind, "batch": batch, "M": M, "N": N, "K": K, "tb": tb,
                    "key": "%d_%d_%d_%d%s" % (batch, M, N, K, "_bt" if tb else ""),
                    "label": "%s%d x %d x %d%s" % ("%d x " % batch if batch > 1 else "", M, N, K,
                                                    " (B^T)" if tb else "")})
    return out


def bench_gemm(B):
    a_ = B.args
    rng = np.random.default_rng(1)
    torch = B.get_torch()
    rows = []
    for g in gemm_shapes(B):
        batch, M, N, K, tb = g["batch"], g["M"], g["N"], g["K"], g["tb"]
        row = {"g": g, "flop": 2.0 * batch * M * N * K, "nv": {}, "cublas": {}}
        log("GEMM %s" % g["label"])
        lead = (batch,) if batch > 1 else ()
        a = rng.standard_normal(lead + (M, K), dtype=np.float32)
        b = rng.standard_normal(lead + ((N, K) if tb else (K, N)), dtype=np.float32)
        model = os.path.join(B.tmp, "gemm_%s.nova" % g["key"])
        with open(model, "w") as f:
            f.write(gemm_text(batch, M, N, K, tb))
        inp = write_inputs(os.path.join(B.tmp, "gemm_%s_in" % g["key"]), {"a": a, "b": b})
        got = {}
        for prec, flags, _, _ in GEMM_PRECS:
            row["nv"][prec] = {}
            got[prec] = novac_gemm(B, row["nv"][prec], "_" + prec, model, flags, inp, g)
        # cuBLAS through PyTorch, and the reference for the error check
        ref = None
        bt = (lambda x: x.transpose(-1, -2)) if tb else (lambda x: x)
        if B.dry:
            for _, _, cb, _ in GEMM_PRECS:
                row["cublas"][cb] = NA_DRY
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            ref = a64 @ (np.swapaxes(b64, -1, -2) if tb else b64)
        elif torch is None:
            for _, _, cb, _ in GEMM_PRECS:
                row["cublas"][cb] = short_err(B.torch_err)
        else:
            try:
                ta, tb_ = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
                if batch * M * N <= GEMM_CHECK_MAX:
                    ref = torch.matmul(ta.double(), bt(tb_.double()))
                old = torch.backends.cuda.matmul.allow_tf32
                try:
                    for tf32, cb in ((False, "fp32"), (True, "tf32")):
                        torch.backends.cuda.matmul.allow_tf32 = tf32
                        row["cublas"][cb] = B.torch_time_ms(lambda: torch.matmul(ta, bt(tb_)), 5,
                                                            a_.torch_gemm_repeat)[0]
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = old
                for dt, cb in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
                    ha, hb = ta.to(dt), tb_.to(dt)
                    row["cublas"][cb] = B.torch_time_ms(lambda: torch.matmul(ha, bt(hb)), 5, a_.torch_gemm_repeat)[0]
                del ta, tb_, ha, hb
            except Exception as e:  # noqa: BLE001
                for _, _, cb, _ in GEMM_PRECS:
                    row["cublas"].setdefault(cb, short_err("%s: %s" % (type(e).__name__, e)))
                B.failures.append("cuBLAS %s: %s" % (g["label"], e))
        for prec, _, _, tol in GEMM_PRECS:
            r_ = row["nv"][prec]
            if got[prec] is None or ref is None or "err" in r_:
                continue
            if not isinstance(ref, np.ndarray):
                d = (torch.from_numpy(got[prec]).cuda().double() - ref).abs().max().item()
                s_ = ref.abs().max().item()
            else:
                d, s_ = float(np.max(np.abs(got[prec] - ref))), float(np.max(np.abs(ref)))
            r_["err"] = d / s_ if s_ else d
            if not np.isfinite(r_["err"]) or r_["err"] > tol:
                B.failures.append("GEMM %s (%s): novac result differs from the reference (%.3g)"
                                  % (g["label"], prec, r_["err"]))
        rows.append(row)
        if torch is not None and not B.dry:
            torch.cuda.empty_cache()
    return rows


def tflops(flop, ms):
    return flop / (ms * 1e-3) / 1e12 if isinstance(ms, (int, float)) and ms > 0 else ms


def report_gemm(B, rows):
    out = ["## 1. GEMM: novac's matmul kernel vs cuBLAS (PyTorch)", ""]
    if B.dry:
        out += ["Dry run: shapes scaled down 16x per dimension (CPU simulation of the kernels); "
                "novac time = novarun wall time of the whole step (no --profile under --gpu-sim).", ""]
    out += ["TFLOP/s = 2 batch M N K / time.  novac: the matmul kernel's time from `novarun --profile` (last of %d "
            "runs); f32 = SIMT tiles, tf32 = `--matmul-precision=tf32` (mma.sync.m16n8k8), bf16 / fp16 = "
            "`--precision=bf16|fp16` (operands rounded by their own kernels, mma.sync.m16n8k16, f32 "
            "accumulation).  cuBLAS: `torch.matmul` on CUDA tensors (batched: bmm; B^T: a transposed view), "
            "CUDA events per call, median of %d after 5 warm-up calls; fp32 = `allow_tf32=False`, tf32 = "
            "`allow_tf32=True`, bf16 / fp16 = inputs of that type.  Ratio = novac TFLOP/s / cuBLAS TFLOP/s "
            "(the matmul kernel alone).  err = max |novac - float64| / max |float64|."
            % (B.args.gemm_repeat, B.args.torch_gemm_repeat), ""]
    head = ["shape (batch x) M x N x K", "kind"]
    for prec, _, cb, _ in GEMM_PRECS:
        head += ["novac %s TFLOP/s" % prec, "cuBLAS %s TFLOP/s" % cb, "%s ratio" % prec]
    head += ["err f32 / tf32 / bf16 / fp16", "compile s (f32, tf32, bf16, fp16)"]
    t = []
    targets = {"bf16": [0, 0, 0.9], "tf32": [0, 0, 0.85]}
    for r in rows:
        f = r["flop"]
        line = [r["g"]["label"], r["g"]["kind"]]
        for prec, _, cb, _ in GEMM_PRECS:
            nv, cu = tflops(f, r["nv"][prec].get("kernel_ms")), tflops(f, r["cublas"].get(cb))
            line += [fnum(nv, "%.2f"), fnum(cu, "%.2f"), ratio(nv, cu, "%.3f")]
            if prec in targets and r["g"]["kind"] != "square" and isinstance(nv, float) and isinstance(cu, float):
                targets[prec][1] += 1
                targets[prec][0] += nv / cu >= targets[prec][2]
        line += [" / ".join(fnum(r["nv"][p].get("err"), "%.1e") for p, _, _, _ in GEMM_PRECS),
                 ", ".join(fnum(r["nv"][p].get("compile_s"), "%.2f") for p, _, _, _ in GEMM_PRECS)]
        t.append(line)
    out += [table(head, t), ""]
    out += ["Targets (transformer and attention shapes): bf16 >= 0.9x cuBLAS on %d of %d shapes (wanted: at least "
            "half); tf32 >= 0.85x on %d of %d." % (targets["bf16"][0], targets["bf16"][1], targets["tf32"][0],
                                                   targets["tf32"][1]), ""]
    out += ["novac's GEMM schedules (from the manifests):", ""]
    for r in rows:
        out.append("- %s: %s" % (r["g"]["label"], "; ".join("%s: %s" % (p, r["nv"][p].get("schedule") or "?")
                                                           for p, _, _, _ in GEMM_PRECS)))
    out += [""]
    head = ["shape", "GFLOP"] + ["novac %s ms" % p for p, _, _, _ in GEMM_PRECS] + \
        ["cuBLAS %s ms" % cb for _, _, cb, _ in GEMM_PRECS] + ["novac f32 whole step ms", "launches"]
    t = [[r["g"]["label"], "%.2f" % (r["flop"] / 1e9)] +
         [fnum(r["nv"][p].get("kernel_ms"), "%.4f") for p, _, _, _ in GEMM_PRECS] +
         [fnum(r["cublas"].get(cb), "%.4f") for _, _, cb, _ in GEMM_PRECS] +
         [fnum(r["nv"]["f32"].get("step_ms"), "%.4f") +
          (" (%s)" % r["nv"]["f32"]["step_kind"] if "step_kind" in r["nv"]["f32"] else ""),
          fnum(r["nv"]["f32"].get("launches"), "%d")] for r in rows]
    out += ["Times:", "", table(head, t), ""]
    return out


# ============================================================ 2. training steps

def import_export_module():
    """testsuite/onnx/models/export.py (its GPTBlock); export.py imports onnx at
    the top, which the model classes do not need: stubbed if missing."""
    sys.path.insert(0, os.path.join(ROOT, "testsuite", "onnx", "models"))
    try:
        import onnx  # noqa: F401
    except ImportError:
        stub = types.ModuleType("onnx")
        stub.numpy_helper = types.ModuleType("onnx.numpy_helper")
        sys.modules["onnx"], sys.modules["onnx.numpy_helper"] = stub, stub.numpy_helper
    import export
    return export


def workloads(B):
    rng = np.random.default_rng(0)
    w = []
    b = 64
    w.append({"key": "mlp_b64", "name": "MLP 784-128-10 (examples/mlp.nova), batch 64", "model": MLP_MODEL,
              "dims": ["--dim=batch=%d" % b], "kind": "mlp", "batch": b,
              "inputs": {"x": rng.standard_normal((b, 784), dtype=np.float32),
                         "y": rng.integers(0, MLP_CLASSES, b).astype(np.int64)}})
    for b in (8, 32):
        w.append({"key": "gpt_b%d" % b, "name": "GPT block (d 32, T 8, vocab 50), batch %d" % b, "model": GPT_MODEL,
                  "dims": ["--dim=batch=%d" % b], "kind": "gpt", "batch": b,
                  "inputs": {"idx": rng.integers(0, GPT_VOCAB, (b, GPT_T)).astype(np.int64),
                             "targets": rng.integers(0, GPT_VOCAB, (b, GPT_T)).astype(np.int64)}})
    # mixed precision: novac --precision=bf16 (bf16 GEMMs on mma.sync.m16n8k16) vs torch.autocast(bf16)
    b = 32
    w.append({"key": "gpt_b%d_bf16" % b, "name": "GPT block, batch %d, bf16 (novac --precision=bf16, PyTorch "
              "autocast)" % b, "model": GPT_MODEL, "dims": ["--dim=batch=%d" % b, "--precision=bf16"], "kind": "gpt",
              "batch": b, "autocast": True,
              "inputs": {"idx": rng.integers(0, GPT_VOCAB, (b, GPT_T)).astype(np.int64),
                         "targets": rng.integers(0, GPT_VOCAB, (b, GPT_T)).astype(np.int64)}})
    # the 4-layer GPT (bench_cpu.py's sizes: width 256, 4 heads, context 128, vocabulary 512) and GPT-2 small as
    # .nova text (bench/gpt_nova.py: parameters drawn at run time, so the compiled steps carry no weights and the
    # GPU pack stays small); scaled down in the dry run
    for cfg, b, name in (({"layers": 4, "d": 256, "heads": 4, "t": 128, "vocab": 512}, 8, "4-layer GPT"),):
        if B.dry:
            cfg, b = {"layers": 2, "d": 64, "heads": 4, "t": 32, "vocab": 256}, 2
        path = os.path.join(B.tmp, "gpt4.nova")
        with open(path, "w") as f:
            f.write(gpt_nova.gpt_text(**cfg))
        for prec in ("fp32", "bf16"):
            w.append({"key": "gpt4_b%d%s" % (b, "_bf16" if prec == "bf16" else ""),
                      "name": "%s (%d layers, d %d, %d heads, T %d, vocab %d; bench/gpt_nova.py), batch %d%s"
                      % (name, cfg["layers"], cfg["d"], cfg["heads"], cfg["t"], cfg["vocab"], b,
                         ", bf16 (autocast)" if prec == "bf16" else ""),
                      "model": path, "dims": ["--dim=batch=%d" % b] + (["--precision=bf16"] if prec == "bf16" else []),
                      "kind": "gptnova", "cfg": cfg, "batch": b, "autocast": prec == "bf16", "torch_compile": True,
                      "flop": gpt_nova.step_flop(cfg["layers"], cfg["d"], cfg["t"], cfg["vocab"], b), "prec": prec,
                      "inputs": {"tokens": rng.integers(0, cfg["vocab"], (b, cfg["t"])).astype(np.int64),
                                 "targets": rng.integers(0, cfg["vocab"], (b, cfg["t"])).astype(np.int64)}})
    # GPT-2 small as .nova text (bench/gpt_nova.py: parameters drawn at run time); a 2-layer one in the dry run
    cfg = dict(gpt_nova.GPT2_SMALL) if not B.dry else {"layers": 2, "d": 64, "heads": 4, "t": 32, "vocab": 256}
    b = 8 if not B.dry else 2
    path = os.path.join(B.tmp, "gpt2_small.nova")
    with open(path, "w") as f:
        f.write(gpt_nova.gpt_text(**cfg))
    w.append({"key": "gpt2s_b%d_bf16" % b,
              "name": "GPT-2 small (%d layers, d %d, %d heads, T %d, vocab %d; bench/gpt_nova.py), batch %d, bf16 "
              "(autocast)" % (cfg["layers"], cfg["d"], cfg["heads"], cfg["t"], cfg["vocab"], b),
              "model": path, "dims": ["--dim=batch=%d" % b, "--precision=bf16"], "kind": "gptnova", "cfg": cfg,
              "batch": b, "autocast": True, "torch_compile": True, "prec": "bf16",
              "flop": gpt_nova.step_flop(cfg["layers"], cfg["d"], cfg["t"], cfg["vocab"], b),
              "inputs": {"tokens": rng.integers(0, cfg["vocab"], (b, cfg["t"])).astype(np.int64),
                         "targets": rng.integers(0, cfg["vocab"], (b, cfg["t"])).astype(np.int64)}})
    for x in w:
        x["in_dir"] = write_inputs(os.path.join(B.tmp, x["key"] + "_in"), x["inputs"])
    return w


def torch_train_ms(B, wl):
    """PyTorch: forward + loss + backward + AdamW step (lr 1e-3), eager and
    (where the workload asks) torch.compile of the module: {"eager": (gpu
    ms, wall ms), "compile": ...}, or None in the dry run (each code path run
    once on the CPU, untimed)."""
    torch = B.torch
    import torch.nn.functional as F
    dev = B.torch_device()
    torch.manual_seed(0)
    if wl["kind"] == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

        def loss_fn(m, x, y):
            return F.cross_entropy(m(x), y)
        args = (wl["inputs"]["x"], wl["inputs"]["y"])
    elif wl["kind"] == "gptnova":
        model = gpt_nova.torch_gpt(**wl["cfg"])

        def loss_fn(m, idx, tgt):
            return m(idx, tgt)[1]
        args = (wl["inputs"]["tokens"], wl["inputs"]["targets"])
    else:
        export = import_export_module()
        model = export.GPTBlock()

        def loss_fn(m, idx, tgt):
            return m(idx, tgt)[1]
        args = (wl["inputs"]["idx"], wl["inputs"]["targets"])
    model = model.to(dev).float().train()
    targs = [torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in args]
    res = {}
    modes = ["eager"] + (["compile"] if wl.get("torch_compile") else [])
    for mode in modes:
        if B.out_of_time(30):
            res[mode] = "skipped (time budget)"
            continue
        m = model if mode == "eager" else torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            if wl.get("autocast"):
                with torch.autocast(dev, dtype=torch.bfloat16):
                    loss = loss_fn(m, *targs)
            else:
                loss = loss_fn(m, *targs)
            loss.backward()
            opt.step()
        if B.dry:
            if mode == "eager":
                step()   # the code path, once, on the CPU; not timed (torch.compile: not run on the CPU)
            continue
        try:
            t0 = time.perf_counter()
            step()       # torch.compile compiles here
            res[mode + "_first_s"] = time.perf_counter() - t0
            res[mode] = B.torch_time_ms(step, B.args.torch_warmup, B.args.torch_repeat)
        except Exception as e:  # noqa: BLE001
            res[mode] = short_err("%s: %s" % (type(e).__name__, e))
            B.failures.append("PyTorch %s %s: %s" % (mode, wl["key"], e))
    return None if B.dry else res


def peak_bf16(B):
    """The GPU's dense bf16 peak (TFLOP/s) for the MFU column, or None."""
    name = ""
    if B.torch is not None and not B.dry:
        try:
            name = B.torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001
            name = ""
    for key, peak in PEAK_BF16:
        if key in name.upper():
            return peak, name
    return None, name or "unknown"


def bench_train(B, wls):
    rows = []
    torch = B.get_torch()
    for wl in wls:
        log("train step %s" % wl["key"])
        row = {"name": wl["name"], "flop": wl.get("flop"), "prec": wl.get("prec", "fp32"),
               "torch_compile": wl.get("torch_compile", False)}
        c = B.compile(wl["key"], wl["model"], wl["dims"] + TRAIN_FLAGS)
        row["compile_s"] = c["wall_s"] if c["ok"] else short_err(c["err"])
        row["kernels"] = len(c["kernels"]) if c.get("kernels") else None
        row["gemms"] = sum(1 for k in c.get("kernels") or [] if k.get("gemm"))
        row["tc"] = sum(1 for k in c.get("kernels") or [] if (k.get("gemm") or {}).get("instruction", "fma") != "fma")
        if c["ok"]:
            r = B.run(c["so"], wl["in_dir"], B.args.train_repeat)
            if r["ok"]:
                row["nv_gpu"] = NA_DRY if B.dry else (r["gpu_ms"] if r["gpu_ms"] is not None
                                                     else "error: no GPU time line")
                row["nv_wall"] = r["wall_ms"]
                # where the step's time goes: the kernels of one profiled run, the largest first
                if not B.dry and wl.get("torch_compile") and not B.out_of_time(30):
                    p = B.run(c["so"], wl["in_dir"], 3, profile=True)
                    if p["ok"] and p["kernels"]:
                        info = {k["name"]: k for k in c["kernels"] or []}
                        tot = sum(v[1] for v in p["kernels"].values()) or 1.0
                        row["top"] = [(n, v[1], 100.0 * v[1] / tot, info.get(n, {})) for n, v in
                                      sorted(p["kernels"].items(), key=lambda kv: -kv[1][1])[:8]]
            else:
                row["nv_gpu"] = row["nv_wall"] = short_err(r["err"])
        else:
            row["nv_gpu"] = row["nv_wall"] = "not compiled"
        keys = ("pt_gpu", "pt_wall", "pc_gpu", "pc_wall")
        if torch is None:
            for k in keys:
                row[k] = short_err(B.torch_err)
        elif B.out_of_time():
            for k in keys:
                row[k] = "skipped (time budget)"
        else:
            try:
                res = torch_train_ms(B, wl)
                if res is None:
                    for k in keys:
                        row[k] = NA_DRY
                    row["pt_note"] = "CPU smoke step ok"
                else:
                    for mode, (g, w) in (("eager", ("pt_gpu", "pt_wall")), ("compile", ("pc_gpu", "pc_wall"))):
                        v = res.get(mode, "not asked")
                        row[g], row[w] = v if isinstance(v, tuple) else (v, v)
                    row["pc_first_s"] = res.get("compile_first_s")
            except Exception as e:  # noqa: BLE001
                for k in keys:
                    row[k] = short_err("%s: %s" % (type(e).__name__, e))
                B.failures.append("PyTorch %s: %s" % (wl["key"], e))
        rows.append(row)
    return rows


def report_train(B, rows):
    a = B.args
    peak, gpu = peak_bf16(B)
    out = ["## 2. Training step (AdamW, lr 1e-3): novac vs PyTorch eager and torch.compile, same GPU", ""]
    out += ["novac: `novac MODEL --dim=batch=B --train --optimizer=adamw --lr=1e-3 [--precision=bf16] %s`, then "
            "`novarun --repeat %d` on one batch (every run is a training step): GPU = CUDA events median, wall = "
            "host median per run.  PyTorch: the same function (GPT block: `GPTBlock` of "
            "testsuite/onnx/models/export.py; MLP: Linear-ReLU-Linear; the 4-layer GPT and GPT-2 small: "
            "bench/gpt_nova.py's module), float32 parameters, bf16 rows under `torch.autocast(bfloat16)`, "
            "`torch.optim.AdamW(lr=1e-3)`, zero_grad + forward + loss + backward + step; eager, and "
            "`torch.compile(model)` (default mode; its first step, which compiles, is not timed); CUDA events "
            "around each step, median of %d after %d warm-up steps; wall = mean over the steps.  Random inputs of "
            "the bound batch.  Compile s = wall time of the novac call.  TFLOP/s = the step's model FLOP "
            "(bench/gpt_nova.py step_flop: 6 x matmul parameters x tokens + the attention products, fwd + bwd) / "
            "GPU time; MFU = that / the GPU's dense bf16 peak (%s: %s TFLOP/s)."
            % (" ".join(B.target), a.train_repeat, a.torch_repeat, a.torch_warmup, gpu,
               "%.1f" % peak if peak else "unknown"), ""]
    if B.dry:
        out += ["Dry run: novac times are CPU simulation wall times; PyTorch CUDA not run (its eager code path ran "
                "once on the CPU: %s)." % ", ".join(sorted(set(r.get("pt_note", "not run") for r in rows))), ""]
    head = ["workload", "novac compile s", "kernels (GEMMs, on tensor cores)", "novac GPU ms/step",
            "novac wall ms/step", "eager GPU ms/step", "torch.compile GPU ms/step", "eager / novac (GPU)",
            "torch.compile / novac (GPU)", "novac TFLOP/s", "MFU novac / eager / compile", "torch.compile first step s"]

    def mfu(ms):
        return ("%.1f%%" % (100.0 * tflops(r["flop"], ms) / peak)) if (
            peak and r.get("flop") and r["prec"] == "bf16" and isinstance(ms, float) and ms > 0) else "n/a"
    t = []
    for r in rows:
        t.append([r["name"], fnum(r.get("compile_s"), "%.2f"),
                  "%s (%s, %s)" % (fnum(r.get("kernels"), "%d"), r.get("gemms", "?"), r.get("tc", "?")),
                  fnum(r.get("nv_gpu")), fnum(r.get("nv_wall")), fnum(r.get("pt_gpu")),
                  fnum(r.get("pc_gpu")) if r.get("torch_compile") else "not run",
                  ratio(r.get("pt_gpu"), r.get("nv_gpu")), ratio(r.get("pc_gpu"), r.get("nv_gpu")),
                  fnum(tflops(r["flop"], r.get("nv_gpu")), "%.1f") if r.get("flop") else "n/a",
                  " / ".join(mfu(r.get(k)) for k in ("nv_gpu", "pt_gpu", "pc_gpu")),
                  fnum(r.get("pc_first_s"), "%.1f")])
    out += [table(head, t), ""]
    out += ["Targets (4-layer GPT and GPT-2 small, bf16): novac >= 1.15x eager and >= 1.0x torch.compile.", ""]
    for r in rows:
        if not r.get("top"):
            continue
        out += ["Where novac's step goes, %s (`novarun --profile --repeat 3`, the last run; the 8 largest kernels):"
                % r["name"], ""]
        out += [table(["kernel", "ms", "share", "op", "iteration space", "schedule"],
                      [[n, "%.4f" % ms, "%.1f%%" % sh, k.get("op", "?"),
                        "x".join(map(str, k.get("iteration_space") or [])),
                        (k.get("schedule") or "")[:120]] for n, ms, sh, k in r["top"]]), ""]
    return out


# ============================================================== 3. block tuner

def kernel_sig(ks):
    return [(k.get("name"), k.get("op"), tuple(k.get("iteration_space") or [])) for k in ks]


def bench_tuner(B, wls):
    res = []
    for wl in wls:
        log("tuner %s" % wl["key"])
        flags = wl["dims"] + TRAIN_FLAGS
        w = {"name": wl["name"], "configs": [], "search_wall_s": 0.0}
        t_search = 0.0
        for blk in [None] + BLOCKS:
            cfg = {"block": blk}
            t0 = time.perf_counter()
            c = B.compile(wl["key"] if blk is None else "%s_blk%d" % (wl["key"], blk), wl["model"],
                          flags + ([] if blk is None else ["--gpu-block=%d" % blk]))
            cfg["compile_s"], cfg["kernels"] = c["wall_s"], c.get("kernels")
            if not c["ok"]:
                cfg["err"] = c["err"]
            else:
                runs = 2 if blk is None else 1      # the analytic choice twice: the noise floor
                cfg["runs"] = [B.run(c["so"], wl["in_dir"], B.args.tune_repeat, profile=True) for _ in range(runs)]
                r = cfg["runs"][0]
                if not r["ok"]:
                    cfg["err"] = r["err"]
                elif B.dry:
                    cfg["times"] = {"(whole step, CPU sim wall)": r["wall_ms"]}
                    cfg["times2"] = ({"(whole step, CPU sim wall)": cfg["runs"][1]["wall_ms"]}
                                     if len(cfg["runs"]) > 1 and cfg["runs"][1]["ok"] else None)
                elif r["kernels"] is None:
                    cfg["err"] = "no --profile output"
                else:
                    cfg["times"] = {k: v[1] for k, v in r["kernels"].items()}
                    cfg["times2"] = ({k: v[1] for k, v in cfg["runs"][1]["kernels"].items()}
                                     if len(cfg["runs"]) > 1 and cfg["runs"][1]["ok"] and cfg["runs"][1]["kernels"]
                                     else None)
            if blk is not None:    # the search: the block-size compiles + their runs
                t_search += time.perf_counter() - t0
            w["configs"].append(cfg)
        w["search_wall_s"] = t_search
        res.append(w)
    return res


def report_tuner(B, res):
    a = B.args
    out = ["## 3. Exhaustive block-size tuner (evaluation only) vs the analytic choice", ""]
    out += ["Each workload's training step compiled once per `--gpu-block` in {%s} and once with the analytic "
            "choice; each run with `novarun --profile --repeat %d` (per-kernel times of the last run).  Per kernel "
            "`nova_kI`: analytic = its time with the analytic choice, best = its minimum over the %d block sizes; "
            "sums over all kernels.  analytic / best > 1: an exhaustive per-kernel tuner would win that much.  "
            "Noise floor: the analytic step profiled a second time (sum over kernels of the per-kernel minimum of "
            "the two runs, against run 1): per-kernel minima over noisy single samples are biased low by about "
            "this much.  Search time = wall time of the %d block-size compiles + their runs (what the analytic "
            "choice saves)." % (", ".join(map(str, BLOCKS)), a.tune_repeat, len(BLOCKS), len(BLOCKS)), ""]
    if B.dry:
        out += ["Dry run: no --profile under --gpu-sim, so each step counts as one 'kernel' timed by the wall "
                "time of the CPU simulation; per-kernel rows are n/a.", ""]
    summary, details = [], []
    for w in res:
        cfgs = w["configs"]
        ana = cfgs[0]
        grid = cfgs[1:]
        # kernel list identity
        sigs = [(c["block"], kernel_sig(c["kernels"])) for c in cfgs if c.get("kernels")]
        if not sigs:
            same = "n/a (no manifests)"
        elif all(s == sigs[0][1] for _, s in sigs):
            same = "yes (%d kernels, %d compiles)" % (len(sigs[0][1]), len(sigs))
        else:
            blk0, s0 = sigs[0]
            diffs = []
            for blk, s in sigs[1:]:
                if s != s0:
                    i = next((i for i, (x, y) in enumerate(zip(s0, s)) if x != y), min(len(s0), len(s)))
                    diffs.append("--gpu-block=%s: %d kernels (analytic %d), first difference at #%d: %s where the "
                                 "analytic step has %s" % (blk, len(s), len(s0), i, s[i][:3] if i < len(s) else "-",
                                                           s0[i][:3] if i < len(s0) else "-"))
            same = "NO (%s; per-kernel comparisons only where name, op and space match)" % "; ".join(diffs[:2])
            B.failures.append("%s: kernel lists differ across block sizes: %s" % (w["name"], diffs[0]))
        # per-block table
        per_block = []
        for c in cfgs:
            lbl = "analytic" if c["block"] is None else str(c["block"])
            if "err" in c:
                per_block.append([lbl, fnum(c.get("compile_s"), "%.2f"), short_err(c["err"]), "", "", ""])
                continue
            r = c["runs"][0]
            per_block.append([lbl, fnum(c["compile_s"], "%.2f"), fnum(r["wall_s"], "%.2f"),
                              NA_DRY if B.dry else fnum(r["gpu_ms"]),
                              fnum(sum(c["times"].values())), fnum(r.get("launches"), "%d")])
        if "times" not in ana:
            summary.append([w["name"], same, short_err(ana.get("err", "no analytic times")), "", "", "", "", "",
                            fnum(w["search_wall_s"], "%.1f"), fnum(ana.get("compile_s"), "%.2f")])
        else:
            names = sorted(ana["times"], key=lambda k: -ana["times"][k])
            kinfo = {k["name"]: k for k in (ana.get("kernels") or [])}
            best, best_blk, missing = {}, {}, 0
            sig_a = {x[0]: x[1:] for x in kernel_sig(ana["kernels"])} if ana.get("kernels") else None

            def same_kernel(c, k):   # kernel K of config C is the analytic step's K
                if sig_a is None or not c.get("kernels"):
                    return True
                if "_sig" not in c:
                    c["_sig"] = {x[0]: x[1:] for x in kernel_sig(c["kernels"])}
                return c["_sig"].get(k) == sig_a.get(k)
            for k in names:
                cands = [(c["times"][k], c["block"]) for c in grid
                         if "times" in c and k in c["times"] and same_kernel(c, k)]
                if cands:
                    best[k], best_blk[k] = min(cands)
                else:
                    missing += 1
            tot_a = sum(ana["times"][k] for k in best)
            tot_b = sum(best.values())
            rat = {k: ana["times"][k] / best[k] for k in best if best[k] > 0}
            worst = max(rat, key=rat.get) if rat else None
            big = [k for k in rat if ana["times"][k] >= 0.01 * tot_a]
            worst_big = max(big, key=rat.get) if big else None

            def desc(k):
                if k is None:
                    return "n/a"
                if k not in kinfo:
                    return "%.2f (%s)" % (rat[k], k)
                ki = kinfo[k]
                return "%.2f (%s, %s, [%s])" % (rat[k], k, ki.get("op", "?"),
                                                 ",".join(map(str, ki.get("iteration_space") or [])))
            noise = "n/a"
            if ana.get("times2"):
                t1, t2 = ana["times"], ana["times2"]
                common = [k for k in t1 if k in t2]
                s1 = sum(t1[k] for k in common)
                smin = sum(min(t1[k], t2[k]) for k in common)
                noise = ratio(s1, smin, "%.3f")
            summary.append([w["name"], same, fnum(tot_a), fnum(tot_b), ratio(tot_a, tot_b, "%.3f"), desc(worst),
                            desc(worst_big), noise, fnum(w["search_wall_s"], "%.1f"),
                            fnum(ana.get("compile_s"), "%.2f")])
            if missing:
                summary[-1][0] += " (%d kernels without a grid time)" % missing
            rows = []
            for k in names[:10]:
                ki = kinfo.get(k, {})
                blk = ki.get("block")
                per = [("err" if "times" not in c else fnum(c["times"].get(k), "%.4f") if same_kernel(c, k)
                        else "(other kernel)") for c in grid]
                rows.append([k, ki.get("op", "n/a"), ",".join(map(str, ki.get("iteration_space") or [])) or "n/a",
                             str(blk[0]) if blk else "n/a", fnum(ana["times"][k], "%.4f"),
                             str(best_blk.get(k, "n/a")), fnum(best.get(k), "%.4f"),
                             ratio(ana["times"][k], best.get(k))] + per)
            details.append((w["name"], rows))
        details_pb = per_block
        w["_per_block"] = details_pb
    head = ["workload", "same kernels for every block size", "analytic sum ms", "best-per-kernel sum ms",
            "analytic / best", "worst kernel: ratio (kernel, op, space)",
            "worst kernel >= 1% of the step", "noise floor", "search wall s", "analytic compile s"]
    out += [table(head, summary), ""]
    for w in res:
        out += ["Per block size, %s (compile s, run wall s = novarun process incl. start-up, step GPU ms = CUDA "
                "events median, kernel sum = --profile of the last run):" % w["name"], "",
                table(["block", "compile s", "run wall s", "step GPU ms", "kernel sum ms", "launches"],
                      w["_per_block"]), ""]
    for name, rows in details:
        out += ["Top 10 kernels by analytic time, %s (ms):" % name, "",
                table(["kernel", "op", "iteration space", "analytic block", "analytic ms", "best block", "best ms",
                       "analytic / best"] + ["b%d" % b for b in BLOCKS], rows), ""]
    return out


# ======================================================== 4. GEMM tile search

SEARCH_TILES = [(64, 64, (32, 32)), (64, 64, (64, 32)), (64, 64, (32, 64)),
                (64, 128, (32, 32)), (64, 128, (64, 32)), (64, 128, (32, 64)), (64, 128, (64, 64)),
                (128, 64, (32, 32)), (128, 64, (64, 32)), (128, 64, (32, 64)), (128, 64, (64, 64)),
                (128, 128, (64, 32)), (128, 128, (32, 64)), (128, 128, (64, 64)),
                (128, 256, (64, 64)), (256, 128, (64, 64)),
                (64, 256, (32, 64)), (64, 256, (64, 32)), (64, 256, (64, 64)),
                (256, 64, (64, 32)), (256, 64, (32, 64)), (256, 64, (64, 64))]
SEARCH_BK = (32, 64)


SEARCH_STAGES = (2, 3, 4)
SMEM_OPTIN = 232448      # an H100's / H200's shared memory a block may opt in to


def stage_bytes(bm, bn, bk):
    """The most one stage of a bf16 tile takes (either layout of each
    operand: rows of BK or of BM / BN values, each padded by 8)."""
    return 2 * (max(bm * (bk + 8), bk * (bm + 8)) + max(bn * (bk + 8), bk * (bn + 8)))


def search_grid(dry):
    """--gemm-tile values of the search: every block tile x warp tile above
    (2 to 8 warps) with 32 and then 64 elements of k a stage, first with
    the configurator's pipeline depth for that tile, then with 2, 3 and 4
    stages (those within the opt-in shared memory of a block).  The dry run
    takes four of them."""
    tiles = ["%dx%dx%d,%dx%d" % (bm, bn, bk, w[0], w[1]) for bk in SEARCH_BK for bm, bn, w in SEARCH_TILES]
    staged = ["%dx%dx%d,%dx%d,%d" % (bm, bn, bk, w[0], w[1], st) for st in SEARCH_STAGES for bk in SEARCH_BK
              for bm, bn, w in SEARCH_TILES if st * stage_bytes(bm, bn, bk) <= SMEM_OPTIN]
    g = tiles + staged
    return (g[:3] + staged[:1]) if dry else g


def tile_name(g):
    """A manifest gemm object's tiles as --gemm-tile writes them (BMxBNxBK,WMxWN,S), with its split-K and
    epilogue noted."""
    t = g.get("tile") or []
    if len(t) != 5:
        return "?"
    name = "%dx%dx%d,%dx%d,%d" % (t[0], t[1], t[2], t[3], t[4], g.get("stages", 1))
    if g.get("split_k", 1) > 1:
        name += " split %d" % g["split_k"]
    return name + (" +epilogue" if g.get("epilogue") else "")


def search_gemms(B, wls):
    """The distinct tensor-core GEMMs of the bf16 GPT steps (from their
    manifests): key -> {gemm fields, count: how many kernels of the steps
    have it, steps: which}."""
    out = {}
    for wl in wls:
        if wl.get("prec") != "bf16" or wl["kind"] != "gptnova":
            continue
        c = B.compile(wl["key"], wl["model"], wl["dims"] + TRAIN_FLAGS)
        for k in c.get("kernels") or []:
            g = k.get("gemm")
            if not g or g.get("instruction") != "mma.sync.m16n8k16":
                continue
            key = (g["batch"], g["m"], g["n"], g["k"], g["a_transposed"], g["b_transposed"])
            e = out.setdefault(key, {"gemm": g, "count": 0, "steps": set(), "analytic_tile": tile_name(g)})
            e["count"] += 1
            e["steps"].add(wl["key"])
    return out


def search_text(gemms):
    """One .nova model computing every GEMM of GEMMS (keys in order) once,
    each an output; each operand x[i, j] = r[i] + c[j] made on the GPU from
    a small random pool (no large parameter to draw on the host), in its
    stored layout (transposed where the step's kernel reads it so)."""
    need = 0
    for (batch, m, n, k, ta, tb) in gemms:
        need = max(need, batch * k + m, batch * m + k, batch * k + n, batch * n + k)
    L = ["# bench/bench_gpu.py: the GEMMs of the bf16 GPT steps, for the tile search",
         "param pool: f32[%d] = uniform(-1, 1)" % need]

    def operand(name, rows, cols):
        L.append("%s_r = reshape(slice(pool, axis=0, start=0, end=%d), shape=[%d, 1])" % (name, rows, rows))
        L.append("%s_c = reshape(slice(pool, axis=0, start=%d, end=%d), shape=[1, %d])" % (name, rows, rows + cols,
                                                                                          cols))
        L.append("%s = %s_r + %s_c" % (name, name, name))
    for i, (batch, m, n, k, ta, tb) in enumerate(gemms):
        a_rows, a_cols = (k, m) if ta else (m, k)
        b_rows, b_cols = (n, k) if tb else (k, n)
        operand("a%d" % i, batch * a_rows, a_cols)
        operand("b%d" % i, batch * b_rows, b_cols)
        lead = "%d, " % batch if batch > 1 else ""
        perm = "perm=[0, 2, 1]" if batch > 1 else "perm=[1, 0]"
        A = "reshape(a%d, shape=[%s%d, %d])" % (i, lead, a_rows, a_cols)
        Bv = "reshape(b%d, shape=[%s%d, %d])" % (i, lead, b_rows, b_cols)
        if batch == 1:
            A, Bv = "a%d" % i, "b%d" % i
        L.append("c%d = matmul(%s, %s)" % (i, "transpose(%s, %s)" % (A, perm) if ta else A,
                                           "transpose(%s, %s)" % (Bv, perm) if tb else Bv))
        L.append("output c%d" % i)
    return "\n".join(L) + "\n"


def bench_search(B, wls):
    gemms = search_gemms(B, wls)
    keys = sorted(gemms, key=lambda x: -2.0 * x[0] * x[1] * x[2] * x[3])
    res = {"gemms": gemms, "keys": keys, "configs": [], "search_s": 0.0}
    if not keys:
        res["err"] = "no bf16 tensor-core GEMM in the steps (were they compiled?)"
        return res
    model = os.path.join(B.tmp, "search.nova")
    with open(model, "w") as f:
        f.write(search_text(keys))
    empty = os.path.join(B.tmp, "search_in")
    os.makedirs(empty, exist_ok=True)
    flags = ["--precision=bf16"]
    for tile in [None, None] + search_grid(B.dry):    # the analytic choice twice: the noise floor
        cfg = {"tile": tile}
        if B.out_of_time(20):
            cfg["err"] = "skipped (time budget)"
            res["configs"].append(cfg)
            continue
        t0 = time.perf_counter()
        c = B.compile("search_" + (tile or "analytic").replace(",", "_"), model,
                      flags + (["--gemm-tile=" + tile] if tile else []))
        cfg["compile_s"] = c["wall_s"]
        if not c["ok"]:
            cfg["err"] = c["err"]
        else:
            byname = {k["name"]: k["gemm"] for k in c["kernels"] or [] if k.get("gemm")}
            r = B.run(c["so"], empty, B.args.search_repeat, profile=True)
            if not r["ok"]:
                cfg["err"] = r["err"]
            elif B.dry:
                cfg["wall_ms"] = r["wall_ms"]
            elif r["kernels"] is None:
                cfg["err"] = "no --profile output"
            else:
                cfg["times"], cfg["tiles"] = {}, {}
                for name, g in byname.items():
                    key = (g["batch"], g["m"], g["n"], g["k"], g["a_transposed"], g["b_transposed"])
                    if name in r["kernels"]:
                        cfg["times"][key] = r["kernels"][name][1]
                        cfg["tiles"][key] = g.get("tile")
        if tile is not None:
            res["search_s"] += time.perf_counter() - t0
        res["configs"].append(cfg)
    return res


def report_search(B, res):
    a = B.args
    out = ["## 4. GEMM tile search: the analytic tiles against every tile of a grid", ""]
    grid = search_grid(B.dry)
    out += ["Every distinct tensor-core GEMM of the bf16 4-layer GPT and GPT-2 small training steps (batch, M, N, K "
            "and the operands' layouts from the manifests' `gemm` objects) computed once in one step "
            "(bench_gpu.py search_text: operands made on the GPU), compiled with the configurator's tiles and with "
            "each `--gemm-tile` of a grid of %d (block tiles 64..256 x 64..256, warp tiles 32..64 x 32..64, 2 to 8 "
            "warps, BK 32 and 64; the configurator's pipeline depth for the tile, then 2, 3 and 4 stages); each "
            "compile run with `novarun --profile --repeat %d` (the kernel's time in "
            "the last run).  analytic / best > 1: the best tile of the grid is that much faster.  Noise floor: "
            "the analytic step run twice.  Search time = the grid's compiles and runs (what the analytic choice "
            "saves; the compiles are of one step holding every GEMM)." % (len(grid), a.search_repeat), ""]
    if res.get("err"):
        return out + ["Not run: %s" % res["err"], ""]
    cfgs = res["configs"]
    done = [c for c in cfgs[2:] if "times" in c or "wall_ms" in c]
    out += ["Configurations run: %d of %d (%d refused or failed, %d skipped by the time budget)."
            % (len(done), len(grid), sum(1 for c in cfgs[2:] if "err" in c and "time budget" not in c["err"]),
               sum(1 for c in cfgs[2:] if "time budget" in c.get("err", ""))), ""]
    if B.dry:
        out += ["Dry run: no --profile under --gpu-sim; whole-step CPU simulation wall times: " +
                ", ".join("%s %s ms" % (c["tile"] or "analytic", fnum(c.get("wall_ms"))) for c in cfgs
                          if "wall_ms" in c), ""]
        return out
    ana, ana2 = cfgs[0], cfgs[1]
    if "times" not in ana:
        return out + ["The analytic step did not run: %s" % short_err(ana.get("err", "?")), ""]
    rows, within, n = [], 0, 0
    for key in res["keys"]:
        g = res["gemms"][key]
        ta_ = ana["times"].get(key)
        cands = [(c["times"][key], c["tile"]) for c in done if key in c.get("times", {})]
        if ta_ is None or not cands:
            rows.append(["%d x %d x %d x %d" % key[:4], "", "", fnum(ta_, "%.4f"), "n/a", "n/a", "n/a", "", ""])
            continue
        best, btile = min(cands)
        best = min(best, ta_)
        r = ta_ / best if best > 0 else float("nan")
        n += 1
        within += r <= 1.10
        rank = 1 + sum(1 for t, _ in cands if t < ta_)
        noise = ratio(ta_, min(ta_, ana2.get("times", {}).get(key, ta_)), "%.3f")
        rows.append(["%s%d x %d x %d" % ("%d x " % key[0] if key[0] > 1 else "", key[1], key[2], key[3]),
                     ("A^T " if key[4] else "") + ("B^T" if key[5] else ""),
                     "%d (%s)" % (g["count"], ", ".join(sorted(g["steps"]))),
                     "%s: %.4f" % (g["analytic_tile"], ta_),
                     "%s: %.4f" % (btile, best), "%.3f" % r, "%d of %d" % (rank, len(cands) + 1), noise,
                     "%.1f" % (2.0 * key[0] * key[1] * key[2] * key[3] / (ta_ * 1e-3) / 1e12)])
    out += ["Analytic within 10%% of the grid's best on %d of %d GEMM shapes (target: 80%%).  Search wall time "
            "%.1f s for %d configurations; the analytic compile %.2f s." % (within, n, res["search_s"], len(done),
                                                                          ana.get("compile_s") or 0), ""]
    out += [table(["GEMM (batch x) M x N x K", "layout", "kernels in the steps", "analytic tile: ms",
                   "best tile: ms", "analytic / best", "analytic's rank", "noise floor", "analytic TFLOP/s"],
                  rows), ""]
    return out


# ====================================================================== header

def header(B, cmdline):
    out = ["# novac GPU benchmark" + (" — DRY RUN (CPU simulation, not GPU numbers)" if B.dry else ""), ""]
    gpu = drv = cuda = "n/a"
    if shutil.which("nvidia-smi"):
        rc, so, _, _ = run_cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"], 30)
        if rc == 0 and so.strip():
            parts = [p.strip() for p in so.strip().splitlines()[0].split(",")]
            gpu = "%s (%s, max SM clock %s)" % (parts[0], parts[2], parts[3]) if len(parts) >= 4 else parts[0]
            drv = parts[1] if len(parts) > 1 else "n/a"
        rc, so, _, _ = run_cmd(["nvidia-smi"], 30)
        m = re.search(r"CUDA Version:\s*([0-9.]+)", so or "")
        if m:
            cuda = m.group(1) + " (driver)"
    torch = B.get_torch()
    tv = "not available (%s)" % B.torch_err if torch is None else torch.__version__
    if torch is not None and not B.dry:
        try:
            gpu = torch.cuda.get_device_name(0) + ("; nvidia-smi: " + gpu if gpu != "n/a" else "")
            cuda += ", torch built with CUDA %s, cuBLAS via torch" % torch.version.cuda
        except Exception as e:  # noqa: BLE001
            gpu += " (torch: %s)" % e
    if B.dry:
        gpu = "none (dry run: --target=cuda --device=h100 --gpu-sim, kernels simulated on the CPU)"
    rc, so, se, _ = run_cmd([B.novac, "--version"], 30)
    nv = (so or se).strip().splitlines()[0] if rc == 0 and (so or se).strip() else "error: %s" % last_error_line(se)
    # what novac's device model says (--device=auto detection)
    model = os.path.join(B.tmp, "gemm.nova")
    with open(model, "w") as f:
        f.write(GEMM_NOVA)
    rc, so, se, _ = run_cmd([B.novac, model, "--dim=M=64", "--dim=N=64", "--dim=K=64", "--explain-config",
                             "--emit=manifest", "-o", os.path.join(B.tmp, "probe.json")] + B.target, 60)
    dev = next((l for l in so.splitlines() if l.startswith("device:")), None) if rc == 0 else None
    rc2, gh, _, _ = run_cmd(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], 20)
    rc3, gs, _, _ = run_cmd(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], 20)
    commit = (gh.strip() + (" + uncommitted changes" if gs.strip() else "")) if rc2 == 0 else "n/a"
    out += ["- GPU: %s" % gpu,
            "- Driver: %s; CUDA: %s" % (drv, cuda),
            "- novac: %s; device model: %s; target flags: `%s`" % (nv, dev[len("device: "):] if dev else
                                                                    "error: %s" % last_error_line(se),
                                                                    " ".join(B.target)),
            "- Commit: %s" % commit,
            "- Host: %s, %s, %d CPUs; Python %s; torch %s; numpy %s" % (platform.node(), platform.machine(),
                                                                       os.cpu_count() or 0,
                                                                       platform.python_version(), tv, np.__version__),
            "- Date: %s" % datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z"),
            "- Command: `%s`" % cmdline, ""]
    return out


# ======================================================================== main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"), help="build dir (default build/)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "gpu_results.md"), help="report file")
    ap.add_argument("--dry-run", action="store_true", help="CPU-only end-to-end check (--gpu-sim)")
    ap.add_argument("--device", default="auto", help="novac --device for the GPU run (default auto)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 330; dry 170)")
    ap.add_argument("--only", default="1,2,4,3", help="sections to run, in this order, e.g. 1,4")
    ap.add_argument("--compile-timeout", type=int, default=180)
    ap.add_argument("--run-timeout", type=int, default=120)
    ap.add_argument("--keep-tmp", action="store_true", help="keep the compiled steps and inputs")
    args = ap.parse_args()
    if args.budget is None:
        args.budget = 170 if args.dry_run else 330
    # repeat counts (tiny in the dry run)
    args.gemm_repeat = 2 if args.dry_run else 10
    args.torch_gemm_repeat = 2 if args.dry_run else 30
    args.train_repeat = 3 if args.dry_run else 50
    args.torch_warmup = 1 if args.dry_run else 10
    args.torch_repeat = 2 if args.dry_run else 50
    args.tune_repeat = 2 if args.dry_run else 20
    args.search_repeat = 2 if args.dry_run else 5
    cmdline = " ".join(shlex.quote(a) for a in ["python3", os.path.relpath(os.path.abspath(__file__), os.getcwd())]
                       + sys.argv[1:])

    B = Bench(args)
    for exe in (B.novac, B.novarun):
        if exe == B.novac and stepcache.MODE == "use" and B.stepcache:
            continue    # every compile comes from the step cache
        if not os.access(exe, os.X_OK):
            sys.exit("bench_gpu: %s not found: build first (make)" % exe)
    if not args.dry_run and not os.path.exists(GPT_MODEL):
        B.failures.append("missing %s" % GPT_MODEL)
    only = set(args.only.split(","))
    lines = header(B, cmdline)
    if args.dry_run:
        try:
            lines += ["Self-test of the novarun output parser and TensorProto I/O: %s" % selftest_parsers(), ""]
        except AssertionError as e:
            lines += ["Self-test of the parsers: FAILED %s" % e, ""]
            B.failures.append("parser self-test: %s" % e)
    sections = {}
    wls = None
    if only & {"2", "3", "4"}:
        wls = workloads(B)
    # in the order --only gives (default: GEMMs, training steps, the tile search, the block tuner last, as
    # the time budget allows); reported in order 1, 2, 3, 4
    for sec in args.only.split(","):
        if sec == "1":
            sections["1"] = report_gemm(B, bench_gemm(B))
        elif sec == "2":
            sections["2"] = report_train(B, bench_train(B, wls))
        elif sec == "3":
            tw = [w for w in wls if w["key"] in ("mlp_b64", "gpt_b32")]
            sections["3"] = report_tuner(B, bench_tuner(B, tw))
        elif sec == "4":
            sections["4"] = report_search(B, bench_search(B, wls))
    for k in ("1", "2", "3", "4"):
        lines += sections.get(k, [])
    elapsed = time.perf_counter() - T0
    lines += ["## Run", "",
              "- Wall time of this run: %.1f s (budget %.0f s)" % (elapsed, args.budget),
              "- Problems: %s" % ("none" if not B.failures else "%d" % len(B.failures))]
    lines += ["  - %s" % " ".join(f.split())[:300] for f in B.failures]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
        log("report written to %s" % args.out)
    except OSError as e:
        log("cannot write %s: %s" % (args.out, e))
        B.failures.append("write report")
    if args.keep_tmp:
        log("kept %s" % B.tmp)
    else:
        shutil.rmtree(B.tmp, ignore_errors=True)
    return 1 if B.failures else 0


if __name__ == "__main__":
    sys.exit(main())
