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
#include "../support/util.h"
#include "codegen.h"

typedef enum { CV_NONE, CV_EXT } stage_conv;

typedef struct gemm_gen {
  nv_sbuf b;
  int tmp;                       /* SSA name counter */
  const char *T;                 /* accumulator (and C) element type */
  const char *TO;                /* A's and B's element type */
  const char *TS;                /* the shared-memory tiles' element type */
  stage_conv conv;               /* TO -> TS on staging */
  bool ta, tb;                   /* A stored K x M, B stored N x K */
  int64_t M, N, K;
  cfg_gemm_simt_schedule s;
  bool sim;
  char As[96], Bs[96], acc[96];  /* memref types */
  const cg_gemm_operands *o;
  char coff[24];                 /* views: the offset of C's view of the current batch point */
} gemm_gen;

#define P(...) nv_sb_printf(&g->b, __VA_ARGS__)

static int fresh(gemm_gen *g) { return g->tmp++; }

/* An index constant, as a fresh SSA value. */
static int cidx(gemm_gen *g, int64_t v) {
  int t = fresh(g);
  P("%%t%d = arith.constant %lld : index\n", t, (long long)v);
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

/* Stages one operand tile: LD x WD elements of the logical ROWS x COLS
 * operand SRC (row index = ROW0 + r, column = COL0 + c) into DST[c][r]
 * (TRANSPOSE) or DST[r][c], zeros outside SRC.  SRC is stored as the
 * logical matrix or, with SWAP, its transpose: then consecutive threads
 * take consecutive rows (contiguous in memory), else columns.  Each value
 * is converted by g->conv (extended to f32, or kept). */
static void stage(gemm_gen *g, const char *src, const char *srct, bool swap, const char *dst, const char *dstt,
                  int64_t rows, int64_t cols, const char *row0, const char *col0, int64_t wd, int64_t count,
                  bool transpose) {
  /* a loop, not unrolled text: unrolled, LLVM hoists every address out of
   * the K loop and the kernel runs out of registers */
  int cwd = cidx(g, swap ? count / wd : wd), crows = cidx(g, rows), ccols = cidx(g, cols), ccount = cidx(g, count);
  int cnt = cidx(g, g->s.threads), citer = cidx(g, (count + g->s.threads - 1) / g->s.threads);
  int si = fresh(g), off = fresh(g), e = fresh(g), ine = fresh(g);
  P("scf.for %%t%d = %%c0 to %%t%d step %%c1 {\n%%t%d = arith.muli %%t%d, %%t%d : index\n"
    "%%t%d = arith.addi %%tx, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\nscf.if %%t%d {\n",
    si, citer, off, si, cnt, e, off, ine, e, ccount, ine);
  int r = fresh(g), c = fresh(g), gr = fresh(g), gc = fresh(g);
  if (swap)
    P("%%t%d = arith.remui %%t%d, %%t%d : index\n%%t%d = arith.divui %%t%d, %%t%d : index\n", r, e, cwd, c, e, cwd);
  else
    P("%%t%d = arith.divui %%t%d, %%t%d : index\n%%t%d = arith.remui %%t%d, %%t%d : index\n", r, e, cwd, c, e, cwd);
  P("%%t%d = arith.addi %s, %%t%d : index\n%%t%d = arith.addi %s, %%t%d : index\n", gr, row0, r, gc, col0, c);
  int ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g), v = fresh(g), l = fresh(g);
  P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
    "%%t%d = arith.andi %%t%d, %%t%d : i1\n",
    ok1, gr, crows, ok2, gc, ccols, ok, ok1, ok2);
  P("%%t%d = scf.if %%t%d -> (%s) {\n%%t%d = memref.load %s[%%t%d, %%t%d] : %s\n", v, ok, g->TS, l, src,
    swap ? gc : gr, swap ? gr : gc, srct);
  int y = l;
  if (g->conv == CV_EXT) {
    y = fresh(g);
    P("%%t%d = arith.extf %%t%d : %s to %s\n", y, l, g->TO, g->TS);
  }
  P("scf.yield %%t%d : %s\n} else {\nscf.yield %%zs : %s\n}\n", y, g->TS, g->TS);
  if (transpose) P("memref.store %%t%d, %s[%%t%d, %%t%d] : %s\n", v, dst, c, r, dstt);
  else P("memref.store %%t%d, %s[%%t%d, %%t%d] : %s\n", v, dst, r, c, dstt);
  P("}\n}\n");
}

/* Whether memref type T (a matrix, maybe a view) has its rows' starts 16
 * bytes apart by multiples (N elements of 16 bytes: the last stride 1, the
 * other stride, the static offset and every batch stride BSTRIDE of the
 * view multiples of N) and its last dim a multiple of N: then a vector of
 * N elements at a column that is a multiple of N is whole and aligned (the
 * buffers themselves start 256-byte aligned). */
static bool rows_aligned(MlirType t, MlirType full, bool views, int nbatch, const int64_t *bstride, int n) {
  int64_t st[2], off = 0, fst[8], foff = 0;
  if (mlirShapedTypeGetRank(t) != 2 || mlirShapedTypeGetDimSize(t, 1) % n ||
      mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t, st, &off)))
    return false;
  if (st[1] != 1 || st[0] % n) return false;
  /* a view's offset is the full operand's (static) plus the batch point's */
  if (!views) return off != mlirShapedTypeGetDynamicStrideOrOffset() && off % n == 0;
  if (mlirShapedTypeGetRank(full) > 8 || mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(full, fst, &foff)) ||
      foff == mlirShapedTypeGetDynamicStrideOrOffset() || foff % n)
    return false;
  for (int j = 0; j < nbatch; j++)
    if (bstride[j] % n) return false;
  return true;
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

/* %row0 and %col0 of the block, then the K loop over tiles of BK: in the
 * GPU form carrying the NACC accumulators of type T (initially INIT) as
 * iter_args, their results %kres; returns the SSA number of BK. */
