/* gemm_cuda.c: the GPU kernel for linalg.matmul (C[M,N] += A[M,K] B[K,N],
 * identity layouts, f32 or f64): a shared-memory tiled SIMT GEMM, written as
 * MLIR text of a private function holding one gpu.launch, which replaces the
 * matmul through a call that is then inlined.
 *
 * Each block computes a BM x BN tile of C with NT threads; each thread a
 * TM x TN sub-tile held in registers (a private memref with constant
 * indices, which LLVM promotes).  The K dimension advances BK at a time:
 * the block stages the A tile (BK x BM, stored k-major) and the B tile
 * (BK x BN) in shared memory, synchronizes, and every thread accumulates
 * BK rank-1 updates of its sub-tile with fused multiply-adds.  Loads past
 * the edges of A and B read zeros; stores past the edges of C are skipped,
 * so any M, N, K works.  Sizes come from cfg_gemm_simt (configurator).
 *
 * The same text with every phase wrapped in a loop over the block's threads
 * (and the block loop made explicit) is the --gpu-sim form: CPU code whose
 * results check the tiling's index arithmetic where there is no GPU.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "../configurator/gemm.h"
#include "../driver/util.h"
#include "codegen.h"

typedef struct gemm_gen {
  nv_sbuf b;
  int tmp;                       /* SSA name counter */
  const char *T;                 /* element type */
  int64_t M, N, K;
  cfg_gemm_simt_schedule s;
  bool sim;
  char As[96], Bs[96], acc[96];  /* memref types */
} gemm_gen;

#define P(...) nv_sb_printf(&g->b, __VA_ARGS__)

static int fresh(gemm_gen *g) { return g->tmp++; }

/* An index constant, as a fresh SSA value. */
static int cidx(gemm_gen *g, int64_t v) {
  int t = fresh(g);
  P("%%t%d = arith.constant %lld : index\n", t, (long long)v);
  return t;
}

static int binop(gemm_gen *g, const char *op, const char *x, const char *y) {
  int t = fresh(g);
  P("%%t%d = %s %s, %s : index\n", t, op, x, y);
  return t;
}

/* The accumulator (I, J) of the current thread (sim form). */
static void acc_ref(gemm_gen *g, char *out, size_t n, int i, int j) {
  int ci = cidx(g, i), cj = cidx(g, j);
  snprintf(out, n, "%%acc[%%tx, %%t%d, %%t%d] : %s", ci, cj, g->acc);
}

/* %trow, %tcol of thread %tx (recomputed per phase: the sim form has one
 * %tx per phase loop). */
static void thread_pos(gemm_gen *g) {
  int tc = cidx(g, g->s.bn / g->s.tn);
  P("%%trow = arith.divui %%tx, %%t%d : index\n%%tcol = arith.remui %%tx, %%t%d : index\n", tc, tc);
}

static void phase_begin(gemm_gen *g) {
  if (g->sim) P("scf.for %%tx = %%c0 to %%nt step %%c1 {\n");
}

static void phase_end(gemm_gen *g) {
  if (g->sim) P("}\n");
}

/* Stages one operand tile: LD x WD elements of SRC (ROWS x COLS, row
 * index = ROW0 + e / WD, column = COL0 + e % WD) into DST[e % WD][e / WD]
 * (A: k-major) or DST[e / WD][e % WD] (B), zeros outside SRC. */
