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
  /* a loop, not unrolled text: unrolled, LLVM hoists every address out of
   * the K loop and the kernel runs out of registers */
  int cwd = cidx(g, wd), crows = cidx(g, rows), ccols = cidx(g, cols), ccount = cidx(g, count);
  int cnt = cidx(g, g->s.threads), citer = cidx(g, (count + g->s.threads - 1) / g->s.threads);
  int si = fresh(g), off = fresh(g), e = fresh(g), ine = fresh(g);
  P("scf.for %%t%d = %%c0 to %%t%d step %%c1 {\n%%t%d = arith.muli %%t%d, %%t%d : index\n"
    "%%t%d = arith.addi %%tx, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\nscf.if %%t%d {\n",
    si, citer, off, si, cnt, e, off, ine, e, ccount, ine);
  int r = fresh(g), c = fresh(g), gr = fresh(g), gc = fresh(g);
  P("%%t%d = arith.divui %%t%d, %%t%d : index\n%%t%d = arith.remui %%t%d, %%t%d : index\n"
    "%%t%d = arith.addi %s, %%t%d : index\n%%t%d = arith.addi %s, %%t%d : index\n",
    r, e, cwd, c, e, cwd, gr, row0, r, gc, col0, c);
  int ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g), v = fresh(g), l = fresh(g);
  P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
    "%%t%d = arith.andi %%t%d, %%t%d : i1\n",
    ok1, gr, crows, ok2, gc, ccols, ok, ok1, ok2);
  P("%%t%d = scf.if %%t%d -> (%s) {\n%%t%d = memref.load %s[%%t%d, %%t%d] : %s\nscf.yield %%t%d : %s\n} else {\n"
    "scf.yield %%zero : %s\n}\n",
    v, ok, g->T, l, src, gr, gc, srct, l, g->T, g->T);
  if (transpose) P("memref.store %%t%d, %s[%%t%d, %%t%d] : %s\n", v, dst, c, r, dstt);
  else P("memref.store %%t%d, %s[%%t%d, %%t%d] : %s\n", v, dst, r, c, dstt);
  P("}\n}\n");
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

/* func.func private @NAME(%A, %B, %C) with the constants both forms use. */
static void open_func(gemm_gen *g, const char *name, const char *A, const char *B, const char *C, int64_t gx,
                      int64_t gy, int threads) {
  P("func.func private @%s(%%A: %s, %%B: %s, %%C: %s) {\n", name, A, B, C);
  P("%%c0 = arith.constant 0 : index\n%%c1 = arith.constant 1 : index\n%%gx = arith.constant %lld : index\n"
    "%%gy = arith.constant %lld : index\n%%nt = arith.constant %d : index\n",
    (long long)gx, (long long)gy, threads);
}

/* Closes the launch (or the sim form's block loops, after freeing its
 * buffers: the names of FREE, with their types) and the function; returns
 * the text, or NULL when out of memory. */
static char *close_func(gemm_gen *g, const char *const *free_names, const char *const *free_types, char *A, char *B,
                        char *C) {
  if (g->sim) {
    for (int i = 0; free_names[i]; i++) P("memref.dealloc %s : %s\n", free_names[i], free_types[i]);
    P("}\n}\n");
  } else
    P("gpu.terminator\n}\n");
  P("return\n}\n");
  free(A);
  free(B);
  free(C);
  if (g->b.oom) {
    nv_sb_free(&g->b);
    return NULL;
  }
  return g->b.s;
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
  open_func(g, name, A, B, C, gx, gy, s->threads);
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
  const char *names[] = {"%As", "%Bs", "%acc", NULL}, *types[] = {G.As, G.Bs, G.acc};
  return close_func(g, names, types, A, B, C);
}