static int open_k_loop(gemm_gen *g, int bm, int bn, int bk, int nacc, const char *init, const char *T) {
  int cbm = cidx(g, bm), cbn = cidx(g, bn), ck = cidx(g, g->K), cbk = cidx(g, bk);
  P("%%row0 = arith.muli %%by, %%t%d : index\n%%col0 = arith.muli %%bx, %%t%d : index\n", cbm, cbn);
  if (g->sim) {
    P("scf.for %%k0 = %%c0 to %%t%d step %%t%d {\n", ck, cbk);
    return cbk;
  }
  P("%%kres:%d = scf.for %%k0 = %%c0 to %%t%d step %%t%d iter_args(", nacc, ck, cbk);
  for (int i = 0; i < nacc; i++) P("%s%%x%d = %s", i ? ", " : "", i, init);
  P(") -> (");
  for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", T);
  P(") {\n");
  return cbk;
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
  int cbk = open_k_loop(g, s->bm, s->bn, s->bk, nacc, "%zero", g->T);
  phase_begin(g);
  /* A tile: BM rows x BK columns of A at (row0, k0), stored k-major */
  stage(g, "%A", At, g->ta, "%As", g->As, g->M, g->K, "%row0", "%k0", s->bk, (int64_t)s->bm * s->bk, true);
  /* B tile: BK rows x BN columns of B at (k0, col0) */
  stage(g, "%B", Bt, g->tb, "%Bs", g->Bs, g->K, g->N, "%k0", "%col0", s->bn, (int64_t)s->bk * s->bn, false);
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
    P(") -> (");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", g->T);
    P(") {\n");
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
      if (g->o->overwrite)
        P("memref.store %s, %%C[%%t%d, %%t%d] : %s\n}\n", acc, gri, gcj, Ct);
      else
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

/* func.func private @NAME(%A, %B, %C) with the constants both forms use
 * (%gz: the batch's points); where the matrices are views, the arguments
 * are the operands themselves, %Af, %Bf, %Cf, whose views batch_views
 * makes %A, %B, %C. */
static void open_func(gemm_gen *g, const char *name, const char *A, const char *B, const char *C, int64_t gx,
                      int64_t gy, int threads) {
  int64_t gz = 1;
  if (g->o->views) {
    char *fa = type_str(g->o->fa), *fb = type_str(g->o->fb), *fc = type_str(g->o->fc);
    P("func.func private @%s(%%Af: %s, %%Bf: %s, %%Cf: %s) {\n", name, fa, fb, fc);
    free(fa), free(fb), free(fc);
    for (int r = 0; r < g->o->nbatch; r++) gz *= g->o->bsize[r];
  } else {
    P("func.func private @%s(%%A: %s, %%B: %s, %%C: %s) {\n", name, A, B, C);
  }
  P("%%c0 = arith.constant 0 : index\n%%c1 = arith.constant 1 : index\n%%gx = arith.constant %lld : index\n"
    "%%gy = arith.constant %lld : index\n%%gz = arith.constant %lld : index\n%%nt = arith.constant %d : index\n",
    (long long)gx, (long long)gy, (long long)gz, threads);
}

/* The matrices %A, %B, %C (types A, B, C) for the batch point BZ: each a
 * view of its operand's buffer (memref.reinterpret_cast) at the operand's
 * offset plus the batch indices (the last loop fastest) times its strides. */
static void batch_views(gemm_gen *g, const char *A, const char *B, const char *C, const char *bz) {
  const cg_gemm_operands *o = g->o;
  if (!o->views) return;
  int bi[CG_GEMM_MAXB];
  char q[24];
  snprintf(q, sizeof q, "%s", bz);
  for (int r = o->nbatch - 1; r >= 0; r--) {
    int cs = cidx(g, o->bsize[r]), rem = fresh(g), div = fresh(g);
    P("%%t%d = arith.remui %s, %%t%d : index\n%%t%d = arith.divui %s, %%t%d : index\n", rem, q, cs, div, q, cs);
    bi[r] = rem;
    snprintf(q, sizeof q, "%%t%d", div);
  }
  const char *names[3] = {"A", "B", "C"}, *views[3] = {A, B, C};
  MlirType full[3] = {o->fa, o->fb, o->fc}, vt[3] = {o->a, o->b, o->c};
  for (int i = 0; i < 3; i++) {
    intptr_t rank = mlirShapedTypeGetRank(full[i]);
    MlirType base = mlirMemRefTypeGet(mlirShapedTypeGetElementType(full[i]), 0, NULL, mlirAttributeGetNull(),
                                      mlirMemRefTypeGetMemorySpace(full[i]));
    char *ft = type_str(full[i]), *bt = type_str(base);
    int md = fresh(g);
    P("%%t%d:%d = memref.extract_strided_metadata %%%sf : %s -> %s, index", md, (int)(2 + 2 * rank), names[i], ft, bt);
    for (intptr_t r = 0; r < 2 * rank; r++) P(", index");
    P("\n");
    char cur[24];
    snprintf(cur, sizeof cur, "%%t%d#1", md);
    for (int j = 0; j < o->nbatch; j++) {
      if (!o->bstride[i][j]) continue;
      int cst = cidx(g, o->bstride[i][j]), mul = fresh(g), add = fresh(g);
      P("%%t%d = arith.muli %%t%d, %%t%d : index\n%%t%d = arith.addi %s, %%t%d : index\n", mul, bi[j], cst, add, cur,
        mul);
      snprintf(cur, sizeof cur, "%%t%d", add);
    }
    if (i == 2) snprintf(g->coff, sizeof g->coff, "%s", cur);
    int64_t st[2], off;
    (void)mlirMemRefTypeGetStridesAndOffset(vt[i], st, &off);
    P("%%%s = memref.reinterpret_cast %%t%d#0 to offset: [%s], sizes: [%lld, %lld], strides: [%lld, %lld] : %s to %s\n",
      names[i], md, cur, (long long)mlirShapedTypeGetDimSize(vt[i], 0), (long long)mlirShapedTypeGetDimSize(vt[i], 1),
      (long long)st[0], (long long)st[1], bt, views[i]);
    free(ft);
    free(bt);
  }
}

/* Frees the type strings A, B, C; returns G's text, or NULL when out of
 * memory. */
static char *finish_text(gemm_gen *g, char *A, char *B, char *C) {
  free(A);
  free(B);
  free(C);
  if (g->b.oom) {
    nv_sb_free(&g->b);
    return NULL;
  }
  return g->b.s;
}

/* Closes the launch (or the sim form's block loops, after freeing its
 * buffers: the names of FREE, with their types) and the function; returns
 * the text, or NULL when out of memory. */
static char *close_func(gemm_gen *g, const char *const *free_names, const char *const *free_types, char *A, char *B,
                        char *C) {
  if (g->sim) {
    for (int i = 0; free_names[i]; i++) P("memref.dealloc %s : %s\n", free_names[i], free_types[i]);
    P("}\n}\n%s", g->o->views ? "}\n" : "");
  } else
    P("gpu.terminator\n}\n");
  P("return\n}\n");
  return finish_text(g, A, B, C);
}

static const char *elem_name(MlirType t) {
  MlirType e = mlirShapedTypeGetElementType(t);
  return mlirTypeIsAF64(e) ? "f64" : mlirTypeIsABF16(e) ? "bf16" : mlirTypeIsAF16(e) ? "f16" : "f32";
}

/* G's sizes and element types from the operands O. */
static void gen_operands(gemm_gen *g, const cg_gemm_operands *o) {
  g->T = elem_name(o->c);
  g->TO = elem_name(o->a);
  g->ta = o->ta;
  g->tb = o->tb;
  g->M = mlirShapedTypeGetDimSize(o->a, o->ta ? 1 : 0);
  g->K = mlirShapedTypeGetDimSize(o->a, o->ta ? 0 : 1);
  g->N = mlirShapedTypeGetDimSize(o->b, o->tb ? 0 : 1);
}

char *cg_gemm_text(const char *name, const cg_gemm_operands *o, const struct cfg_gemm_simt_schedule *s, bool sim) {
  gemm_gen G = {.s = *s, .sim = sim, .o = o}, *g = &G;
  char *A = type_str(o->a), *B = type_str(o->b), *C = type_str(o->c);
  gen_operands(g, o);
  G.TS = G.T;
  G.conv = strcmp(G.TO, G.T) ? CV_EXT : CV_NONE;
  const char *space = sim ? "" : ", #gpu.address_space<workgroup>";
  snprintf(G.As, sizeof G.As, "memref<%dx%dx%s%s>", s->bk, s->bm, G.T, space);
  snprintf(G.Bs, sizeof G.Bs, "memref<%dx%dx%s%s>", s->bk, s->bn, G.T, space);
  if (sim) snprintf(G.acc, sizeof G.acc, "memref<%dx%dx%dx%s>", s->threads, s->tm, s->tn, G.T);
  int64_t gx = (G.N + s->bn - 1) / s->bn, gy = (G.M + s->bm - 1) / s->bm;
  open_func(g, name, A, B, C, gx, gy, s->threads);
  if (sim) {
    if (o->views) P("scf.for %%bz = %%c0 to %%gz step %%c1 {\n");
    batch_views(g, A, B, C, "%bz");
    P("scf.for %%by = %%c0 to %%gy step %%c1 {\nscf.for %%bx = %%c0 to %%gx step %%c1 {\n");
    P("%%zero = arith.constant 0.0 : %s\n%%zs = arith.constant 0.0 : %s\n%%As = memref.alloc() : %s\n"
      "%%Bs = memref.alloc() : %s\n%%acc = memref.alloc() : %s\n",
      G.T, G.TS, G.As, G.Bs, G.acc);
  } else {
    P("gpu.launch blocks(%%bx, %%by, %%bz) in (%%sx = %%gx, %%sy = %%gy, %%sz = %%gz) threads(%%tx, %%ty, %%tz) in "
      "(%%ux = %%nt, %%uy = %%c1, %%uz = %%c1) workgroup(%%As : %s, %%Bs : %s) {\n",
      G.As, G.Bs);
    batch_views(g, A, B, C, "%bz");
    P("%%zero = arith.constant 0.0 : %s\n%%zs = arith.constant 0.0 : %s\n", G.T, G.TS);
  }
  gen_body(g, A, B, C);
  const char *names[] = {"%As", "%Bs", "%acc", NULL}, *types[] = {G.As, G.Bs, G.acc};
  return close_func(g, names, types, A, B, C);
}

/* ---- tensor cores: mma.sync with tf32, bf16 or f16 operands -----------
 *
 * f32 operands with --matmul-precision=tf32 take mma.sync.m16n8k8 .tf32,
 * 16-bit ones (a contraction of --precision=bf16/fp16 values that reads
 * them itself, half_contract.c) mma.sync.m16n8k16 .bf16/.f16; both
 * accumulate in f32 (sm_80+).  The block tile, warp layout and warp tile
 * are cfg_gemm's (its split-K is not generated).  tf32: the block stages A
 * (BM x BK, row-major) and B (BK x BN) in shared memory, one stage, the
 * values rounded to tf32 as they are staged (tc_body); 16-bit operands go
 * through a pipeline of stages and ldmatrix (p16_body, below).  Each warp
 * computes its WTM x WTN warp tile as (WTM/16) x
 * (WTN/8) mma tiles, one mma per tile and k step (8 or 16), the
 * accumulators (vector<2x2xf32> each) carried through the K loop.
 * Fragments follow the PTX ISA's layouts, with g = lane / 4, t = lane % 4:
 *   tf32 A register i: row g + 8 (i % 2), column t + 4 (i / 2)
 *   tf32 B register i: row t + 4 i, column g
 *   16-bit A register r, half j: row g + 8 (r % 2), column 2t + j + 8 (r / 2)
 *   16-bit B register r, half j: row 2t + j + 8 r, column g
 *   C element (r, c) of the 2x2 vector: row g + 8 r, column 2 t + c.
 * The sim form cannot run a warp-wide instruction one thread at a time: its
 * threads store their fragments to a per-warp buffer in one phase and, in
 * the next, each computes its accumulators from the fragments of its warp's
 * 32 lanes, addressed by the same layouts read backwards: tf32 element
 * (row, k) of A is register (row / 8) + 2 (k / 4) of lane (row % 8) * 4 +
 * k % 4, element (k, col) of B register k / 4 of lane col * 4 + k % 4;
 * 16-bit element (row, k) of A is half k % 2 of register (row / 8) +
 * 2 (k / 8) of lane (row % 8) * 4 + (k % 8) / 2, element (k, col) of B half
 * k % 2 of register k / 8 of lane col * 4 + (k % 8) / 2.  Products of the
 * (rounded) operands are exact in f32, so only the order of the sums can
 * differ from the GPU's. */

typedef struct tc_gen {
  gemm_gen *g;
  const cfg_gemm_schedule *s;
  int mi, ni;             /* mma tiles per warp: WTM/16, WTN/8 */
  bool h16;               /* 16-bit operands: m16n8k16 (else tf32, m16n8k8) */
  int kstep;              /* the mma's k: 16 or 8 */
  int fa, fb;             /* operand values per lane and mma tile: 8 and 4, or 4 and 2 */
  char fA[96], fB[96], accm[96];
  const char *Wt;         /* split-K: C's tiles go to the workspace %W (this type) at [%bz, row, col] */
} tc_gen;

/* %warp, %lane, %g, %t, %m0, %n0 (warp tile origin in the block tile) of %tx. */
static void warp_pos(tc_gen *c) {
  gemm_gen *g = c->g;
  int c32 = cidx(g, 32), c4 = cidx(g, 4), cwn = cidx(g, c->s->wn), cwtm = cidx(g, c->s->warp_tile_m),
      cwtn = cidx(g, c->s->warp_tile_n);
  P("%%warp = arith.divui %%tx, %%t%d : index\n%%lane = arith.remui %%tx, %%t%d : index\n", c32, c32);
  P("%%g = arith.divui %%lane, %%t%d : index\n%%t = arith.remui %%lane, %%t%d : index\n", c4, c4);
  P("%%wi = arith.divui %%warp, %%t%d : index\n%%wj = arith.remui %%warp, %%t%d : index\n", cwn, cwn);
  P("%%m0 = arith.muli %%wi, %%t%d : index\n%%n0 = arith.muli %%wj, %%t%d : index\n", cwtm, cwtn);
}

/* %t<result> = BASE + C (index). */
static int add_c(gemm_gen *g, const char *base, int64_t v) {
  int cv = cidx(g, v), r = fresh(g);
  P("%%t%d = arith.addi %s, %%t%d : index\n", r, base, cv);
  return r;
}

/* Sim: acc[tx][idx][i] += sum_k A(row, k) B(k, col) over the fragments of
 * the warp, for this thread's element i of mma tile (MI, NI). */
static void emulate_mma(tc_gen *c, int mi, int ni) {
  gemm_gen *g = c->g;
  int idx = mi * c->ni + ni;
  int c0 = cidx(g, 0), c1 = cidx(g, 1), c8 = cidx(g, 8), c4 = cidx(g, 4), c2 = cidx(g, 2), ck = cidx(g, c->kstep);
  int cmi = cidx(g, mi), cni = cidx(g, ni), cidxv = cidx(g, idx);
  for (int i = 0; i < 4; i++) {
    int ci = cidx(g, i), crh = cidx(g, i / 2), ccl = cidx(g, i % 2);
    int old = fresh(g), sum = fresh(g);
    P("%%t%d = memref.load %%acc[%%tx, %%t%d, %%t%d] : %s\n", old, cidxv, ci, c->accm);
    P("%%t%d = scf.for %%k = %%t%d to %%t%d step %%t%d iter_args(%%s = %%t%d) -> (f32) {\n", sum, c0, ck, c1, old);
    /* the lane and the value index within it, of A (row g + 8 (i / 2), k) and of B (k, col 2t + i % 2) */
    int col2 = fresh(g), col = fresh(g), la0 = fresh(g), lb0 = fresh(g), la = fresh(g), lb = fresh(g), ia = fresh(g),
        ib = fresh(g);
    P("%%t%d = arith.muli %%t, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", col2, c2, col, col2, ccl);
    P("%%t%d = arith.muli %%g, %%t%d : index\n%%t%d = arith.muli %%t%d, %%t%d : index\n", la0, c4, lb0, col, c4);
    if (c->h16) {
      int k8 = fresh(g), k2 = fresh(g), kh = fresh(g), kj = fresh(g), kh2 = fresh(g), kh4 = fresh(g), r2 = fresh(g),
          s0 = fresh(g), c7 = cidx(g, 7);
      P("%%t%d = arith.andi %%k, %%t%d : index\n%%t%d = arith.divui %%t%d, %%t%d : index\n"
        "%%t%d = arith.divui %%k, %%t%d : index\n%%t%d = arith.remui %%k, %%t%d : index\n",
        k8, c7, k2, k8, c2, kh, c8, kj, c2);
      P("%%t%d = arith.addi %%t%d, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", la, la0, k2, lb, lb0, k2);
      /* A: 2 (i / 2) + 4 (k / 8) + k % 2; B: 2 (k / 8) + k % 2 */
      P("%%t%d = arith.muli %%t%d, %%t%d : index\n%%t%d = arith.muli %%t%d, %%t%d : index\n"
        "%%t%d = arith.muli %%t%d, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n"
        "%%t%d = arith.addi %%t%d, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n",
        kh2, kh, c2, kh4, kh, c4, r2, crh, c2, s0, r2, kh4, ia, s0, kj, ib, kh2, kj);
    } else {
      int k4 = fresh(g), kq = fresh(g), kq2 = fresh(g);
      P("%%t%d = arith.remui %%k, %%t%d : index\n%%t%d = arith.divui %%k, %%t%d : index\n", k4, c4, kq, c4);
      P("%%t%d = arith.addi %%t%d, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", la, la0, k4, lb, lb0, k4);
      /* A: i / 2 + 2 (k / 4); B: k / 4 */
      P("%%t%d = arith.muli %%t%d, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n"
        "%%t%d = arith.addi %%t%d, %%c0 : index\n",
        kq2, kq, c2, ia, kq2, crh, ib, kq);
    }
    int av = fresh(g), bv = fresh(g), nv = fresh(g);
    P("%%t%d = memref.load %%fA[%%warp, %%t%d, %%t%d, %%t%d] : %s\n", av, la, cmi, ia, c->fA);
    P("%%t%d = memref.load %%fB[%%warp, %%t%d, %%t%d, %%t%d] : %s\n", bv, lb, cni, ib, c->fB);
    if (c->h16) {
      int ax = fresh(g), bx = fresh(g);
      P("%%t%d = arith.extf %%t%d : %s to f32\n%%t%d = arith.extf %%t%d : %s to f32\n", ax, av, g->TS, bx, bv, g->TS);
      av = ax, bv = bx;
    }
    P("%%t%d = math.fma %%t%d, %%t%d, %%s : f32\nscf.yield %%t%d : f32\n}\n", nv, av, bv, nv);
    P("memref.store %%t%d, %%acc[%%tx, %%t%d, %%t%d] : %s\n", sum, cidxv, ci, c->accm);
  }
}

/* GPU: the mma of tile IDX, its operand registers A and B, accumulator
 * %y<IDX>; returns the SSA number of the new accumulator. */
static int mma(tc_gen *c, int idx, const int *a, const int *b) {
  gemm_gen *g = c->g;
  const char *V = "vector<2x2xf32>";
  int d = fresh(g);
  if (!c->h16) {
    int fa = fresh(g), fb = fresh(g);
    P("%%t%d = vector.from_elements %%t%d, %%t%d, %%t%d, %%t%d : vector<4x1xf32>\n", fa, a[0], a[1], a[2], a[3]);
    P("%%t%d = vector.from_elements %%t%d, %%t%d : vector<2x1xf32>\n", fb, b[0], b[1]);
    P("%%t%d = nvgpu.mma.sync (%%t%d, %%t%d, %%y%d) {mmaShape = [16, 8, 8], tf32Enabled} : "
      "(vector<4x1xf32>, vector<2x1xf32>, %s) -> %s\n",
      d, fa, fb, idx, V, V);
    return d;
  }
  /* nvgpu.mma.sync has no bf16 form: the NVVM op, on the accumulator's four values */
  int cv[4], dv[4];
  for (int i = 0; i < 4; i++) {
    cv[i] = fresh(g);
    P("%%t%d = vector.extract %%y%d[%d, %d] : f32 from %s\n", cv[i], idx, i / 2, i % 2, V);
  }
  const char *rt = strcmp(g->TS, "bf16") ? "vector<2xf16>" : "i32";
  int st = fresh(g);
  P("%%t%d = nvvm.mma.sync A[%%t%d, %%t%d, %%t%d, %%t%d] B[%%t%d, %%t%d] C[%%t%d, %%t%d, %%t%d, %%t%d] "
    "{layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, multiplicandAPtxType = #nvvm.mma_type<%s>, "
    "multiplicandBPtxType = #nvvm.mma_type<%s>, shape = #nvvm.shape<m = 16, n = 8, k = 16>} : (%s, %s, f32) -> "
    "!llvm.struct<(f32, f32, f32, f32)>\n",
    st, a[0], a[1], a[2], a[3], b[0], b[1], cv[0], cv[1], cv[2], cv[3], g->TS, g->TS, rt, rt);
  for (int i = 0; i < 4; i++) {
    dv[i] = fresh(g);
    P("%%t%d = llvm.extractvalue %%t%d[%d] : !llvm.struct<(f32, f32, f32, f32)>\n", dv[i], st, i);
  }
  P("%%t%d = vector.from_elements %%t%d, %%t%d, %%t%d, %%t%d : %s\n", d, dv[0], dv[1], dv[2], dv[3], V);
  return d;
}

/* The epilogue (o->epi) for the element (ROW, COL) of C's (view's) matrix
 * whose product is V (f32, C's new value): E's loop indices (the element's
 * place in C's full buffer), C stored where it is read later, E's operands
 * loaded, E's body (a cast of its arguments and loop indices marked
 * nova.epilogue, which cuda.c replaces by E's ops), its result stored in
 * Y. */
static void epi_store(gemm_gen *g, const char *Ct, int row, int col, int v) {
  const cg_gemm_operands *o = g->o;
  const cg_gemm_epilogue *e = &o->epi;
  int idx[8];
  if (!o->views) idx[0] = row, idx[1] = col;
  else { /* C's full buffer is contiguous: its indices from the element's offset */
    int64_t st[2], off, fst[8], foff;
    (void)mlirMemRefTypeGetStridesAndOffset(o->c, st, &off);
    (void)mlirMemRefTypeGetStridesAndOffset(o->fc, fst, &foff);
    int c0 = cidx(g, st[0]), c1 = cidx(g, st[1]), cf = cidx(g, foff), a = fresh(g), b = fresh(g), s1 = fresh(g),
        s2 = fresh(g), lin = fresh(g);
    P("%%t%d = arith.muli %%t%d, %%t%d : index\n%%t%d = arith.muli %%t%d, %%t%d : index\n"
      "%%t%d = arith.addi %s, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n"
      "%%t%d = arith.subi %%t%d, %%t%d : index\n",
      a, row, c0, b, col, c1, s1, g->coff, a, s2, s1, b, lin, s2, cf);
    for (int k = e->nloops - 1; k >= 0; k--) {
      int64_t dim = mlirShapedTypeGetDimSize(o->fc, k);
      int cd = cidx(g, dim);
      idx[k] = fresh(g);
      P("%%t%d = arith.remui %%t%d, %%t%d : index\n", idx[k], lin, cd);
      if (k) {
        int q = fresh(g);
        P("%%t%d = arith.divui %%t%d, %%t%d : index\n", q, lin, cd);
        lin = q;
      }
    }
  }
  if (e->store_c) P("memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n", v, row, col, Ct);
  int args[CG_EPI_MAX], yarg = -1;
  char *ts[CG_EPI_MAX] = {NULL};
  for (int i = 0; i < e->n; i++) {
    ts[i] = type_str(e->elem[i]);
    if (e->role[i] == CG_EPI_C) {
      args[i] = v;
      continue;
    }
    if (e->role[i] == CG_EPI_Y) yarg = e->arg[i];
    char *mt = type_str(e->type[i]);
    args[i] = fresh(g);
    if (!e->used[i]) {
      P("%%t%d = arith.constant %s : %s\n", args[i], mlirTypeIsAFloat(e->elem[i]) ? "0.0" : "0", ts[i]);
    } else {
      P("%%t%d = memref.load %%E%d[", args[i], e->arg[i]);
      int r = e->role[i] == CG_EPI_Y ? e->nloops : e->rank[i];
      for (int k = 0; k < r; k++) P("%s%%t%d", k ? ", " : "", idx[e->role[i] == CG_EPI_Y ? k : e->map[i][k]]);
      P("] : %s\n", mt);
    }
    free(mt);
  }
  int res = fresh(g);
  P("%%t%d = builtin.unrealized_conversion_cast ", res);
  for (int i = 0; i < e->n; i++) P("%s%%t%d", i ? ", " : "", args[i]);
  for (int k = 0; k < e->nloops; k++) P(", %%t%d", idx[k]);
  P(" : ");
  for (int i = 0; i < e->n; i++) P("%s%s", i ? ", " : "", ts[i]);
  for (int k = 0; k < e->nloops; k++) P(", index");
  P(" to %s {nova.epilogue}\n", ts[e->n - 1]);
  if (e->y_is_c && !o->views) P("memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n", res, row, col, Ct);
  else {
    char *yt = type_str(e->y_is_c ? o->fc : e->type[e->n - 1]);
    if (e->y_is_c) P("memref.store %%t%d, %%Cf[", res);
    else P("memref.store %%t%d, %%E%d[", res, yarg);
    for (int k = 0; k < e->nloops; k++) P("%s%%t%d", k ? ", " : "", idx[k]);
    P("] : %s\n", yt);
    free(yt);
  }
  for (int i = 0; i < e->n; i++) free(ts[i]);
}

/* Element I of the thread's accumulators of mma tile IDX, as the fresh
 * value returned (sim: from its slice of %acc; GPU: from the K loop's
 * results). */
static int acc_value(tc_gen *c, int idx, int i) {
  gemm_gen *g = c->g;
  int v = fresh(g);
  if (g->sim) {
    int cidxv = cidx(g, idx), ci = cidx(g, i);
    P("%%t%d = memref.load %%acc[%%tx, %%t%d, %%t%d] : %s\n", v, cidxv, ci, c->accm);
  } else
    P("%%t%d = vector.extract %%kres#%d[%d, %d] : f32 from vector<2x2xf32>\n", v, idx, i / 2, i % 2);
  return v;
}

/* With an epilogue: the block's accumulators go through shared memory
 * (%Cs, BM x (BN + 4) f32 over the stages, which the K loop no longer
 * needs), then the block's threads take its elements in order (a warp a
 * row's consecutive columns: coalesced loads of the epilogue's operands and
 * stores) and apply the epilogue once each, in a loop: one copy of its ops,
 * not one per register. */
static void tc_store_staged(tc_gen *c, const char *Ct) {
  gemm_gen *g = c->g;
  const cfg_gemm_schedule *s = c->s;
  int pitch = s->bn + 4;
  char cst[96];
  snprintf(cst, sizeof cst, "memref<%dx%dxf32%s>", s->bm, pitch, g->sim ? "" : ", #gpu.address_space<workgroup>");
  if (g->sim) P("%%Cs = memref.alloc() : %s\n", cst);
  else
    P("gpu.barrier\n%%Cs = memref.view %%dyn[%%c0][] : memref<?xi8, #gpu.address_space<workgroup>> to %s\n", cst);
  phase_begin(g);
  if (g->sim) warp_pos(c);
  int c2 = cidx(g, 2);
  P("%%sr0 = arith.addi %%m0, %%g : index\n%%st2 = arith.muli %%t, %%t%d : index\n"
    "%%sc0 = arith.addi %%n0, %%st2 : index\n", c2);
  for (int mi = 0; mi < c->mi; mi++)
    for (int ni = 0; ni < c->ni; ni++)
      for (int i = 0; i < 4; i++) {
        int cr = cidx(g, mi * 16 + 8 * (i / 2)), cc = cidx(g, ni * 8 + i % 2), r = fresh(g), col = fresh(g);
        P("%%t%d = arith.addi %%sr0, %%t%d : index\n%%t%d = arith.addi %%sc0, %%t%d : index\n", r, cr, col, cc);
        int v = acc_value(c, mi * c->ni + ni, i);
        P("memref.store %%t%d, %%Cs[%%t%d, %%t%d] : %s\n", v, r, col, cst);
      }
  phase_end(g);
  if (!g->sim) P("gpu.barrier\n");
  phase_begin(g);
  int64_t n = (int64_t)s->bm * s->bn;
  int cnq = cidx(g, (n + s->threads - 1) / s->threads), cnt = cidx(g, s->threads), cn = cidx(g, n),
      cbn = cidx(g, s->bn), cm = cidx(g, g->M), cN = cidx(g, g->N);
  int q = fresh(g), e0 = fresh(g), e = fresh(g), in = fresh(g), r = fresh(g), cc = fresh(g), row = fresh(g),
      col = fresh(g), ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g), v = fresh(g);
  P("scf.for %%t%d = %%c0 to %%t%d step %%c1 {\n%%t%d = arith.muli %%t%d, %%t%d : index\n"
    "%%t%d = arith.addi %%t%d, %%tx : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\nscf.if %%t%d {\n",
    q, cnq, e0, q, cnt, e, e0, in, e, cn, in);
  P("%%t%d = arith.divui %%t%d, %%t%d : index\n%%t%d = arith.remui %%t%d, %%t%d : index\n"
    "%%t%d = arith.addi %%row0, %%t%d : index\n%%t%d = arith.addi %%col0, %%t%d : index\n",
    r, e, cbn, cc, e, cbn, row, r, col, cc);
  P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
    "%%t%d = arith.andi %%t%d, %%t%d : i1\nscf.if %%t%d {\n%%t%d = memref.load %%Cs[%%t%d, %%t%d] : %s\n",
    ok1, row, cm, ok2, col, cN, ok, ok1, ok2, ok, v, r, cc, cst);
  if (!g->o->overwrite) {
    int old = fresh(g), sum = fresh(g);
    P("%%t%d = memref.load %%C[%%t%d, %%t%d] : %s\n%%t%d = arith.addf %%t%d, %%t%d : f32\n", old, row, col, Ct, sum,
      old, v);
    v = sum;
  }
  epi_store(g, Ct, row, col, v);
  P("}\n}\n}\n");
  phase_end(g);
  if (g->sim) P("memref.dealloc %%Cs : %s\n", cst);
}

