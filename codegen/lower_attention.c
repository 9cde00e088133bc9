/* lower_attention.c: nova.attention -> linalg on tensors.
 *
 * q (B, Hq, S, D), k (B, Hk, T, D), v (B, Hk, T, Dv), bias broadcasting to
 * (B, Hq, S, T); R = Hq / Hk query heads share a KV head (query head
 * h = g R + r reads KV head g).  The R query heads of group g are
 * contiguous, so q viewed as (B, Hk, R S, D) makes both products batched
 * matmuls over (B, Hk), with K and V read once per group, never copied per
 * query head:
 *   scores  X = q k^T                                  (B, Hk, R S, T)
 *   Z = scale X, capped (c tanh(Z / c)) when softcap c > 0, + bias
 *   m = max_j Z,  E = exp(Z - m'),  l = sum_j E      (one pass for E and l)
 *   Y = (E v) / l                                      (B, Hk, R S, Dv)
 *       (m' = 0 where m = -inf, and Y = 0 where l = 0: a row whose keys
 *       are all masked gives 0, not NaN)
 * Seven structured ops (k^T, the two contractions, the score epilogue with
 * the bias, the row maxima, E with its sums, the normalisation); the
 * contractions are linalg.contract ops in matmul's loop order, which the CPU
 * tiling register-tiles as it does nova.matmul.
 */
#include <math.h>
#include <string.h>

#include "lower_internal.h"

/* bias (rank <= 4, broadcasting to (B, Hq, S, T)) viewed as rank 5 against
 * the scores (B, Hk, R, S, T): its head axis split into (Hk, R) or (1, 1). */
static tv bias5(lw *L, tv b, int64_t hk, int64_t r) {
  int64_t s4[4] = {1, 1, 1, 1};
  for (int i = 0; i < b.rank; i++) s4[i + 4 - b.rank] = b.shape[i];
  bool heads = s4[1] != 1;
  int64_t s5[5] = {s4[0], heads ? hk : 1, heads ? r : 1, s4[2], s4[3]};
  return lw_reshape(L, b, 5, s5);
}

/* Z = scale X (capped) + bias, on the rank-5 view of the scores. */
static tv epilogue(lw *L, tv x5, tv b5, double scale, double cap) {
  const char *T = lw_ety(x5.dt);
  char body[900], capped[400];
  if (cap > 0)
    snprintf(capped, sizeof capped,
             "%%c = arith.constant %s : %s\n%%q = arith.divf %%z0, %%c : %s\n%%th = math.tanh %%q : %s\n"
             "%%z1 = arith.mulf %%th, %%c : %s\n", FL(cap, x5.dt), T, T, T, T);
  snprintf(body, sizeof body, "%%sc = arith.constant %s : %s\n%%z0 = arith.mulf %%in0, %%sc : %s\n%s%%r = arith.addf %s, %%in1 : %s",
           FL(scale, x5.dt), T, T, cap > 0 ? capped : "", cap > 0 ? "%z1" : "%z0", T);
  tv ins[2] = {x5, b5};
  return lw_elementwise(L, 2, ins, 5, x5.shape, x5.dt, body);
}

/* E = exp(Z - m') and its row sums l = sum_j E, in one pass (m the row
 * maxima, m' = 0 where m = -inf: a fully masked row has E = 0, l = 0).  E
 * comes out of a generic with a reduction loop, which elementwise fusion
 * leaves alone: fused into the contraction that reads it, the exponential
 * would be recomputed for every output column and the contraction would
 * lose its register tile. */
