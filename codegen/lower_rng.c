/* lower_rng.c: nova.dropout and nova.stochastic_round to linalg, with a
 * counter-based generator.
 *
 * Both draw, for element i of x (row-major linear index, < 2^32), the
 * first word w of Philox4x32-10 (Salmon et al., SC'11; the generator of
 * PyTorch's CUDA dropout and of Random123) of
 *   counter = (i, stream, low 32 bits of step, high 32 bits of step)
 *   key     = (low 32 bits of seed, high 32 bits of seed).
 * nova.dropout(x, seed, step) {ratio, stream}: element i is kept, and
 * scaled by 1 / (1 - ratio), when u >= ratio, else 0, where u = (w >> 8)
 * 2^-24 in [0, 1).  The mask is a pure function of (seed, step, stream,
 * i): the backward pass (another nova.dropout of the gradient, autodiff.c)
 * recomputes it instead of keeping it, and testsuite/e2e/test_dropout.py
 * reproduces it with a numpy Philox checked against Random123's
 * known-answer vectors.
 * nova.stochastic_round(x, seed, step) {stream}: f32 x to bf16 by adding
 * the low 16 bits of w to x's bits and dropping the low 16 (x's magnitude
 * rounds up with probability (its bits below bf16's) / 2^16: E[result] =
 * x); infinities and NaNs round to nearest (they stay what they are).
 */
#include <stdio.h>
#include <string.h>

#include "lower_internal.h"
#include "mlir-c/BuiltinAttributes.h"

/* Philox4x32 constants (Random123 philox.h): multipliers and Weyl key increments. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10

/* %hN, %lN = high and low words of the 64-bit product M * %SRC (i32). */
static void mulhilo(nv_sbuf *b, const char *tag, unsigned m, const char *src) {
  nv_sb_printf(b, "%%%sm = arith.constant %u : i64\n%%%sx = arith.extui %s : i32 to i64\n", tag, m, tag, src);
  nv_sb_printf(b, "%%%sp = arith.muli %%%sm, %%%sx : i64\n%%%sl = arith.trunci %%%sp : i64 to i32\n", tag, tag, tag,
               tag, tag);
  nv_sb_printf(b, "%%%ss = arith.shrui %%%sp, %%c32 : i64\n%%%sh = arith.trunci %%%ss : i64 to i32\n", tag, tag, tag,
               tag);
}

/* One round r: (c0..c3, k0, k1) of round r-1 -> of round r (names %cR_J, %kR_J). */
static void philox_round(nv_sbuf *b, int r) {
  char a[16], c[16], t0[16], t1[16];
  snprintf(a, sizeof a, "%%c%d_0", r - 1);
  snprintf(c, sizeof c, "%%c%d_2", r - 1);
  snprintf(t0, sizeof t0, "r%da", r);
  snprintf(t1, sizeof t1, "r%db", r);
  mulhilo(b, t0, PHILOX_M0, a);
  mulhilo(b, t1, PHILOX_M1, c);
  int k = r - 1; /* the key of this round */
  nv_sb_printf(b, "%%r%dx0 = arith.xori %%%sh, %%c%d_1 : i32\n%%c%d_0 = arith.xori %%r%dx0, %%k%d_0 : i32\n", r, t1,
               r - 1, r, r, k);
  nv_sb_printf(b, "%%c%d_1 = arith.addi %%%sl, %%zero32 : i32\n", r, t1);
  nv_sb_printf(b, "%%r%dx2 = arith.xori %%%sh, %%c%d_3 : i32\n%%c%d_2 = arith.xori %%r%dx2, %%k%d_1 : i32\n", r, t0,
               r - 1, r, r, k);
  nv_sb_printf(b, "%%c%d_3 = arith.addi %%%sl, %%zero32 : i32\n", r, t0);
  if (r < PHILOX_ROUNDS) /* the next round's key */
    nv_sb_printf(b, "%%k%d_0 = arith.addi %%k%d_0, %%w0 : i32\n%%k%d_1 = arith.addi %%k%d_1, %%w1 : i32\n", r, k, r,
                 k);
}

/* The Philox word of element i of X: %in1 = seed, %in2 = step (i64);
 * defines %c<ROUNDS>_0 (i32). */