/* C (+)= the accumulators: element (r, cc) of mma tile (mi, ni) at row
 * g + 8r, column 2t + cc of the warp tile (or split-K's workspace). */
static void tc_store(tc_gen *c, const char *Ct) {
  gemm_gen *g = c->g;
  phase_begin(g);
  if (g->sim) warp_pos(c);
  int cm = cidx(g, g->M), cn = cidx(g, g->N), c2 = cidx(g, 2);
  P("%%gr0 = arith.addi %%row0, %%m0 : index\n%%gr1 = arith.addi %%gr0, %%g : index\n"
    "%%gc0 = arith.addi %%col0, %%n0 : index\n%%tt2 = arith.muli %%t, %%t%d : index\n"
    "%%gc1 = arith.addi %%gc0, %%tt2 : index\n",
    c2);
  for (int mi = 0; mi < c->mi; mi++)
    for (int ni = 0; ni < c->ni; ni++)
      for (int i = 0; i < 4; i++) {
        int cr = cidx(g, mi * 16 + 8 * (i / 2)), cc = cidx(g, ni * 8 + i % 2), row = fresh(g), col = fresh(g);
        P("%%t%d = arith.addi %%gr1, %%t%d : index\n%%t%d = arith.addi %%gc1, %%t%d : index\n", row, cr, col, cc);
        int ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g);
        P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
          "%%t%d = arith.andi %%t%d, %%t%d : i1\nscf.if %%t%d {\n",
          ok1, row, cm, ok2, col, cn, ok, ok1, ok2, ok);
        int v = acc_value(c, mi * c->ni + ni, i);
        int cv = fresh(g), sum = fresh(g);
        if (c->Wt)
          P("memref.store %%t%d, %%W[%%bz, %%t%d, %%t%d] : %s\n}\n", v, row, col, c->Wt);
        else if (g->o->overwrite)
          P("memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n}\n", v, row, col, Ct);
        else
          P("%%t%d = memref.load %%C[%%t%d, %%t%d] : %s\n%%t%d = arith.addf %%t%d, %%t%d : f32\n"
            "memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n}\n",
            cv, row, col, Ct, sum, cv, v, sum, row, col, Ct);
      }
  phase_end(g);
}