/* ---- tensor cores: mma.sync.m16n8k8 with tf32 operands ------------------
 *
 * --matmul-precision=tf32 (f32 only, sm_80+): the block tile, warp layout
 * and warp tile of cfg_gemm (one shared-memory stage; its split-K is not
 * generated).  The block stages A (BM x BK, row-major) and B (BK x BN) in
 * shared memory; each warp computes its WTM x WTN warp tile as
 * (WTM/16) x (WTN/8) mma tiles, one nvgpu.mma.sync per tile and k step of
 * 8, the accumulators (vector<2x2xf32> each) carried through the K loop.
 * Fragments follow the PTX ISA's m16n8k8 .tf32 layout, with g = lane / 4
 * and t = lane % 4:
 *   A register i: row g + 8 (i % 2), column t + 4 (i / 2)
 *   B register i: row t + 4 i, column g
 *   C element (r, c) of the 2x2 vector: row g + 8 r, column 2 t + c.
 * The sim form cannot run a warp-wide instruction one thread at a time: its
 * threads store their fragments to a per-warp buffer in one phase and, in
 * the next, each computes its accumulators from the fragments of its warp's
 * 32 lanes, addressed by the same layout read backwards (element (row, k)
 * of A is register (row / 8) + 2 (k / 4) of lane (row % 8) * 4 + k % 4;
 * element (k, col) of B is register k / 4 of lane col * 4 + k % 4). */

