"""The GEMM kernels of the cuda target (SIMT tiles, and tensor cores with
--matmul-precision=tf32) on shapes that exercise every edge: sizes below,
at and above the tiles, K below one k step and across several k tiles,
grids of one and of many blocks, both SIMT tile sizes (64x64 when the
tiles fill the SMs, 32x32 otherwise).  Also plain matmuls on the cpu
target.  Run by testsuite/run.sh with --gpu-sim flags (every kernel run as
CPU loops, exact f32 arithmetic) and by make check-gpu on the GPU, where
tf32 operands (10-bit mantissa) get a relative tolerance of 5e-3 (the
sim form rounds them to tf32 too: the same tolerance).  K of 2048 and
more: the cpu target's cache blocks (m by mc, k by kc).  With
--precision=bf16 and fp16 the operands are rounded to 16 bits and the
products summed in f32 (tensor cores, mma.sync.m16n8k16, on the cuda
target; the runtime's vdpbf16ps kernel on AVX-512 BF16 CPUs): the result,
rounded to 16 bits, must equal the exact product of the rounded operands
rounded the same way, but for rare ties of the f32 sums.  Batched,
broadcast and transposed contractions (a batch of both operands, a
weight the batch shares, attention's [B, H, T, D] products, either operand
transposed) against float64, also under --precision=bf16.  Convolutions
(im2col + these GEMMs: the forward, the input and the weight gradient)
under --precision=bf16 and fp16, their 16-bit operands moved as they are
(padding, im2col, transposes) and read by the 16-bit GEMM: against
float64 of the rounded operands.  The elementwise op after a product
(bias, GELU, residual, constants), which the cuda target's tensor-core
GEMM applies as its epilogue, under bf16."""
import sys

import numpy as np

from harness import EXTRA_FLAGS, Failure, _compile_and_run, case, check_close, compile_and_run, rel_err, results
from refs import conv_ref

rng = np.random.default_rng(7)
import ml_dtypes

TF32 = "--matmul-precision=tf32" in EXTRA_FLAGS
TOL = {"f32": 5e-3 if TF32 else 1e-5, "f64": 1e-12}
SHAPES = [(1, 1, 1), (5, 7, 3), (16, 8, 8), (64, 64, 8), (65, 63, 9), (100, 130, 70), (33, 300, 17),
          (256, 192, 40), (768, 768, 16), (770, 700, 9)]


def gemm_case(m, n, k, dt):
    def run():
        a = rng.uniform(-1, 1, (m, k))
        b = rng.uniform(-1, 1, (k, n))
        np_dt = np.float32 if dt == "f32" else np.float64
        text = "input a: %s[%d, %d]\ninput b: %s[%d, %d]\nc = matmul(a, b)\noutput c\n" % (dt, m, k, dt, k, n)
        outs, _ = compile_and_run(text, {"a": a.astype(np_dt), "b": b.astype(np_dt)})
        ref = a.astype(np_dt).astype(np.float64) @ b.astype(np_dt).astype(np.float64)
        check_close(outs[0], ref, TOL[dt])
    case("gemm.%dx%dx%d.%s" % (m, n, k, dt), run)


def half_case(m, n, k, prec, tile=None):
    """C = A B under --precision=PREC against float64 of the rounded operands
    (TILE: the kernel's tiles forced by --gemm-tile)."""
    def run():
        dt = ml_dtypes.bfloat16 if prec == "bf16" else np.float16
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        text = "input a: f32[%d, %d]\ninput b: f32[%d, %d]\nc = matmul(a, b)\noutput c\n" % (m, k, k, n)
        outs, _ = compile_and_run(text, {"a": a, "b": b},
                                  flags=["--precision=" + prec] + (["--gemm-tile=" + tile] if tile else []))
        ref = (a.astype(dt).astype(np.float64) @ b.astype(dt).astype(np.float64)).astype(np.float32).astype(dt)
        got = np.asarray(outs[0], dtype=np.float32)
        ulp = 2.0 ** (-8 if prec == "bf16" else -11)
        check_close(got, ref.astype(np.float64), ulp)
        same = float(np.mean(got == ref.astype(np.float32)))
        if same < 0.98:
            raise Failure("only %.1f%% of the results equal the rounded product of the rounded operands" % (100 * same))
    case("gemm.%dx%dx%d.%s%s" % (m, n, k, prec, ".tile_" + tile.replace(",", "_") if tile else ""), run)


def batched_case(name, shapes, expr, ref, prec=None, tol=None):
    """A batched, broadcast or transposed contraction (one GEMM kernel, its
    batch points on the grid's z on the cuda target) against float64 (TOL:
    a relative tolerance for several 16-bit roundings in a row)."""
    def run():
        ins = {k: rng.uniform(-1, 1, s).astype(np.float32) for k, s in shapes.items()}
        text = "".join("input %s: f32[%s]\n" % (k, ", ".join(map(str, s))) for k, s in shapes.items())
        text += "c = %s\noutput c\n" % expr
        flags = ["--precision=" + prec] if prec else []
        outs, _ = compile_and_run(text, ins, flags=flags)
        if prec:
            dt = ml_dtypes.bfloat16 if prec == "bf16" else np.float16
            want = ref(*[v.astype(dt).astype(np.float64) for v in ins.values()])
            check_close(np.asarray(outs[0], dtype=np.float64), want, tol or 2.0 ** (-8 if prec == "bf16" else -11))
        else:
            check_close(outs[0], ref(*[v.astype(np.float64) for v in ins.values()]), TOL["f32"])
    case("gemm.batched.%s%s" % (name, "." + prec if prec else ""), run)