static void stage(gemm_gen *g, const char *src, const char *srct, const char *dst, const char *dstt, int64_t rows,
                  int64_t cols, const char *row0, const char *col0, int64_t wd, int64_t count, bool transpose) {
  int cwd = cidx(g, wd), crows = cidx(g, rows), ccols = cidx(g, cols);
  for (int64_t i = 0; i * g->s.threads < count; i++) {
    char x[32], y[32];
    int off = cidx(g, i * g->s.threads);
    snprintf(x, sizeof x, "%%t%d", off);
    int e = binop(g, "arith.addi", "%tx", x);
    snprintf(x, sizeof x, "%%t%d", e);
    snprintf(y, sizeof y, "%%t%d", cwd);
    int r = binop(g, "arith.divui", x, y), c = binop(g, "arith.remui", x, y);
    snprintf(x, sizeof x, "%%t%d", r);
    int gr = binop(g, "arith.addi", row0, x);
    snprintf(x, sizeof x, "%%t%d", c);
    int gc = binop(g, "arith.addi", col0, x);
    int ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g), v = fresh(g), l = fresh(g);
    P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
      "%%t%d = arith.andi %%t%d, %%t%d : i1\n",
      ok1, gr, crows, ok2, gc, ccols, ok, ok1, ok2);
    P("%%t%d = scf.if %%t%d -> (%s) {\n%%t%d = memref.load %s[%%t%d, %%t%d] : %s\nscf.yield %%t%d : %s\n} else {\n"
      "scf.yield %%zero : %s\n}\n",
      v, ok, g->T, l, src, gr, gc, srct, l, g->T, g->T);
    if (transpose) P("memref.store %%t%d, %s[%%t%d, %%t%d] : %s\n", v, dst, c, r, dstt);
    else P("memref.store %%t%d, %s[%%t%d, %%t%d] : %s\n", v, dst, r, c, dstt);
  }
}

/* The accumulators: on the GPU, SSA values carried through the K loops
 * (registers); in the sim form, a per-thread slice of a memref (the
 * threads of a phase run one after the other).  acc_get returns the name of
 * accumulator IDX's current value, emitting a load in the sim form; in the
 * GPU form WHERE names the loop's values: "y" (the k step loop's iter_args)
 * or "res" (the K loop's results). */
static void acc_get(gemm_gen *g, char *out, size_t n, int idx, const char *where) {
  if (!g->sim) {
    if (!strcmp(where, "res")) snprintf(out, n, "%%kres#%d", idx);
    else snprintf(out, n, "%%y%d", idx);
    return;
  }
  char ref[160];
  acc_ref(g, ref, sizeof ref, idx / g->s.tn, idx % g->s.tn);
  int t = fresh(g);
  P("%%t%d = memref.load %s\n", t, ref);
  snprintf(out, n, "%%t%d", t);
}

/* "(T, T, ...)" for the NACC accumulators. */
static void acc_types(gemm_gen *g, int nacc) {
  P("(");
  for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", g->T);
  P(")");
}