typedef struct tc_gen {
  gemm_gen *g;
  const cfg_gemm_schedule *s;
  int mi, ni;             /* mma tiles per warp: WTM/16, WTN/8 */
  char fA[96], fB[96], accm[96];
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

/* Loads this thread's fragments for k step KS: A of mma row tile MI into
 * a0..a3, B of column tile NI into b0, b1; returns the SSA numbers. */
static void load_frag_a(tc_gen *c, const char *ks, int mi, int a[4]) {
  gemm_gen *g = c->g;
  int base = cidx(g, mi * 16), c8 = cidx(g, 8), c4 = cidx(g, 4);
  int rb = fresh(g), ra = fresh(g), ra8 = fresh(g), ka = fresh(g), kb = fresh(g);
  P("%%t%d = arith.addi %%m0, %%t%d : index\n%%t%d = arith.addi %%t%d, %%g : index\n"
    "%%t%d = arith.addi %%t%d, %%t%d : index\n%%t%d = arith.addi %%t, %s : index\n"
    "%%t%d = arith.addi %%t%d, %%t%d : index\n",
    rb, base, ra, rb, ra8, ra, c8, ka, ks, kb, ka, c4);
  int rows[4] = {ra, ra8, ra, ra8}, ks_[4] = {ka, ka, kb, kb};
  for (int i = 0; i < 4; i++) {
    a[i] = fresh(g);
    P("%%t%d = memref.load %%As[%%t%d, %%t%d] : %s\n", a[i], rows[i], ks_[i], g->As);
  }
}

static void load_frag_b(tc_gen *c, const char *ks, int ni, int b[2]) {
  gemm_gen *g = c->g;
  int base = cidx(g, ni * 8), c4 = cidx(g, 4);
  int cb = fresh(g), col = fresh(g), k0 = fresh(g), k1 = fresh(g);
  P("%%t%d = arith.addi %%n0, %%t%d : index\n%%t%d = arith.addi %%t%d, %%g : index\n"
    "%%t%d = arith.addi %%t, %s : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n",
    cb, base, col, cb, k0, ks, k1, k0, c4);
  b[0] = fresh(g);
  P("%%t%d = memref.load %%Bs[%%t%d, %%t%d] : %s\n", b[0], k0, col, g->Bs);
  b[1] = fresh(g);
  P("%%t%d = memref.load %%Bs[%%t%d, %%t%d] : %s\n", b[1], k1, col, g->Bs);
}

/* Sim: acc[tx][idx][i] += sum_k A(row, k) B(k, col) over the fragments of
 * the warp, for this thread's element i of mma tile (MI, NI). */
static void emulate_mma(tc_gen *c, int mi, int ni) {
  gemm_gen *g = c->g;
  int idx = mi * c->ni + ni;
  int c0 = cidx(g, 0), c1 = cidx(g, 1), c8 = cidx(g, 8), c4 = cidx(g, 4), c2 = cidx(g, 2);
  int cmi = cidx(g, mi), cni = cidx(g, ni), cidxv = cidx(g, idx);
  for (int i = 0; i < 4; i++) {
    int ci = cidx(g, i), crh = cidx(g, i / 2), ccl = cidx(g, i % 2);
    int old = fresh(g), sum = fresh(g);
    P("%%t%d = memref.load %%acc[%%tx, %%t%d, %%t%d] : %s\n", old, cidxv, ci, c->accm);
    P("%%t%d = scf.for %%k = %%t%d to %%t%d step %%t%d iter_args(%%s = %%t%d) -> (f32) {\n", sum, c0, c8, c1, old);
    int k4 = fresh(g), kq = fresh(g), la0 = fresh(g), la = fresh(g), kq2 = fresh(g), ra = fresh(g), av = fresh(g);
    P("%%t%d = arith.remui %%k, %%t%d : index\n%%t%d = arith.divui %%k, %%t%d : index\n", k4, c4, kq, c4);
    P("%%t%d = arith.muli %%g, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", la0, c4, la, la0, k4);
    P("%%t%d = arith.muli %%t%d, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", kq2, kq, c2, ra, kq2,
      crh);
    P("%%t%d = memref.load %%fA[%%warp, %%t%d, %%t%d, %%t%d] : %s\n", av, la, cmi, ra, c->fA);
    int col2 = fresh(g), col = fresh(g), lb0 = fresh(g), lb = fresh(g), bv = fresh(g), nv = fresh(g);
    P("%%t%d = arith.muli %%t, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", col2, c2, col, col2, ccl);
    P("%%t%d = arith.muli %%t%d, %%t%d : index\n%%t%d = arith.addi %%t%d, %%t%d : index\n", lb0, col, c4, lb, lb0, k4);
    P("%%t%d = memref.load %%fB[%%warp, %%t%d, %%t%d, %%t%d] : %s\n", bv, lb, cni, kq, c->fB);
    P("%%t%d = math.fma %%t%d, %%t%d, %%s : f32\nscf.yield %%t%d : f32\n}\n", nv, av, bv, nv);
    P("memref.store %%t%d, %%acc[%%tx, %%t%d, %%t%d] : %s\n", sum, cidxv, ci, c->accm);
  }
}

static void tc_body(tc_gen *c, const char *At, const char *Bt, const char *Ct) {
  gemm_gen *g = c->g;
  const cfg_gemm_schedule *s = c->s;
  int nacc = c->mi * c->ni;
  const char *V = "vector<2x2xf32>";
  if (g->sim) { /* zero the accumulators */
    phase_begin(g);
    int cn = cidx(g, nacc), c4 = cidx(g, 4), c0 = cidx(g, 0), c1 = cidx(g, 1);
    P("scf.for %%ai = %%t%d to %%t%d step %%t%d {\nscf.for %%aj = %%t%d to %%t%d step %%t%d {\n"
      "memref.store %%zero, %%acc[%%tx, %%ai, %%aj] : %s\n}\n}\n",
      c0, cn, c1, c0, c4, c1, c->accm);
    phase_end(g);
  } else
    warp_pos(c);
  int cbk = open_k_loop(g, s->bm, s->bn, s->bk, nacc, "%vz", V);
  phase_begin(g);
  stage(g, "%A", At, "%As", g->As, g->M, g->K, "%row0", "%k0", s->bk, (int64_t)s->bm * s->bk, false);
  stage(g, "%B", Bt, "%Bs", g->Bs, g->K, g->N, "%k0", "%col0", s->bn, (int64_t)s->bk * s->bn, false);
  phase_end(g);
  if (!g->sim) P("gpu.barrier\n");
  int a[16][4], b[32][2];
  char ksn[32];
  if (g->sim) {
    for (int ks = 0; ks < s->bk; ks += 8) {
      snprintf(ksn, sizeof ksn, "%%t%d", cidx(g, ks));
      phase_begin(g);
      warp_pos(c);
      for (int mi = 0; mi < c->mi; mi++) load_frag_a(c, ksn, mi, a[mi]);
      for (int ni = 0; ni < c->ni; ni++) load_frag_b(c, ksn, ni, b[ni]);
      /* publish the fragments to the warp */
      for (int mi = 0; mi < c->mi; mi++)
        for (int i = 0; i < 4; i++) {
          int cmi = cidx(g, mi), ci = cidx(g, i);
          P("memref.store %%t%d, %%fA[%%warp, %%lane, %%t%d, %%t%d] : %s\n", a[mi][i], cmi, ci, c->fA);
        }
      for (int ni = 0; ni < c->ni; ni++)
        for (int i = 0; i < 2; i++) {
          int cni = cidx(g, ni), ci = cidx(g, i);
          P("memref.store %%t%d, %%fB[%%warp, %%lane, %%t%d, %%t%d] : %s\n", b[ni][i], cni, ci, c->fB);
        }
      phase_end(g);
      phase_begin(g);
      warp_pos(c);
      for (int mi = 0; mi < c->mi; mi++)
        for (int ni = 0; ni < c->ni; ni++) emulate_mma(c, mi, ni);
      phase_end(g);
    }
  } else {
    /* the k steps of the tile: a loop carrying the accumulators */
    int c8 = cidx(g, 8);
    P("%%kkres:%d = scf.for %%ks = %%c0 to %%t%d step %%t%d iter_args(", nacc, cbk, c8);
    for (int i = 0; i < nacc; i++) P("%s%%y%d = %%x%d", i ? ", " : "", i, i);
    P(") -> (");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", V);
    P(") {\n");
    for (int mi = 0; mi < c->mi; mi++) load_frag_a(c, "%ks", mi, a[mi]);
    for (int ni = 0; ni < c->ni; ni++) load_frag_b(c, "%ks", ni, b[ni]);
    int fa[16], fb[32], d[256];
    for (int mi = 0; mi < c->mi; mi++) {
      fa[mi] = fresh(g);
      P("%%t%d = vector.from_elements %%t%d, %%t%d, %%t%d, %%t%d : vector<4x1xf32>\n", fa[mi], a[mi][0], a[mi][1],
        a[mi][2], a[mi][3]);
    }
    for (int ni = 0; ni < c->ni; ni++) {
      fb[ni] = fresh(g);
      P("%%t%d = vector.from_elements %%t%d, %%t%d : vector<2x1xf32>\n", fb[ni], b[ni][0], b[ni][1]);
    }
    for (int mi = 0; mi < c->mi; mi++)
      for (int ni = 0; ni < c->ni; ni++) {
        int idx = mi * c->ni + ni;
        d[idx] = fresh(g);
        P("%%t%d = nvgpu.mma.sync (%%t%d, %%t%d, %%y%d) {mmaShape = [16, 8, 8], tf32Enabled} : "
          "(vector<4x1xf32>, vector<2x1xf32>, %s) -> %s\n",
          d[idx], fa[mi], fb[ni], idx, V, V);
      }
    P("scf.yield ");
    for (int i = 0; i < nacc; i++) P("%s%%t%d", i ? ", " : "", d[i]);
    P(" : ");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", V);
    P("\n}\ngpu.barrier\nscf.yield ");
    for (int i = 0; i < nacc; i++) P("%s%%kkres#%d", i ? ", " : "", i);
    P(" : ");
    for (int i = 0; i < nacc; i++) P("%s%s", i ? ", " : "", V);
    P("\n");
  }
  P("}\n");
  /* C += accumulators: element (r, cc) of tile (mi, ni) at row g + 8r, column 2t + cc */
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
        int idx = mi * c->ni + ni;
        int cr = cidx(g, mi * 16 + 8 * (i / 2)), cc = cidx(g, ni * 8 + i % 2), row = fresh(g), col = fresh(g);
        P("%%t%d = arith.addi %%gr1, %%t%d : index\n%%t%d = arith.addi %%gc1, %%t%d : index\n", row, cr, col, cc);
        int ok1 = fresh(g), ok2 = fresh(g), ok = fresh(g);
        P("%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n%%t%d = arith.cmpi ult, %%t%d, %%t%d : index\n"
          "%%t%d = arith.andi %%t%d, %%t%d : i1\nscf.if %%t%d {\n",
          ok1, row, cm, ok2, col, cn, ok, ok1, ok2, ok);
        int v = fresh(g);
        if (g->sim) {
          int cidxv = cidx(g, idx), ci = cidx(g, i);
          P("%%t%d = memref.load %%acc[%%tx, %%t%d, %%t%d] : %s\n", v, cidxv, ci, c->accm);
        } else
          P("%%t%d = vector.extract %%kres#%d[%d, %d] : f32 from %s\n", v, idx, i / 2, i % 2, V);
        int cv = fresh(g), sum = fresh(g);
        P("%%t%d = memref.load %%C[%%t%d, %%t%d] : %s\n%%t%d = arith.addf %%t%d, %%t%d : f32\n"
          "memref.store %%t%d, %%C[%%t%d, %%t%d] : %s\n}\n",
          cv, row, col, Ct, sum, cv, v, sum, row, col, Ct);
      }
  phase_end(g);
}