/* ---- the pipeline: S shared-memory stages filled by cp.async -----------
 *
 * Each operand's tile is staged as the operand is stored: A as [BM][BK]
 * (or, stored K x M, [BK][BM]), B as [BN][BK] (or, stored K x N, [BK][BN]),
 * S stages of both in (dynamic) shared memory, every row padded against
 * bank conflicts (tc_tiles).  Rows whose values allow it (rows_aligned) are
 * copied 16 bytes at a time by cp.async (cg: around L1), zero-filled past
 * the operand (a source size of 0); other operands value by value, loaded
 * and stored.  The K loop, over the BK-deep tiles:
 *   prologue: tiles 0 .. S-2 into stages 0 .. S-2, one commit group each;
 *   tile kt: wait until at most S-2 groups are pending (tile kt has landed,
 *   for this thread), barrier (for every thread; and every thread is done
 *   with stage (kt-1) % S), copy tile kt+S-1 into that stage, commit, and
 *   compute from stage kt % S;
 * with one stage: barrier, copy tile kt, wait for it, barrier, compute.
 * Tiles past K are zero-filled, never read from the operand.
 * tf32 fragments are loaded value by value (the layouts above, read from
 * the tile as stored) and rounded to tf32 there (to nearest, ties away
 * from zero, as cvt.rna.tf32.f32: the tensor cores then see the same
 * operands on the GPU and in the sim form).
 * 16-bit fragments come from ldmatrix: .x4 for an mma row tile of A (its four 8x8
 * matrices are the registers a0..a3), .x4 for two column tiles of B and .x2
 * for a last one (b0, b1 of each), .trans where the tile is stored with k
 * along its rows.  Lane l gives the address of row l % 8 of matrix l / 8;
 * without .trans lane (g, t) receives row g, values 2t and 2t+1 of each
 * matrix, with .trans values g of rows 2t and 2t+1.
 * The sim form runs the same stages and indices, copies as vector loads and
 * stores, and ldmatrix as what it does: every lane publishes its row
 * addresses to its warp, then gathers its registers from the rows the
 * other lanes named. */