static void gen_body(gemm_gen *g, const char *At, const char *Bt, const char *Ct) {
  const cfg_gemm_simt_schedule *s = &g->s;
  int nacc = s->tm * s->tn;
  char ref[160];
  if (g->sim) { /* zero the accumulators */
    phase_begin(g);
    for (int i = 0; i < s->tm; i++)
      for (int j = 0; j < s->tn; j++) {
        acc_ref(g, ref, sizeof ref, i, j);
        P("memref.store %%zero, %s\n", ref);
      }
    phase_end(g);
  }
  int cbm = cidx(g, s->bm), cbn = cidx(g, s->bn), ck = cidx(g, g->K), cbk = cidx(g, s->bk);
  P("%%row0 = arith.muli %%by, %%t%d : index\n%%col0 = arith.muli %%bx, %%t%d : index\n", cbm, cbn);
  if (g->sim) P("scf.for %%k0 = %%c0 to %%t%d step %%t%d {\n", ck, cbk);
  else {
    P("%%kres:%d = scf.for %%k0 = %%c0 to %%t%d step %%t%d iter_args(", nacc, ck, cbk);
    for (int i = 0; i < nacc; i++) P("%s%%x%d = %%zero", i ? ", " : "", i);
    P(") -> ");
    acc_types(g, nacc);
    P(" {\n");
  }
  phase_begin(g);
  /* A tile: BM rows x BK columns of A at (row0, k0), stored k-major */
  stage(g, "%A", At, "%As", g->As, g->M, g->K, "%row0", "%k0", s->bk, (int64_t)s->bm * s->bk, true);
  /* B tile: BK rows x BN columns of B at (k0, col0) */
  stage(g, "%B", Bt, "%Bs", g->Bs, g->K, g->N, "%k0", "%col0", s->bn, (int64_t)s->bk * s->bn, false);
  phase_end(g);
  if (!g->sim) P("gpu.barrier\n");
  phase_begin(g);
  thread_pos(g);
  int ctm = cidx(g, s->tm), ctn = cidx(g, s->tn);
  P("%%r0 = arith.muli %%trow, %%t%d : index\n%%q0 = arith.muli %%tcol, %%t%d : index\n", ctm, ctn);
  if (g->sim) P("scf.for %%kk = %%c0 to %%t%d step %%c1 {\n", cbk);
  else {
    P("%%kkres:%d = scf.for %%kk = %%c0 to %%t%d step %%c1 iter_args(", nacc, cbk);
    for (int i = 0; i < nacc; i++) P("%s%%y%d = %%x%d", i ? ", " : "", i, i);
    P(") -> ");
    acc_types(g, nacc);
    P(" {\n");
  }
  int av[16], bv[16], nv[64];
  for (int i = 0; i < s->tm; i++) {
    int ci = cidx(g, i), r = fresh(g);
    P("%%t%d = arith.addi %%r0, %%t%d : index\n", r, ci);
    av[i] = fresh(g);
    P("%%t%d = memref.load %%As[%%kk, %%t%d] : %s\n", av[i], r, g->As);
  }
  for (int j = 0; j < s->tn; j++) {
    int cj = cidx(g, j), q = fresh(g);
    P("%%t%d = arith.addi %%q0, %%t%d : index\n", q, cj);
    bv[j] = fresh(g);
    P("%%t%d = memref.load %%Bs[%%kk, %%t%d] : %s\n", bv[j], q, g->Bs);
  }
  for (int i = 0; i < s->tm; i++)
    for (int j = 0; j < s->tn; j++) {
      int idx = i * s->tn + j;
      char old[64];
      acc_get(g, old, sizeof old, idx, "y");
      nv[idx] = fresh(g);
      P("%%t%d = math.fma %%t%d, %%t%d, %s : %s\n", nv[idx], av[i], bv[j], old, g->T);
      if (g->sim) {
        acc_ref(g, ref, sizeof ref, i, j);
        P("memref.store %%t%d, %s\n", nv[idx], ref);
      }
    }
  if (!g->sim) {
    P("scf.yield ");
    for (int i = 0; i < nacc; i++) P("%s%%t%d", i ? ", " : "", nv[i]);
    P(" : ");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", g->T);
    P("\n");
  }
  P("}\n");
  phase_end(g);
  if (!g->sim) {
    P("gpu.barrier\nscf.yield ");
    for (int i = 0; i < nacc; i++) P("%s%%kkres#%d", i ? ", " : "", i);
    P(" : ");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", g->T);
    P("\n");
  }
  P("}\n");
  /* C tile += accumulators, inside C */
  phase_begin(g);
  thread_pos(g);
  int cm = cidx(g, g->M), cn = cidx(g, g->N), ctm2 = cidx(g, s->tm), ctn2 = cidx(g, s->tn);
  P("%%r1 = arith.muli %%trow, %%t%d : index\n%%q1 = arith.muli %%tcol, %%t%d : index\n", ctm2, ctn2);
  P("%%gr0 = arith.addi %%row0, %%r1 : index\n%%gc0 = arith.addi %%col0, %%q1 : index\n");
  for (int i = 0; i < s->tm; i++) {
    int ci = cidx(g, i), gri = fresh(g);
    P("%%t%d = arith.addi %%gr0, %%t%d : index\n", gri, ci);
    for (int j = 0; j < s->tn; j++) {
      int cj = cidx(g, j), gcj = fresh(g);
      P("%%t%d = arith.addi %%gc0, %%t%d : index\n", gcj, cj);
      int ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g);
      P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
        "%%t%d = arith.andi %%t%d, %%t%d : i1\n",
        ok1, gri, cm, ok2, gcj, cn, ok, ok1, ok2);
      P("scf.if %%t%d {\n", ok);
      char acc[64];
      acc_get(g, acc, sizeof acc, i * s->tn + j, "res");
      int cv = fresh(g), sum = fresh(g);
      P("%%t%d = memref.load %%C[%%t%d, %%t%d] : %s\n%%t%d = arith.addf %%t%d, %s : %s\n"
        "memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n}\n",
        cv, gri, gcj, Ct, sum, cv, acc, g->T, sum, gri, gcj, Ct);
    }
  }
  phase_end(g);
}