static void philox_word(nv_sbuf *b, const tv *x, int64_t stream) {
  nv_sb_printf(b, "%%c32 = arith.constant 32 : i64\n%%zero32 = arith.constant 0 : i32\n");
  nv_sb_printf(b, "%%w0 = arith.constant %u : i32\n%%w1 = arith.constant %u : i32\n", PHILOX_W0, PHILOX_W1);
  nv_sb_printf(b, "%%lin0 = arith.constant 0 : index\n");
  for (int i = 0; i < x->rank; i++) { /* row-major linear index: lin(i+1) = lin(i) dim(i) + index(i) */
    nv_sb_printf(b, "%%ix%d = linalg.index %d : index\n%%dm%d = arith.constant %lld : index\n", i, i, i,
                 (long long)x->shape[i]);
    nv_sb_printf(b, "%%ls%d = arith.muli %%lin%d, %%dm%d : index\n%%lin%d = arith.addi %%ls%d, %%ix%d : index\n", i, i,
                 i, i + 1, i, i);
  }
  nv_sb_printf(b, "%%lini = arith.index_cast %%lin%d : index to i64\n%%c0_0 = arith.trunci %%lini : i64 to i32\n",
               x->rank);
  nv_sb_printf(b, "%%c0_1 = arith.constant %lld : i32\n", (long long)(int32_t)(uint32_t)stream);
  nv_sb_printf(b, "%%c0_2 = arith.trunci %%in2 : i64 to i32\n%%sth = arith.shrui %%in2, %%c32 : i64\n"
                  "%%c0_3 = arith.trunci %%sth : i64 to i32\n");
  nv_sb_printf(b, "%%k0_0 = arith.trunci %%in1 : i64 to i32\n%%sdh = arith.shrui %%in1, %%c32 : i64\n"
                  "%%k0_1 = arith.trunci %%sdh : i64 to i32\n");
  for (int r = 1; r <= PHILOX_ROUNDS; r++) philox_round(b, r);
}

/* The body: %in0 = x, %in1 = seed, %in2 = step (i64); defines %r. */
static void dropout_body(nv_sbuf *b, const tv *x, double ratio, int64_t stream) {
  const char *et = lw_ety(x->dt);
  philox_word(b, x, stream);
  /* u = (w >> 8) 2^-24, exact in f32 */
  nv_sb_printf(b, "%%c8 = arith.constant 8 : i32\n%%w24 = arith.shrui %%c%d_0, %%c8 : i32\n", PHILOX_ROUNDS);
  nv_sb_printf(b, "%%uf = arith.uitofp %%w24 : i32 to %s\n%%sc = arith.constant %s : %s\n", et,
               FL(1.0 / 16777216.0, x->dt), et);
  nv_sb_printf(b, "%%u = arith.mulf %%uf, %%sc : %s\n%%p = arith.constant %s : %s\n", et, FL(ratio, x->dt), et);
  nv_sb_printf(b, "%%keep = arith.cmpf oge, %%u, %%p : %s\n%%inv = arith.constant %s : %s\n", et,
               FL(1.0 / (1.0 - ratio), x->dt), et);
  nv_sb_printf(b, "%%xs = arith.mulf %%in0, %%inv : %s\n%%z = arith.constant %s : %s\n", et, FL(0.0, x->dt), et);
  nv_sb_printf(b, "%%r = arith.select %%keep, %%xs, %%z : %s\n", et);
}

/* An elementwise generic over X (the scalars SEED and STEP read by
 * every element) whose body is B's text; frees B. */
static tv rng_generic(lw *L, tv x, tv seed, tv step, const tv *res, nv_sbuf *b) {
  int idm[NOVA_MAX_RANK];
  for (int i = 0; i < x.rank; i++) idm[i] = i;
  const int *maps[3] = {idm, idm, idm}; /* the scalars' maps have no entries */
  char iters[NOVA_MAX_RANK + 1] = {0};
  for (int i = 0; i < x.rank && i < NOVA_MAX_RANK; i++) iters[i] = 'p';
  tv ins[3] = {x, seed, step};
  tv r = lw_generic(L, 3, ins, maps, x.rank, iters, idm, res->rank, res->shape, res->dt, (tv){.id = -1},
                    b->s ? b->s : "");
  nv_sb_free(b);
  return r;
}

tv lw_lower_dropout(lw *L, MlirOperation op, tv x, tv seed, tv step, const tv *res) {
  double ratio = mlirFloatAttrGetValueDouble(mlirOperationGetAttributeByName(op, nova_str("ratio")));
  nv_sbuf b = {0};
  dropout_body(&b, &x, ratio, lw_iattr(op, "stream"));
  return rng_generic(L, x, seed, step, res, &b);
}

tv lw_lower_sround(lw *L, MlirOperation op, tv x, tv seed, tv step, const tv *res) {
  nv_sbuf b = {0};
  philox_word(&b, &x, lw_iattr(op, "stream"));
  nv_sb_printf(&b, "%%bits = arith.bitcast %%in0 : f32 to i32\n%%lo16 = arith.constant 65535 : i32\n"
                   "%%rnd = arith.andi %%c%d_0, %%lo16 : i32\n%%sum = arith.addi %%bits, %%rnd : i32\n",
               PHILOX_ROUNDS);
  nv_sb_printf(&b, "%%c16 = arith.constant 16 : i32\n%%hi = arith.shrui %%sum, %%c16 : i32\n"
                   "%%h16 = arith.trunci %%hi : i32 to i16\n%%sr = arith.bitcast %%h16 : i16 to bf16\n");
  nv_sb_printf(&b, "%%rn = arith.truncf %%in0 : f32 to bf16\n%%ab = math.absf %%in0 : f32\n"
                   "%%inf = arith.constant 0x7F800000 : f32\n%%fin = arith.cmpf olt, %%ab, %%inf : f32\n"
                   "%%r = arith.select %%fin, %%sr, %%rn : bf16\n");
  return rng_generic(L, x, seed, step, res, &b);
}