BATCHED = [
    ("both", {"a": (3, 37, 20), "b": (3, 20, 45)}, "matmul(a, b)", lambda a, b: a @ b),
    ("weight_shared", {"a": (4, 33, 24), "w": (24, 70)}, "matmul(a, w)", lambda a, w: a @ w),
    ("heads", {"q": (2, 3, 17, 16), "k": (2, 3, 16, 19)}, "matmul(q, k)", lambda q, k: q @ k),
    ("a_transposed", {"a": (2, 24, 40), "b": (2, 24, 30)}, "matmul(transpose(a, perm=[0, 2, 1]), b)",
     lambda a, b: a.transpose(0, 2, 1) @ b),
    ("b_transposed", {"a": (5, 9, 32), "b": (5, 18, 32)}, "matmul(a, transpose(b, perm=[0, 2, 1]))",
     lambda a, b: a @ b.transpose(0, 2, 1)),
    ("weight_transposed", {"a": (3, 20, 64), "w": (48, 64)}, "matmul(a, transpose(w))", lambda a, w: a @ w.T),
    # few output tiles, long k: split-K on the tensor cores (a weight gradient's shape; a batched one)
    ("split_k_weight_grad", {"x": (1000, 64), "dy": (1000, 48)}, "matmul(transpose(x), dy)", lambda x, dy: x.T @ dy),
    ("split_k_batched", {"a": (2, 40, 900), "b": (2, 900, 24)}, "matmul(a, b)", lambda a, b: a @ b),
]

from math import erf as _erf
_verf = np.vectorize(_erf)


def _gelu(x):
    return 0.5 * x * (1 + _verf(x / np.sqrt(2)))


# the elementwise op after a product, which the cuda target's tensor-core
# GEMM applies in its store (its epilogue): a bias and GELU, a residual that
# reads the GEMM's own operand, constants on attention's batched [B, H, T, T]
# scores (C a view of each batch point: E's indices from the element's
# offset), a split-K GEMM's (the epilogue in the kernel summing the ranges)
EPILOGUES = [
    ("epilogue.bias_gelu", {"x": (64, 96), "w": (96, 80), "b": (80,)}, "gelu(matmul(x, w) + b)",
     lambda x, w, b: _gelu(x @ w + b)),
    ("epilogue.residual", {"x": (2, 24, 64), "w": (64, 64), "b": (64,)}, "x + (matmul(x, w) + b)",
     lambda x, w, b: x + (x @ w + b)),
    ("epilogue.heads_scaled", {"q": (2, 3, 17, 16), "k": (2, 3, 16, 19)}, "matmul(q, k) * 0.25 + 1.0",
     lambda q, k: (q @ k) * 0.25 + 1.0),
    ("epilogue.split_k", {"x": (32, 1200), "w": (1200, 40), "b": (40,)}, "gelu(matmul(x, w) + b)",
     lambda x, w, b: _gelu(x @ w + b)),
    # two products read by one op: the second one's epilogue reads the first's result
    ("epilogue.two_products", {"x": (16, 32), "w": (32, 24), "v": (32, 24)}, "matmul(x, w) + matmul(x, v)",
     lambda x, w, v: x @ w + x @ v),
]


def conv_grads_ref(x, w, dy, strides, pads, dil):
    """dx, dw of sum(conv(x, w) * dy) (one group), in float64."""
    ns = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[ns + i]) for i in range(ns)])
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for o in np.ndindex(*dy.shape[2:]):
        g = dy[(slice(None), slice(None)) + o]  # N, F
        for k in np.ndindex(*w.shape[2:]):
            idx = (slice(None), slice(None)) + tuple(o[i] * strides[i] + k[i] * dil[i] for i in range(ns))
            dw[(slice(None), slice(None)) + k] += g.T @ xp[idx]
            dxp[idx] += g @ w[(slice(None), slice(None)) + k]
    crop = (slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + x.shape[2 + i]) for i in range(ns))
    return dxp[crop], dw