static void exp_sums(lw *L, tv z, tv *e, tv *l) {
  const char *T = lw_ety(z.dt);
  bool red[NOVA_MAX_RANK] = {0};
  red[z.rank - 1] = true;
  tv m = lw_reduce(L, z, red, 'M', 0, NULL, NULL);
  *l = lw_filled(L, m.rank, m.shape, z.dt, 0.0);
  tv e0 = lw_empty(L, z.rank, z.shape, z.dt);
  tv l1 = lw_fresh(L, m.rank, m.shape, z.dt);
  nv_sbuf b = {0};
  char full[160], rows[160], loops[80];
  int k = 0, kf = 0, kr = 0;
  for (int i = 0; i < z.rank; i++) {
    k += snprintf(loops + k, sizeof loops - (size_t)k, "%sd%d", i ? ", " : "", i);
    kf += snprintf(full + kf, sizeof full - (size_t)kf, "%sd%d", i ? ", " : "", i);
    if (i < z.rank - 1) kr += snprintf(rows + kr, sizeof rows - (size_t)kr, "%sd%d", i ? ", " : "", i);
  }
  nv_sb_printf(&b, "%%v%d:2 = linalg.generic {indexing_maps = [affine_map<(%s) -> (%s)>, affine_map<(%s) -> (%s)>, "
               "affine_map<(%s) -> (%s)>, affine_map<(%s) -> (%s)>], iterator_types = [",
               l1.id, loops, full, loops, rows, loops, rows, loops, full);
  for (int i = 0; i < z.rank; i++) nv_sb_printf(&b, "%s\"%s\"", i ? ", " : "", i < z.rank - 1 ? "parallel" : "reduction");
  nv_sb_printf(&b, "]} ins(%%v%d, %%v%d : %s, %s) outs(%%v%d, %%v%d : %s, %s) {\n", z.id, m.id, TT(z), TT(m), l->id,
               e0.id, TT(*l), TT(e0));
  nv_sb_printf(&b,
               "    ^bb0(%%in0: %s, %%in1: %s, %%acc: %s, %%eo: %s):\n"
               "      %%ninf = arith.constant %s : %s%s\n      %%zero = arith.constant %s : %s%s\n"
               "      %%isn = arith.cmpf oeq, %%in1, %%ninf : %s%s\n      %%ms = arith.select %%isn, %%zero, %%in1 : %s%s\n"
               "      %%d = arith.subf %%in0, %%ms : %s%s\n      %%t = math.exp %%d : %s%s\n"
               "      %%s = arith.addf %%acc, %%t : %s%s\n      linalg.yield %%s, %%t : %s, %s%s\n"
               "    } -> (%s, %s)",
               T, T, T, T, FL(-INFINITY, z.dt), T, L->loc, FL(0, z.dt), T, L->loc, T, L->loc, T, L->loc, T, L->loc, T,
               L->loc, T, L->loc, T, T, L->loc, TT(*l), TT(z));
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  /* %vN#0 is l and %vN#1 is E: given plain names (a cast to the same type folds away) */
  tv er = lw_fresh(L, z.rank, z.shape, z.dt), lr = lw_fresh(L, m.rank, m.shape, z.dt);
  lw_emit(L, "%%v%d = tensor.cast %%v%d#1 : %s to %s", er.id, l1.id, TT(z), TT(z));
  lw_emit(L, "%%v%d = tensor.cast %%v%d#0 : %s to %s", lr.id, l1.id, TT(m), TT(m));
  *e = er, *l = lr;
}

/* c (B, G, M, N) = a (B, G, M, K) b (B, G, K, N), as a linalg.contract: a
 * generic would take in the elementwise producer of its operand (the
 * probabilities: exp recomputed per output column, no register tile). */
static tv contract(lw *L, tv a, tv b) {
  int64_t s[4] = {a.shape[0], a.shape[1], a.shape[2], b.shape[3]};
  tv f = lw_filled(L, 4, s, a.dt, 0.0);
  tv r = lw_fresh(L, 4, s, a.dt);
  lw_emit(L,
          "%%v%d = linalg.contract indexing_maps = [affine_map<(b, g, m, n, k) -> (b, g, m, k)>, "
          "affine_map<(b, g, m, n, k) -> (b, g, k, n)>, affine_map<(b, g, m, n, k) -> (b, g, m, n)>] "
          "ins(%%v%d, %%v%d : %s, %s) outs(%%v%d : %s) -> %s",
          r.id, a.id, b.id, TT(a), TT(b), f.id, TT(f), TT(r));
  return r;
}

tv lw_lower_attention(lw *L, MlirOperation op, const tv *in, const tv *res) {
  tv q = in[0], k = in[1], v = in[2];
  int64_t B = q.shape[0], hq = q.shape[1], S = q.shape[2], D = q.shape[3];
  int64_t hk = k.shape[1], T = k.shape[2], R = hq / hk;
  tv q4 = lw_reshape(L, q, 4, (int64_t[]){B, hk, R * S, D});
  tv kt = lw_transpose(L, k, (int64_t[]){0, 1, 3, 2});
  tv x = contract(L, q4, kt);
  tv x5 = lw_reshape(L, x, 5, (int64_t[]){B, hk, R, S, T});
  tv z = epilogue(L, x5, bias5(L, in[3], hk, R), lw_fattr(op, "scale"), lw_fattr(op, "softcap"));
  tv e, l;
  exp_sums(L, z, &e, &l);
  tv y = lw_reshape(L, contract(L, lw_reshape(L, e, 4, x.shape), v), 5, (int64_t[]){B, hk, R, S, v.shape[3]});
  /* Y = (E v) / l, 0 for fully masked rows */
  const char *Ty = lw_ety(y.dt);
  char body[400];
  snprintf(body, sizeof body,
           "%%zero = arith.constant %s : %s\n%%lz = arith.cmpf oeq, %%in1, %%zero : %s\n%%q = arith.divf %%in0, %%in1 : %s\n"
           "%%r = arith.select %%lz, %%zero, %%q : %s", FL(0, y.dt), Ty, Ty, Ty, Ty);
  int ym[5] = {0, 1, 2, 3, 4}, lm[4] = {0, 1, 2, 3};
  tv ins[2] = {y, l};
  const int *mp[2] = {ym, lm};
  tv yn = lw_generic(L, 2, ins, mp, 5, "ppppp", ym, 5, y.shape, y.dt, (tv){.id = -1}, body);
  return lw_reshape(L, yn, 4, res->shape);
}