static char *type_str(MlirType t) {
  nv_sbuf b = {0};
  mlirTypePrint(t, cg_print_to_sbuf, &b);
  return b.s;
}

char *cg_gemm_text(const char *name, MlirType at, MlirType bt, MlirType ct, const struct cfg_gemm_simt_schedule *s,
                   bool sim) {
  gemm_gen G = {.s = *s, .sim = sim}, *g = &G;
  char *A = type_str(at), *B = type_str(bt), *C = type_str(ct);
  MlirType et = mlirShapedTypeGetElementType(ct);
  G.T = mlirTypeIsAF64(et) ? "f64" : "f32";
  G.M = mlirShapedTypeGetDimSize(at, 0);
  G.K = mlirShapedTypeGetDimSize(at, 1);
  G.N = mlirShapedTypeGetDimSize(bt, 1);
  const char *space = sim ? "" : ", #gpu.address_space<workgroup>";
  snprintf(G.As, sizeof G.As, "memref<%dx%dx%s%s>", s->bk, s->bm, G.T, space);
  snprintf(G.Bs, sizeof G.Bs, "memref<%dx%dx%s%s>", s->bk, s->bn, G.T, space);
  if (sim) snprintf(G.acc, sizeof G.acc, "memref<%dx%dx%dx%s>", s->threads, s->tm, s->tn, G.T);
  int64_t gx = (G.N + s->bn - 1) / s->bn, gy = (G.M + s->bm - 1) / s->bm;
  P("func.func private @%s(%%A: %s, %%B: %s, %%C: %s) {\n", name, A, B, C);
  P("%%c0 = arith.constant 0 : index\n%%c1 = arith.constant 1 : index\n%%gx = arith.constant %lld : index\n"
    "%%gy = arith.constant %lld : index\n%%nt = arith.constant %d : index\n",
    (long long)gx, (long long)gy, s->threads);
  if (sim) {
    P("scf.for %%by = %%c0 to %%gy step %%c1 {\nscf.for %%bx = %%c0 to %%gx step %%c1 {\n");
    P("%%zero = arith.constant 0.0 : %s\n%%As = memref.alloc() : %s\n%%Bs = memref.alloc() : %s\n"
      "%%acc = memref.alloc() : %s\n",
      G.T, G.As, G.Bs, G.acc);
  } else {
    P("gpu.launch blocks(%%bx, %%by, %%bz) in (%%sx = %%gx, %%sy = %%gy, %%sz = %%c1) threads(%%tx, %%ty, %%tz) in "
      "(%%ux = %%nt, %%uy = %%c1, %%uz = %%c1) workgroup(%%As : %s, %%Bs : %s) {\n",
      G.As, G.Bs);
    P("%%zero = arith.constant 0.0 : %s\n", G.T);
  }
  gen_body(g, A, B, C);
  if (sim) P("memref.dealloc %%As : %s\nmemref.dealloc %%Bs : %s\nmemref.dealloc %%acc : %s\n}\n}\n", G.As, G.Bs, G.acc);
  else P("gpu.terminator\n}\n");
  P("return\n}\n");
  free(A);
  free(B);
  free(C);
  if (G.b.oom) {
    nv_sb_free(&G.b);
    return NULL;
  }
  return G.b.s;
}