def conv_case(name, xs, ws, strides, pads, dil, prec):
    """One training step of loss = sum(conv(x, w) * g), x and w params,
    under --precision=PREC: the output and both gradients against float64
    of the rounded operands (each result rounded to 16 bits once).  fp16
    without loss scaling: the default scale of 65536 overflows these
    gradients (sums of about 100 products of magnitude <= 1)."""
    def run():
        dt = ml_dtypes.bfloat16 if prec == "bf16" else np.float16
        x = rng.uniform(-1, 1, xs).astype(np.float32)
        w = rng.uniform(-1, 1, ws).astype(np.float32)
        r64 = lambda a: a.astype(dt).astype(np.float64)  # noqa: E731
        y = conv_ref(r64(x), r64(w), strides, pads, dil, 1)
        g = rng.uniform(-1, 1, y.shape).astype(np.float32)
        text = "param x: f32[%s] = file(\"x.bin\")\nparam w: f32[%s] = file(\"w.bin\")\n" % (
            ", ".join(map(str, xs)), ", ".join(map(str, ws)))
        text += "const g: f32[%s] = file(\"g.bin\")\n" % ", ".join(map(str, y.shape))
        text += "r = conv(x, w, strides=%s, pads=%s, dilations=%s)\noutput r\noutput loss = reduce_sum(r * g)\n" % (
            list(strides), list(pads), list(dil))
        outs, dumped = _compile_and_run(text, {}, {"x.bin": x, "w.bin": w, "g.bin": g},
                                        ["--train", "--keep-grads", "--precision=" + prec] +
                                        (["--loss-scale=none"] if prec == "fp16" else []), True, None)
        ulp = 2.0 ** (-8 if prec == "bf16" else -11)
        dx, dw = conv_grads_ref(r64(x), r64(w), r64(g), strides, pads, dil)
        check_close(np.asarray(outs[0], dtype=np.float64), y, ulp, "conv output")
        check_close(dumped["grad.x"], dx, ulp, "input gradient")
        check_close(dumped["grad.w"], dw, ulp, "weight gradient")
    case("gemm.conv.%s.%s" % (name, prec), run)


CONVS = [("3x3_padded", (2, 8, 9, 9), (16, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
         ("strided_dilated", (2, 4, 7, 6), (6, 4, 3, 2), (2, 1), (1, 0, 1, 1), (1, 2)),
         ("1d", (3, 5, 20), (7, 5, 4), (2,), (1, 2), (1,))]

if TF32:
    def tf32_rounds():
        """The tf32 operands are rounded (10-bit mantissa): the error is that of tf32, not of f32."""
        a = rng.uniform(-1, 1, (64, 256)).astype(np.float32)
        b = rng.uniform(-1, 1, (256, 64)).astype(np.float32)
        text = "input a: f32[64, 256]\ninput b: f32[256, 64]\nc = matmul(a, b)\noutput c\n"
        outs, _ = compile_and_run(text, {"a": a, "b": b})
        e = rel_err(outs[0], a.astype(np.float64) @ b.astype(np.float64))
        if not 1e-5 < e < 5e-3:
            raise Failure("relative error %.3g against f64: expected that of tf32 operands (1e-5 .. 5e-3)" % e)
    case("gemm.tf32_rounds", tf32_rounds)

    def tf32_tiles():
        """tf32 GEMMs with tiles given by hand (--gemm-tile) against float64."""
        a = rng.uniform(-1, 1, (100, 70)).astype(np.float32)
        b = rng.uniform(-1, 1, (70, 130)).astype(np.float32)
        text = "input a: f32[100, 70]\ninput b: f32[70, 130]\nc = matmul(a, b)\noutput c\n"
        for tile in ["32x32x8,16x8", "64x128x16,32x64", "128x64x32,64x32", "64x64x8,32x32,4", "32x32x16,16x16,1",
                     "64x32x8,32x16,3"]:
            outs, _ = compile_and_run(text, {"a": a, "b": b}, flags=["--gemm-tile=" + tile])
            check_close(outs[0], a.astype(np.float64) @ b.astype(np.float64), TOL["f32"], "--gemm-tile=" + tile)
    if "--gpu-sim" in EXTRA_FLAGS:
        case("gemm.tf32_tiles", tf32_tiles)

for shape in SHAPES:
    gemm_case(*shape, "f32")
for shape in SHAPES[:6]:
    gemm_case(*shape, "f64")
for shape in [(224, 40, 2048), (120, 33, 3072)]:   # long k: cache-blocked on the cpu
    gemm_case(*shape, "f32")
for b in BATCHED:
    batched_case(*b)
if not TF32:
    for b in BATCHED:
        batched_case(*b, prec="bf16")
    for e in EPILOGUES:
        batched_case(*e, prec="bf16", tol=2.0 ** -6)
    for shape in SHAPES[:8] + [(96, 80, 2000)]:
        half_case(*shape, "bf16")
    for shape in SHAPES[1:7]:
        half_case(*shape, "fp16")
    if "--gpu-sim" in EXTRA_FLAGS:   # tiles given by hand (--gemm-tile, the tile search of bench/bench_gpu.py)
        for tile in ["32x32x16,16x8", "64x128x32,32x64", "128x64x64,64x64", "256x32x16,32x32", "16x256x32,16x64",
                     "64x64x16,32x32,4", "32x64x32,16x32,1", "64x32x16,32x16,3"]:
            half_case(100, 130, 70, "bf16", tile)
            half_case(33, 300, 17, "fp16", tile)
    for c in CONVS:
        conv_case(*c, prec="bf16")
    conv_case(*CONVS[0], prec="fp16")

print("# gemm: %d passed, %d failed" % (results["pass"], results["fail"]))
sys.exit(0)