typedef struct pipe {
  tc_gen *c;
  int S;                   /* stages */
  bool kca, kcb;           /* A stored M x K, B stored N x K: k along the staged rows */
  bool va, vb;             /* 16-byte copies */
  int64_t ar, ac, br, bc;  /* the staged tiles' rows and (unpadded) columns */
  int nbx4, nslot;         /* ldmatrix.x4 of B per k step (pairs of column tiles); all ldmatrix per k step */
  char addr[96];           /* sim: the row addresses [warp][lane][slot][2] */
  int split;               /* split-K: the K tiles of a batch point in SPLIT ranges of KTPS tiles */
  int64_t ktps;
} pipe;

/* Copies the TR x TC window at (OROW, OCOL) of SRC (type SRCT, SR x SC as
 * stored) into stage STG (an SSA name) of DST, zeros outside SRC; VEC:
 * 16 bytes at a time (then a piece is all in or all out of SRC).
 * Consecutive threads take consecutive pieces of a row. */
static void copy_tile(gemm_gen *g, const char *src, const char *srct, int64_t SR, int64_t SC, const char *orow,
                      const char *ocol, int64_t TR, int64_t TC, const char *dst, const char *dstt, const char *stg,
                      bool vec) {
  int w = !vec ? 1 : strcmp(g->TS, "f32") ? 8 : 4;
  int64_t n = TR * (TC / w);
  const char *V = !strcmp(g->TS, "bf16") ? "vector<8xbf16>" : !strcmp(g->TS, "f16") ? "vector<8xf16>" : "vector<4xf32>";
  int cwd = cidx(g, TC / w), cw = cidx(g, w), csr = cidx(g, SR), csc = cidx(g, SC), cn = cidx(g, n);
  int cnt = cidx(g, g->s.threads), citer = cidx(g, (n + g->s.threads - 1) / g->s.threads);
  int si = fresh(g), off = fresh(g), e = fresh(g), ine = fresh(g);
  P("scf.for %%t%d = %%c0 to %%t%d step %%c1 {\n%%t%d = arith.muli %%t%d, %%t%d : index\n"
    "%%t%d = arith.addi %%tx, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\nscf.if %%t%d {\n",
    si, citer, off, si, cnt, e, off, ine, e, cn, ine);
  int i = fresh(g), jv = fresh(g), j = fresh(g), gi = fresh(g), gj = fresh(g);
  P("%%t%d = arith.divui %%t%d, %%t%d : index\n%%t%d = arith.remui %%t%d, %%t%d : index\n"
    "%%t%d = arith.muli %%t%d, %%t%d : index\n",
    i, e, cwd, jv, e, cwd, j, jv, cw);
  P("%%t%d = arith.addi %s, %%t%d : index\n%%t%d = arith.addi %s, %%t%d : index\n", gi, orow, i, gj, ocol, j);
  int ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g);
  P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
    "%%t%d = arith.andi %%t%d, %%t%d : i1\n",
    ok1, gi, csr, ok2, gj, csc, ok, ok1, ok2);
  if (vec && !g->sim) {
    /* out of SRC: no byte read (source size 0), the address kept inside SRC */
    int si2 = fresh(g), sj2 = fresh(g), ns = fresh(g), tk = fresh(g);
    P("%%t%d = arith.select %%t%d, %%t%d, %%c0 : index\n%%t%d = arith.select %%t%d, %%t%d, %%c0 : index\n"
      "%%t%d = arith.select %%t%d, %%t%d, %%c0 : index\n",
      si2, ok, gi, sj2, ok, gj, ns, ok, cw);
    P("%%t%d = nvgpu.device_async_copy %s[%%t%d, %%t%d], %s[%s, %%t%d, %%t%d], %d, %%t%d {bypassL1} : %s to %s\n", tk,
      src, si2, sj2, dst, stg, i, j, w, ns, srct, dstt);
  } else if (vec) {
    int v = fresh(g), l = fresh(g), z = fresh(g);
    P("%%t%d = scf.if %%t%d -> (%s) {\n%%t%d = vector.load %s[%%t%d, %%t%d] : %s, %s\nscf.yield %%t%d : %s\n"
      "} else {\n%%t%d = arith.constant dense<0.0> : %s\nscf.yield %%t%d : %s\n}\n",
      v, ok, V, l, src, gi, gj, srct, V, l, V, z, V, z, V);
    P("vector.store %%t%d, %s[%s, %%t%d, %%t%d] : %s, %s\n", v, dst, stg, i, j, dstt, V);
  } else {
    int v = fresh(g), l = fresh(g);
    P("%%t%d = scf.if %%t%d -> (%s) {\n%%t%d = memref.load %s[%%t%d, %%t%d] : %s\nscf.yield %%t%d : %s\n"
      "} else {\nscf.yield %%zs : %s\n}\n",
      v, ok, g->TS, l, src, gi, gj, srct, l, g->TS, g->TS);
    P("memref.store %%t%d, %s[%s, %%t%d, %%t%d] : %s\n", v, dst, stg, i, j, dstt);
  }
  P("}\n}\n");
}

/* Both operands' tiles for the K offset KN into stage STG (SSA names). */
static void copy_tiles(pipe *p, const char *At, const char *Bt, const char *kn, const char *stg) {
  gemm_gen *g = p->c->g;
  if (p->kca) copy_tile(g, "%A", At, g->M, g->K, "%row0", kn, p->ar, p->ac, "%As", g->As, stg, p->va);
  else copy_tile(g, "%A", At, g->K, g->M, kn, "%row0", p->ar, p->ac, "%As", g->As, stg, p->va);
  if (p->kcb) copy_tile(g, "%B", Bt, g->N, g->K, "%col0", kn, p->br, p->bc, "%Bs", g->Bs, stg, p->vb);
  else copy_tile(g, "%B", Bt, g->K, g->N, kn, "%col0", p->br, p->bc, "%Bs", g->Bs, stg, p->vb);
}

/* %l8 (lane % 8), %q (lane / 8: the matrix whose row this lane names) and
 * its two bits %qa (q % 2) and %qb (q / 2); %q2 (for .x2: (lane % 16) / 8). */
static void ldm_lane(gemm_gen *g) {
  int c8 = cidx(g, 8), c2 = cidx(g, 2), c16 = cidx(g, 16), l16 = fresh(g);
  P("%%l8 = arith.remui %%lane, %%t%d : index\n%%q = arith.divui %%lane, %%t%d : index\n"
    "%%qa = arith.remui %%q, %%t%d : index\n%%qb = arith.divui %%q, %%t%d : index\n"
    "%%t%d = arith.remui %%lane, %%t%d : index\n%%q2 = arith.divui %%t%d, %%t%d : index\n",
    c8, c8, c2, c2, l16, c16, l16, c8);
}

/* %t<result> = A * 8 + B + C (SSA names; B and C may be NULL). */
static int lin8(gemm_gen *g, const char *a, const char *b, const char *c) {
  int c8 = cidx(g, 8), r = fresh(g);
  P("%%t%d = arith.muli %s, %%t%d : index\n", r, a, c8);
  const char *t[2] = {b, c};
  for (int i = 0; i < 2; i++)
    if (t[i]) {
      int n = fresh(g);
      P("%%t%d = arith.addi %%t%d, %s : index\n", n, r, t[i]);
      r = n;
    }
  return r;
}

/* The row and column this lane names for ldmatrix SLOT of the k step KS:
 * slots 0 .. mi-1 are A's row tiles, then B's pairs of column tiles, then
 * a last single one. */
static void ldm_addr(pipe *p, int slot, const char *ks, int *row, int *col) {
  tc_gen *c = p->c;
  gemm_gen *g = c->g;
  char b[24], q[24];
  if (slot < c->mi) { /* A: matrix q is rows 8 (q % 2), k 8 (q / 2) of the 16 x 16 tile */
    snprintf(b, sizeof b, "%%t%d", add_c(g, "%m0", slot * 16));
    if (p->kca) *row = lin8(g, "%qa", b, "%l8"), *col = lin8(g, "%qb", ks, NULL);
    else *row = lin8(g, "%qb", ks, "%l8"), *col = lin8(g, "%qa", b, NULL);
    return;
  }
  /* B: matrix q is column tile ni + q / 2, k 8 (q % 2) */
  int ni = 2 * (slot - c->mi);
  bool x2 = slot - c->mi >= p->nbx4;
  snprintf(b, sizeof b, "%%t%d", add_c(g, "%n0", ni * 8));
  snprintf(q, sizeof q, "%s", x2 ? "%q2" : "%qa");
  int n0 = x2 ? 0 : lin8(g, "%qb", b, NULL);
  char nb[24];
  snprintf(nb, sizeof nb, "%%t%d", n0);
  const char *nbase = x2 ? b : nb;
  if (p->kcb) {
    int r = fresh(g);
    P("%%t%d = arith.addi %s, %%l8 : index\n", r, nbase);
    *row = r, *col = lin8(g, q, ks, NULL);
  } else {
    *row = lin8(g, q, ks, "%l8");
    int r = fresh(g);
    P("%%t%d = arith.addi %s, %%c0 : index\n", r, nbase);
    *col = r;
  }
}

