"""The GEMM kernels of the cuda target (SIMT tiles, and tensor cores with
--matmul-precision=tf32) on shapes that exercise every edge: sizes below,
at and above the tiles, K below one k step and across several k tiles,
grids of one and of many blocks, both SIMT tile sizes (64x64 when the
tiles fill the SMs, 32x32 otherwise).  Also plain matmuls on the cpu
target.  Run by testsuite/run.sh with --gpu-sim flags (every kernel run as
CPU loops, exact f32 arithmetic) and by make check-gpu on the GPU, where
tf32 operands (10-bit mantissa) get a relative tolerance of 5e-3.  K of
2048 and more: the cpu target's cache blocks (m by mc, k by kc)."""
import sys

import numpy as np

from harness import EXTRA_FLAGS, case, check_close, compile_and_run, results

rng = np.random.default_rng(7)
TF32_ON_GPU = "--matmul-precision=tf32" in EXTRA_FLAGS and "--gpu-sim" not in EXTRA_FLAGS
TOL = {"f32": 5e-3 if TF32_ON_GPU else 1e-5, "f64": 1e-12}
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


for shape in SHAPES:
    gemm_case(*shape, "f32")
for shape in SHAPES[:6]:
    gemm_case(*shape, "f64")
for shape in [(224, 40, 2048), (120, 33, 3072)]:   # long k: cache-blocked on the cpu
    gemm_case(*shape, "f32")

print("# gemm: %d passed, %d failed" % (results["pass"], results["fail"]))
sys.exit(0)