char *cg_gemm_tc_text(const char *name, MlirType at, MlirType bt, MlirType ct, const struct cfg_gemm_schedule *s,
                      bool sim) {
  cfg_gemm_simt_schedule simt = {.threads = s->threads};
  gemm_gen G = {.s = simt, .sim = sim, .T = "f32"}, *g = &G;
  tc_gen C = {g, s, s->warp_tile_m / 16, s->warp_tile_n / 8, "", "", ""};
  char *A = type_str(at), *B = type_str(bt), *Ct = type_str(ct);
  G.M = mlirShapedTypeGetDimSize(at, 0);
  G.K = mlirShapedTypeGetDimSize(at, 1);
  G.N = mlirShapedTypeGetDimSize(bt, 1);
  const char *space = sim ? "" : ", #gpu.address_space<workgroup>";
  snprintf(G.As, sizeof G.As, "memref<%dx%dxf32%s>", s->bm, s->bk, space);
  snprintf(G.Bs, sizeof G.Bs, "memref<%dx%dxf32%s>", s->bk, s->bn, space);
  int nw = s->warps;
  snprintf(C.fA, sizeof C.fA, "memref<%dx32x%dx4xf32>", nw, C.mi);
  snprintf(C.fB, sizeof C.fB, "memref<%dx32x%dx2xf32>", nw, C.ni);
  snprintf(C.accm, sizeof C.accm, "memref<%dx%dx4xf32>", s->threads, C.mi * C.ni);
  int64_t gx = (G.N + s->bn - 1) / s->bn, gy = (G.M + s->bm - 1) / s->bm;
  open_func(g, name, A, B, Ct, gx, gy, s->threads);
  if (sim) {
    P("scf.for %%by = %%c0 to %%gy step %%c1 {\nscf.for %%bx = %%c0 to %%gx step %%c1 {\n");
    P("%%zero = arith.constant 0.0 : f32\n%%As = memref.alloc() : %s\n%%Bs = memref.alloc() : %s\n"
      "%%acc = memref.alloc() : %s\n%%fA = memref.alloc() : %s\n%%fB = memref.alloc() : %s\n",
      G.As, G.Bs, C.accm, C.fA, C.fB);
  } else {
    P("gpu.launch blocks(%%bx, %%by, %%bz) in (%%sx = %%gx, %%sy = %%gy, %%sz = %%c1) threads(%%tx, %%ty, %%tz) in "
      "(%%ux = %%nt, %%uy = %%c1, %%uz = %%c1) workgroup(%%As : %s, %%Bs : %s) {\n",
      G.As, G.Bs);
    P("%%zero = arith.constant 0.0 : f32\n%%vz = arith.constant dense<0.0> : vector<2x2xf32>\n");
  }
  tc_body(&C, A, B, Ct);
  const char *names[] = {"%As", "%Bs", "%acc", "%fA", "%fB", NULL}, *types[] = {G.As, G.Bs, C.accm, C.fA, C.fB};
  return close_func(g, names, types, A, B, Ct);
}