/* GPU: ldmatrix SLOT at k step KS from stage %sc; the registers (i32 for
 * bf16, vector<2xf16>) of A's row tile into A[slot], of B's column tiles
 * into B[ni]. */
static void ldm_gpu(pipe *p, int slot, const char *ks, int (*A)[4], int (*B)[2]) {
  tc_gen *c = p->c;
  gemm_gen *g = c->g;
  bool isa = slot < c->mi, x2 = !isa && slot - c->mi >= p->nbx4;
  int row, col, n = x2 ? 2 : 4, v = fresh(g);
  ldm_addr(p, slot, ks, &row, &col);
  P("%%t%d = nvgpu.ldmatrix %s[%%sc, %%t%d, %%t%d] {numTiles = %d : i32, transpose = %s} : %s -> vector<%dx2x%s>\n",
    v, isa ? "%As" : "%Bs", row, col, n, (isa ? p->kca : p->kcb) ? "false" : "true", isa ? g->As : g->Bs, n, g->TS);
  for (int i = 0; i < n; i++) {
    int r = fresh(g);
    P("%%t%d = vector.extract %%t%d[%d] : vector<2x%s> from vector<%dx2x%s>\n", r, v, i, g->TS, n, g->TS);
    if (!strcmp(g->TS, "bf16")) {
      int w = fresh(g), x = fresh(g);
      P("%%t%d = vector.bitcast %%t%d : vector<2xbf16> to vector<1xi32>\n%%t%d = vector.extract %%t%d[0] : i32 from "
        "vector<1xi32>\n",
        w, r, x, w);
      r = x;
    }
    if (isa) A[slot][i] = r;
    else B[2 * (slot - c->mi) + i / 2][i % 2] = r;
  }
}

/* Sim, one phase per call: every thread stores the addresses of its slots
 * at the k step KS; then every thread gathers its fragments (into %fA
 * [warp][lane][mi][2r + j], %fB [warp][lane][ni][2r + j]: register r, half
 * j) from the rows its warp's lanes named. */
static void ldm_sim_publish(pipe *p, const char *ks) {
  gemm_gen *g = p->c->g;
  for (int s = 0; s < p->nslot; s++) {
    int row, col, cs = cidx(g, s);
    ldm_addr(p, s, ks, &row, &col);
    P("memref.store %%t%d, %%addr[%%warp, %%lane, %%t%d, %%c0] : %s\nmemref.store %%t%d, %%addr[%%warp, %%lane, %%t%d, "
      "%%c1] : %s\n",
      row, cs, p->addr, col, cs, p->addr);
  }
}

static void ldm_sim_gather(pipe *p) {
  tc_gen *c = p->c;
  gemm_gen *g = c->g;
  for (int s = 0; s < p->nslot; s++) {
    bool isa = s < c->mi, x2 = !isa && s - c->mi >= p->nbx4, trans = !(isa ? p->kca : p->kcb);
    const char *buf = isa ? "%As" : "%Bs", *bt = isa ? g->As : g->Bs;
    int cs = cidx(g, s);
    for (int q = 0; q < (x2 ? 2 : 4); q++)
      for (int j = 0; j < 2; j++) {
        /* the lane naming the row: 8q + g, or (.trans) 8q + 2t + j; the value's column: its named column plus
         * 2t + j, or (.trans) g */
        int c8q = cidx(g, 8 * q), src = fresh(g), off = fresh(g), cj = cidx(g, j), c2 = cidx(g, 2), t2 = fresh(g);
        P("%%t%d = arith.muli %%t, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", t2, c2, off, t2, cj);
        if (trans) P("%%t%d = arith.addi %%t%d, %%t%d : index\n", src, c8q, off);
        else P("%%t%d = arith.addi %%t%d, %%g : index\n", src, c8q);
        int r = fresh(g), cl = fresh(g), cc = fresh(g), v = fresh(g);
        P("%%t%d = memref.load %%addr[%%warp, %%t%d, %%t%d, %%c0] : %s\n%%t%d = memref.load %%addr[%%warp, %%t%d, "
          "%%t%d, %%c1] : %s\n",
          r, src, cs, p->addr, cl, src, cs, p->addr);
        if (trans) P("%%t%d = arith.addi %%t%d, %%g : index\n", cc, cl);
        else P("%%t%d = arith.addi %%t%d, %%t%d : index\n", cc, cl, off);
        P("%%t%d = memref.load %s[%%sc, %%t%d, %%t%d] : %s\n", v, buf, r, cc, bt);
        int dst_i, dst_e;
        if (isa) dst_i = s, dst_e = 2 * q + j;
        else dst_i = 2 * (s - c->mi) + q / 2, dst_e = 2 * (q % 2) + j;
        int ci = cidx(g, dst_i), ce = cidx(g, dst_e);
        P("memref.store %%t%d, %s[%%warp, %%lane, %%t%d, %%t%d] : %s\n", v, isa ? "%fA" : "%fB", ci, ce,
          isa ? c->fA : c->fB);
      }
  }
}

/* %t<result>: V (f32) rounded to tf32 (to nearest, ties away from zero;
 * NaN kept). */
static int round_tf32(gemm_gen *g, int v) {
  int bi = fresh(g), half = fresh(g), ad = fresh(g), mk = fresh(g), mm = fresh(g), rf = fresh(g), nan = fresh(g),
      y = fresh(g);
  P("%%t%d = arith.bitcast %%t%d : f32 to i32\n%%t%d = arith.constant 4096 : i32\n"
    "%%t%d = arith.addi %%t%d, %%t%d : i32\n%%t%d = arith.constant -8192 : i32\n"
    "%%t%d = arith.andi %%t%d, %%t%d : i32\n%%t%d = arith.bitcast %%t%d : i32 to f32\n"
    "%%t%d = arith.cmpf uno, %%t%d, %%t%d : f32\n%%t%d = arith.select %%t%d, %%t%d, %%t%d : f32\n",
    bi, v, half, ad, bi, half, mk, mm, ad, mk, rf, mm, nan, v, v, y, nan, v, rf);
  return y;
}

/* tf32: this lane's fragments at the k step KS from stage %sc, rounded:
 * A register r of row tile mi at row g + 8 (r % 2), k t + 4 (r / 2); B
 * register r of column tile ni at column g, k t + 4 r; into A[mi][r],
 * B[ni][r]. */
static void tf32_frags(pipe *p, const char *ks, int (*A)[4], int (*B)[2]) {
  tc_gen *c = p->c;
  gemm_gen *g = c->g;
  int k0 = fresh(g);
  P("%%t%d = arith.addi %s, %%t : index\n", k0, ks);
  char kb[24];
  snprintf(kb, sizeof kb, "%%t%d", k0);
  for (int x = 0; x < c->mi + c->ni; x++) {
    bool isa = x < c->mi, kc = isa ? p->kca : p->kcb;
    char base[24];
    snprintf(base, sizeof base, "%%t%d", isa ? add_c(g, "%m0", x * 16) : add_c(g, "%n0", (x - c->mi) * 8));
    int i0 = fresh(g);
    P("%%t%d = arith.addi %s, %%g : index\n", i0, base);
    char ib[24];
    snprintf(ib, sizeof ib, "%%t%d", i0);
    for (int r = 0; r < (isa ? 4 : 2); r++) {
      int i = isa && r % 2 ? add_c(g, ib, 8) : i0, k = add_c(g, kb, 4 * (isa ? r / 2 : r)), v = fresh(g);
      P("%%t%d = memref.load %s[%%sc, %%t%d, %%t%d] : %s\n", v, isa ? "%As" : "%Bs", kc ? i : k, kc ? k : i,
        isa ? g->As : g->Bs);
      if (isa) A[x][r] = round_tf32(g, v);
      else B[x - c->mi][r] = round_tf32(g, v);
    }
  }
}

static void pipe_body(pipe *p, const char *At, const char *Bt, const char *Ct) {
  tc_gen *c = p->c;
  gemm_gen *g = c->g;
  const cfg_gemm_schedule *s = c->s;
  int nacc = c->mi * c->ni, S = p->S;
  const char *V = "vector<2x2xf32>";
  char kn[24], stg[24];
  if (g->sim) { /* zero the accumulators */
    phase_begin(g);
    int cn = cidx(g, nacc), c4 = cidx(g, 4);
    P("scf.for %%ai = %%c0 to %%t%d step %%c1 {\nscf.for %%aj = %%c0 to %%t%d step %%c1 {\n"
      "memref.store %%zero, %%acc[%%tx, %%ai, %%aj] : %s\n}\n}\n",
      cn, c4, c->accm);
    phase_end(g);
  } else {
    warp_pos(c);
    if (c->h16) ldm_lane(g);
  }
  int cbm = cidx(g, s->bm), cbn = cidx(g, s->bn), cbk = cidx(g, s->bk), cS = cidx(g, S), cS1 = cidx(g, S - 1);
  int64_t kt_all = (g->K + s->bk - 1) / s->bk;
  P("%%row0 = arith.muli %%by, %%t%d : index\n%%col0 = arith.muli %%bx, %%t%d : index\n", cbm, cbn);
  /* the block's K tiles: %kt0 .. %kt0 + %nkt - 1 (split-K: range %bz % split
   * of ktps tiles, the last one shorter) */
  if (p->split > 1) {
    int csp = cidx(g, p->split), ck = cidx(g, p->ktps), call = cidx(g, kt_all), r = fresh(g), left = fresh(g);
    P("%%t%d = arith.remui %%bz, %%t%d : index\n%%kt0 = arith.muli %%t%d, %%t%d : index\n"
      "%%t%d = arith.subi %%t%d, %%kt0 : index\n%%nkt = arith.minui %%t%d, %%t%d : index\n",
      r, csp, r, ck, left, call, left, ck);
  } else
    P("%%kt0 = arith.constant 0 : index\n%%nkt = arith.constant %lld : index\n", (long long)kt_all);
  /* prologue: tiles 0 .. S-2 */
  int tokp = -1;
  for (int q = 0; q + 1 < S; q++) {
    int cq = cidx(g, q), tq = fresh(g), kq = fresh(g);
    P("%%t%d = arith.addi %%kt0, %%t%d : index\n%%t%d = arith.muli %%t%d, %%t%d : index\n", tq, cq, kq, tq, cbk);
    snprintf(kn, sizeof kn, "%%t%d", kq);
    snprintf(stg, sizeof stg, "%%t%d", cidx(g, q));
    phase_begin(g);
    copy_tiles(p, At, Bt, kn, stg);
    phase_end(g);
    if (!g->sim) P("%%t%d = \"nvgpu.device_async_create_group\"() : () -> !nvgpu.device.async.token\n", tokp = fresh(g));
  }
  if (g->sim) P("scf.for %%kt = %%c0 to %%nkt step %%c1 {\n");
  else {
    P("%%kres:%d = scf.for %%kt = %%c0 to %%nkt step %%c1 iter_args(", nacc);
    for (int i = 0; i < nacc; i++) P("%s%%x%d = %%vz", i ? ", " : "", i);
    P(") -> (");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", V);
    P(") {\n");
    if (S >= 2) P("nvgpu.device_async_wait %%t%d {numGroups = %d : i32}\n", tokp, S - 2);
    P("gpu.barrier\n");
  }
  /* tile kt + S - 1 into stage (kt + S - 1) % S; compute from stage kt % S */
  P("%%ktn = arith.addi %%kt, %%t%d : index\n%%ktg = arith.addi %%ktn, %%kt0 : index\n"
    "%%kn = arith.muli %%ktg, %%t%d : index\n%%sn = arith.remui %%ktn, %%t%d : index\n"
    "%%sc = arith.remui %%kt, %%t%d : index\n",
    cS1, cbk, cS, cS);
  phase_begin(g);
  copy_tiles(p, At, Bt, "%kn", "%sn");
  phase_end(g);
  if (!g->sim) {
    int tk = fresh(g);
    P("%%t%d = \"nvgpu.device_async_create_group\"() : () -> !nvgpu.device.async.token\n", tk);
    if (S == 1) P("nvgpu.device_async_wait %%t%d {numGroups = 0 : i32}\ngpu.barrier\n", tk);
  }
  if (g->sim) {
    for (int ks = 0; ks < s->bk; ks += c->kstep) {
      char ksn[24];
      snprintf(ksn, sizeof ksn, "%%t%d", cidx(g, ks));
      if (c->h16) {
        phase_begin(g);
        warp_pos(c);
        ldm_lane(g);
        ldm_sim_publish(p, ksn);
        phase_end(g);
        phase_begin(g);
        warp_pos(c);
        ldm_sim_gather(p);
        phase_end(g);
      } else { /* publish the rounded fragments to the warp */
        phase_begin(g);
        warp_pos(c);
        int a[16][4], b[32][2];
        tf32_frags(p, ksn, a, b);
        for (int mi = 0; mi < c->mi; mi++)
          for (int r = 0; r < 4; r++) {
            int cmi = cidx(g, mi), cr = cidx(g, r);
            P("memref.store %%t%d, %%fA[%%warp, %%lane, %%t%d, %%t%d] : %s\n", a[mi][r], cmi, cr, c->fA);
          }
        for (int ni = 0; ni < c->ni; ni++)
          for (int r = 0; r < 2; r++) {
            int cni = cidx(g, ni), cr = cidx(g, r);
            P("memref.store %%t%d, %%fB[%%warp, %%lane, %%t%d, %%t%d] : %s\n", b[ni][r], cni, cr, c->fB);
          }
        phase_end(g);
      }
      phase_begin(g);
      warp_pos(c);
      for (int mi = 0; mi < c->mi; mi++)
        for (int ni = 0; ni < c->ni; ni++) emulate_mma(c, mi, ni);
      phase_end(g);
    }
    P("}\n");
  } else {
    int cks = cidx(g, c->kstep);
    P("%%kkres:%d = scf.for %%ks = %%c0 to %%t%d step %%t%d iter_args(", nacc, cbk, cks);
    for (int i = 0; i < nacc; i++) P("%s%%y%d = %%x%d", i ? ", " : "", i, i);
    P(") -> (");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", V);
    P(") {\n");
    int a[16][4], b[32][2], d[256];
    if (c->h16)
      for (int sl = 0; sl < p->nslot; sl++) ldm_gpu(p, sl, "%ks", a, b);
    else
      tf32_frags(p, "%ks", a, b);
    for (int mi = 0; mi < c->mi; mi++)
      for (int ni = 0; ni < c->ni; ni++) d[mi * c->ni + ni] = mma(c, mi * c->ni + ni, a[mi], b[ni]);
    P("scf.yield ");
    for (int i = 0; i < nacc; i++) P("%s%%t%d", i ? ", " : "", d[i]);
    P(" : ");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", V);
    P("\n}\nscf.yield ");
    for (int i = 0; i < nacc; i++) P("%s%%kkres#%d", i ? ", " : "", i);
    P(" : ");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", V);
    P("\n}\n");
    /* the zero-filled copies past K still pending */
    if (S >= 2) P("nvgpu.device_async_wait %%t%d {numGroups = 0 : i32}\n", tokp);
  }
  if (g->o->epi.n && !c->Wt) tc_store_staged(c, Ct);
  else tc_store(c, Ct);
}

/* The staged tiles of one stage, each operand's as it is stored (A
 * [BM][BK] or, stored K x M, [BK][BM]; B [BN][BK] or [BK][BN]), rows
 * padded so that a warp's fragment loads fall on distinct banks: 16-bit
 * rows by 8 values (a row 4 words past a multiple of 8 words: the 8 rows
 * an ldmatrix reads at once cover the 32 banks); tf32 rows of k by 4 (the
 * same: lanes g, t read word 4g' + t), tf32 rows of m or n to 8 words past
 * a multiple of 32 (lanes t read 4 rows, g 8 consecutive words).  Sizes
 * in elements of 2 or 4 bytes; every row a multiple of 16 bytes. */
static void tc_tiles(const struct cfg_gemm_schedule *s, bool h16, bool ta, bool tb, int64_t dims[2][2]) {
  int64_t r[2] = {ta ? s->bk : s->bm, tb ? s->bn : s->bk}, c[2] = {ta ? s->bm : s->bk, tb ? s->bk : s->bn};
  bool kc[2] = {!ta, tb};
  for (int i = 0; i < 2; i++) {
    dims[i][0] = r[i];
    dims[i][1] = c[i] + (h16 ? 8 : kc[i] ? 4 : ((8 - c[i] % 32) % 32 + 32) % 32);
  }
}

int64_t cg_gemm_tc_stage_bytes(const struct cfg_gemm_schedule *s, bool h16, bool ta, bool tb) {
  int64_t d[2][2];
  tc_tiles(s, h16, ta, tb, d);
  return (d[0][0] * d[0][1] + d[1][0] * d[1][1]) * (h16 ? 2 : 4);
}

int64_t cg_gemm_tc_dyn_smem(const struct cfg_gemm_schedule *s, bool h16, bool ta, bool tb, bool epilogue) {
  int64_t st = cg_gemm_tc_smem(s, h16, ta, tb), cs = (int64_t)s->bm * (s->bn + 4) * 4;
  return epilogue && cs > st ? cs : st;
}

int64_t cg_gemm_tc_smem(const struct cfg_gemm_schedule *s, bool h16, bool ta, bool tb) {
  return cg_gemm_tc_stage_bytes(s, h16, ta, tb) * (s->stages > 1 ? s->stages : 1);
}

/* Split-K's second kernel: C[b] (+)= the sum over s of W[b * split + s]
 * (fixed order), one thread an element, 256 a block; the sim form the same
 * loops. */
static void split_sum(gemm_gen *g, int split, const char *A, const char *B, const char *Ct, const char *Wt) {
  int64_t mn = g->M * g->N, nb = 1;
  for (int r = 0; r < g->o->nbatch; r++) nb *= g->o->bsize[r];
  int cmn = cidx(g, mn), cn = cidx(g, g->N), csp = cidx(g, split), c256 = cidx(g, 256),
      cgx = cidx(g, (mn + 255) / 256), cnb = cidx(g, nb);
  if (g->sim) P("scf.for %%bz = %%c0 to %%t%d step %%c1 {\nscf.for %%e = %%c0 to %%t%d step %%c1 {\n", cnb, cmn);
  else
    P("gpu.launch blocks(%%bx, %%by, %%bz) in (%%sx = %%t%d, %%sy = %%c1, %%sz = %%t%d) threads(%%tx, %%ty, %%tz) in "
      "(%%ux = %%t%d, %%uy = %%c1, %%uz = %%c1) {\n",
      cgx, cnb, c256);
  batch_views(g, A, B, Ct, "%bz");
  if (!g->sim) {
    int e0 = fresh(g), in = fresh(g);
    P("%%t%d = arith.muli %%bx, %%t%d : index\n%%e = arith.addi %%t%d, %%tx : index\n"
      "%%t%d = arith.cmpi ult, %%e, %%t%d : index\nscf.if %%t%d {\n",
      e0, c256, e0, in, cmn, in);
  }
  int m = fresh(g), n = fresh(g), w0 = fresh(g), sum = fresh(g), wi = fresh(g), x = fresh(g), y = fresh(g);
  P("%%t%d = arith.divui %%e, %%t%d : index\n%%t%d = arith.remui %%e, %%t%d : index\n"
    "%%t%d = arith.muli %%bz, %%t%d : index\n",
    m, cn, n, cn, w0, csp);
  P("%%t%d = scf.for %%s = %%c0 to %%t%d step %%c1 iter_args(%%acc = %%zero) -> (f32) {\n"
    "%%t%d = arith.addi %%t%d, %%s : index\n%%t%d = memref.load %%W[%%t%d, %%t%d, %%t%d] : %s\n"
    "%%t%d = arith.addf %%acc, %%t%d : f32\nscf.yield %%t%d : f32\n}\n",
    sum, csp, wi, w0, x, wi, m, n, Wt, y, x, y);
  if (g->o->epi.n) {
    int v = sum;
    if (!g->o->overwrite) {
      int old = fresh(g), nw = fresh(g);
      P("%%t%d = memref.load %%C[%%t%d, %%t%d] : %s\n%%t%d = arith.addf %%t%d, %%t%d : f32\n", old, m, n, Ct, nw, old,
        sum);
      v = nw;
    }
    epi_store(g, Ct, m, n, v);
  } else if (g->o->overwrite) P("memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n", sum, m, n, Ct);
  else {
    int old = fresh(g), nw = fresh(g);
    P("%%t%d = memref.load %%C[%%t%d, %%t%d] : %s\n%%t%d = arith.addf %%t%d, %%t%d : f32\n"
      "memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n",
      old, m, n, Ct, nw, old, sum, nw, m, n, Ct);
  }
  P(g->sim ? "}\n}\n" : "}\ngpu.terminator\n}\n");
}

char *cg_gemm_tc_text(const char *name, const cg_gemm_operands *o, const struct cfg_gemm_schedule *s, bool sim) {
  cfg_gemm_simt_schedule simt = {.threads = s->threads};
  gemm_gen G = {.s = simt, .sim = sim, .o = o}, *g = &G;
  gen_operands(g, o);
  bool h16 = !strcmp(G.TO, "bf16") || !strcmp(G.TO, "f16");
  int es = h16 ? 2 : 4, vn = 16 / es, split = s->split_k > 1 ? s->split_k : 1;
  tc_gen C = {g, s, s->warp_tile_m / 16, s->warp_tile_n / 8, h16, h16 ? 16 : 8, h16 ? 8 : 4, h16 ? 4 : 2, "", "", "",
              NULL};
  G.TS = G.TO;
  char *A = type_str(o->a), *B = type_str(o->b), *Ct = type_str(o->c);
  const char *space = sim ? "" : ", #gpu.address_space<workgroup>";
  int64_t d[2][2], nb = 1;
  for (int r = 0; r < o->nbatch; r++) nb *= o->bsize[r];
  tc_tiles(s, h16, G.ta, G.tb, d);
  pipe Pp = {&C, s->stages > 1 ? s->stages : 1, !G.ta, G.tb, false, false, 0, 0, 0, 0, 0, 0, "", split,
             s->k_tiles_per_split};
  snprintf(G.As, sizeof G.As, "memref<%dx%lldx%lldx%s%s>", Pp.S, (long long)d[0][0], (long long)d[0][1], G.TS, space);
  snprintf(G.Bs, sizeof G.Bs, "memref<%dx%lldx%lldx%s%s>", Pp.S, (long long)d[1][0], (long long)d[1][1], G.TS, space);
  Pp.ar = d[0][0], Pp.ac = G.ta ? s->bm : s->bk, Pp.br = d[1][0], Pp.bc = G.tb ? s->bk : s->bn;
  Pp.va = rows_aligned(o->a, o->fa, o->views, o->nbatch, o->bstride[0], vn) && Pp.ac % vn == 0;
  Pp.vb = rows_aligned(o->b, o->fb, o->views, o->nbatch, o->bstride[1], vn) && Pp.bc % vn == 0;
  Pp.nbx4 = C.ni / 2;
  Pp.nslot = C.mi + C.ni / 2 + C.ni % 2;
  snprintf(Pp.addr, sizeof Pp.addr, "memref<%dx32x%dx2xindex>", s->warps, Pp.nslot);
  int nw = s->warps;
  snprintf(C.fA, sizeof C.fA, "memref<%dx32x%dx%dx%s>", nw, C.mi, C.fa, G.TS);
  snprintf(C.fB, sizeof C.fB, "memref<%dx32x%dx%dx%s>", nw, C.ni, C.fb, G.TS);
  snprintf(C.accm, sizeof C.accm, "memref<%dx%dx4xf32>", s->threads, C.mi * C.ni);
  char Wt[128] = "";
  if (split > 1) {
    snprintf(Wt, sizeof Wt, "memref<%lldx%lldx%lldxf32, strided<[%lld, %lld, 1]>>", (long long)(nb * split),
             (long long)G.M, (long long)G.N, (long long)(G.M * G.N), (long long)G.N);
    C.Wt = Wt;
  }
  int64_t gx = (G.N + s->bn - 1) / s->bn, gy = (G.M + s->bm - 1) / s->bm;
  if (o->views) {
    char *fa = type_str(o->fa), *fb = type_str(o->fb), *fc = type_str(o->fc);
    P("func.func private @%s(%%Af: %s, %%Bf: %s, %%Cf: %s", name, fa, fb, fc);
    free(fa), free(fb), free(fc);
  } else
    P("func.func private @%s(%%A: %s, %%B: %s, %%C: %s", name, A, B, Ct);
  if (split > 1) P(", %%Wf: memref<%lldxf32>", (long long)o->work_elems);
  for (int j = 0; j < o->epi.nargs; j++)
    for (int i = 0; i < o->epi.n; i++)
      if (o->epi.role[i] != CG_EPI_C && o->epi.arg[i] == j) {
        char *et = type_str(o->epi.type[i]);
        P(", %%E%d: %s", j, et);
        free(et);
        break;
      }
  P(") {\n%%c0 = arith.constant 0 : index\n%%c1 = arith.constant 1 : index\n%%gx = arith.constant %lld : index\n"
    "%%gy = arith.constant %lld : index\n%%gz = arith.constant %lld : index\n%%nt = arith.constant %d : index\n"
    "%%zero = arith.constant 0.0 : f32\n",
    (long long)gx, (long long)gy, (long long)(nb * split), s->threads);
  if (split > 1)
    P("%%W = memref.reinterpret_cast %%Wf to offset: [0], sizes: [%lld, %lld, %lld], strides: [%lld, %lld, 1] : "
      "memref<%lldxf32> to %s\n",
      (long long)(nb * split), (long long)G.M, (long long)G.N, (long long)(G.M * G.N), (long long)G.N,
      (long long)o->work_elems, Wt);
  /* the batch point of block %bz (split-K: %bz / split) */
  char bp[24] = "%bz";
  if (sim) {
    P("scf.for %%bz = %%c0 to %%gz step %%c1 {\n");
    if (split > 1) {
      int csp = cidx(g, split), t = fresh(g);
      P("%%t%d = arith.divui %%bz, %%t%d : index\n", t, csp);
      snprintf(bp, sizeof bp, "%%t%d", t);
    }
    batch_views(g, A, B, Ct, bp);
    P("scf.for %%by = %%c0 to %%gy step %%c1 {\nscf.for %%bx = %%c0 to %%gx step %%c1 {\n");
    P("%%zs = arith.constant 0.0 : %s\n%%As = memref.alloc() : %s\n"
      "%%Bs = memref.alloc() : %s\n%%acc = memref.alloc() : %s\n%%fA = memref.alloc() : %s\n"
      "%%fB = memref.alloc() : %s\n%%addr = memref.alloc() : %s\n",
      G.TS, G.As, G.Bs, C.accm, C.fA, C.fB, Pp.addr);
  } else {
    /* the stages in dynamic shared memory: past a block's static 48 KiB
     * up to the device's opt-in limit (the runtime opts in at launch) */
    int64_t abytes = (int64_t)Pp.S * d[0][0] * d[0][1] * es;
    P("%%dsm = arith.constant %lld : i32\n", (long long)cg_gemm_tc_dyn_smem(s, h16, G.ta, G.tb, o->epi.n > 0 && split == 1));
    P("gpu.launch blocks(%%bx, %%by, %%bz) in (%%sx = %%gx, %%sy = %%gy, %%sz = %%gz) threads(%%tx, %%ty, %%tz) in "
      "(%%ux = %%nt, %%uy = %%c1, %%uz = %%c1) dynamic_shared_memory_size %%dsm {\n");
    P("%%dyn = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>\n"
      "%%offb = arith.constant %lld : index\n"
      "%%As = memref.view %%dyn[%%c0][] : memref<?xi8, #gpu.address_space<workgroup>> to %s\n"
      "%%Bs = memref.view %%dyn[%%offb][] : memref<?xi8, #gpu.address_space<workgroup>> to %s\n",
      (long long)abytes, G.As, G.Bs);
    if (split > 1) {
      int csp = cidx(g, split), t = fresh(g);
      P("%%t%d = arith.divui %%bz, %%t%d : index\n", t, csp);
      snprintf(bp, sizeof bp, "%%t%d", t);
    }
    batch_views(g, A, B, Ct, bp);
    P("%%zs = arith.constant 0.0 : %s\n%%vz = arith.constant dense<0.0> : vector<2x2xf32>\n", G.TS);
  }
  pipe_body(&Pp, A, B, Ct);
  if (sim) {
    const char *names[] = {"%As", "%Bs", "%acc", "%fA", "%fB", "%addr"}, *types[] = {G.As, G.Bs, C.accm, C.fA, C.fB,
                                                                                   Pp.addr};
    for (int i = 0; i < 6; i++) P("memref.dealloc %s : %s\n", names[i], types[i]);
    P("}\n}\n}\n");
  } else
    P("gpu.terminator\n}\n");
  if (split > 1) split_sum(g, split, A, B, Ct, Wt);
  P("return\n}\n");
  return finish_text(g, A, B, Ct);
}
